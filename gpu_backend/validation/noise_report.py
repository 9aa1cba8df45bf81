"""The noise study's report: ``noise.json`` (every raw time and figure, with git commit and package
versions) and ``noise.md`` (the tables).

Mirrors nothing in vLLM. Invariants: renders only what :mod:`gpu_backend.validation.noise_study` measured; a
missing figure prints ``n/a``. Imports the standard library and ``sim.experiment.results``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def _pct(x: Any) -> str:
    return f"{100 * x:.1f} %" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def render(data: dict[str, Any]) -> str:
    lines = ["# CPU timing noise: where it comes from and what reduces it", "",
             f"git commit {data.get('git_commit')}; torch {data.get('versions', {}).get('torch')}; host at the end: "
             f"{data.get('host')}; wall time {data.get('wall_s')} s.", "",
             "## 1. Step noise (coefficient of variation of one step's time over rounds)", "",
             "| setting | shape | median | CV, 1 run | CV, median of 3 | CV, median of 5 | P90 / median, 1 run | "
             "first run / rest | steal |", "|---|---|---|---|---|---|---|---|---|"]
    for r in data.get("step_noise", []):
        m1, m3, m5 = r["median_of_1"], r["median_of_3"], r["median_of_5"]
        lines.append(f"| {r['setting']} | {r['shape']} | {m1['median_ms']:.2f} ms | {_pct(m1['cv'])} | "
                     f"{_pct(m3['cv'])} | {_pct(m5['cv'])} | {m1['p90_over_median']:.2f} | "
                     f"{r['first_run_penalty']:.2f} | {_pct(r['steal_share'])} |")
    by_setting: dict[str, list[float]] = {}
    for r in data.get("step_noise", []):
        by_setting.setdefault(r["setting"], []).append(r["median_of_1"]["cv"])
    if by_setting:
        lines += ["", "Mean CV over the shapes (one run per step): " + "; ".join(
            f"{k} {_pct(sum(v) / len(v))}" for k, v in by_setting.items()) + "."]
    lines += ["", "## 2. Amplification: per-step noise -> per-request error (simulated replays)", "",
              "| workload | per-step noise (lognormal sigma) | TTFT MAPE | E2E MAPE |", "|---|---|---|---|"]
    for r in data.get("amplification", []):
        lines.append(f"| {r['config']} | {_pct(r['step_sigma'])} | {_pct(r['ttft_mape'])} | {_pct(r['e2e_mape'])} |")
    if data.get("real_vs_real"):
        lines += ["", "## 3. Real vs real (two real replays per timing setting)", "",
                  "| workload | setting | TTFT MAPE | TTFT P50 / P99 err | E2E MAPE | wall s |",
                  "|---|---|---|---|---|---|"]
        for r in data["real_vs_real"]:
            t, e = r["ttft"], r["e2e"]
            lines.append(f"| {r['config']} | {r['setting']} | {_pct(t.get('mape'))} | {_pct(t.get('p50_err'))} / "
                         f"{_pct(t.get('p99_err'))} | {_pct(e.get('mape'))} | {r['wall_s']} |")
    return "\n".join(lines) + "\n"


def write_report(out: Path, data: dict[str, Any]) -> None:
    """``data`` should hold ``git_commit``, read when the study started (its code's commit)."""
    from sim.experiment.results import git_commit, package_versions, write_json

    data = {"git_commit": git_commit(Path(__file__).resolve().parent), **data, "versions": package_versions()}
    write_json(out / "noise.json", data)
    (out / "noise.md").write_text(render(data), encoding="utf-8")
