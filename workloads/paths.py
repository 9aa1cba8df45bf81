"""Where the project's read-only shared inputs live, and how a config's input path resolves
(mirrors nothing in vLLM).

Invariants: an input path is absolute, or relative to the folder of the config that names it
(never to the working directory). Imports nothing from sim.
"""

from __future__ import annotations

from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_traces_dir() -> Path:
    """The shared public traces: ``<repo>/../shared/traces`` (no environment variable involved)."""
    return _REPO_ROOT.parent / "shared" / "traces"


def input_path(p: str, base_dir: str | Path) -> Path:
    """An input path: ``p`` (``~`` expanded) if absolute, else ``base_dir / p``."""
    path = Path(p).expanduser()
    return path if path.is_absolute() else (Path(base_dir) / path)


def default_input(kind: str, trace: str | None = None) -> Path | None:
    """The shared file or folder a workload (or arrival) ``kind`` reads when its ``path`` is not
    set; None when the kind reads no file by default (synthetic generators, ``trace``, ``bailian``)."""
    shared = shared_traces_dir()
    if kind == "mooncake":
        return shared / "mooncake" / "conversation_trace.jsonl"
    if kind == "ragpulse":
        return shared / "ragpulse"
    if kind == "agent_trace":
        return shared / "weka_agent_sample"
    if kind == "azure":
        return shared / "azure_llm_2023" / f"AzureLLMInferenceTrace_{trace}.csv"
    return None
