"""The figures of a side-channel study (``apcsim sidechannel``), as PNG and SVG in its folder.

Mirrors nothing in vLLM. Figures (``FIGURES``):

* ``sidechannel_roc`` -- ROC curves of the presence attack (row 1) and the capacity attack (row 2),
  one curve per salt policy, one panel per attacker domain, at the reference point (the first
  value of every other axis); from each point's ``probes.parquet`` (scikit-learn ``roc_curve``);
* ``sidechannel_auc_vs_load`` -- presence and capacity AUC (bootstrap 95 % CI as a band) against
  the load (``rate_scale``, log axis), one curve per policy, one panel per attacker domain, one row
  per attack and other swept setting (block size, noise, ...);
* ``sidechannel_tradeoff`` -- the cost of each policy (hit rate lost against ``none`` by the
  background traffic replayed alone) against what still leaks (presence AUC; capacity AUC), filled markers with
  the attacker in the victim's domain, open ones outside it, CI as error bars.

Invariants: a figure whose data is missing is skipped (None); failed points are left out; reads
result files only. Imports matplotlib artists through ``sim.analysis.figure_style`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from sklearn.metrics import roc_curve

from sim.analysis import figure_style as fs
from sim.analysis.sidechannel_data import COST, DOMAIN_LABEL, SideChannelData

_SHORT = {"engine.block_size": "block", "latency.noise": "step noise", "sidechannel.network": "network"}
_ATTACKS = (("presence", "presence AUC", -1.0), ("capacity", "capacity (prime + probe) AUC", 1.0))


def _colors(d: SideChannelData) -> dict[str, Any]:
    return dict(zip(d.policies, fs.colors(len(d.policies), "Dark2")))


def _policy_handles(d: SideChannelData, colors: dict[str, Any]) -> list[Artist]:
    return [Line2D([], [], color=colors[p], marker=fs.MARKERS[i % len(fs.MARKERS)], label=f"salt: {p}")
            for i, p in enumerate(d.policies)]


def _attacks(d: SideChannelData) -> list[tuple[str, str, float]]:
    return [a for a in _ATTACKS if f"{a[0]}_auc" in d.df and d.df[f"{a[0]}_auc"].notna().any()]


def roc(d: SideChannelData) -> Figure | None:
    ref = d.reference()
    attacks = _attacks(d)
    if ref.empty or not attacks:
        return None
    colors = _colors(d)
    fig, axes = fs.grid(len(attacks), len(d.domains), w=3.6, h=3.4)
    for i, (attack, label, sign) in enumerate(attacks):
        for j, domain in enumerate(d.domains):
            ax = axes[i][j]
            for k, policy in enumerate(d.policies):
                sub = ref[(ref["salt_policy"] == policy) & (ref["attacker_domain"] == domain)]
                probes = d.probes(sub["key"].iloc[0]) if len(sub) else None
                if probes is None:
                    continue
                p = probes[probes["attack"] == attack]
                if p["label"].nunique() < 2:
                    continue
                fpr, tpr, _ = roc_curve(p["label"], sign * p["observed_ttft"])
                ax.plot(fpr, tpr, color=colors[policy], lw=max(1.2, 2.6 - 0.3 * k), drawstyle="steps-post")
            ax.plot([0, 1], [0, 1], ":", color="grey", lw=1)
            ax.set_xlim(-0.01, 1.01)
            ax.set_ylim(-0.01, 1.01)
            ax.set_xlabel("false positive rate")
            ax.set_ylabel("true positive rate")
            ax.set_title(f"{attack}: {DOMAIN_LABEL.get(domain, domain)}", fontsize=9.5)
    where = d.reference_title()
    return fs.finish(fig, f"{d.name}: ROC of the TTFT classifier{' (' + where + ')' if where else ''}",
                     _policy_handles(d, colors))


def _settings(d: SideChannelData) -> list[dict[str, Any]]:
    """Every combination of the other swept axes (block size, noise, ...) that the study holds."""
    if not d.others:
        return [{}]
    combos = d.df[d.others].drop_duplicates()
    return [dict(zip(d.others, row)) for row in combos.itertuples(index=False)]


def auc_vs_load(d: SideChannelData) -> Figure | None:
    attacks = _attacks(d)
    if d.load is None or len(d.loads()) < 2 or not attacks:
        return None
    settings = _settings(d)
    rows = [(a, s) for a in attacks for s in settings]
    colors = _colors(d)
    loads = d.loads()
    fig, axes = fs.grid(len(rows), len(d.domains), w=4.4 if d.others else 3.6, h=2.9)
    for i, ((attack, label, _), setting) in enumerate(rows):
        base = d.df
        for key, val in setting.items():
            base = base[base[key] == val]
        for j, domain in enumerate(d.domains):
            ax = axes[i][j]
            for k, policy in enumerate(d.policies):
                c = base[(base["salt_policy"] == policy) & (base["attacker_domain"] == domain)]
                c = c.assign(_x=c[d.load].astype(float)).sort_values("_x")
                if c.empty:
                    continue
                ax.fill_between(c["_x"], c[f"{attack}_auc_ci_low"], c[f"{attack}_auc_ci_high"], color=colors[policy],
                                alpha=0.15, lw=0)
                ax.plot(c["_x"], c[f"{attack}_auc"], "-", marker=fs.MARKERS[k % len(fs.MARKERS)], color=colors[policy],
                        ms=max(3.0, 7.0 - 0.8 * k))
            ax.axhline(0.5, color="grey", ls=":", lw=1)
            fs.log_axis(ax, loads)
            ax.set_ylim(0.0, 1.02)
            ax.set_xlabel("load (background rate_scale, log scale)")
            ax.set_ylabel(label)
            extra = ", ".join(f"{_SHORT.get(k, k.rsplit('.', 1)[-1])}={v}" for k, v in setting.items())
            ax.set_title(f"{DOMAIN_LABEL.get(domain, domain)}{chr(10) + extra if extra else ''}", fontsize=9)
    return fs.finish(fig, f"{d.name}: AUC against load", _policy_handles(d, colors))


def _hit_rate_lost(ref: pd.DataFrame) -> pd.Series:
    base = ref[ref["salt_policy"] == "none"].set_index("attacker_domain")[COST]
    return ref["attacker_domain"].map(base) - ref[COST]


def tradeoff(d: SideChannelData) -> Figure | None:
    ref = d.reference()
    attacks = _attacks(d)
    if ref.empty or not attacks or "none" not in d.policies:
        return None
    ref = ref.assign(_lost=_hit_rate_lost(ref))
    colors = _colors(d)
    fig, axes = fs.grid(1, len(attacks), w=4.6, h=3.8, sharey=False)
    for j, (attack, label, _) in enumerate(attacks):
        ax = axes[0][j]
        for k, policy in enumerate(d.policies):
            for domain in d.domains:
                r = ref[(ref["salt_policy"] == policy) & (ref["attacker_domain"] == domain)]
                if r.empty:
                    continue
                y = r[f"{attack}_auc"].to_numpy()
                err = np.vstack([y - r[f"{attack}_auc_ci_low"].to_numpy(), r[f"{attack}_auc_ci_high"].to_numpy() - y])
                inside = domain == "same"
                ax.errorbar(r["_lost"], y, yerr=err, fmt=fs.MARKERS[k % len(fs.MARKERS)], ms=8, capsize=3,
                            color=colors[policy], mfc=colors[policy] if inside else "white", mew=1.6)
        ax.axhline(0.5, color="grey", ls=":", lw=1)
        ax.set_ylim(0.0, 1.02)
        ax.set_xlabel("hit rate lost against salt none (background replayed alone)")
        ax.set_ylabel(label)
        ax.set_title(f"what {attack} leaks vs what the policy costs", fontsize=9.5)
    handles = _policy_handles(d, colors) + [
        Line2D([], [], ls="", marker="o", color="black", label="attacker in the victim's domain"),
        Line2D([], [], ls="", marker="o", color="black", mfc="white", label="attacker outside it")]
    where = d.reference_title()
    return fs.finish(fig, f"{d.name}: leakage against cost{' (' + where + ')' if where else ''}", handles, ncol=3)


FIGURES: dict[str, Callable[[SideChannelData], Figure | None]] = {
    "sidechannel_roc": roc,
    "sidechannel_auc_vs_load": auc_vs_load,
    "sidechannel_tradeoff": tradeoff,
}
"""File stem -> builder (None when the study lacks what the figure needs)."""


def plot_sidechannel(folder: str | Path) -> list[Path]:
    """Draw every applicable side-channel figure of a study folder; returns the files written."""
    d = SideChannelData(Path(folder))
    return [] if d.df.empty else fs.draw_figures(FIGURES, d, d.folder)
