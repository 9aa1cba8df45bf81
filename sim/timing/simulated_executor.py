"""The simulated executor: step durations from a latency model, sampled tokens from each
request's plan (trace-given ``output_token_ids`` or the simulator's unique generated ids).

Implements :class:`sim.core.executor.Executor`; a step that schedules nothing takes zero time (vLLM
runs no forward pass for it); ``price`` lets the replay fast-forward price a step
shape without running it. Imports neither simpy nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.core.executor import StepResult, StepShape, planned_samples, step_shape
from sim.timing.latency import LatencyModel

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.scheduler_output import SchedulerOutput


class SimulatedExecutor:
    """Step duration from a latency model; sampled tokens from each request's plan."""

    def __init__(self, latency_model: LatencyModel) -> None:
        self.latency_model = latency_model

    def execute(self, output: SchedulerOutput) -> StepResult:
        if output.is_empty():  # no forward pass for an empty batch (vLLM's EMPTY_MODEL_RUNNER_OUTPUT)
            return StepResult(0.0, {})
        return StepResult(self.latency_model.step_time(step_shape(output)), planned_samples(output))

    def price(self, shape: StepShape) -> float:
        """Duration of a step of this shape without running it (the engine's exact fast-forward)."""
        return self.latency_model.step_time(shape)
