"""Statistics of a coding-agent session trace (mirrors nothing in vLLM): the numbers the synthetic
agent generator's
defaults come from (``python -m workloads.agent_stats [FOLDER]`` prints them; so does
``apcsim workloads stats`` on an ``agent_trace`` config).

Per step ``i -> i+1`` of a session (top-level requests): ``growth = in[i+1] - in[i] - out[i]``
(the tool result / user text appended), ``gap = t[i+1] - t[i]``; a *context reset* is a step whose
hash ids do not extend the previous request's (compaction; the shared prompt blocks survive).
Reads hash ids only to compare prefixes; nothing is expanded to tokens.

Invariants: reads only; the statistics are a pure function of the folder. Imports neither simpy
nor torch.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

from workloads.agent_sessions import session_files


def _pct(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    a = np.asarray(values, dtype=np.float64)
    return {
        "p10": float(np.percentile(a, 10)), "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)), "mean": float(a.mean()), "max": float(a.max()),
    }


def agent_trace_statistics(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Distributions (p10/p50/p90/mean/max) of the quantities the generator models."""
    per_session: list[float] = []
    first_in: list[float] = []
    growth: list[float] = []
    outs: list[float] = []
    gaps: list[float] = []
    think: list[float] = []
    tool: list[float] = []
    system: list[float] = []
    resets = steps = subagents = requests = 0
    for path in session_files(folder):
        doc = json.loads(path.read_text(encoding="utf-8"))
        reqs = [r for r in doc["requests"] if r.get("type") != "subagent"]
        subagents += len(doc["requests"]) - len(reqs)
        requests += len(reqs)
        tool.append(doc.get("tool_tokens", 0))
        system.append(doc.get("system_tokens", 0))
        per_session.append(len(reqs))
        if reqs:
            first_in.append(reqs[0]["in"])
        for r in reqs:
            outs.append(r["out"])
            if "think_time" in r:
                think.append(r["think_time"])
        for a, b in zip(reqs, reqs[1:]):
            steps += 1
            growth.append(b["in"] - a["in"] - a["out"])
            gaps.append(b["t"] - a["t"])
            ha, hb = a["hash_ids"], b["hash_ids"]
            if hb[: len(ha)] != ha:
                resets += 1
    return {
        "sessions": len(per_session),
        "requests": requests,
        "subagents": subagents,
        "requests_per_session": _pct(per_session),
        "tool_tokens": _pct(tool),
        "system_tokens": _pct(system),
        "first_input_tokens": _pct(first_in),
        "step_growth_tokens": _pct(growth),
        "output_tokens": _pct(outs),
        "step_gap_s": _pct(gaps),
        "think_time_s": _pct(think),
        "context_resets": resets,
        "steps": steps,
    }


def format_statistics(stats: dict[str, Any]) -> str:
    """A small human-readable table of :func:`agent_trace_statistics`."""
    lines = [f"sessions {stats['sessions']}, requests {stats['requests']}, sub-agents {stats['subagents']}, "
             f"context resets {stats['context_resets']} of {stats['steps']} steps"]
    for key, value in stats.items():
        if isinstance(value, dict) and value:
            cells = "  ".join(f"{k} {v:,.1f}" for k, v in value.items())
            lines.append(f"  {key:<22} {cells}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    from workloads.paths import shared_traces_dir

    folder = sys.argv[1] if len(sys.argv) > 1 else shared_traces_dir() / "weka_agent_sample"
    print(format_statistics(agent_trace_statistics(folder)))
