"""A side-channel study folder read for tables and plots: ok points, the role of every axis, the
reference point and each point's probes.

Mirrors nothing in vLLM (the layout of ``apcsim sidechannel``: a sweep folder whose rows carry the
attack columns of ``sim.experiment.sidechannel.point``, and ``points/<key>/probes.parquet``).
Roles: the salt policy (column ``salt_policy``), the attacker's domain (``attacker_domain``), the
load (the axis ``workload.arrival.rate_scale``); every other swept axis (block size, noise, ...)
is held at its *reference* value -- the first value the study file lists -- unless a figure
shows it.

Invariants: failed points are left out; policies and domains keep the study's order (the
canonical order of ``POLICIES`` when not swept); reading never re-runs anything. Imports pandas
only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

LOAD = "workload.arrival.rate_scale"
SALT_AXIS = "workload.tenants.salt"
DOMAIN_AXIS = "sidechannel.attacker.domain"
POLICIES = ("none", "shared_system_prompt", "per_tenant", "per_user", "per_session", "per_request")
DOMAINS = ("same", "same_tenant", "other")
COST = "background_alone_hit_rate"
"""What a policy costs is read from this column: the background's hit rate replayed alone."""
DOMAIN_LABEL = {"same": "attacker in the victim's domain", "same_tenant": "attacker in the victim's tenant",
                "other": "attacker in another tenant"}


class SideChannelData:
    """A study's table (ok points) with axis roles and reference values."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        table = self.folder / "table.parquet"
        if not table.is_file():
            raise FileNotFoundError(2, "no table.parquet (run apcsim sidechannel first)", str(table))
        df = pd.read_parquet(table)
        self.name = self.folder.name
        labels: dict[str, list[Any]] = {}
        manifest = self.folder / "sweep.json"
        if manifest.is_file():
            m = json.loads(manifest.read_text())
            self.name = m.get("name", self.name)
            labels = {a["key"]: list(a["labels"]) for a in m.get("axes", []) if a["key"] in df.columns}
        self.df = df[df["status"] == "ok"].copy() if "status" in df else df.copy()
        if "presence_auc" not in self.df and "capacity_auc" not in self.df:
            raise ValueError(f"{self.folder}: not a side-channel study (no attack columns)")
        self.axes = labels
        self.load = LOAD if LOAD in labels else None
        self.others = [k for k in labels if k not in (LOAD, SALT_AXIS, DOMAIN_AXIS)]
        self.policies = _ordered(self.df["salt_policy"], labels.get(SALT_AXIS), POLICIES)
        self.domains = _ordered(self.df["attacker_domain"], labels.get(DOMAIN_AXIS), DOMAINS)

    def reference(self, *, keep_load: bool = False, keep: tuple[str, ...] = ()) -> pd.DataFrame:
        """Rows at the reference value of every other axis (the load too unless ``keep_load``)."""
        d = self.df
        for key in self.others + ([self.load] if self.load and not keep_load else []):
            if key in keep:
                continue
            d = d[d[key] == self.axes[key][0]]
        return d

    def loads(self) -> list[float]:
        return sorted(float(v) for v in self.df[self.load].unique()) if self.load else []

    def reference_title(self, *, keep_load: bool = False, keep: tuple[str, ...] = ()) -> str:
        """What the reference rows hold fixed, e.g. ``block_size=16, noise=default, load x1``."""
        parts = [f"{_short(k)}={self.axes[k][0]}" for k in self.others if k not in keep]
        if self.load and not keep_load:
            parts.append(f"load x{self.axes[self.load][0]:g}")
        return ", ".join(parts)

    def probes(self, key: str) -> pd.DataFrame | None:
        """A point's probes (``points/<key>/probes.parquet``), or None when absent."""
        p = self.folder / "points" / key / "probes.parquet"
        return pd.read_parquet(p) if p.is_file() else None


def _ordered(col: pd.Series, swept: list[Any] | None, canonical: tuple[str, ...]) -> list[str]:
    present = list(dict.fromkeys(str(v) for v in col.dropna()))
    order = [str(v) for v in swept] if swept else list(canonical)
    return [v for v in order if v in present] + [v for v in present if v not in order]


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]
