"""Re-score a validation report folder from the measurements it already holds.

Mirrors nothing in vLLM. ``apcsim validate`` (``gpu_backend.validation.validate``) keeps every request's
simulated and real latencies in ``pairs.csv`` and the per-step error in ``report.json``. When the
*statistics* change -- for instance the noise floor over every pair of real runs
(:func:`gpu_backend.validation.latency_error.noise_over_pairs`) in place of real run 2 against run 1 -- a
folder can be scored again without timing anything again::

    python -m gpu_backend.validation.rescore results/reference/cpu_tiny/validate_chat [...]

Invariants: only ``report.json``'s ``stats`` and ``targets`` are recomputed, from ``pairs.csv``;
everything measured (``per_step``, summaries, wall times, the run's commit and versions) is kept as
it was. The report records the re-scoring (``rescored``: commit, date, what was recomputed, and the
targets met before and after) and ``report.md`` is rendered again. Imports numpy and pandas (no
torch).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pandas as pd

from gpu_backend.validation.latency_error import summarize_pairs, targets
from gpu_backend.validation.validation_report import render_markdown
from sim.experiment.results import git_commit, write_json


def _met(t: dict[str, Any]) -> str:
    entries = [v for v in t.values() if isinstance(v, dict) and "met" in v]
    return f"{sum(1 for v in entries if v['met'])} of {len(entries)}"


def rescore(folder: str | Path) -> dict[str, Any]:
    """Recompute ``folder``'s stats and targets from its ``pairs.csv``; rewrite ``report.json`` and
    ``report.md``. Returns the new report."""
    folder = Path(folder)
    report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    pairs = pd.read_csv(folder / "pairs.csv")
    before = _met(report.get("targets", {}))
    report["stats"] = summarize_pairs(pairs, int(report["num_real_runs"]))
    report["targets"] = targets(report["stats"], report["per_step"])
    report["rescored"] = {
        "git_commit": git_commit(Path(__file__).resolve().parent),
        "date": dt.date.today().isoformat(),
        "recomputed": "stats and targets, from pairs.csv (noise: median over every pair of real runs)",
        "targets_met_before": before,
        "targets_met_after": _met(report["targets"]),
    }
    write_json(folder / "report.json", report)
    (folder / "report.md").write_text(render_markdown(report), encoding="utf-8")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", help="validation report folders (report.json + pairs.csv)")
    a = ap.parse_args(argv)
    for f in a.folders:
        r = rescore(f)["rescored"]
        print(f"{f}: targets met {r['targets_met_before']} -> {r['targets_met_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
