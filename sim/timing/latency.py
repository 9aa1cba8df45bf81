"""Latency models: how long one engine step takes, from the shape of its batch.

The scheduler never sees these; a :class:`~sim.timing.simulated_executor.SimulatedExecutor` turns
each ``SchedulerOutput`` into a :class:`~sim.core.executor.StepShape` and asks a
:class:`LatencyModel` for the duration. This module holds the interface and :class:`FixedLatency`;
:mod:`sim.timing.roofline` (model + GPU roofline) and :mod:`sim.timing.fitted_latency` (a
calibrated linear model read from a file) implement it beside it.

The CPU offload tier's transfers are not part of a step's duration here, as they are not in vLLM
0.33.0's: its worker copies on streams of its own beside the forward. The replay composes them
(``sim.replay.kv_transfer`` over ``sim.timing.transfer_link``): a step lasts the model's time plus
the wait for its flushed stores (``jobs_to_flush``); a load delays its request (reported no
earlier than the next step's output), never the step; an empty step while transfers are pending
lasts until the first one it may report lands. The link's figures come with the model: a fitted
model's file carries the calibrated link (``host_link``), the roofline's GPU spec its
``host_link_gb_s`` (``tests/test_latency_link.py`` derives the composed times by hand).
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
