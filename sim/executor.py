"""The executor interface: the one seam between the scheduler and time (simulated or measured).

An executor takes a :class:`~sim.scheduler.SchedulerOutput` (which requests compute how many tokens
after how much context, into which blocks) and returns a :class:`StepResult`: how long the step
took and the token each request whose prefill completed has sampled. ``SimulatedExecutor`` asks a
latency model; ``gpu_backend``'s executor runs real forward passes. Imports neither simpy nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sim.latency import LatencyModel, StepShape
from sim.scheduler import SchedulerOutput


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
        return output.shape  # type: ignore[no-any-return]
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
            j = len(r.output_token_ids) + max(0, r.num_output_placeholders - 1)
            sampled[r.request_id] = [r.planned_output_token(j)]
    return sampled


class SimulatedExecutor:
    """Step duration from a latency model; sampled tokens from each request's plan."""

    def __init__(self, latency_model: LatencyModel) -> None:
        self.latency_model = latency_model

    def execute(self, output: SchedulerOutput) -> StepResult:
        return StepResult(self.latency_model.step_time(step_shape(output)), planned_samples(output))

    def price(self, shape: StepShape) -> float:
        """Duration of a step of this shape without running it (the engine's exact fast-forward)."""
        return self.latency_model.step_time(shape)
