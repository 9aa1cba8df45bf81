"""Experiments: validated YAML config (pydantic) -> one resolved engine description -> run or sweep
(local processes or Ray) -> a results folder. Mirrors how a vLLM engine is launched (engine
arguments resolved once at start-up) and benchmarked. Invariants: validation lives here, once;
block sizes, pool size and ``max_model_len`` are derived only by ``engine_description.resolve``.
Imports every layer below it, never ``sim.analysis``, ``sim.cli`` or ``gpu_backend``.
"""
