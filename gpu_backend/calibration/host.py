"""Where a measurement ran: the device's name and the host's load, for calibration and validation
metadata.

Mirrors nothing in vLLM. Invariants: lookups only (nothing is changed); every field degrades to a
plain fallback rather than raising (no ``/proc/cpuinfo`` off Linux, no load average on Windows).
Imports torch.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def load_average() -> list[float] | None:
    """The host's 1/5/15-minute load averages (contention from other processes on a shared host)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # pragma: no cover
        return None


def device_name(device: torch.device) -> str:
    """The GPU's name, or ``cpu (<model name>, <n> logical cores)``."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:  # pragma: no cover - not Linux
        pass
    return f"cpu ({name}, {os.cpu_count()} logical cores)"
