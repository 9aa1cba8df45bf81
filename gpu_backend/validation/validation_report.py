"""The markdown report of ``apcsim validate``: the headline table and the explanations around it.

Mirrors nothing in vLLM. Every error statistic is named for what it compares (*err of P50*: the
simulated distribution's P50 against the real one's; *percentiles of the per-request error*: of each
request's own error), and the report ends with a suggested next step (:func:`next_step`: recalibrate
when a step kind is mispriced, accept the noise floor, or use the model).

Invariants: renders only what ``gpu_backend.validation.validate`` computed (the report dict also written as
``report.json``); a missing or non-finite figure prints ``n/a``, never a made-up number. Imports
nothing beyond the standard library and ``latency_error``'s metric names and ``noise_of``.
"""

from __future__ import annotations

import math
from typing import Any

from gpu_backend.validation.latency_error import METRICS, noise_of


def _pct(x: Any) -> str:
    return f"{100 * x:+.1f} %" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _abs_pct(x: Any) -> str:
    return f"{100 * x:.1f} %" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _r(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


HEADER = ("| metric | n | MAPE (per request) | err of P50 | err of P90 | err of P99 | err of mean | r | band | "
          "noise MAPE | noise err of P50 / P99 | noise r |")


def noise_pairs_table(stats: dict[str, Any]) -> list[str]:
    """Every pair of real runs against each other (markdown lines; none with fewer than 3 runs,
    where the one pair is the headline table's noise)."""
    pairs = stats["ttft"].get("noise_pairs", {})
    if len(pairs) < 2:
        return []
    lines = ["| pair | " + " | ".join(f"{m.upper()} MAPE / err of P50 / err of P99" for m in ("ttft", "e2e")) + " |",
             "|---|---|---|"]
    for name in pairs:
        cells = [f"{_abs_pct(p.get('mape'))} / {_pct(p.get('p50_err'))} / {_pct(p.get('p99_err'))}"
                 for p in (stats[m]["noise_pairs"][name] for m in ("ttft", "e2e"))]
        lines.append(f"| {name.replace('_vs_', ' vs ').replace('real', 'real ')} | " + " | ".join(cells) + " |")
    return lines


def validation_table(stats: dict[str, Any]) -> list[str]:
    """The headline table (markdown lines): *err of P50* is the signed error of the distribution's
    P50 (simulated P50 against real P50), never a percentile of per-request errors."""
    lines = [HEADER, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in METRICS:
        s = stats[m]["sim_vs_real"]
        nz = noise_of(stats[m])
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


BIASED_KIND = 0.15
"""A step kind whose in-situ mean signed error reaches this is mispriced (the next step recalibrates)."""


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def next_step(report: dict[str, Any]) -> str:
    """The suggested next step, from the report's own figures (one paragraph)."""
    model = report["model"]
    path = model.get("path") or "MODEL.json"
    device = "cuda" if str(report["backend"].get("device", "")).startswith("cuda") else "cpu"
    full = "gpu" if device == "cuda" else "cpu"
    cfg = report.get("config_path") or "CONFIG"
    recal = (f"`apcsim calibrate --config {cfg} --device {device} --grid {full} --repeats 9 --out {path}`, "
             f"then `apcsim validate {cfg}` again")
    kinds = report["per_step"].get("by_kind", {})
    biased = [(k, v["mean_signed"]) for k, v in kinds.items()
              if v.get("n", 0) >= 10 and _finite(v.get("mean_signed")) and abs(v["mean_signed"]) >= BIASED_KIND]
    if biased:
        k, b = max(biased, key=lambda kv: abs(kv[1]))
        grid = model.get("grid")
        how = ("with more timed rounds on an otherwise idle machine" if grid == full else
               f"with the full {full} grid (this model was fitted on the {grid} grid)" if grid else
               f"with the full {full} grid and more timed rounds, on an otherwise idle machine")
        return (f"The model misprices {k} steps by {_pct(b)} on average in this replay (see `steps_real1.csv`): "
                f"recalibrate {how}: {recal}.")
    t = report["stats"]["ttft"]
    mape, noise = t["sim_vs_real"].get("mape"), noise_of(t).get("mape", math.nan)
    if _finite(mape) and _finite(noise) and mape <= 1.5 * noise:
        return (f"The TTFT error (MAPE {_abs_pct(mape)}) is within the backend's own run-to-run noise "
                f"({_abs_pct(noise)}): this machine cannot measure the model more precisely. For tighter figures "
                f"calibrate and validate where step times are stable (a dedicated GPU: "
                f"`bash gpu_backend/device/device_run.sh`).")
    if report.get("targets", {}).get("all_met"):
        return (f"The fitted model meets the accuracy targets: use it in experiments and sweeps with "
                f"`latency: {{kind: fitted, path: {path}}}`.")
    return (f"Recalibrate on this machine and validate again ({recal}); if the error stays, compare measured and "
            f"predicted step times in `steps_real1.csv` to find the step shapes the model misprices.")


def _noise_basis(stats: dict[str, Any]) -> str:
    n = stats["ttft"].get("noise", {}).get("num_pairs")
    if n is None:
        return "real run 2 vs real run 1"
    return "real run vs real run" + (f", the median over the {n} pairs of real runs below" if n > 1 else "")


def _with_blank(lines: list[str]) -> list[str]:
    return [*lines, ""] if lines else []


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
             f"- first-admission token hit rate: sim {_hit(report['sim_summary'])}, real "
             f"{_hit(report['real_summaries'][0])}",
             f"- latency model: `{cal['path']}` (calibrated on {cal.get('device')}, {cal.get('created')}, "
             f"commit {str(cal.get('git_commit'))[:12]}"
             + (f", {cal['grid']} grid" if cal.get("grid") else "") + "; held-out per-step MAPE "
             f"{_abs_pct(cal.get('holdout_mape'))}, calibration noise floor median CV "
             f"{_abs_pct(cal.get('noise_median_cv'))})",
             "", f"## Per-request error (simulated vs real run 1; noise = {_noise_basis(st)})", "",
             *validation_table(st), "", *_with_blank(noise_pairs_table(st)),
             "All errors are relative and signed: (simulated - real) / real. *err of P50 / P90 / P99 / mean* compare "
             "one statistic of the two distributions (how far a headline TTFT percentile is off); *MAPE* (mean "
             "absolute per-request error) and *r* (Pearson correlation) pair each request with itself. Bands: "
             "excellent = MAPE < 10 % and r > 0.95, good = MAPE < 20 % and r > 0.85.", "",
             "Percentiles of the per-request error (each request's (simulated - real) / real; median / P90 / P99 "
             "over requests):", ""]
    for m in METRICS:
        s = st[m]["sim_vs_real"]
        lines.append(f"- {m.upper()}: {_pct(s.get('rel_err_p50'))} / {_pct(s.get('rel_err_p90'))} / "
                     f"{_pct(s.get('rel_err_p99'))}")
    lines += ["", "## Error targets", "", *targets_table(report.get("targets", {}))]
    ps = report["per_step"]
    lines += ["", "## Latency model in situ (every step of real run 1, priced by the model)", "",
              f"- steps: {ps['n']}; per-step MAPE {_abs_pct(ps.get('mape'))}; sum of predicted / sum of measured "
              f"step time {ps.get('total_ratio', float('nan')):.3f}"]
    for k, v in ps.get("by_kind", {}).items():
        lines.append(f"- {k}: {v['n']} steps, MAPE {_abs_pct(v.get('mape'))}, mean signed error "
                     f"{_pct(v.get('mean_signed'))}")
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
              f"{report.get('load_average')}.", "",
              "## Next step", "", next_step(report), ""]
    return "\n".join(lines)


def _hit(summary: dict[str, Any]) -> str:
    rate = summary.get("first_admission_token_hit_rate", summary.get("request_hit_rate"))
    return f"{rate:.3f}" if _finite(rate) else "n/a"
