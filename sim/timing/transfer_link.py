"""The GPU<->CPU link that the CPU offload tier's transfers cross (mirrors nothing in vLLM's code:
it is the physical PCIe or NVLink-C2C link under vLLM 0.33.0's CPU offloading worker,
``CPUOffloadingWorker`` in ``vllm/v1/kv_offload/cpu/gpu_worker.py``).

That worker copies with one ``SingleDirectionOffloadingHandler`` per direction (a store handler
GPU -> CPU, a load handler CPU -> GPU): each handler chains its transfers, every transfer's stream
waiting for the previous transfer's end event, so within a direction transfers run one at a time in
submission order, and the two directions never wait for each other. PCIe Gen5 x16 and NVLink-C2C are
full duplex, so each direction has the link's whole bandwidth. Hence, by default (``duplex``), two
lanes like a two-way road with one lane each way: a transfer waits for the ones submitted before it
*in its own direction*, then takes ``latency_s + bytes / bandwidth``; a load is never queued behind
a burst of stores.

``duplex=False`` (``engine.offload_link_duplex: false``) is the conservative reading for hosts whose
two directions share copy engines or host memory bandwidth: one lane, loads and stores in one FIFO,
so a load submitted behind stores waits for them. (vLLM's third handler, for expedited loads of
requests already running, is not modelled: the simulated connector plans no such load.)

The link's two figures come, in this order of precedence, from ``engine.offload_bandwidth_gb_s``
(bandwidth only, latency 0), from a calibration file's ``host_link`` section (:class:`LinkFit`,
written by ``apcsim calibrate`` from timed block copies on the real backend: bandwidth *and* a fixed
per-transfer latency), or from the GPU spec's ``host_link_gb_s`` (latency 0); the engine
description (``sim.experiment.engine_description``) resolves them once.

Invariants: completion times never decrease in submission order within a lane (one per direction
with ``duplex``, one for both without); a transfer of 0 bytes completes at ``max(now, lane free) +
latency_s``; the link holds no clock of its own (callers pass ``now``).
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
    """A link of ``bandwidth_gb_s`` GB/s (1e9 bytes/s) per direction with a fixed per-transfer
    latency: one FIFO lane per direction (``duplex``), or one lane shared by both."""

    bandwidth_gb_s: float
    latency_s: float = 0.0
    duplex: bool = True
    load_free_at: float = 0.0  # when the last submitted load leaves its lane (shared: the last transfer)
    store_free_at: float = 0.0  # when the last submitted store leaves its lane (shared: the last transfer)
    bytes_moved: int = 0

    def __post_init__(self) -> None:
        if not self.bandwidth_gb_s > 0:
            raise ValueError(f"link bandwidth must be > 0 GB/s, got {self.bandwidth_gb_s}")
        if not self.latency_s >= 0:
            raise ValueError(f"link latency must be >= 0 s, got {self.latency_s}")

    def submit(self, now: float, num_bytes: int, *, load: bool) -> float:
        """Changes state: queue a transfer of ``num_bytes`` at ``now``, a load (CPU -> GPU) or a store
        (GPU -> CPU); returns when it completes."""
        free = self.load_free_at if load else self.store_free_at
        start = now if now > free else free
        done = start + self.latency_s + num_bytes / (self.bandwidth_gb_s * 1e9)
        # duplex: only this direction's lane is taken; shared: both directions wait for this transfer
        if load or not self.duplex:
            self.load_free_at = done
        if not load or not self.duplex:
            self.store_free_at = done
        self.bytes_moved += num_bytes
        return done

    def seconds_for(self, num_bytes: int) -> float:
        """Query: how long ``num_bytes`` take on an idle lane."""
        return self.latency_s + num_bytes / (self.bandwidth_gb_s * 1e9)
