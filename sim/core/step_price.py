"""A step price the decode fast-forward computes in compiled code (mirrors nothing in vLLM).

The fast-forward (``sim.replay.decode_window``) prices every step of a window before playing it:
a 16-replica fleet replay of the first 2,000 Mooncake requests prices 575 k steps, each a call
into the interpreted latency model (``SimulatedExecutor.price`` -> ``RooflineLatency.step_time``),
about a quarter of the engine's work in the fleet's windows (callgrind: 5,400 instructions a
step, the arithmetic a few dozen). :class:`RooflinePrice` holds the roofline's coefficients and
does the same arithmetic -- the same float operations in the same order, so the same double,
bit for bit -- compiled with the engine group (``sim.core.native_build``), where the planner
calls it directly with the step's four sums, without a ``StepShape`` or a Python frame.

``RooflineLatency.step_price()`` builds one; ``SimulatedExecutor.step_price`` offers it when the
executor's durations are the roofline's alone (no per-step jitter). Equality with
``RooflineLatency.step_time`` is a property test. Imports nothing beyond the stdlib.
"""

from __future__ import annotations


class RooflinePrice:
    """``max(compute, memory) + overhead`` over a step's four sums (see ``sim.timing.roofline``):
    compute ``(dense * new + lm_head * seqs + attn * pairs) / flops_per_s``, memory
    ``(weights + kv * (context + 2 * new)) / bytes_per_s``."""

    def __init__(self, dense: float, lm_head: float, attn: float, flops_per_s: float, weights: float,
                 kv: float, bytes_per_s: float, overhead_s: float) -> None:
        self.dense = dense
        self.lm_head = lm_head
        self.attn = attn
        self.flops_per_s = flops_per_s
        self.weights = weights
        self.kv = kv
        self.bytes_per_s = bytes_per_s
        self.overhead_s = overhead_s

    def step_time(self, num_seqs: int, num_new_tokens: int, context_tokens: int, attention_pairs: int) -> float:
        """The duration of a step with these sums (``RooflineLatency.step_time``'s operations, in
        its order: each int taken as the nearest double, as Python's ``float * int`` does)."""
        flops = self.dense * float(num_new_tokens) + self.lm_head * float(num_seqs) + self.attn * float(attention_pairs)
        compute = flops / self.flops_per_s
        memory = (self.weights + self.kv * float(context_tokens + 2 * num_new_tokens)) / self.bytes_per_s
        return (compute if compute > memory else memory) + self.overhead_s
