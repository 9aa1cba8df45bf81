"""What each change to the calibration buys: refits of a reference's own samples, side by side.

Mirrors nothing in vLLM. A CPU reference folder (:mod:`gpu_backend.validation.cpu_reference`) holds every
calibration sample (``model.samples.csv``: grid shapes and replay steps, with the held-out
split), each calibration replay step's single measurement beside its median over the re-timing
passes (``calibration_steps.csv``) and every step of validation real run 1 with its re-timed
median (``validate_*/steps_real1.csv``). This module refits the model on the same training
samples four ways -- replay steps by their single measurement or by their re-timed median, times
the ``base`` terms or ``base`` plus ``multi_token_step`` -- and reports for each the coefficients,
the held-out residuals by step kind and the per-step error on the validation steps (against their
re-timed medians, the target's estimator). And, model-free, how fast each workload's decode steps
run against the same shapes in the other workloads (:func:`same_shape`): a cost the step's shape
does not carry. Nothing is measured again: the figures are functions of the files.

Invariants: the training and held-out samples are those of ``model.samples.csv`` (the validation
steps never enter a fit); held-out and validation errors are always against the re-timed medians
(grid shapes: the median of their rounds), whatever the fit was trained on. Imports numpy, pandas,
scipy (through :mod:`gpu_backend.calibration.latency_fit`); no torch.

    python -m gpu_backend.calibration.fit_ablation results/reference/cpu_tiny
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_backend.calibration.fit_report import STEP_KINDS
from gpu_backend.calibration.latency_fit import FEATURE_SETS, error_summary, fit_nnls, predict
from sim.core.executor import StepShape

FIELDS = ("num_seqs", "num_decode_seqs", "num_new_tokens", "num_prefill_tokens", "context_tokens", "attention_pairs")
VARIANTS = {
    "single measurement, base": ("measured_s", FEATURE_SETS["base"]),
    "single measurement, base+multi_token": ("measured_s", (*FEATURE_SETS["base"], "multi_token_step")),
    "re-timed median, base": ("retimed_s", FEATURE_SETS["base"]),
    "re-timed median, base+multi_token": ("retimed_s", (*FEATURE_SETS["base"], "multi_token_step")),
}


def _shapes(df: pd.DataFrame) -> list[StepShape]:
    return [StepShape(*(int(v) for v in row)) for row in df[list(FIELDS)].itertuples(index=False)]


def _by_kind(err: np.ndarray, kinds: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {"all": error_summary(err)}
    for k in STEP_KINDS:
        if (kinds == k).any():
            out[k] = error_summary(err[kinds == k])
    return out


def samples(folder: Path) -> pd.DataFrame:
    """``model.samples.csv`` with, for replay rows, the single measurement and the re-timed median."""
    s = pd.read_csv(folder / "model.samples.csv")
    steps = pd.read_csv(folder / "calibration_steps.csv")
    steps["label"] = steps["source"] + "#" + steps["step"].astype(str)
    m = s.merge(steps[["label", "measured_s", "retimed_s"]], on="label", how="left")
    grid = m["source"] == "grid"
    m.loc[grid, "measured_s"] = m.loc[grid, "median_s"]
    m.loc[grid, "retimed_s"] = m.loc[grid, "median_s"]
    if m["retimed_s"].isna().any():
        raise ValueError(f"{folder}: replay samples without a row in calibration_steps.csv")
    return m


def ablation(folder: str | Path, variants: dict[str, tuple[str, Sequence[str]]] | None = None) -> dict[str, Any]:
    folder = Path(folder)
    s = samples(folder)
    train, held = s[~s["heldout"]], s[s["heldout"]]
    vals = {p.parent.name: pd.read_csv(p) for p in sorted(folder.glob("validate_*/steps_real1.csv"))}
    out: dict[str, Any] = {"folder": str(folder), "n_train": len(train), "n_holdout": len(held), "variants": {}}
    for name, (target, feats) in (variants or VARIANTS).items():
        coefs = fit_nnls(_shapes(train), train[target].to_numpy(), feats)
        h_err = predict(coefs, _shapes(held)) / held["retimed_s"].to_numpy() - 1
        rec: dict[str, Any] = {"target": target, "features": list(feats), "coefficients": coefs,
                               "holdout": _by_kind(h_err, held["kind"].to_numpy())}
        for key, t in vals.items():
            e = predict(coefs, _shapes(t)) / t["retimed_s"].to_numpy() - 1
            rec[key] = _by_kind(e, t["kind"].to_numpy())
        out["variants"][name] = rec
    return out


def same_shape(folder: str | Path, bin_tokens: int = 64) -> dict[str, Any]:
    """Decode steps of 1 and 2 sequences of every workload (calibration replays and validation run 1,
    re-timed medians), binned by sequence count and context per sequence (``bin_tokens``): per
    workload, the median of each step's time over the median of its bin across all workloads."""
    folder = Path(folder)
    cal = pd.read_csv(folder / "calibration_steps.csv")
    parts = [cal[["source", "kind", "num_seqs", "context_tokens", "retimed_s"]]]
    for p in sorted(folder.glob("validate_*/steps_real1.csv")):
        t = pd.read_csv(p)
        parts.append(t.assign(source=p.parent.name)[["source", "kind", "num_seqs", "context_tokens", "retimed_s"]])
    d = pd.concat(parts, ignore_index=True)
    d = d[(d["kind"] == "decode") & (d["num_seqs"] <= 2)].copy()
    d["bin"] = d["num_seqs"].astype(str) + ":" + (d["context_tokens"] // d["num_seqs"] // bin_tokens).astype(str)
    counts = d.groupby("bin")["source"].nunique()
    d = d[d["bin"].map(counts) >= 2]  # bins that at least two workloads share
    d["ratio"] = d["retimed_s"] / d.groupby("bin")["retimed_s"].transform("median")
    return {"bin_tokens": bin_tokens, "by_workload": {
        str(src): {"steps": int(len(g)), "median_ratio": float(g["ratio"].median())} for src, g in d.groupby("source")}}


def render(rep: dict[str, Any]) -> list[str]:
    lines = [f"Refits of `{rep['folder']}`'s training samples ({rep['n_train']}); errors against re-timed medians "
             "(MAPE / mean signed).", "", "| fit | " + " | ".join(
                 f"{w} {k}" for w in ("held-out", *[k for k in rep["variants"][next(iter(rep["variants"]))]
                                                   if k.startswith("validate_")]) for k in STEP_KINDS) + " |"]
    cols = lines[-1].count("|") - 1
    lines.append("|" + "---|" * cols)
    for name, v in rep["variants"].items():
        cells = []
        for w in ("holdout", *[k for k in v if k.startswith("validate_")]):
            for k in STEP_KINDS:
                e = v[w].get(k)
                cells.append(f"{100 * e['mape']:.1f} % / {100 * e['mean_signed']:+.1f} %" if e else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| fit | " + " | ".join(f"`{f}`" for f in VARIANTS["re-timed median, base+multi_token"][1]) + " |",
              "|---|" + "---|" * len(VARIANTS["re-timed median, base+multi_token"][1])]
    for name, v in rep["variants"].items():
        c = v["coefficients"]
        lines.append(f"| {name} | " + " | ".join(
            f"{c[f]:.4g}" if f in c else "-" for f in VARIANTS["re-timed median, base+multi_token"][1]) + " |")
    ss = rep.get("same_shape")
    if ss:
        lines += ["", f"Same shape, other workload: decode steps of 1-2 sequences (re-timed medians) against the "
                  f"median of their shape bin (sequence count, context per sequence in {ss['bin_tokens']}-token "
                  "bins) over all workloads:", "", "| workload | steps | median time / bin median |", "|---|---|---|"]
        for src, v in ss["by_workload"].items():
            lines.append(f"| {src} | {v['steps']} | {v['median_ratio']:.3f} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("folder", help="a CPU reference folder (results/reference/cpu_tiny)")
    a = ap.parse_args(argv)
    from sim.experiment.results import git_commit, package_versions

    rep = ablation(a.folder)
    rep["same_shape"] = same_shape(a.folder)
    rep["git_commit"], rep["versions"] = git_commit(Path(__file__).resolve().parent), package_versions()
    folder = Path(a.folder)
    (folder / "ablation.json").write_text(json.dumps(rep, indent=2) + "\n")
    text = "\n".join(["# Calibration ablation", "", *render(rep), ""])
    (folder / "ablation.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
