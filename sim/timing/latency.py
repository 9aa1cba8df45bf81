"""Latency models: how long one engine step takes, from the shape of its batch.

The scheduler never sees these; a :class:`~sim.timing.simulated_executor.SimulatedExecutor` turns
each ``SchedulerOutput`` into a :class:`~sim.core.executor.StepShape` and asks a
:class:`LatencyModel` for the duration. This module holds the interface and :class:`FixedLatency`;
:mod:`sim.timing.roofline` (model + GPU roofline) and :mod:`sim.timing.fitted_latency` (a
calibrated linear model read from a file) implement it beside it.
Imports neither simpy nor torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from sim.core.executor import StepShape


class LatencyModel(ABC):
    """Maps a step's shape to its duration in seconds (must be > 0)."""

    name: str = "abstract"

    @abstractmethod
    def step_time(self, shape: StepShape) -> float: ...

    def describe(self) -> dict[str, object]:
        """Parameters worth writing beside results."""
        return {"name": self.name}


class FixedLatency(LatencyModel):
    """Every step takes the same time: for tests and for comparisons with vLLM step by step."""

    name = "fixed"

    def __init__(self, step_time_s: float) -> None:
        if not step_time_s > 0:
            raise ValueError(f"fixed step time must be > 0, got {step_time_s}")
        self.step_time_s = float(step_time_s)

    def step_time(self, shape: StepShape) -> float:
        return self.step_time_s

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "step_time_s": self.step_time_s}
