"""``apcsim --version`` (mirrors ``vllm --version``, which prints the package version): apcsim's
version, the vLLM versions whose behaviour it mirrors (``sim.core.version_profile``), and whether
the compiled modules are in use -- the mypyc engine group (``sim.core.native_build``) and each
Cython module -- since without them a run gives the same results, only slower.

Invariants: only reads (imports the engine modules to see where they came from); imports neither
simpy nor torch.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence
from importlib import metadata
from typing import Any

CYTHON_MODULES = (
    ("sim.core.compiled_pool", "block pool"),
    ("sim.core.compiled_hash", "hash chain"),
    ("workloads.trace_scan", "trace scanner"),
    ("workloads.bounds_scan", "bounds loops"),
    ("sim.cluster.compiled_index", "KV-event index"),
)
"""The optional Cython modules ``setup.py`` builds, with what each speeds up."""


def _compiled(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return bool(spec and spec.origin and not spec.origin.endswith((".py", ".pyx")))


def version_text() -> str:
    """The three lines ``apcsim --version`` prints."""
    from sim.core.native_build import ENGINE_MODULES, interpreted_engine_modules
    from sim.core.version_profile import DEFAULT_VERSION, PROFILES

    try:
        version = metadata.version("apcsim")
    except metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    others = [v for v in PROFILES if v != DEFAULT_VERSION]
    native = len(ENGINE_MODULES) - len(interpreted_engine_modules())
    cython = ", ".join(f"{what} {'yes' if _compiled(name) else 'no'}" for name, what in CYTHON_MODULES)
    return "\n".join([
        f"apcsim {version}",
        f"mirrors vLLM {DEFAULT_VERSION} (default; engine.vllm_version: {', '.join(others)} too)",
        f"compiled: engine modules (mypyc) {native} of {len(ENGINE_MODULES)}; Cython: {cython}",
    ])


class VersionAction(argparse.Action):
    """``--version``: print :func:`version_text` and exit 0 (computed only when asked)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(version_text())
        parser.exit(0)
