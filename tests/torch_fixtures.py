"""Fixtures shared by the torch-backend test modules (imported by name; needs torch)."""

from __future__ import annotations

import pytest
import torch

from gpu_backend.model import LlamaModel
from gpu_backend.shapes import TINY


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny kernels run fastest on one thread (and do not fight other processes for cores)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    """The tiny fp32 CPU model, seed 0."""
    return LlamaModel(TINY, dtype=torch.float32, device="cpu", seed=0)
