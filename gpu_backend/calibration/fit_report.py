"""What a calibration reports about its fit: the per-term table and the residuals by step kind.

Mirrors nothing in vLLM. Given the fitted coefficients and the calibration samples (isolated grid
shapes and the steps of real replays), it computes

* per term: the coefficient, its unit, and its mean share of the predicted step time for each
  step kind on the replay steps (the terms' weight where it matters: the steps a replay runs);
* residuals (predicted minus measured, over measured) on training and held-out samples, overall,
  by step kind (``prefill`` / ``decode`` / ``mixed``, the executor's kinds) and by source
  (``grid`` / ``replay``) x kind.

Invariants: pure functions of their inputs (numpy only); a group with no sample is left out, never
reported as zero; a kind is the one :func:`step_kind_of` derives from the shape, the executor's rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpu_backend.calibration.latency_fit import error_summary
from sim.core.executor import StepShape
from sim.timing.fitted_latency import FittedLatency

STEP_KINDS = ("prefill", "decode", "mixed")

UNITS = {
    "intercept": "s per step (fixed: launches, framework, weights streamed once)",
    "num_seqs": "s per sequence",
    "num_decode_seqs": "s per decode sequence",
    "num_prefill_seqs": "s per prefill sequence",
    "num_new_tokens": "s per token computed (GEMM FLOPs)",
    "num_prefill_tokens": "s per prefill token",
    "num_decode_tokens": "s per decode token",
    "context_tokens": "s per cached-context token",
    "attention_pairs": "s per query-key pair (attention FLOPs, quadratic in a prefill)",
    "kv_read_tokens": "s per token of K/V read (memory-bound KV bytes)",
    "mixed_step": "s per step mixing decodes with a prefill chunk",
    "multi_token_step": "s per step of more than one token (GEMM weight packing; a one-token step is a GEMV)",
}


def step_kind_of(shape: StepShape) -> str:
    """``decode`` (only decodes), ``prefill`` (no decodes) or ``mixed`` (the executor's kinds)."""
    if shape.num_decode_seqs == shape.num_seqs:
        return "decode"
    return "prefill" if shape.num_decode_seqs == 0 else "mixed"


def unit_of(feature: str) -> str:
    if feature.startswith("num_new_tokens_over_"):
        return f"s per token beyond {feature.rsplit('_', 1)[1]} (roofline knee: GEMMs compute-bound past it)"
    return UNITS.get(feature, "s per unit")


def term_table(coefs: dict[str, float], shapes: Sequence[StepShape], kinds: Sequence[str],
               kv_bytes_per_token: int | None = None) -> list[dict[str, Any]]:
    """One row per term: coefficient, unit, and its mean share of the predicted time per step kind."""
    model = FittedLatency(coefs)
    pred = np.array([model.step_time(s) for s in shapes]) if shapes else np.zeros(0)
    kinds_a = np.array(kinds)
    rows = []
    for f, c in model.coefs.items():
        vals = np.array([c * FittedLatency.feature_value(f, s) for s in shapes]) if shapes else np.zeros(0)
        row: dict[str, Any] = {"term": f, "coefficient": c, "unit": unit_of(f)}
        if f == "kv_read_tokens" and kv_bytes_per_token:
            row["per_byte_s"] = c / kv_bytes_per_token
        for k in STEP_KINDS:
            sel = kinds_a == k
            if sel.any():
                row[f"share_{k}"] = float(np.mean(vals[sel] / pred[sel]))
        rows.append(row)
    return rows


def residuals(err: np.ndarray, kinds: Sequence[str], sources: Sequence[str], mask: np.ndarray) -> dict[str, Any]:
    """Error summaries of ``err[mask]``: overall, by kind, and by source x kind."""
    kinds_a, src_a = np.array(kinds), np.array(sources)
    out: dict[str, Any] = {"all": error_summary(err[mask]), "by_kind": {}, "by_source": {}}
    for k in STEP_KINDS:
        sel = mask & (kinds_a == k)
        if sel.any():
            out["by_kind"][k] = error_summary(err[sel])
    for src in sorted(set(sources)):
        per: dict[str, Any] = {}
        for k in STEP_KINDS:
            sel = mask & (src_a == src) & (kinds_a == k)
            if sel.any():
                per[k] = error_summary(err[sel])
        sel = mask & (src_a == src)
        if sel.any():
            per["all"] = error_summary(err[sel])
            out["by_source"][src] = per
    return out


def format_terms(rows: list[dict[str, Any]]) -> list[str]:
    """The per-term table as markdown lines."""
    lines = ["| term | coefficient | unit | share of prefill / decode / mixed step time |", "|---|---|---|---|"]
    for r in rows:
        shares = " / ".join(f"{100 * r[f'share_{k}']:.0f} %" if f"share_{k}" in r else "-" for k in STEP_KINDS)
        extra = f" ({r['per_byte_s'] * 1e9:.3g} ns/B)" if "per_byte_s" in r else ""
        lines.append(f"| `{r['term']}` | {r['coefficient']:.4g}{extra} | {r['unit']} | {shares} |")
    return lines


def format_residuals(res: dict[str, Any], title: str) -> list[str]:
    """Residuals by source and kind as markdown lines (MAPE, P90 |error|, mean signed error)."""
    lines = [f"| {title} | n | MAPE | P90 abs | mean signed |", "|---|---|---|---|---|"]

    def row(label: str, s: dict[str, Any]) -> None:
        if s.get("n"):
            lines.append(f"| {label} | {s['n']} | {100 * s['mape']:.1f} % | {100 * s['p90_abs']:.1f} % | "
                         f"{100 * s['mean_signed']:+.1f} % |")

    row("all", res["all"])
    for k, s in res["by_kind"].items():
        row(k, s)
    for src, per in res["by_source"].items():
        for k, s in per.items():
            if k != "all":
                row(f"{src} / {k}", s)
    return lines
