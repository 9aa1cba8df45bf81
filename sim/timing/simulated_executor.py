"""The simulated executor: step durations from a latency model, sampled tokens from each
request's plan (trace-given ``output_token_ids`` or the simulator's unique generated ids).

Implements :class:`sim.core.executor.Executor`; a step that schedules nothing takes zero time (vLLM
runs no forward pass for it); ``price`` lets the replay fast-forward price a step shape without
running it. With a :class:`~sim.timing.step_noise.StepNoise` every step's duration is multiplied by
that step's jitter factor (keyed by the step index, so a priced step and the same step run plainly
get the same duration); without one, durations are the latency model's exactly.
Imports neither simpy nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.core.executor import StepResult, StepShape, planned_samples, step_shape
from sim.core.step_price import RooflinePrice
from sim.timing.latency import LatencyModel
from sim.timing.roofline import RooflineLatency
from sim.timing.step_noise import StepNoise

if TYPE_CHECKING:  # pragma: no cover
    from sim.core.scheduler_output import SchedulerOutput


class SimulatedExecutor:
    """Step duration from a latency model (times an optional per-step jitter); sampled tokens
    from each request's plan."""

    def __init__(self, latency_model: LatencyModel, noise: StepNoise | None = None) -> None:
        self.latency_model = latency_model
        self.noise = noise
        # the fast-forward's compiled pricing (sim.core.step_price), the same doubles as price():
        # offered for the roofline alone (a subclass may price otherwise) and without jitter
        self.step_price: RooflinePrice | None = (
            latency_model.step_price() if type(latency_model) is RooflineLatency and noise is None else None)

    def execute(self, output: SchedulerOutput) -> StepResult:
        if output.is_empty():  # no forward pass for an empty batch (vLLM's EMPTY_MODEL_RUNNER_OUTPUT)
            return StepResult(0.0, {})
        d = self.latency_model.step_time(step_shape(output))
        if self.noise is not None:
            d *= self.noise.factor(output.step)
        return StepResult(d, planned_samples(output))

    def price(self, shape: StepShape, step: int | None = None) -> float:
        """Duration of a step of this shape without running it (the engine's exact fast-forward);
        ``step``, the index the step will have, selects its jitter (none without it)."""
        d = self.latency_model.step_time(shape)
        if self.noise is not None and step is not None:
            d *= self.noise.factor(step)
        return d

