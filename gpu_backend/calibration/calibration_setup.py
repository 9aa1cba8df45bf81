"""What a calibration runs on: the backend and engine settings of one experiment config.

Mirrors nothing in vLLM. :class:`CalibrationSetup` is plain data (model shape, device, dtype,
attention path, block size, threads, seed, timing mode); :func:`setup_from_config` reads it from an
experiment config so a calibration matches the validation that follows it. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass
class CalibrationSetup:
    model_shape: str = "tiny"
    device: str = "cpu"
    dtype: str = "float32"
    attention: str = "auto"
    block_size: int = 16
    num_threads: int | None = 1
    seed: int = 0
    timing: Literal["wall", "cuda_events", "thread_cpu"] = "wall"
    timing_repeats: int = 1


def setup_from_config(path: str) -> tuple[CalibrationSetup, str]:
    """Backend and engine settings of an experiment config (so calibration matches the validation)."""
    from sim.experiment.config import load_config

    cfg = load_config(path)
    b = cfg.backend
    shape = b.model_shape
    if shape.endswith((".yaml", ".yml")) and not Path(shape).is_absolute():
        shape = str(cfg.resolve_path(shape))
    return CalibrationSetup(shape, b.device, b.dtype, b.attention, cfg.engine.block_size, b.num_threads,
                            b.seed if b.seed is not None else cfg.seed, b.timing, b.timing_repeats), cfg.name
