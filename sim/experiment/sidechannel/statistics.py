"""How well a score separates two classes of probes: ROC AUC with a bootstrap confidence
interval, the best single-threshold accuracy and the two-sample Kolmogorov-Smirnov statistic.

Mirrors nothing in vLLM; the statistics of the attacks in the literature (a probe classifier's
ROC AUC, hypothesis tests on TTFT). Computed with scikit-learn (``roc_auc_score``, ``roc_curve``)
and SciPy (``bootstrap``, ``mannwhitneyu``, ``ks_2samp``); nothing is hand-written but the glue.

* **AUC**: the probability that a random positive scores above a random negative (ties count
  one half); 0.5 means the score tells nothing.
* **CI**: stratified percentile bootstrap (positives and negatives resampled separately, so
  every resample has both classes); the AUC of a resample is the Mann-Whitney U of its two
  samples over ``n_pos * n_neg`` (the same number as ``roc_auc_score``).
* **Best accuracy**: the highest ``(TP + TN) / n`` over every threshold of the ROC curve.
* **KS**: the largest gap between the two empirical CDFs, and its p-value.

Invariants: pure functions of their inputs and the seed. With one class empty every number is
NaN. Imports neither simpy nor torch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats
from sklearn.metrics import roc_auc_score, roc_curve


def _auc_statistic(pos: np.ndarray, neg: np.ndarray, axis: int = -1) -> np.ndarray:
    u = stats.mannwhitneyu(pos, neg, axis=axis, method="asymptotic").statistic
    return np.asarray(u) / (pos.shape[axis] * neg.shape[axis])


def separation(labels: np.ndarray, scores: np.ndarray, *, resamples: int = 1000, confidence: float = 0.95,
               rng: np.random.Generator | None = None) -> dict[str, Any]:
    """AUC (higher score = positive), its CI, best-threshold accuracy and KS (module docstring);
    ``rng`` drives the bootstrap (default: a fixed seed)."""
    labels = np.asarray(labels, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    pos, neg = scores[labels == 1], scores[labels == 0]
    out: dict[str, Any] = {"n_pos": int(pos.size), "n_neg": int(neg.size)}
    if pos.size == 0 or neg.size == 0:
        nan = math.nan
        return {**out, "auc": nan, "auc_ci_low": nan, "auc_ci_high": nan, "best_accuracy": nan,
                "best_threshold": nan, "ks_statistic": nan, "ks_pvalue": nan}
    auc = float(roc_auc_score(labels, scores))
    if np.ptp(scores) == 0:  # every score equal: no resample can differ from 0.5
        low = high = auc
    else:
        gen = rng if rng is not None else np.random.default_rng(0)
        ci = stats.bootstrap((pos, neg), _auc_statistic, n_resamples=resamples, confidence_level=confidence,
                             method="percentile", vectorized=True, rng=gen)
        low, high = float(ci.confidence_interval.low), float(ci.confidence_interval.high)
    fpr, tpr, thresholds = roc_curve(labels, scores)
    accuracy = (tpr * pos.size + (1.0 - fpr) * neg.size) / labels.size
    best = int(np.argmax(accuracy))
    ks = stats.ks_2samp(pos, neg)
    return {**out, "auc": auc, "auc_ci_low": low, "auc_ci_high": high, "best_accuracy": float(accuracy[best]),
            "best_threshold": float(thresholds[best]), "ks_statistic": float(ks.statistic),
            "ks_pvalue": float(ks.pvalue)}
