"""The GPU<->CPU link that the CPU offload tier's transfers cross (mirrors nothing in vLLM's code:
it is the physical PCIe or NVLink-C2C link under vLLM's CPU offloading worker,
``vllm/v1/kv_offload/cpu/gpu_worker.py``, which copies blocks with one DMA stream per direction).

Like a one-lane bridge: each transfer waits for the ones submitted before it, then takes
``latency_s + bytes / bandwidth``. Loads (CPU -> GPU) and stores (GPU -> CPU) share the one queue
(the issue's "stores share the link"): a load submitted behind a burst of stores waits for them,
which is the conservative reading of PCIe's two directions served by shared copy engines and
host memory bandwidth.

The link's two figures come, in this order of precedence, from ``engine.offload_bandwidth_gb_s``
(bandwidth only, latency 0), from a calibration file's ``host_link`` section (:class:`LinkFit`,
written by ``apcsim calibrate`` from timed block copies on the real backend: bandwidth *and* a fixed
per-transfer latency), or from the GPU spec's ``host_link_gb_s`` (latency 0); the engine
description (``sim.experiment.engine_description``) resolves them once.

Invariants: completion times never decrease in submission order; a transfer of 0 bytes completes
at ``max(now, free_at) + latency_s``; the link holds no clock of its own (callers pass ``now``).
Imports neither simpy nor torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LINK_KEY = "host_link"
"""The calibration file's section with the fitted link (``gpu_backend.calibration.link_timing`` writes it)."""


@dataclass(frozen=True)
class LinkFit:
    """A calibrated link: ``seconds(bytes) = latency_s + bytes / (bandwidth_gb_s * 1e9)``, and what
    was measured (``measured``: e.g. pinned host <-> an H100, or host <-> host on a CPU-only machine)."""

    bandwidth_gb_s: float
    latency_s: float
    measured: str = ""

    @classmethod
    def from_calibration(cls, data: Mapping[str, Any], source: str = "calibration") -> LinkFit | None:
        """The ``host_link`` section of a calibration file's mapping (None without one); a bad value
        raises ValueError naming the key."""
        sec = data.get(LINK_KEY)
        if sec is None:
            return None
        if not isinstance(sec, Mapping):
            raise ValueError(f"{source}: {LINK_KEY} must be a mapping")
        vals: list[float] = []
        for key, positive in (("bandwidth_gb_s", True), ("latency_s", False)):
            v = sec.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
                    or (v <= 0 if positive else v < 0):
                raise ValueError(f"{source}: {LINK_KEY}.{key} must be a finite number "
                                 f"{'> 0' if positive else '>= 0'}, got {v!r}")
            vals.append(float(v))
        return cls(vals[0], vals[1], str(sec.get("measured", "")))


@dataclass(slots=True)
class TransferLink:
    """A FIFO link of ``bandwidth_gb_s`` GB/s (1e9 bytes/s) with a fixed per-transfer latency."""

    bandwidth_gb_s: float
    latency_s: float = 0.0
    free_at: float = 0.0  # when the last submitted transfer leaves the link
    bytes_moved: int = 0

    def __post_init__(self) -> None:
        if not self.bandwidth_gb_s > 0:
            raise ValueError(f"link bandwidth must be > 0 GB/s, got {self.bandwidth_gb_s}")
        if not self.latency_s >= 0:
            raise ValueError(f"link latency must be >= 0 s, got {self.latency_s}")

    def submit(self, now: float, num_bytes: int) -> float:
        """Changes state: queue a transfer of ``num_bytes`` at ``now``; returns when it completes."""
        start = now if now > self.free_at else self.free_at
        self.free_at = start + self.latency_s + num_bytes / (self.bandwidth_gb_s * 1e9)
        self.bytes_moved += num_bytes
        return self.free_at

    def seconds_for(self, num_bytes: int) -> float:
        """Query: how long ``num_bytes`` take on an idle link."""
        return self.latency_s + num_bytes / (self.bandwidth_gb_s * 1e9)
