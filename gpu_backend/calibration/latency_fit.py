"""Fitting the step-latency model: NNLS in relative error, the feature set chosen by cross-validation.

Mirrors nothing in vLLM. :class:`sim.timing.fitted_latency.FittedLatency` is linear in features of
a step's :class:`~sim.core.executor.StepShape` -- ``num_new_tokens`` (GEMMs), ``attention_pairs``
(attention FLOPs over cached + new tokens), ``kv_read_tokens`` (KV bytes read, per token),
``num_seqs`` / ``num_decode_seqs`` (per-sequence overheads) and an intercept (weights streamed,
launches) -- optionally with a roofline knee ``num_new_tokens_over_<K>`` (GEMMs memory-bound below
``K`` tokens, compute-bound above).

Invariants: coefficients are non-negative (``scipy.optimize.nnls``) and fitted on rows scaled by
``1 / measured`` (least squares in *relative* error, which is what TTFT and TPOT of short steps
care about); columns are scaled to unit norm before solving and scaled back; the feature set is
chosen among candidates by K-fold CV on the points given (the caller keeps held-out points out),
the simplest set winning ties; folds are seeded.

Terms and their physics: ``intercept`` -- a fixed cost per forward pass (launches, framework
overhead, and the weights streamed once per step: on a memory-bound GPU decode the largest part);
``num_seqs`` -- per-sequence cost (metadata, per-sequence attention work); ``num_new_tokens`` --
GEMM FLOPs, linear in the tokens computed (a knee bends it like the roofline: flat at the weight
read until ``K`` tokens); ``attention_pairs`` -- attention FLOPs, quadratic in a prefill's length
and linear in its cached context; ``kv_read_tokens`` -- memory-bound KV bytes read;
``mixed_step`` -- a per-step cost of mixing decodes with a prefill chunk, and ``multi_token_step``
-- a per-step cost of computing more than one token (a matrix product over two or more rows runs
as a GEMM that packs the weights first, over one row as a matrix-vector product that does not: on
a CPU a one-sequence decode costs less than a linear term in the token count says), each kept only
when the data needs it (cross-validation).

Imports numpy and scipy (lazily); no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sim.core.executor import StepShape
from sim.timing.fitted_latency import FittedLatency, knee_feature

#: Candidate feature sets, simplest first; the fit picks one by cross-validation on training points.
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "base": ("intercept", "num_seqs", "num_new_tokens", "attention_pairs", "kv_read_tokens"),
    "split_seqs": ("intercept", "num_decode_seqs", "num_prefill_seqs", "num_new_tokens", "attention_pairs",
                   "kv_read_tokens"),
    "split_tokens": ("intercept", "num_decode_seqs", "num_prefill_seqs", "num_prefill_tokens",
                     "num_decode_tokens", "attention_pairs", "context_tokens", "kv_read_tokens"),
}


def design_matrix(shapes: Sequence[StepShape], features: Sequence[str]) -> np.ndarray:
    return np.array([[FittedLatency.feature_value(f, s) for f in features] for s in shapes], dtype=np.float64)


def candidate_feature_sets(knees: Sequence[int] = (), mixed: bool = False) -> dict[str, tuple[str, ...]]:
    """:data:`FEATURE_SETS` plus ``base`` with one roofline knee at each of ``knees`` tokens, and
    (``mixed``) ``base`` and ``split_seqs`` with a per-mixed-step cost (``mixed_step``); always
    ``base`` with a per-step cost of a multi-token step (``multi_token_step``, alone and with
    ``mixed_step``)."""
    sets = dict(FEATURE_SETS)
    for k in knees:
        sets[f"base+knee{k}"] = (*FEATURE_SETS["base"], knee_feature(k))
    if mixed:
        sets["base+mixed"] = (*FEATURE_SETS["base"], "mixed_step")
        sets["split_seqs+mixed"] = (*FEATURE_SETS["split_seqs"], "mixed_step")
    sets["base+multi_token"] = (*FEATURE_SETS["base"], "multi_token_step")
    if mixed:
        sets["base+multi_token+mixed"] = (*sets["base+multi_token"], "mixed_step")
    return sets


def fit_nnls(shapes: Sequence[StepShape], times: Sequence[float] | np.ndarray,
             features: Sequence[str]) -> dict[str, float]:
    """Non-negative least squares in relative error: ``min || (X c - y) / y ||``, ``c >= 0``.

    Columns are scaled to unit norm before solving (conditioning: ``attention_pairs`` is ~1e6 times
    ``num_seqs``) and the coefficients scaled back."""
    from scipy.optimize import nnls

    y = np.asarray(times, dtype=np.float64)
    a = design_matrix(shapes, features) / y[:, None]
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    coef, _ = nnls(a / norms, np.ones_like(y), maxiter=50 * a.shape[1])
    coef = coef / norms
    return {f: float(c) for f, c in zip(features, coef)}


def predict(coefs: dict[str, float], shapes: Sequence[StepShape]) -> np.ndarray:
    model = FittedLatency(coefs)
    return np.array([model.step_time(s) for s in shapes])


def rel_errors(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (pred - y) / y


def error_summary(err: np.ndarray) -> dict[str, float]:
    a = np.abs(err)
    if a.size == 0:
        return {"n": 0}
    return {"n": int(a.size), "mape": float(a.mean()), "p50_abs": float(np.quantile(a, 0.5)),
            "p90_abs": float(np.quantile(a, 0.9)), "max_abs": float(a.max()), "mean_signed": float(err.mean())}


def _kfold_mape(shapes: list[StepShape], y: np.ndarray, features: Sequence[str], k: int, seed: int) -> float:
    n = len(shapes)
    k = max(2, min(k, n))
    idx = np.random.default_rng(seed).permutation(n)
    errs = []
    for f in range(k):
        test = idx[f::k]
        train = np.setdiff1d(idx, test)
        coefs = fit_nnls([shapes[i] for i in train], y[train], features)
        if not any(v > 0 for v in coefs.values()):
            return math.inf
        pred = predict(coefs, [shapes[i] for i in test])
        errs.append(np.abs(rel_errors(pred, y[test])))
    return float(np.concatenate(errs).mean())


def choose_and_fit(shapes: list[StepShape], y: np.ndarray, *, feature_sets: dict[str, tuple[str, ...]] | None = None,
                   folds: int = 5, seed: int = 0) -> tuple[str, dict[str, float], dict[str, float]]:
    """Pick the feature set with the lowest K-fold CV MAPE (an earlier, simpler set wins unless a
    later one is better by > 1 % relative and 0.01 percentage points), then fit it on all of
    ``shapes``. Returns (name, coefs, CV MAPE per set)."""
    sets = feature_sets or FEATURE_SETS
    cv = {name: _kfold_mape(shapes, y, feats, folds, seed) for name, feats in sets.items()}
    names = list(sets)  # simplest first
    best = names[0]
    for name in names[1:]:
        if cv[name] < cv[best] * 0.99 - 1e-4:
            best = name
    return best, fit_nnls(shapes, y, sets[best]), cv
