"""The executor interface: the one seam between the scheduler and time (simulated or measured).

An executor takes a :class:`~sim.core.scheduler_output.SchedulerOutput` (which requests compute how many tokens
after how much context, into which blocks) and returns a :class:`StepResult`: how long the step
took and the token each request whose prefill completed has sampled. ``sim.timing``'s ``SimulatedExecutor`` asks a
latency model; ``gpu_backend``'s executor runs real forward passes. Imports neither simpy nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sim.core.request import generated_token_id

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.scheduler_output import SchedulerOutput


_SHAPE_FIELDS = ("num_seqs", "num_decode_seqs", "num_new_tokens", "num_prefill_tokens", "context_tokens",
                 "attention_pairs")


class StepShape:
    """Aggregate work of one engine step (all sums over the scheduled requests); immutable by
    contract (no method changes it; equal and hashable by its six fields, in order).

    A plain class, not a NamedTuple or a frozen dataclass: every engine step builds one (the decode
    fast-forward one per window step; 3.4 M in a 16-replica fleet replay of Mooncake), and compiled
    by mypyc with the step modules (``sim.core.native_build``) a plain class's constructor costs
    about 23 ns, a NamedTuple's 228 ns (its ``__new__`` is interpreted) and a frozen dataclass's
    640 ns. ``__eq__``, ``__hash__``, ``__repr__`` and pickling are the NamedTuple's, over ``fields()``.

    * ``num_new_tokens``: tokens computed this step (prefill chunks + decodes);
    * ``context_tokens``: sum of each request's already-computed tokens (cached or earlier chunks),
      i.e. KV that attention must read but not write;
    * ``attention_pairs``: query-key pairs attention evaluates:
      ``sum(new_i * context_i + new_i * (new_i + 1) / 2)`` (causal within the new tokens);
    * a *decode* request computes exactly one token right after its last sampled token; everything
      else (including recompute after preemption) is prefill.
    """

    __slots__ = _SHAPE_FIELDS

    def __init__(self, num_seqs: int, num_decode_seqs: int, num_new_tokens: int, num_prefill_tokens: int,
                 context_tokens: int, attention_pairs: int) -> None:
        self.num_seqs = num_seqs
        self.num_decode_seqs = num_decode_seqs
        self.num_new_tokens = num_new_tokens
        self.num_prefill_tokens = num_prefill_tokens
        self.context_tokens = context_tokens
        self.attention_pairs = attention_pairs

    def fields(self) -> tuple[int, int, int, int, int, int]:
        """The six fields in constructor order."""
        return (self.num_seqs, self.num_decode_seqs, self.num_new_tokens, self.num_prefill_tokens,
                self.context_tokens, self.attention_pairs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepShape):
            return NotImplemented
        return self.fields() == other.fields()

    def __hash__(self) -> int:
        return hash(self.fields())

    def __reduce__(self) -> tuple[type[StepShape], tuple[int, int, int, int, int, int]]:
        return StepShape, self.fields()  # pickle and copy rebuild it through __init__

    def __repr__(self) -> str:
        return "StepShape(" + ", ".join(f"{k}={v}" for k, v in zip(_SHAPE_FIELDS, self.fields(), strict=True)) + ")"

    @property
    def num_prefill_seqs(self) -> int:
        return self.num_seqs - self.num_decode_seqs

    @property
    def num_decode_tokens(self) -> int:
        return self.num_new_tokens - self.num_prefill_tokens

    @property
    def kv_read_tokens(self) -> int:
        """Tokens whose K/V attention reads: context plus the new tokens themselves."""
        return self.context_tokens + self.num_new_tokens

    @staticmethod
    def decode_only(num_seqs: int, context_tokens: int) -> StepShape:
        """A pure decode step of ``num_seqs`` requests whose contexts sum to ``context_tokens``."""
        return StepShape(num_seqs, num_seqs, num_seqs, 0, context_tokens, context_tokens + num_seqs)

    @staticmethod
    def prefill_only(num_tokens: int, context_tokens: int = 0) -> StepShape:
        """One request prefilling ``num_tokens`` new tokens after ``context_tokens`` cached ones."""
        pairs = num_tokens * context_tokens + num_tokens * (num_tokens + 1) // 2
        return StepShape(1, 0, num_tokens, num_tokens, context_tokens, pairs)




@dataclass(slots=True)
class StepResult:
    """Duration of one engine step and the tokens it sampled, by request id."""

    duration_s: float
    sampled_token_ids: dict[str, list[int]]


class Executor(Protocol):
    """Anything that can run one scheduled batch."""

    def execute(self, output: SchedulerOutput) -> StepResult: ...


def step_shape(output: SchedulerOutput) -> StepShape:
    """Aggregate the work of a step for latency models (see :class:`StepShape`); memoised."""
    if output.shape is not None:
        return output.shape
    num_decode = 0
    num_prefill_tokens = 0
    new_total = 0
    context = 0
    pairs = 0
    for s in output.scheduled:
        n = s.num_new_tokens
        c = s.num_computed_before
        new_total += n
        context += c
        pairs += n * c + n * (n + 1) // 2
        if n == 1 and s.request.output_token_ids and c == s.request.num_tokens - 1:
            num_decode += 1
        else:
            num_prefill_tokens += n
    output.shape = StepShape(len(output.scheduled), num_decode, new_total, num_prefill_tokens, context, pairs)
    return output.shape


def planned_samples(output: SchedulerOutput) -> dict[str, list[int]]:
    """The next planned output token of every request that samples in this step."""
    sampled: dict[str, list[int]] = {}
    for s in output.scheduled:
        if s.samples:
            r = s.request
            # index of the token this step samples: outputs known so far, plus those still in
            # flight (async scheduling's placeholders, this step's own included)
            ph = r.num_output_placeholders
            j = len(r.output_token_ids) + (ph - 1 if ph > 1 else 0)
            # (planned_output_token, with its common case -- no trace-given outputs -- called directly)
            sampled[r.request_id] = [generated_token_id(r.uid, j) if r.output_token_plan is None
                                     else r.planned_output_token(j)]
    return sampled
