"""The markdown report of ``apcsim validate``: the headline table and the explanations around it.

Mirrors nothing in vLLM. Invariants: renders only what ``gpu_backend.validate`` computed (the
report dict also written as ``report.json``); a missing or non-finite figure prints ``n/a``, never
a made-up number. Imports nothing beyond the standard library and ``latency_error``'s metric names.
"""

from __future__ import annotations

import math
from typing import Any

from gpu_backend.latency_error import METRICS


def _pct(x: Any) -> str:
    return f"{100 * x:+.1f} %" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _abs_pct(x: Any) -> str:
    return f"{100 * x:.1f} %" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _r(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def validation_table(stats: dict[str, Any]) -> list[str]:
    """The headline table (markdown lines)."""
    lines = ["| metric | n | MAPE | P50 err | P90 err | P99 err | mean err | r | band | noise MAPE | "
             "noise P50 / P99 err | noise r |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in METRICS:
        s = stats[m]["sim_vs_real"]
        nz = stats[m].get("noise_real2_vs_real1", {})
        lines.append(
            f"| {m.upper()} | {s.get('n', 0)} | {_abs_pct(s.get('mape'))} | {_pct(s.get('p50_err'))} | "
            f"{_pct(s.get('p90_err'))} | {_pct(s.get('p99_err'))} | {_pct(s.get('mean_err'))} | "
            f"{_r(s.get('pearson_r'))} | {s.get('band', 'n/a')} | {_abs_pct(nz.get('mape'))} | "
            f"{_pct(nz.get('p50_err'))} / {_pct(nz.get('p99_err'))} | {_r(nz.get('pearson_r'))} |")
    return lines


_TARGET_LABELS = {
    "per_step_prefill_mape": "per-step MAPE, prefill steps", "per_step_decode_mape": "per-step MAPE, decode steps",
    "per_step_mixed_mape": "per-step MAPE, mixed steps", "ttft_mape": "TTFT MAPE", "ttft_p50": "TTFT P50 |err|",
    "ttft_p99": "TTFT P99 |err|", "e2e_mape": "E2E MAPE", "e2e_p50": "E2E P50 |err|", "e2e_p99": "E2E P99 |err|",
}
_BOUNDS = {"per_step": "< 10 %", "mape": "<= 1.2 x noise MAPE", "p50": "<= max(5 %, noise P50 |err|)",
           "p99": "<= max(5 %, noise P99 |err|)"}


def targets_table(tg: dict[str, Any]) -> list[str]:
    """The targets of ``latency_error.targets`` as markdown lines."""
    lines = ["| target | value | bound | rule | met |", "|---|---|---|---|---|"]
    yn = {True: "yes", False: "**no**", None: "n/a"}
    for key, label in _TARGET_LABELS.items():
        if key not in tg:
            continue
        t = tg[key]
        rule = _BOUNDS["per_step" if key.startswith("per_step") else key.rsplit("_", 1)[1]]
        lines.append(f"| {label} | {_abs_pct(t['value'])} | {_abs_pct(t['bound'])} | {rule} | {yn[t['met']]} |")
    if "all_met" in tg:
        basis = ("each step's median over the re-timing passes (the model's own error)"
                 if tg.get("per_step_basis") == "retimed" else "each step's time as the replay measured it")
        lines += ["", f"All targets met: {yn[tg['all_met']]}. Per-step MAPE against {basis}."]
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    st = report["stats"]
    cal = report["model"]
    be = report["backend"]
    agree = st["hit_tokens_agreement"]
    lines = [f"# Validation: {report['name']}", "",
             f"Simulated (fitted latency model) vs real (torch backend, {be['device_name']}, "
             f"{be['model_shape']} {be['dtype']}, attention {be['attention']}) "
             f"replays of the same workload and scheduler: {report['workload']}.", "",
             f"- requests compared: {report['num_requests']}; real runs: {report['num_real_runs']}; "
             f"hit_tokens agree sim vs real: {agree['sim_vs_real1']:.0%}"
             + (f", real 2 vs real 1: {agree['real2_vs_real1']:.0%}" if "real2_vs_real1" in agree else ""),
             f"- token hit rate: sim {report['sim_summary']['token_hit_rate']:.3f}, real "
             f"{report['real_summaries'][0]['token_hit_rate']:.3f}",
             f"- latency model: `{cal['path']}` (calibrated on {cal.get('device')}, {cal.get('created')}, "
             f"commit {str(cal.get('git_commit'))[:12]}; held-out per-step MAPE "
             f"{_abs_pct(cal.get('holdout_mape'))}, calibration noise floor median CV "
             f"{_abs_pct(cal.get('noise_median_cv'))})",
             "", "## Per-request error (simulated vs real run 1; noise = real run 2 vs real run 1)", "",
             *validation_table(st), "",
             "Errors are relative and signed (simulated minus real, over real): *P50/P90/P99/mean err* compare the "
             "distribution's statistic; MAPE and r are per request. Bands: excellent = MAPE < 10 % and r > 0.95, "
             "good = MAPE < 20 % and r > 0.85.", "",
             "Per-request signed relative error percentiles (P50 / P90 / P99):", ""]
    for m in METRICS:
        s = st[m]["sim_vs_real"]
        lines.append(f"- {m.upper()}: {_pct(s.get('rel_err_p50'))} / {_pct(s.get('rel_err_p90'))} / "
                     f"{_pct(s.get('rel_err_p99'))}")
    lines += ["", "## Error targets (issue 15)", "", *targets_table(report.get("targets", {}))]
    ps = report["per_step"]
    lines += ["", "## Latency model in situ (every step of real run 1, priced by the model)", "",
              f"- steps: {ps['n']}; per-step MAPE {_abs_pct(ps.get('mape'))}; sum of predicted / sum of measured "
              f"step time {ps.get('total_ratio', float('nan')):.3f}"]
    for k, v in ps.get("by_kind", {}).items():
        lines.append(f"- {k}: {v['n']} steps, MAPE {_abs_pct(v.get('mape'))}, mean signed {_pct(v.get('mean_signed'))}")
    if "retimed" in ps:
        rt, mn = ps["retimed"], ps["measurement_noise"]
        lines += ["", f"Against each step's median over {rt['passes']} re-timing passes after the replay (the "
                      f"model's own error): MAPE {_abs_pct(rt.get('mape'))}, predicted / measured total "
                      f"{rt.get('total_ratio', float('nan')):.3f}; the replay's single measurement against that "
                      f"median (measurement noise): MAPE {_abs_pct(mn.get('mape'))}."]
        for k, v in rt.get("by_kind", {}).items():
            lines.append(f"- {k}: MAPE {_abs_pct(v.get('mape'))}, mean signed {_pct(v.get('mean_signed'))}; "
                         f"measurement noise MAPE {_abs_pct(mn['by_kind'][k].get('mape'))}")
    if report["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in report["warnings"]]
    lines += ["", "## Files", "",
              "`pairs.csv` (per-request pairs), `steps_real1.csv` (every step of real run 1: shape, measured, "
              "predicted), `scatter.png`, `cdf.png`, `report.json` (everything here plus config, versions, git "
              "commit).", "",
              f"git commit {report['git_commit']}; torch {report['versions'].get('torch')}; "
              f"wall time {report['wall_s']:.1f} s; host load average (1/5/15 min) at the end: "
              f"{report.get('load_average')}.", ""]
    return "\n".join(lines)
