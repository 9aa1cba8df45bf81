"""The compact table ``apcsim sweep`` prints when its points are done (mirrors nothing in vLLM): one
row per point, its swept axes against the headline metrics the run summary leads with --
first-admission hit rate, TTFT p50 / p90 / p99 in the summary's units and, for fleets, the goodput
under the TTFT SLO -- so that a sweep answers on the terminal, not only in ``table.csv``.

Invariants: renders only columns present in the sweep's table (a failed point shows its status);
at most ``max_rows`` rows, then a line saying how many more are in the table. Reads the table and
``sweep.json`` only. Imports neither simpy nor torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from sim.cli.summary import seconds, sig

_METRICS = (("first_admission_token_hit_rate", "hit rate", sig), ("ttft_p50_s", "TTFT p50", seconds),
            ("ttft_p90_s", "TTFT p90", seconds), ("ttft_p99_s", "TTFT p99", seconds),
            ("cluster.goodput_fraction", "goodput", lambda v: f"{sig(100 * v)} %" if v == v else "n/a"))


def _cell(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "n/a" if value is None or (isinstance(value, float) and value != value) else str(value)


def render_sweep_table(folder: Path, max_rows: int = 60) -> str:
    """The sweep at ``folder``: its axes against the headline metrics, one line per point."""
    table = pd.read_parquet(folder / "table.parquet")
    axes = [a["key"] for a in json.loads((folder / "sweep.json").read_text()).get("axes", [])]
    axes = [a for a in axes if a in table.columns]
    metrics = [(col, name, fmt) for col, name, fmt in _METRICS if col in table.columns]
    header = [*(a.rsplit(".", 1)[-1] for a in axes), *(name for _, name, _ in metrics)]
    rows = []
    for _, r in table.sort_values("point").head(max_rows).iterrows():
        cells = [_cell(r[a]) for a in axes]
        if str(r.get("status", "ok")) != "ok":
            rows.append([*cells, f"({r.get('status')}: see points/{r.get('key', '?')}/error.txt)"])
        else:
            rows.append([*cells, *(fmt(r[col]) for col, _, fmt in metrics)])
    widths = [max([len(h)] + [len(row[i]) for row in rows if i < len(row)]) for i, h in enumerate(header)]
    slo = table["cluster.ttft_slo_s"].iloc[0] if "cluster.ttft_slo_s" in table.columns else None
    lines = ["points      hit rate: first admission" + (f"; goodput: TTFT <= {seconds(slo)}" if slo else ""),
             "  " + "  ".join(f"{h:>{w}}" for h, w in zip(header, widths))]
    for row in rows:
        fixed = "  ".join(f"{c:>{w}}" for c, w in zip(row, widths))
        lines.append("  " + fixed + ("  " + row[-1] if len(row) > len(widths) else ""))
    if len(table) > max_rows:
        lines.append(f"  ... {len(table) - max_rows} more points in {folder / 'table.csv'}")
    return "\n".join(lines)
