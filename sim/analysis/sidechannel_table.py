"""The headline tables of a side-channel study: per salt policy and attacker domain, what each
attack achieves and what the policy costs in hit rate.

Mirrors nothing in vLLM. :func:`headline` -- one row per (policy, domain) at the reference point
(``sim.analysis.sidechannel_data``): presence AUC with its bootstrap CI, best-threshold accuracy
and KS statistic; reconstruction success over all its blocks; capacity (prime + probe) AUC with
CI; the background's hit rate replayed alone (``background_alone_hit_rate``: free of the attack's
own cache churn) and the hit rate it loses against ``none`` at the same settings.
:func:`auc_by_load` -- presence (or capacity) AUC per policy and domain at every load.
:func:`by_setting` -- presence AUC and reconstruction success per combination of the other swept
axes (block size, noise, ...).
:func:`write_tables` writes both as Markdown (``headline.md``) and CSV.

Invariants: numbers come from the study's table only; a missing value prints as ``-``. Imports
pandas only.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from sim.analysis.sidechannel_data import COST, SideChannelData


def _num(v: Any, fmt: str = ".3f") -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(f) else format(f, fmt)


def _auc_ci(row: pd.Series, attack: str) -> str:
    auc = row.get(f"{attack}_auc")
    if auc is None or _num(auc) == "-":
        return "-"
    return f"{_num(auc)} [{_num(row.get(f'{attack}_auc_ci_low'))}, {_num(row.get(f'{attack}_auc_ci_high'))}]"


def _recon_column(df: pd.DataFrame) -> str | None:
    cols = sorted((c for c in df.columns if c.startswith("recon_success_n")), key=lambda c: int(c[15:]))
    return cols[-1] if cols else None


def headline(d: SideChannelData) -> pd.DataFrame:
    """One row per (policy, domain) at the reference point (see the module docstring)."""
    ref = d.reference()
    recon = _recon_column(ref)
    rows = []
    for policy in d.policies:
        for domain in d.domains:
            sub = ref[(ref["salt_policy"] == policy) & (ref["attacker_domain"] == domain)]
            if sub.empty:
                continue
            r = sub.iloc[0]
            base = ref[(ref["salt_policy"] == "none") & (ref["attacker_domain"] == domain)]
            none_hr = float(base[COST].iloc[0]) if len(base) else math.nan
            lost = none_hr - float(r[COST])
            rows.append({
                "salt policy": policy, "attacker": domain,
                "presence AUC [95% CI]": _auc_ci(r, "presence"),
                "presence best acc.": _num(r.get("presence_best_accuracy")),
                "presence KS": _num(r.get("presence_ks_statistic")),
                f"reconstruction success ({recon[15:]} blocks)" if recon else "reconstruction success":
                    _num(r.get(recon)) if recon else "-",
                "capacity AUC [95% CI]": _auc_ci(r, "capacity"),
                "background hit rate (alone)": _num(r.get(COST)),
                "hit rate lost": _num(lost),
            })
    return pd.DataFrame(rows)


def auc_by_load(d: SideChannelData, attack: str = "presence") -> pd.DataFrame:
    """``attack`` AUC per (policy, domain) row and load column (empty when load was not swept)."""
    if d.load is None or f"{attack}_auc" not in d.df:
        return pd.DataFrame()
    ref = d.reference(keep_load=True)
    rows = []
    for row, sub in _cells(d, ref):
        for load in d.loads():
            at = sub[sub[d.load].astype(float) == load]
            row[f"load x{load:g}"] = _num(at[f"{attack}_auc"].iloc[0]) if len(at) else "-"
        rows.append(row)
    return pd.DataFrame(rows)


def _cells(d: SideChannelData, ref: pd.DataFrame) -> Iterator[tuple[dict[str, Any], pd.DataFrame]]:
    """Each (salt policy, attacker domain) present in ``ref``, in the study's order: the table row
    to fill (its two label cells set) and the points of that pair."""
    for policy in d.policies:
        for domain in d.domains:
            sub = ref[(ref["salt_policy"] == policy) & (ref["attacker_domain"] == domain)]
            if not sub.empty:
                yield {"salt policy": policy, "attacker": domain}, sub


def by_setting(d: SideChannelData) -> pd.DataFrame:
    """Presence AUC / reconstruction success per (policy, domain) row and column per combination
    of the other swept axes (block size, noise, ...), at the reference load; empty without them."""
    if not d.others:
        return pd.DataFrame()
    ref = d.reference(keep=tuple(d.others))
    recon = _recon_column(ref)
    combos = ref[d.others].drop_duplicates()
    rows = []
    for row, sub in _cells(d, ref):
        for combo in combos.itertuples(index=False):
            at = sub
            for key, val in zip(d.others, combo):
                at = at[at[key] == val]
            name = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(d.others, combo))
            row[name] = (f"{_num(at['presence_auc'].iloc[0])} / {_num(at[recon].iloc[0], '.2f')}"
                         if len(at) and recon and "presence_auc" in at else "-")
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame) -> str:
    """A DataFrame of strings as a Markdown table."""
    if df.empty:
        return ""
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in rec) + " |" for rec in df.itertuples(index=False)]
    return "\n".join(lines)


def report(d: SideChannelData) -> str:
    """The headline table and the AUC-by-load tables as Markdown text."""
    parts = [f"# {d.name}: timing side channel per salt policy", ""]
    where = d.reference_title()
    parts += [f"At {where}." if where else "", "", markdown(headline(d))]
    for attack in ("presence", "capacity"):
        t = auc_by_load(d, attack)
        if not t.empty:
            title = d.reference_title(keep_load=True)
            parts += ["", f"## {attack} AUC by load (rate_scale{', ' + title if title else ''})", "", markdown(t)]
    settings = by_setting(d)
    if not settings.empty:
        recon = _recon_column(d.df)
        title = d.reference_title(keep=tuple(d.others))
        parts += ["", f"## presence AUC / reconstruction success ({recon[15:] if recon else '?'} blocks) by "
                      f"{', '.join(k.rsplit('.', 1)[-1] for k in d.others)}{' (' + title + ')' if title else ''}", "",
                  markdown(settings)]
    return "\n".join(parts).strip() + "\n"


def write_tables(folder: str | Path) -> list[Path]:
    """Write ``headline.md`` and ``headline.csv`` into a study folder; returns the files."""
    d = SideChannelData(Path(folder))
    md = d.folder / "headline.md"
    csv = d.folder / "headline.csv"
    md.write_text(report(d))
    headline(d).to_csv(csv, index=False)
    return [md, csv]
