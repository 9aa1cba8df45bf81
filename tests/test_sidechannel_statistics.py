"""ROC AUC, its bootstrap CI, best-threshold accuracy and KS of the side-channel attacks."""

import math

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from sim.experiment.sidechannel.point import _reconstruction
from sim.experiment.sidechannel.statistics import _auc_statistic, separation


def test_known_small_example():
    labels = np.array([1, 1, 1, 0, 0, 0])
    scores = np.array([0.9, 0.8, 0.3, 0.7, 0.2, 0.1])  # one positive below one negative: 8 of 9 pairs right
    s = separation(labels, scores, resamples=200)
    assert s["auc"] == pytest.approx(8 / 9)
    assert s["best_accuracy"] == pytest.approx(5 / 6)  # threshold 0.8: TP 2, TN 3
    assert s["ks_statistic"] == pytest.approx(2 / 3)
    assert s["n_pos"] == s["n_neg"] == 3
    assert s["auc_ci_low"] <= s["auc"] <= s["auc_ci_high"] <= 1.0


def test_bootstrap_statistic_is_roc_auc():
    rng = np.random.default_rng(1)
    pos, neg = rng.normal(0.5, 1, 37), np.round(rng.normal(0, 1, 53), 1)  # ties included
    labels = np.r_[np.ones(37), np.zeros(53)]
    assert float(_auc_statistic(pos, neg)) == pytest.approx(roc_auc_score(labels, np.r_[pos, neg]))
    batch = _auc_statistic(np.vstack([pos, pos[::-1]]), np.vstack([neg, neg]), axis=-1)
    assert batch.shape == (2,) and batch[0] == pytest.approx(batch[1])


def test_ci_covers_the_true_auc_about_as_often_as_it_says():
    """Over 30 data sets with no signal the 95 % CI covers 0.5 in most of them (nominal 28.5)."""
    rng = np.random.default_rng(4)
    labels = np.r_[np.ones(100), np.zeros(100)]
    covered = 0
    for i in range(30):
        s = separation(labels, rng.normal(size=200), resamples=300, rng=np.random.default_rng(i))
        covered += s["auc_ci_low"] <= 0.5 <= s["auc_ci_high"]
        assert s["auc_ci_high"] - s["auc_ci_low"] < 0.25
    assert covered >= 25
    signal = separation(labels, np.r_[rng.normal(1, 1, 100), rng.normal(0, 1, 100)], rng=np.random.default_rng(0))
    assert signal["auc_ci_low"] > 0.65


def test_degenerate_inputs():
    labels = np.array([1, 0, 1, 0])
    flat = separation(labels, np.zeros(4))
    assert flat["auc"] == flat["auc_ci_low"] == flat["auc_ci_high"] == 0.5
    perfect = separation(labels, np.array([2.0, 1.0, 3.0, 0.0]))
    assert perfect["auc"] == 1.0 and perfect["best_accuracy"] == 1.0 and perfect["ks_statistic"] == 1.0
    empty = separation(np.ones(3), np.arange(3.0))
    assert math.isnan(empty["auc"]) and empty["n_neg"] == 0


def test_reconstruction_success_is_every_round_right_so_far():
    rows = []
    right_blocks = {0: [True, True, True], 1: [True, False, True], 2: [False, True, True]}
    for trial, rights in right_blocks.items():
        for block, right in enumerate(rights):
            for cand in range(3):
                true = cand == 1
                fast = true == right  # the fastest probe is the true one iff the round is right
                rows.append({"attack": "reconstruction", "trial": trial, "block": block, "candidate": cand,
                             "label": int(true), "observed_ttft": 0.01 if (fast and (true or cand == 0)) else 0.02})
    out = _reconstruction(pd.DataFrame(rows), 3, seed=0)
    assert out["recon_success_n1"] == pytest.approx(2 / 3)
    assert out["recon_success_n2"] == pytest.approx(1 / 3)
    assert out["recon_success_n3"] == pytest.approx(1 / 3)
    assert out["recon_block_accuracy"] == pytest.approx(7 / 9)
    assert out["recon_probes_per_block"] == 3 and out["recon_trials"] == 3
