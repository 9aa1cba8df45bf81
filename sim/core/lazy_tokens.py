"""What a compact prompt offers (``LazyTokens``): a prompt held as, e.g., runs of trace block ids,
expanded to token ids only when needed (``workloads.tokens.RunTokens`` is one).

A module of its own, left interpreted: ``sim.core.request`` is compiled by mypyc (``setup.py``),
and a ``runtime_checkable`` protocol must be defined in interpreted code. ``sim.core.request``
re-exports it. Imports nothing from the project.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class LazyTokens(Protocol):
    """A compact prompt (e.g. runs of trace block ids) expanded to token ids only when needed.

    It may also offer ``runs() -> (starts, lengths) | None``: the prompt as runs of consecutive
    ids, which the fast hasher digests without expanding (``Request.token_runs``)."""

    def __len__(self) -> int: ...

    def materialize(self) -> np.ndarray: ...
