"""Real forward passes for the batches the ``sim`` scheduler produces.

The scheduler, KV-cache manager and block pool are the simulator's own (``sim/``); this package
adds what a GPU worker adds in vLLM: a Llama-style model with seeded random weights
(:mod:`gpu_backend.model`), a paged KV cache whose block ids *are* the pool's block ids
(:mod:`gpu_backend.kv_cache`), paged attention (:mod:`gpu_backend.attention`, with a Triton decode
kernel in :mod:`gpu_backend.triton_decode`), and :class:`gpu_backend.executor.TorchExecutor`, the
executor the SimPy replay drives instead of the latency model (``apcsim run ... --backend torch``).

Token ids reach the embedding as ``token_id % vocab_size``: trace ids and the simulator's generated
ids (up to ``2**62 + ...``) are arbitrary integers, and the check here is only that cached and
recomputed KV agree, which any fixed mapping preserves.

torch is imported only inside this package (and its tests); importing the package itself, or
:mod:`gpu_backend.shapes`, does not import torch.
"""
