"""``apcsim validate CONFIG``: simulated vs real per-request latency on one workload (issue #6).

The same config (scheduler, pool, workload) is replayed

* once **simulated**: the SimPy replay with the calibrated latency model (``latency: {kind: fitted,
  path: ...}`` in the config, or ``--model-file``);
* ``--real-runs`` times (default 2) **real**: the same SimPy replay with every step a real forward
  pass on the torch backend (:class:`~gpu_backend.executor.TorchExecutor`, config section
  ``backend:``), step durations measured. Before each real replay the executor runs a few discarded
  warm-up steps.

Timing semantics: in both replays a step's duration advances the SimPy clock and requests arrive on
that clock, so the only difference between the simulated and the real run is where step durations
come from. When the simulated and measured durations differ, the scheduler may batch differently
(a request may arrive before or after a step starts); the comparison is per request anyway -- it
is what a user of the simulator reads -- and the report says how often the prefix-cache
``hit_tokens`` granted at admission agree between the runs. Scheduler (Python) time is in neither.

For TTFT, TPOT and E2E the report gives, on requests present in both runs (TPOT: more than one
output token):

* MAPE = mean ``|sim - real| / real``;
* signed error of the distribution's P50, P90, P99 and mean: ``(stat(sim) - stat(real)) / stat(real)``
  (what a sweep's headline numbers would be off by), and the P50/P90/P99 of the per-request signed
  relative error;
* Pearson r of the per-request pairs;
* the **noise floor**: the same figures between real run 1 and real run 2 (the backend against
  itself), so errors are read against it;
* a quality band: *excellent* (MAPE < 10 % and r > 0.95), *good* (MAPE < 20 % and r > 0.85), else
  *poor*.

Plus the latency model's in-situ per-step error: its prediction for every step of real run 1 (that
step's exact shape) against the measured duration.

Output folder (default ``<output_dir>/<name>/validate``): ``report.md``, ``report.json``,
``pairs.csv`` (one row per request: sim, real and real-2 TTFT/TPOT/E2E and hit tokens),
``steps_real1.csv`` (every step of real run 1: shape, measured and predicted seconds), ``scatter.png``,
``cdf.png``.
"""

from __future__ import annotations

import argparse
import gc
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from gpu_backend.batch import SeqInput
from gpu_backend.executor import TorchExecutor
from gpu_backend.factory import make_torch_executor
from sim.cli.calibrate import add_validate_arguments
from sim.core.scheduler import Scheduler
from sim.experiment.config import ConfigError, ExperimentConfig, config_to_dict, load_config
from sim.experiment.results import git_commit, package_versions, write_json
from sim.experiment.run import build_latency, replay_experiment
from sim.timing.fitted_latency import FittedLatency

METRICS = ("ttft", "tpot", "e2e")
EXCELLENT = (0.10, 0.95)
GOOD = (0.20, 0.85)


# ----------------------------------------------------------------------------- statistics


def quality_band(mape: float, r: float) -> str:
    """``excellent`` (MAPE < 10 % and r > 0.95), ``good`` (< 20 % and > 0.85), else ``poor``."""
    if not (math.isfinite(mape) and math.isfinite(r)):
        return "n/a"
    if mape < EXCELLENT[0] and r > EXCELLENT[1]:
        return "excellent"
    if mape < GOOD[0] and r > GOOD[1]:
        return "good"
    return "poor"


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    if a.size < 2 or np.std(a) == 0 or np.std(b) == 0:
        return math.nan
    return float(np.corrcoef(a, b)[0, 1])


def compare(pred: Sequence[float], real: Sequence[float]) -> dict[str, float]:
    """Error figures of per-request ``pred`` against ``real`` (pairs with a NaN or real <= 0 dropped)."""
    p = np.asarray(pred, dtype=np.float64)
    r = np.asarray(real, dtype=np.float64)
    ok = np.isfinite(p) & np.isfinite(r) & (r > 0)
    p, r = p[ok], r[ok]
    out: dict[str, float] = {"n": int(p.size)}
    if p.size == 0:
        return out
    rel = (p - r) / r
    out["mape"] = float(np.abs(rel).mean())
    for q in (50, 90, 99):
        out[f"p{q}_err"] = float((np.percentile(p, q) - np.percentile(r, q)) / np.percentile(r, q))
    out["mean_err"] = float((p.mean() - r.mean()) / r.mean())
    for q in (50, 90, 99):
        out[f"rel_err_p{q}"] = float(np.percentile(rel, q))
    out["rel_err_mean"] = float(rel.mean())
    out["pearson_r"] = pearson(p, r)
    out["real_p50_s"] = float(np.percentile(r, 50))
    out["pred_p50_s"] = float(np.percentile(p, 50))
    out["band"] = quality_band(out["mape"], out["pearson_r"])  # type: ignore[assignment]
    return out


