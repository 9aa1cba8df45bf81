"""Latency models: how long one engine step takes, from the shape of its batch.

The scheduler never sees these; a ``SimulatedExecutor`` turns each ``SchedulerOutput`` into a
:class:`StepShape` and asks a :class:`LatencyModel` for the duration. Imports neither simpy nor torch.

This module holds the interface and :class:`FixedLatency`; the others live beside it and are
re-exported here (lazily, so ``sim.roofline`` and ``sim.fitted_latency`` can import this module):

* :class:`~sim.roofline.RooflineLatency` with :class:`~sim.roofline.ModelSpec`,
  :class:`~sim.roofline.GPUSpec`, their loaders and :func:`~sim.roofline.kv_cache_blocks`;
* :class:`~sim.fitted_latency.FittedLatency`, a calibrated linear model read from a file.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from sim.fitted_latency import FittedLatency
    from sim.roofline import (
        GPUSpec,
        ModelSpec,
        RooflineLatency,
        kv_cache_blocks,
        list_gpu_specs,
        list_model_specs,
        load_gpu_spec,
        load_model_spec,
    )


@dataclass(frozen=True, slots=True)
class StepShape:
    """Aggregate work of one engine step (all sums over the scheduled requests).

    * ``num_new_tokens``: tokens computed this step (prefill chunks + decodes);
    * ``context_tokens``: sum of each request's already-computed tokens (cached or earlier chunks),
      i.e. KV that attention must read but not write;
    * ``attention_pairs``: query-key pairs attention evaluates:
      ``sum(new_i * context_i + new_i * (new_i + 1) / 2)`` (causal within the new tokens);
    * a *decode* request computes exactly one token right after its last sampled token; everything
      else (including recompute after preemption) is prefill.
    """

    num_seqs: int
    num_decode_seqs: int
    num_new_tokens: int
    num_prefill_tokens: int
    context_tokens: int
    attention_pairs: int

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
    def decode_only(num_seqs: int, context_tokens: int) -> "StepShape":
        """A pure decode step of ``num_seqs`` requests whose contexts sum to ``context_tokens``."""
        return StepShape(num_seqs, num_seqs, num_seqs, 0, context_tokens, context_tokens + num_seqs)

    @staticmethod
    def prefill_only(num_tokens: int, context_tokens: int = 0) -> "StepShape":
        """One request prefilling ``num_tokens`` new tokens after ``context_tokens`` cached ones."""
        pairs = num_tokens * context_tokens + num_tokens * (num_tokens + 1) // 2
        return StepShape(1, 0, num_tokens, num_tokens, context_tokens, pairs)


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


_REEXPORTS = {
    "FittedLatency": "sim.fitted_latency",
    "GPUSpec": "sim.roofline",
    "ModelSpec": "sim.roofline",
    "RooflineLatency": "sim.roofline",
    "kv_cache_blocks": "sim.roofline",
    "list_gpu_specs": "sim.roofline",
    "list_model_specs": "sim.roofline",
    "load_gpu_spec": "sim.roofline",
    "load_model_spec": "sim.roofline",
}

__all__ = ["FixedLatency", "LatencyModel", "StepShape", *_REEXPORTS]


def __getattr__(name: str) -> object:  # PEP 562: lazy re-exports, no import cycle
    module = _REEXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
