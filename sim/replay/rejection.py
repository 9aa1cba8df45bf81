"""Requests the engine refuses alone (mirrors vLLM 0.25.1's request intake): the reason, or None.

vLLM validates each request before it reaches the scheduler and refuses only that request
(``InputProcessor._validate_prompt_len`` in ``vllm/v1/engine/input_processor.py``; the API server
answers it with an error, the engine serves the others):

* ``prompt_too_long`` -- a prompt longer than ``max_model_len``, *or exactly as long*: "The decoder
  prompt (length N) plus the number of requested output tokens (at least 1) is longer than the
  maximum model length";
* ``never_fits_pool`` -- the simulator's addition, for one full-attention group: a request whose
  longest KV footprint needs more blocks than the pool's ``num_gpu_blocks - 1`` usable ones (block
  0 is the null block). vLLM's start-up check (``_check_enough_kv_cache_memory``, counted with the
  null block) lets such a pool through, and vLLM would then preempt that request over and over; the
  simulator would stop with a stall. The footprint is the slots of every computed token: the
  prompt plus all outputs but the last (the last sampled token is never fed back), capped at
  ``max_model_len`` (vLLM stops a request there: ``FINISHED_LENGTH_CAPPED``), in blocks of
  ``block_size``. Hybrid / sliding-window groups are not checked (a window frees its blocks as it
  slides; a request that cannot fit still stops the run with the stall message).

A request not refused here runs exactly as before; a refused one gets no uid and never reaches the
scheduler (``sim.replay.intake``). Imports neither simpy nor torch.
"""

from __future__ import annotations

from sim.core.kv_cache_spec import cdiv
from sim.core.scheduler import Scheduler
from workloads.trace_format import TraceRequest

PROMPT_TOO_LONG = "prompt_too_long"
NEVER_FITS_POOL = "never_fits_pool"


def reject_reason(tr: TraceRequest, scheduler: Scheduler) -> str | None:
    """Why the engine refuses ``tr`` (``"<code>: <explanation>"``), or None. Pure lookup."""
    max_len = scheduler.config.max_model_len
    n = len(tr.tokens)
    if n >= max_len:  # vLLM's _validate_prompt_len: the prompt plus one output token must fit
        return f"{PROMPT_TOO_LONG}: prompt of {n} tokens, max_model_len {max_len} (prompt + 1 output must fit)"
    cc = scheduler.cache_config
    if cc.kv_groups:
        return None
    outputs = min(tr.output_tokens, max_len - n)  # vLLM stops the request at max_model_len
    slots = n + outputs - 1
    need = cdiv(slots, cc.block_size)
    usable = cc.num_gpu_blocks - 1
    if need > usable:
        return (f"{NEVER_FITS_POOL}: {slots} KV slots ({n} prompt + {outputs - 1} output tokens) need {need} blocks "
                f"of {cc.block_size}, the pool has {usable} usable")
    return None
