"""The executor: the sim Scheduler's steps as real forward passes (``apcsim run --backend torch``).

It mirrors what a vLLM v1 GPU worker adds under the scheduler: the model runner and, with a CPU
offload tier, the offloading connector's worker. Per step the data flows

    SchedulerOutput -> block tables, flat batch (gpu_backend.layout)
        -> the CPU tier's stores, flushes and loads (offload_worker)
        -> LlamaModel.forward with an attention path (gpu_backend.attention)
        -> sampled tokens, measured seconds, the tier's finished jobs -> StepResult

* :mod:`~gpu_backend.executor.executor` -- :class:`TorchExecutor`, the
  :class:`sim.core.executor.Executor` the SimPy replay drives instead of the latency model;
* :mod:`~gpu_backend.executor.model` -- the Llama-style decoder with seeded random weights, and its
  dense forward (the correctness oracle);
* :mod:`~gpu_backend.executor.cpu_kv_store`, :mod:`~gpu_backend.executor.offload_worker` -- the CPU
  tier's host store and block copies, in vLLM 0.33.0's ``OffloadingConnectorWorker`` order;
* :mod:`~gpu_backend.executor.factory` -- ``make_torch_executor(cfg, scheduler)``, named by
  ``sim.experiment.backend``'s registry (``sim`` never imports this package);
* :mod:`~gpu_backend.executor.real_run` -- a whole config replayed with every step a forward pass,
  the real run that calibration and validation measure.

Imports :mod:`gpu_backend.layout` and :mod:`gpu_backend.attention` below it, never the calibration,
validation or device packages above it.
"""
