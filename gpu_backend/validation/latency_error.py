"""Per-request latency error of a simulated run against a real one: the figures ``apcsim validate``
reports.

Mirrors nothing in vLLM. For TTFT, TPOT and E2E (``METRICS``), on requests present in both runs:

* MAPE = mean ``|sim - real| / real``;
* signed error of the distribution's P50, P90, P99 and mean: ``(stat(sim) - stat(real)) / stat(real)``
  (what a sweep's headline numbers would be off by), and the P50/P90/P99 of the per-request signed
  relative error;
* Pearson r of the per-request pairs;
* a quality band: *excellent* (MAPE < 10 % and r > 0.95), *good* (MAPE < 20 % and r > 0.85), else
  *poor*.

The same figures between two real runs are the **noise floor** (the backend against itself). With
``k >= 2`` real runs every one of the ``k (k - 1) / 2`` pairs is compared, and the noise is the
median over the pairs (:func:`noise_over_pairs`): one pair is a single draw of the backend's
run-to-run spread, and a run that happens to land next to run 1 would shrink the bounds to their 5 %
floor. :func:`targets` checks the latency model's error targets against it. Invariants: pairs with a NaN
or a non-positive real value are dropped before any figure; requests are paired by id, one to one
(a duplicate id is an error). Imports numpy and pandas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

METRICS = ("ttft", "tpot", "e2e")
EXCELLENT = (0.10, 0.95)
GOOD = (0.20, 0.85)


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


def compare(pred: npt.ArrayLike, real: npt.ArrayLike) -> dict[str, Any]:
    """Error figures of per-request ``pred`` against ``real`` (pairs with a NaN or real <= 0 dropped)."""
    p = np.asarray(pred, dtype=np.float64)
    r = np.asarray(real, dtype=np.float64)
    ok = np.isfinite(p) & np.isfinite(r) & (r > 0)
    p, r = p[ok], r[ok]
    out: dict[str, Any] = {"n": int(p.size)}
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
    out["band"] = quality_band(out["mape"], out["pearson_r"])
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


NOISE_KEYS = ("mape", "p50_err", "p90_err", "p99_err", "mean_err", "pearson_r")


def noise_over_pairs(pair_stats: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The noise floor over pairs of real runs: per figure the median over the pairs, of the magnitude
    for the signed errors (a bound is a magnitude) and of ``pearson_r`` as it is; ``num_pairs``."""
    out: dict[str, Any] = {"num_pairs": len(pair_stats)}
    for key in NOISE_KEYS:
        vals = [float(p[key]) for p in pair_stats if isinstance(p.get(key), (int, float)) and math.isfinite(p[key])]
        if vals:
            out[key] = float(np.median(vals if key == "pearson_r" else np.abs(vals)))
    return out


def noise_of(entry: dict[str, Any]) -> dict[str, Any]:
    """A metric's noise floor in a stats dict: ``noise`` (over every pair of real runs), or
    ``noise_real2_vs_real1`` in a report written before ``noise`` existed; ``{}`` with one real run."""
    noise: dict[str, Any] = entry.get("noise", entry.get("noise_real2_vs_real1", {}))
    return noise


def summarize_pairs(pairs: pd.DataFrame, num_real: int) -> dict[str, Any]:
    """Per metric: sim vs real run 1 (``sim_vs_real``; and vs every run, ``sim_vs_reals``) and, with
    2+ real runs, every pair of real runs (``noise_pairs``, ``noise_real2_vs_real1`` among them) and
    the noise floor over them (``noise``, :func:`noise_over_pairs`)."""
    out: dict[str, Any] = {}
    for m in METRICS:
        entry: dict[str, Any] = {"sim_vs_real": compare(pairs[f"{m}_sim"], pairs[f"{m}_real1"])}
        entry["sim_vs_reals"] = {f"real{k}": compare(pairs[f"{m}_sim"], pairs[f"{m}_real{k}"])
                                 for k in range(1, num_real + 1)}
        if num_real >= 2:
            nps = {f"real{b}_vs_real{a}": compare(pairs[f"{m}_real{b}"], pairs[f"{m}_real{a}"])
                   for a in range(1, num_real + 1) for b in range(a + 1, num_real + 1)}
            entry["noise_pairs"] = nps
            entry["noise_real2_vs_real1"] = nps["real2_vs_real1"]
            entry["noise"] = noise_over_pairs(list(nps.values()))
        out[m] = entry
    hits = {"sim_vs_real1": float((pairs["hit_tokens_sim"] == pairs["hit_tokens_real1"]).mean())}
    if num_real >= 2:
        hits["real2_vs_real1"] = float((pairs["hit_tokens_real2"] == pairs["hit_tokens_real1"]).mean())
    out["hit_tokens_agreement"] = hits
    return out


def targets(stats: dict[str, Any], per_step: dict[str, Any]) -> dict[str, Any]:
    """The latency model's error targets: per-step MAPE < 10 % for every step kind (against the re-timed
    step times when the run has them: the model's own error, measurement noise averaged out); TTFT and E2E MAPE
    within 1.2x the real-vs-real noise of the same workload; their P50 and P99 within 5 %, or within
    the noise's P50/P99 error where that is larger. The noise is ``noise`` (the median over every pair
    of real runs), or a report dict's ``noise_real2_vs_real1`` where it has no ``noise`` (written
    before it existed). Each entry: the figure, its bound, met or not (None when a figure is
    missing, e.g. without a second real run)."""
    out: dict[str, Any] = {}
    basis = per_step.get("retimed", per_step)  # the model's own error where the steps were re-timed
    for kind, v in basis.get("by_kind", {}).items():
        out[f"per_step_{kind}_mape"] = _target(v.get("mape"), PER_STEP_MAPE, strict=True)
    for m in ("ttft", "e2e"):
        s = stats[m]["sim_vs_real"]
        nz = noise_of(stats[m])
        noise_mape = nz.get("mape")
        out[f"{m}_mape"] = _target(s.get("mape"), None if noise_mape is None else NOISE_FACTOR * noise_mape)
        for q in ("p50", "p99"):
            noise_q = nz.get(f"{q}_err")
            bound = None if noise_q is None else max(PCTL_ERR, abs(noise_q))
            out[f"{m}_{q}"] = _target(None if s.get(f"{q}_err") is None else abs(s[f"{q}_err"]), bound)
    met = [t["met"] for t in out.values()]
    out["all_met"] = all(met) if met and None not in met else None
    out["per_step_basis"] = "retimed" if "retimed" in per_step else "measured"
    return out


PER_STEP_MAPE = 0.10
NOISE_FACTOR = 1.2
PCTL_ERR = 0.05


def _target(value: float | None, bound: float | None, *, strict: bool = False) -> dict[str, Any]:
    """``value`` against ``bound`` (``<`` when ``strict``, else ``<=``); None when either is missing."""
    ok = None
    if value is not None and bound is not None and math.isfinite(value):
        ok = bool(value < bound) if strict else bool(value <= bound)
    return {"value": value, "bound": bound, "met": ok}
