"""The ground floor of the torch backend: what a step's data looks like on the device.

A step of the ``sim`` Scheduler (a :class:`~sim.core.scheduler.SchedulerOutput`) becomes tensors here,
laid out the way vLLM v1's GPU model runner lays them out:

* :mod:`~gpu_backend.layout.shapes` -- the model's shape (layers, heads, head size, vocabulary):
  ``tiny`` for CI or a ``sim.timing`` model spec. Imports no torch;
* :mod:`~gpu_backend.layout.batch` -- one step flattened into one token dimension (prefill chunks
  and decodes side by side: positions, ``query_start_loc``, ``seq_lens``, block table, slot mapping),
  as vLLM v1's model runner prepares it;
* :mod:`~gpu_backend.layout.kv_cache` -- the paged KV cache, one ``[num_blocks, block_size,
  num_kv_heads, head_dim]`` K and V per layer indexed by the sim ``BlockPool``'s block ids, and the
  runner's per-request block tables.

Everything above reads these: :mod:`gpu_backend.attention` reads the batch and the cache,
:mod:`gpu_backend.executor` builds them every step. This package imports nothing of
``gpu_backend``; importing it (or :mod:`~gpu_backend.layout.shapes`) imports no torch.
"""
