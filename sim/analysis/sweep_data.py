"""A sweep folder's table read for plotting: ok points, and the role of every swept axis.

Mirrors nothing in vLLM (apcsim's own sweep layout: ``table.parquet`` + ``sweep.json``, written by
``sim.experiment.sweep``). Roles come from the axes' config keys: the block size
(``engine.block_size``), the pool capacity (``engine.kv_cache_gib`` in GiB, or
``engine.num_gpu_blocks`` in blocks), the salt policy (``workload.tenants.salt``), the tenant count
(``workload.tenants.num_tenants``); every other axis names the *configs*, one curve each.

Invariants: failed points are left out (``status != "ok"``); configs keep their order of first
appearance in the table; reading a folder never re-runs anything; a folder whose ``sweep.json``
lacks ``complete: true`` (a sweep running or interrupted) is refused with ``ResultsError``.

Imports pandas and, of sim.experiment, only its results-folder check (no matplotlib, no simpy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from sim.experiment.results_folder import require_complete_sweep

BLOCK = "engine.block_size"
CAP_GIB = "engine.kv_cache_gib"
CAP_BLOCKS = "engine.num_gpu_blocks"
SALT = "workload.tenants.salt"
TENANTS = "workload.tenants.num_tenants"
ROLE_KEYS = {BLOCK, CAP_GIB, CAP_BLOCKS, SALT, TENANTS}


class SweepData:
    """A sweep's table (ok points only) and the roles of its axes."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        table = self.folder / "table.parquet"
        if not table.is_file():
            raise FileNotFoundError(2, "no table.parquet (run apcsim sweep first)", str(table))
        m = require_complete_sweep(self.folder)
        df = pd.read_parquet(table)
        axes = [a["key"] for a in m.get("axes", [])]
        self.name = m.get("name", self.folder.name)
        self.axes = [a for a in axes if a in df.columns]
        if "first_admission_token_hit_rate" not in df and "request_hit_rate" in df:  # a table of release 0.1
            df["first_admission_token_hit_rate"] = df["request_hit_rate"]
        self.all = df
        self.df = df[df["status"] == "ok"].copy() if "status" in df else df.copy()
        self.block = BLOCK in self.axes and self.df["block_size"].nunique() > 1
        self.cap: str | None = None
        self.cap_label = ""
        if CAP_GIB in self.axes:
            self.cap, self.cap_label = "kv_pool_gib", "KV pool capacity (GiB)"
        elif CAP_BLOCKS in self.axes:
            self.cap, self.cap_label = "num_gpu_blocks", "KV pool capacity (blocks)"
        self.salt = "salt_policy" if SALT in self.axes else None
        self.tenants = "num_tenants" if TENANTS in self.axes else None
        self.others = [a for a in self.axes if a not in ROLE_KEYS]
        self.df["_config"] = self._config_labels(self.df)
        self.configs = list(dict.fromkeys(self.df["_config"]))

    def _config_labels(self, df: pd.DataFrame) -> pd.Series:
        if not self.others:
            kinds = df["workload_kind"].astype(str) if "workload_kind" in df else pd.Series("", index=df.index)
            return kinds
        parts = []
        for key in self.others:
            vals = df[key].astype(str)
            parts.append(vals if key == "workload" and len(self.others) == 1 else f"{_short(key)}=" + vals)
        out = parts[0]
        for p in parts[1:]:
            out = out + ", " + p
        return out

    def salts(self) -> list[Any]:
        return list(dict.fromkeys(self.df[self.salt])) if self.salt else [None]

    def caps(self) -> list[Any]:
        return sorted(self.df[self.cap].dropna().unique()) if self.cap else [None]

    def blocks(self) -> list[int]:
        return sorted(int(b) for b in self.df["block_size"].unique())

    def where(self, df: pd.DataFrame | None = None, **eq: Any) -> pd.DataFrame:
        """Rows of ``df`` (default: every ok point) whose columns equal ``eq`` (a None value or an
        empty column name is no condition)."""
        d = self.df if df is None else df
        for col, val in eq.items():
            if not col or val is None:
                continue
            d = d[d[col] == val]
        return d

    def pivot(self, values: str, index: str | list[str], columns: str, df: pd.DataFrame | None = None) -> pd.DataFrame:
        """``values`` by ``index`` x ``columns`` over ``df`` (default: every ok point), one point per cell.

        Never averages: when points differ in an axis that is neither in ``index``, in ``columns`` nor
        held fixed (by filtering ``df`` first, e.g. with :meth:`where`), it raises ``ValueError``
        naming that axis."""
        d = self.df if df is None else df
        keys = ([index] if isinstance(index, str) else list(index)) + [columns]
        dup = d.duplicated(subset=keys, keep=False)
        if dup.any():
            cols = [*self.axes, "block_size", "kv_pool_gib", "num_gpu_blocks", "salt_policy", "num_tenants"]
            varying = [c for c in dict.fromkeys(cols) if c in d and c not in keys and d.loc[dup, c].nunique() > 1]
            raise ValueError(f"{int(dup.sum())} points share cells of {values} by {keys}: hold "
                             f"{', '.join(varying) or 'the other axes'} fixed first (a pivot never averages)")
        out = d.pivot(index=keys[:-1], columns=columns, values=values)
        if len(keys) == 2:  # rows and columns in their order of first appearance (numbers sorted)
            out = out.reindex(index=_ordered(d[keys[0]]))
        return out.reindex(columns=_ordered(d[columns]))

    def cap_title(self, cap: Any) -> str:
        if cap is None:
            return ""
        if self.cap == "kv_pool_gib":
            sub = self.df[self.df[self.cap] == cap]
            tokens = int(sub["capacity_tokens"].median()) if len(sub) else 0  # the resolved engine's
            return f"KV pool {num_label(cap)} GiB (~{_tokens(tokens)} tokens)"
        return f"KV pool {int(cap):,} blocks"


def _ordered(col: pd.Series) -> list[Any]:
    """A column's distinct values: sorted when numeric, else in their order of first appearance."""
    values = list(dict.fromkeys(col.dropna()))
    return sorted(values) if all(isinstance(v, (int, float)) for v in values) else values


def _short(key: str) -> str:
    for prefix in ("workload.", "engine.", "latency."):
        if key.startswith(prefix) and key != prefix.rstrip("."):
            return key[len(prefix):]
    return key


def num_label(v: Any) -> str:
    """A number as a short label: ``16``, ``0.25``."""
    f = float(v)
    return f"{int(f)}" if f.is_integer() else f"{f:g}"


def _tokens(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M"
    if n >= 1024:
        k = n / 1024
        return f"{k:.0f}k" if abs(k - round(k)) < 0.05 or k >= 10 else f"{k:.1f}k"
    return str(n)
