"""Workloads: trace loaders and generators -> a ``TraceRequest`` stream (mirrors the request
fields vLLM takes: prompt ids, ``cache_salt``, LoRA, ``prompt_logprobs``, priority). Invariants: the
same section, seeds and input files give the identical stream. Imports sim.core only.
"""