def pairs_table(sim: pd.DataFrame, reals: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """One row per request id: simulated and real (run 1, 2, ...) latencies and hit tokens."""
    cols = ["request_id", "arrival", "prompt_tokens", "output_tokens", "hit_tokens", *METRICS]
    df = sim[cols].rename(columns={c: f"{c}_sim" for c in ("hit_tokens", *METRICS)})
    for k, real in enumerate(reals, start=1):
        sub = real[["request_id", "hit_tokens", *METRICS]].rename(
            columns={c: f"{c}_real{k}" for c in ("hit_tokens", *METRICS)})
        df = df.merge(sub, on="request_id", how="inner", validate="one_to_one")
    return df.sort_values("arrival", kind="stable").reset_index(drop=True)


def summarize_pairs(pairs: pd.DataFrame, num_real: int) -> dict[str, Any]:
    """Per metric: sim vs real run 1, and (with 2+ real runs) real run 2 vs run 1 (the noise floor)."""
    out: dict[str, Any] = {}
    for m in METRICS:
        entry = {"sim_vs_real": compare(pairs[f"{m}_sim"], pairs[f"{m}_real1"])}
        if num_real >= 2:
            entry["noise_real2_vs_real1"] = compare(pairs[f"{m}_real2"], pairs[f"{m}_real1"])
        out[m] = entry
    t = out["ttft"]["sim_vs_real"]
    if t.get("n"):
        out["ttft_targets"] = {  # the H200 targets
            "p50_within_5pct": abs(t["p50_err"]) <= 0.05, "p99_within_5pct": abs(t["p99_err"]) <= 0.05,
            "mape_under_10pct": t["mape"] < 0.10}
        out["ttft_targets"]["all_met"] = all(out["ttft_targets"].values())
    hits = {"sim_vs_real1": float((pairs["hit_tokens_sim"] == pairs["hit_tokens_real1"]).mean())}
    if num_real >= 2:
        hits["real2_vs_real1"] = float((pairs["hit_tokens_real2"] == pairs["hit_tokens_real1"]).mean())
    out["hit_tokens_agreement"] = hits
    return out


# ----------------------------------------------------------------------------- runs


@dataclass
class RealRun:
    requests: pd.DataFrame
    summary: dict[str, Any]
    steps_measured: np.ndarray
    steps_predicted: np.ndarray
    step_kinds: list[str]
    step_shapes: list[Any]
    executor_info: dict[str, Any]
    wall_s: float


def _warm_up(ex: TorchExecutor, cfg: ExperimentConfig, steps: int = 3) -> None:
    """A few discarded steps (a long prefill, a decode batch, a mixed step) on random pool blocks.
    Harmless to the replay: a block is only read after the replay itself wrote it."""
    cache = ex.cache
    bs = cache.block_size
    rng = np.random.default_rng(12345)
    e = cfg.engine
    n_pre = max(2, min(e.max_num_batched_tokens // 2, 512))
    n_dec = max(1, min(e.max_num_seqs, 8))
    ctx = 64
    need_pre = -(-n_pre // bs)
    need_dec = -(-(ctx + 1) // bs)
    if need_pre + n_dec * need_dec > cache.num_blocks - 1:
        return
    ids = (rng.permutation(cache.num_blocks - 1) + 1).tolist()
    pre = SeqInput("w-pre", rng.integers(0, 1000, n_pre), 0, ids[:need_pre])
    dec = [SeqInput(f"w-d{i}", rng.integers(0, 1000, 1), ctx, ids[need_pre + i * need_dec: need_pre + (i + 1) * need_dec])
           for i in range(n_dec)]
    for _ in range(steps):
        ex.run_timed([pre])
        ex.run_timed(dec)
        ex.run_timed([pre, *dec])


def real_run(cfg: ExperimentConfig, model: FittedLatency, warmup_steps: int = 3) -> RealRun:
    """Replay ``cfg`` on the torch backend; keep the per-step shapes to price them with ``model``."""
    made: list[TorchExecutor] = []

    def factory(c: ExperimentConfig, scheduler: Scheduler) -> TorchExecutor:
        ex = make_torch_executor(c, scheduler)
        _warm_up(ex, c, warmup_steps)
        made.append(ex)
        return ex

    t0 = time.perf_counter()
    result, workload = replay_experiment(cfg, progress=False, executor_factory=factory)
    wall = time.perf_counter() - t0
    ex = made[0]
    measured = np.array([row[4] for row in ex.step_log])
    predicted = np.array([model.step_time(s) for s in ex.step_shapes])
    kinds = [row[1] for row in ex.step_log]
    ex_shapes = ex.step_shapes
    info = workload.executor_info or ex.describe()
    made.clear()
    del ex
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return RealRun(result.requests, result.summary, measured, predicted, kinds, list(ex_shapes), info, wall)


def with_fitted_latency(cfg: ExperimentConfig, model_file: str | Path | None) -> ExperimentConfig:
    """``cfg`` with ``latency: {kind: fitted, path: model_file}`` when a file is given; else ``cfg``
    must already use a fitted model."""
    if model_file is not None:
        data = config_to_dict(cfg)
        data["latency"] = {"kind": "fitted", "path": str(Path(model_file).resolve())}
        from sim.experiment.config import config_from_dict

        return config_from_dict(data, cfg.source, cfg.base_dir)
    if cfg.latency.kind != "fitted":
        raise ConfigError(f"{cfg.source}: latency.kind: validate needs a fitted model "
                          f"(latency: {{kind: fitted, path: ...}} or --model-file), got {cfg.latency.kind!r}")
    return cfg


def consistency_warnings(cfg: ExperimentConfig, model: FittedLatency) -> list[str]:
    """Where the model file was calibrated under other settings than this config's backend runs."""
    meta = model.metadata
    b = cfg.backend
    want = {"model_shape": b.model_shape, "dtype": b.dtype, "device_type": b.device, "block_size": cfg.engine.block_size,
            "attention_requested": b.attention}
    if b.device == "cpu":
        want["num_threads"] = b.num_threads or torch.get_num_threads()
    out = []
    for key, value in want.items():
        if key in meta and meta[key] != value:
            out.append(f"model file {key}={meta[key]!r} but this config runs {value!r}")
    return out


# ----------------------------------------------------------------------------- plots


def _plain_ticks(axis: Any) -> None:
    """Log-axis tick labels as plain numbers (``60``, ``200``) rather than ``6 x 10^1``."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(fmt)
    axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
    axis.set_minor_formatter(fmt)


def plot_scatter(pairs: pd.DataFrame, path: Path, title: str, num_real: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    for ax, m in zip(axes, METRICS):
        real = pairs[f"{m}_real1"].to_numpy(float) * 1e3
        sim = pairs[f"{m}_sim"].to_numpy(float) * 1e3
        ok = np.isfinite(real) & np.isfinite(sim) & (real > 0) & (sim > 0)
        vals = [real[ok], sim[ok]]
        if num_real >= 2:
            r2 = pairs[f"{m}_real2"].to_numpy(float) * 1e3
            ok2 = np.isfinite(r2) & np.isfinite(real) & (real > 0) & (r2 > 0)
            ax.scatter(real[ok2], r2[ok2], s=14, c="0.6", marker="x", label="real run 2 (noise)")
            vals.append(r2[ok2])
        ax.scatter(real[ok], sim[ok], s=16, c="tab:blue", alpha=0.8, label="simulated")
        allv = np.concatenate(vals) if vals else np.array([1.0])
        if allv.size:
            lo, hi = allv.min() * 0.8, allv.max() * 1.25
            xs = np.array([lo, hi])
            ax.plot(xs, xs, "k-", lw=1, label="y = x")
            ax.fill_between(xs, xs * 0.9, xs * 1.1, color="tab:green", alpha=0.12, label="±10 %")
            ax.fill_between(xs, xs * 0.8, xs * 1.2, color="tab:green", alpha=0.07, label="±20 %")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_ticks(ax.xaxis)
        _plain_ticks(ax.yaxis)
        ax.set_xlabel(f"real {m.upper()}, run 1 (ms)")
        ax.set_ylabel(f"simulated {m.upper()} (ms)" + (" / real run 2 (x)" if num_real >= 2 else ""))
        ax.set_title(m.upper())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_cdf(pairs: pd.DataFrame, path: Path, title: str, num_real: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    series = [("sim", "simulated", "tab:blue", "-"), ("real1", "real run 1", "tab:red", "-")]
    if num_real >= 2:
        series.append(("real2", "real run 2", "tab:orange", "--"))
    for ax, m in zip(axes, METRICS):
        for key, label, color, ls in series:
            v = np.sort(pairs[f"{m}_{key}"].dropna().to_numpy(float)) * 1e3
            if v.size:
                ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", color=color, ls=ls, label=label)
        ax.set_xscale("log")
        _plain_ticks(ax.xaxis)
        ax.set_xlabel(f"{m.upper()} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{m.upper()} CDF")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------------- report


def _pct(x: Any) -> str:
    return f"{100 * x:+.1f} %" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _abs_pct(x: Any) -> str:
    return f"{100 * x:.1f} %" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _r(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def validation_table(stats: dict[str, Any]) -> list[str]:
    """The headline table (markdown lines)."""
    lines = ["| metric | n | MAPE | P50 err | P90 err | P99 err | mean err | r | band | noise MAPE | noise P50 / P99 err | noise r |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in METRICS:
        s = stats[m]["sim_vs_real"]
        nz = stats[m].get("noise_real2_vs_real1", {})
        lines.append(
            f"| {m.upper()} | {s.get('n', 0)} | {_abs_pct(s.get('mape'))} | {_pct(s.get('p50_err'))} | "
            f"{_pct(s.get('p90_err'))} | {_pct(s.get('p99_err'))} | {_pct(s.get('mean_err'))} | {_r(s.get('pearson_r'))} | "
            f"{s.get('band', 'n/a')} | {_abs_pct(nz.get('mape'))} | {_pct(nz.get('p50_err'))} / {_pct(nz.get('p99_err'))} | "
            f"{_r(nz.get('pearson_r'))} |")
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    st = report["stats"]
    cal = report["model"]
    L = [f"# Validation: {report['name']}", "",
         f"Simulated (fitted latency model) vs real (torch backend, {report['backend']['device_name']}, "
         f"{report['backend']['model_shape']} {report['backend']['dtype']}, attention {report['backend']['attention']}) "
         f"replays of the same workload and scheduler: {report['workload']}.", "",
         f"- requests compared: {report['num_requests']}; real runs: {report['num_real_runs']}; "
         f"hit_tokens agree sim vs real: {st['hit_tokens_agreement']['sim_vs_real1']:.0%}"
         + (f", real 2 vs real 1: {st['hit_tokens_agreement']['real2_vs_real1']:.0%}"
            if "real2_vs_real1" in st["hit_tokens_agreement"] else ""),
         f"- token hit rate: sim {report['sim_summary']['token_hit_rate']:.3f}, real "
         f"{report['real_summaries'][0]['token_hit_rate']:.3f}",
         f"- latency model: `{cal['path']}` (calibrated on {cal.get('device')}, {cal.get('created')}, "
         f"commit {str(cal.get('git_commit'))[:12]}; held-out per-step MAPE "
         f"{_abs_pct(cal.get('holdout_mape'))}, calibration noise floor median CV {_abs_pct(cal.get('noise_median_cv'))})",
         "", "## Per-request error (simulated vs real run 1; noise = real run 2 vs real run 1)", "",
         *validation_table(st), "",
         "Errors are relative and signed (simulated minus real, over real): *P50/P90/P99/mean err* compare the "
         "distribution's statistic; MAPE and r are per request. Bands: excellent = MAPE < 10 % and r > 0.95, "
         "good = MAPE < 20 % and r > 0.85.", "",
         "Per-request signed relative error percentiles (P50 / P90 / P99):", ""]
    tg = st.get("ttft_targets")
    for m in METRICS:
        s = st[m]["sim_vs_real"]
        L.append(f"- {m.upper()}: {_pct(s.get('rel_err_p50'))} / {_pct(s.get('rel_err_p90'))} / {_pct(s.get('rel_err_p99'))}")
    if tg:
        yn = {True: "met", False: "not met"}
        L += ["", f"TTFT targets (issue #6, stated for an H200): P50 within 5 % {yn[tg['p50_within_5pct']]}, "
                  f"P99 within 5 % {yn[tg['p99_within_5pct']]}, MAPE < 10 % {yn[tg['mape_under_10pct']]}."]
    ps = report["per_step"]
    L += ["", "## Latency model in situ (every step of real run 1, priced by the model)", "",
          f"- steps: {ps['n']}; per-step MAPE {_abs_pct(ps.get('mape'))}; sum of predicted / sum of measured step time "
          f"{ps.get('total_ratio', float('nan')):.3f}"]
    for k, v in ps.get("by_kind", {}).items():
        L.append(f"- {k}: {v['n']} steps, MAPE {_abs_pct(v.get('mape'))}, mean signed {_pct(v.get('mean_signed'))}")
    if report["warnings"]:
        L += ["", "## Warnings", ""] + [f"- {w}" for w in report["warnings"]]
    L += ["", "## Files", "", "`pairs.csv` (per-request pairs), `steps_real1.csv` (every step of real run 1: shape, measured, predicted), `scatter.png`, `cdf.png`, `report.json` "
          "(everything here plus config, versions, git commit).", "",
          f"git commit {report['git_commit']}; torch {report['versions'].get('torch')}; "
          f"wall time {report['wall_s']:.1f} s; host load average (1/5/15 min) at the end: {report.get('load_average')}.", ""]
    return "\n".join(L)


def _display_path(p: Path) -> str:
    """``p`` resolved, relative to the working directory when it lies below it."""
    p = Path(p).resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _loadavg() -> list[float] | None:
    """The host's 1/5/15-minute load averages at the end (contention on a shared CPU)."""
    try:
        import os

        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # pragma: no cover
        return None


def per_step_error(run: RealRun) -> dict[str, Any]:
    y, p = run.steps_measured, run.steps_predicted
    out: dict[str, Any] = {"n": int(y.size)}
    if y.size:
        rel = (p - y) / y
        out.update(mape=float(np.abs(rel).mean()), mean_signed=float(rel.mean()), total_ratio=float(p.sum() / y.sum()),
                   measured_total_s=float(y.sum()), predicted_total_s=float(p.sum()))
        kinds = np.array(run.step_kinds)
        out["by_kind"] = {k: {"n": int((kinds == k).sum()), "mape": float(np.abs(rel[kinds == k]).mean()),
                              "mean_signed": float(rel[kinds == k].mean())}
                          for k in ("prefill", "mixed", "decode") if (kinds == k).any()}
    return out


def steps_table(run: RealRun) -> pd.DataFrame:
    """Every step of a real run: its shape, measured and predicted seconds."""
    rows = []
    for i, (shape, kind) in enumerate(zip(run.step_shapes, run.step_kinds)):
        rows.append({"step": i, "kind": kind, "num_seqs": shape.num_seqs, "num_decode_seqs": shape.num_decode_seqs,
                     "num_new_tokens": shape.num_new_tokens, "num_prefill_tokens": shape.num_prefill_tokens,
                     "context_tokens": shape.context_tokens, "attention_pairs": shape.attention_pairs,
                     "measured_s": float(run.steps_measured[i]), "predicted_s": float(run.steps_predicted[i])})
    return pd.DataFrame(rows)


def validate(cfg: ExperimentConfig, out_dir: str | Path, *, real_runs: int = 2, warmup_steps: int = 3,
             budget_s: float | None = None, step_overhead_s: float = 0.002, log=print) -> dict[str, Any]:
    """Run the simulated and ``real_runs`` real replays of ``cfg`` and write the report folder.

    With ``budget_s``, the real replays' wall time is estimated from the simulated one (its summed
    step time plus ``step_overhead_s`` per step for the scheduler) and fewer real runs are made (at
    least one) when they would not fit; the report says so."""
    if real_runs < 1:
        raise ValueError("need at least one real run")
    t0 = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.backend.device == "cpu" and cfg.backend.num_threads:
        torch.set_num_threads(cfg.backend.num_threads)
    model = build_latency(cfg)
    assert isinstance(model, FittedLatency)
    sim_result, workload = replay_experiment(cfg, progress=False)
    log(f"validate {cfg.name}: simulated replay: {len(sim_result.requests)} requests, "
        f"{sim_result.summary['num_steps']} steps, TTFT p50 {sim_result.summary['ttft_p50_s'] * 1e3:.2f} ms")
    warnings: list[str] = []
    if budget_s is not None:
        setup_s = 10.0 if cfg.backend.device == "cuda" else 0.5  # model build + warm-up
        est = float(sim_result.steps["duration"].sum()) + step_overhead_s * len(sim_result.steps) + setup_s
        fit = max(1, int((budget_s - (time.perf_counter() - t0)) // max(est, 1e-9)))
        if fit < real_runs:
            warnings.append(f"time budget {budget_s:.0f} s: {fit} real run(s) instead of {real_runs} "
                            f"(each estimated at {est:.1f} s from the simulated replay)")
            log("   " + warnings[-1])
            real_runs = fit
    reals = []
    for k in range(real_runs):
        run = real_run(cfg, model, warmup_steps)
        reals.append(run)
        log(f"   real run {k + 1}: {run.summary['num_steps']} steps in {run.wall_s:.1f} s wall, "
            f"TTFT p50 {run.summary['ttft_p50_s'] * 1e3:.2f} ms")
    pairs = pairs_table(sim_result.requests, [r.requests for r in reals])
    stats = summarize_pairs(pairs, real_runs)
    meta = model.metadata
    fit = meta.get("fit", {}) if isinstance(meta.get("fit"), dict) else {}
    noise = meta.get("noise_floor", {}) if isinstance(meta.get("noise_floor"), dict) else {}
    info = reals[0].executor_info
    report: dict[str, Any] = {
        "name": cfg.name,
        "workload": workload.description,
        "num_requests": int(len(pairs)),
        "num_real_runs": real_runs,
        "stats": stats,
        "per_step": per_step_error(reals[0]),
        "sim_summary": sim_result.summary,
        "real_summaries": [r.summary for r in reals],
        "real_wall_s": [r.wall_s for r in reals],
        "backend": {k: info.get(k) for k in ("device", "device_name", "model_shape", "dtype", "attention", "timing",
                                              "num_threads", "num_blocks", "block_size")},
        "model": {"path": _display_path(cfg.resolve_path(cfg.latency.path)) if cfg.latency.kind == "fitted" else None,
                  "features": dict(model.coefs), "device": meta.get("device"), "created": meta.get("created"),
                  "git_commit": meta.get("git_commit"), "torch_version": meta.get("torch_version"),
                  "feature_set": fit.get("feature_set"), "holdout_mape": fit.get("holdout", {}).get("mape"),
                  "noise_median_cv": noise.get("median_cv")},
        "warnings": warnings + consistency_warnings(cfg, model),
        "load_average": _loadavg(),
        "config": config_to_dict(cfg),
        "git_commit": git_commit(Path(__file__).resolve().parent),
        "versions": package_versions(),
        "wall_s": 0.0,
    }
    pairs.to_csv(out / "pairs.csv", index=False, float_format="%.9g")
    steps_table(reals[0]).to_csv(out / "steps_real1.csv", index=False, float_format="%.6g")
    title = f"{cfg.name}: simulated vs real ({report['backend']['device_name']}, {report['backend']['model_shape']})"
    plot_scatter(pairs, out / "scatter.png", title, real_runs)
    plot_cdf(pairs, out / "cdf.png", title, real_runs)
    report["wall_s"] = time.perf_counter() - t0
    write_json(out / "report.json", report)
    (out / "report.md").write_text(render_markdown(report), encoding="utf-8")
    for line in validation_table(stats):
        log("   " + line)
    log(f"wrote {out}/report.md, report.json, pairs.csv, steps_real1.csv, scatter.png, cdf.png")
    return report


add_arguments = add_validate_arguments


def run_from_args(args: argparse.Namespace) -> int:
    overrides = list(args.set)
    if args.device is not None:
        overrides.append(f"backend.device={args.device}")
    cfg = with_fitted_latency(load_config(args.config, overrides), args.model_file)
    if cfg.backend.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{cfg.source}: backend.device: cuda requested but torch sees no CUDA device")
    out = Path(args.out) if args.out else cfg.results_dir() / "validate"
    validate(cfg, out, real_runs=args.real_runs, warmup_steps=args.warmup_steps)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="apcsim validate", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    try:
        return run_from_args(ap.parse_args(argv))
    except ConfigError as exc:
        print(f"apcsim validate: error: {exc}")
        return 2


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main())
