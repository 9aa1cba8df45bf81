"""Real forward passes for the batches the ``sim`` scheduler produces.

The scheduler, KV-cache manager and block pool are the simulator's own (``sim/``); this package
adds what a GPU worker adds in vLLM, and then measures it. Its subpackages follow one step's data
path, each importing only those below it (the import contracts in ``pyproject.toml``):

* :mod:`gpu_backend.layout` -- what a step's data looks like on the device: model shapes, the flat
  step batch, a paged KV cache whose block ids *are* the pool's block ids;
* :mod:`gpu_backend.attention` -- paged attention over that cache (reference, flash, a Triton decode
  kernel) and the run-time choice between them;
* :mod:`gpu_backend.executor` -- :class:`~gpu_backend.executor.executor.TorchExecutor`, the executor
  the SimPy replay drives instead of the latency model (``apcsim run ... --backend torch``), with
  a Llama-style model with seeded random weights and the CPU offload tier's worker;
* :mod:`gpu_backend.calibration` -- ``apcsim calibrate``: the latency model fitted on timed steps;
* :mod:`gpu_backend.validation` -- reuse equals recompute, ``apcsim validate``, the noise studies;
* :mod:`gpu_backend.device` -- the one device script that runs all of it on a GPU.

``sim`` never imports this package: it names ``gpu_backend.executor.factory`` and the calibration
commands by string (``sim.experiment.backend``, ``sim.cli.calibrate``).

Token ids reach the embedding as ``token_id % vocab_size``: trace ids and the simulator's generated
ids (up to ``2**62 + ...``) are arbitrary integers, and the check here is only that cached and
recomputed KV agree, which any fixed mapping preserves.

torch is imported only inside this package (and its tests); importing the package itself, its
subpackages' ``__init__`` (except :mod:`gpu_backend.attention`, which re-exports its classes), or
:mod:`gpu_backend.layout.shapes`, does not import torch.
"""
