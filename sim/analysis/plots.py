"""``apcsim plot``: the standard figures of a sweep folder, as PNG and SVG beside its table.

Roles are read from the sweep's axes (``sweep.json``): the block size (``engine.block_size``), the
pool capacity (``engine.kv_cache_gib`` in GiB, or ``engine.num_gpu_blocks`` in blocks), the salt
policy (``workload.tenants.salt``), the tenant count (``workload.tenants.num_tenants``); every other
axis (e.g. a labelled ``workload`` axis, ``seed``, an arrival rate) names the *configs*, one curve
each. A figure whose x axis was not swept is skipped. Failed points are left out.

* ``hit_rate_vs_block_size`` -- vLLM's ``token_hit_rate`` vs block size, one curve per config, one
  panel per capacity (rows: salt policies); the offline references dashed (infinite cache) and
  dotted (Belady at the same capacity), request-level (see ``workloads.bounds``);
* ``hit_rate_vs_capacity`` -- the same against capacity (log axis), one curve per block size, one
  panel per config;
* ``ttft_vs_block_size`` / ``ttft_vs_capacity`` -- TTFT p50 and p99 (log axis), at the first salt
  policy of the sweep;
* ``ttft_cdf`` -- the TTFT distribution of every (config, capacity) panel, one curve per block size,
  at the first salt policy;
* ``salt_policy`` -- hit rate, TTFT p50 and p99 per salt policy: against the tenant count when it
  was swept, else bars per config, at a reference block size (16 if swept, else the smallest).

matplotlib runs headless (Agg); nothing here needs a display.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

BLOCK = "engine.block_size"
CAP_GIB = "engine.kv_cache_gib"
CAP_BLOCKS = "engine.num_gpu_blocks"
SALT = "workload.tenants.salt"
TENANTS = "workload.tenants.num_tenants"
ROLE_KEYS = {BLOCK, CAP_GIB, CAP_BLOCKS, SALT, TENANTS}
BOUND_STYLE = {"infinite_cache_hit_rate": "--", "belady_hit_rate": ":"}
FORMATS = ("png", "svg")

plt.rcParams.update({
    "font.size": 10, "axes.titlesize": 10.5, "axes.labelsize": 10, "legend.fontsize": 9,
    "xtick.labelsize": 9, "ytick.labelsize": 9, "axes.grid": True, "grid.alpha": 0.3,
    "figure.dpi": 110, "savefig.dpi": 110,
})


class SweepData:
    """A sweep's table (ok points only) and the roles of its axes."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        table = self.folder / "table.parquet"
        if not table.is_file():
            raise FileNotFoundError(2, "no table.parquet (run apcsim sweep first)", str(table))
        df = pd.read_parquet(table)
        manifest = self.folder / "sweep.json"
        self.name = self.folder.name
        axes: list[str] = []
        if manifest.is_file():
            m = json.loads(manifest.read_text())
            axes = [a["key"] for a in m.get("axes", [])]
            self.name = m.get("name", self.name)
        self.axes = [a for a in axes if a in df.columns]
        self.all = df
        self.df = df[df["status"] == "ok"].copy() if "status" in df else df.copy()
        self.block = BLOCK in self.axes and self.df["block_size"].nunique() > 1
        if CAP_GIB in self.axes:
            self.cap, self.cap_label = "kv_pool_gib", "KV pool capacity (GiB)"
        elif CAP_BLOCKS in self.axes:
            self.cap, self.cap_label = "num_gpu_blocks", "KV pool capacity (blocks)"
        else:
            self.cap, self.cap_label = None, ""
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
        d = self.df if df is None else df
        for col, val in eq.items():
            if not col or val is None:
                continue
            d = d[d[col] == val]
        return d

    def cap_title(self, cap: Any) -> str:
        if cap is None:
            return ""
        if self.cap == "kv_pool_gib":
            sub = self.df[self.df[self.cap] == cap]
            tokens = int(sub["capacity_tokens"].median()) if len(sub) else 0  # the resolved engine's
            return f"KV pool {_num(cap)} GiB (~{_tokens(tokens)} tokens)"
        return f"KV pool {int(cap):,} blocks"


def _short(key: str) -> str:
    for prefix in ("workload.", "engine.", "latency."):
        if key.startswith(prefix) and key != prefix.rstrip("."):
            return key[len(prefix):]
    return key


def _num(v: Any) -> str:
    f = float(v)
    return f"{int(f)}" if f.is_integer() else f"{f:g}"


def _tokens(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M"
    if n >= 1024:
        k = n / 1024
        return f"{k:.0f}k" if abs(k - round(k)) < 0.05 or k >= 10 else f"{k:.1f}k"
    return str(n)


def _log_ticks(axis: Any, span: float = 100.0) -> None:
    """1-2-5 ticks (powers of ten only over more than 3 decades) with plain labels on a log axis."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0,) if span > 1000 else (1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _time_axis(ax: Any, which: str, values: Any) -> bool:
    """Log scale with 1-2-5 labels when the values span more than a factor of 4, else linear."""
    v = np.asarray(pd.Series(values).dropna(), dtype=float)
    v = v[v > 0]
    axis = ax.yaxis if which == "y" else ax.xaxis
    if v.size and v.max() / v.min() > 4:
        (ax.set_yscale if which == "y" else ax.set_xscale)("log")
        _log_ticks(axis, v.max() / v.min())
        return True
    return False


_QUALITATIVE = {"tab10": 10, "Set2": 8, "Dark2": 8}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _colors(n: int, cmap: str = "tab10") -> list[Any]:
    """``n`` colours: by index from a qualitative map when it has enough, else spread over viridis."""
    size = _QUALITATIVE.get(cmap)
    if size is not None and n <= size:
        return [plt.get_cmap(cmap)(i) for i in range(n)]
    cm = plt.get_cmap("viridis" if size is not None else cmap)
    return [cm(x) for x in np.linspace(0.0, 0.9, max(n, 1))]


def _log2_axis(ax: Any, values: Sequence[float]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(list(values)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _num(v)))
    ax.xaxis.set_minor_locator(NullLocator())


def _log_axis(ax: Any, values: Sequence[float]) -> None:
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(list(values)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _num(v)))
    ax.xaxis.set_minor_locator(NullLocator())


def _grid(nrows: int, ncols: int, *, w: float = 3.9, h: float = 3.0, sharey: bool | str = True) -> tuple[Any, Any]:
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(7.0, w * ncols), h * nrows + 1.2), squeeze=False,
                             sharey=sharey)
    return fig, axes


def _finish(fig: Any, title: str, handles: list[Any], folder: Path, stem: str, ncol: int | None = None) -> Any:
    """Title, layout and the legend below the panels; returns the figure (saved by the caller)."""
    fig.suptitle(title, fontsize=12)
    n = len(handles)
    longest = max((len(h.get_label()) for h in handles), default=10)
    fits = max(1, int(fig.get_size_inches()[0] * 72 / (longest * 6.3 + 45)))
    ncol = min(ncol or 4, n, fits) if n else 1
    rows = math.ceil(n / max(ncol, 1))
    height = fig.get_size_inches()[1]
    bottom = min(0.45, (0.35 + 0.22 * rows) / height)
    fig.tight_layout(rect=(0, bottom, 1, 0.96))
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=ncol, frameon=False,
                   bbox_to_anchor=(0.5, 0.0))
    fig.apcsim_stem = stem
    return fig


def png_bytes(fig: Any) -> bytes:
    """The figure as PNG bytes, then closed (for notebooks: ``IPython.display.Image(data=...)``)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def save_figure(fig: Any, folder: Path, stem: str) -> list[Path]:
    """Write ``<folder>/<stem>.png`` and ``.svg`` (each atomically) and close the figure."""
    import os

    out = []
    for ext in FORMATS:
        p = Path(folder) / f"{stem}.{ext}"
        tmp = p.with_name(f".{p.name}.tmp")
        fig.savefig(tmp, format=ext)
        os.replace(tmp, p)
        out.append(p)
    plt.close(fig)
    return out


def _row_label(ax: Any, text: str) -> None:
    ax.annotate(text, xy=(0, 0.5), xytext=(-ax.yaxis.labelpad - 34, 0), xycoords=ax.yaxis.label,
                textcoords="offset points", ha="right", va="center", rotation=90, fontsize=10.5,
                fontweight="bold")


def _style_handles(entries: list[tuple[str, str, Any]]) -> list[Any]:
    return [Line2D([], [], color=c, linestyle=ls, marker="o" if ls == "-" else None, label=label)
            for label, ls, c in entries]


# -- figures ----------------------------------------------------------------------------------
def hit_rate_vs_block_size(d: SweepData) -> Any:
    if not d.block:
        return None
    salts, caps, blocks = d.salts(), d.caps(), d.blocks()
    colors = dict(zip(d.configs, _colors(len(d.configs))))
    fig, axes = _grid(len(salts), len(caps))
    bounds = [b for b in BOUND_STYLE if b in d.df and d.df[b].notna().any()]
    for i, salt in enumerate(salts):
        for j, cap in enumerate(caps):
            ax = axes[i][j]
            sub = d.where(**{d.salt or "": salt, d.cap or "": cap}) if (d.salt or d.cap) else d.df
            for cfg in d.configs:
                c = sub[sub["_config"] == cfg].sort_values("block_size")
                if c.empty:
                    continue
                ax.plot(c["block_size"], c["token_hit_rate"], "-o", color=colors[cfg], ms=4, lw=1.8)
                for b in bounds:
                    ax.plot(c["block_size"], c[b], BOUND_STYLE[b], color=colors[cfg], lw=1.3, alpha=0.85)
            _log2_axis(ax, blocks)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("Block size (tokens per block)")
            if j == 0:
                ax.set_ylabel("Hit rate (fraction of prompt tokens)")
            title = d.cap_title(cap)
            if d.salt:
                title = f"{title}\nsalt policy: {salt}" if title else f"salt policy: {salt}"
            ax.set_title(title)
    handles = _style_handles([(cfg, "-", colors[cfg]) for cfg in d.configs])
    handles += _style_handles([("simulated vLLM LRU (token_hit_rate)", "-", "0.3")])
    if "infinite_cache_hit_rate" in bounds:
        handles += _style_handles([("infinite cache (request-level bound)", "--", "0.3")])
    if "belady_hit_rate" in bounds:
        handles += _style_handles([("Belady offline optimal, same capacity", ":", "0.3")])
    return _finish(fig, f"{d.name}: prefix-cache hit rate vs block size", handles, d.folder,
                   "hit_rate_vs_block_size", ncol=min(len(handles), 4))


def hit_rate_vs_capacity(d: SweepData) -> Any:
    if d.cap is None or d.df[d.cap].nunique() < 2:
        return None
    salts, caps, blocks = d.salts(), d.caps(), d.blocks()
    colors = dict(zip(blocks, _colors(len(blocks), "viridis")))
    fig, axes = _grid(len(salts), len(d.configs))
    for i, salt in enumerate(salts):
        for j, cfg in enumerate(d.configs):
            ax = axes[i][j]
            sub = d.where(d.df[d.df["_config"] == cfg], **{d.salt or "": salt}) if d.salt else d.df[d.df["_config"] == cfg]
            for bs in blocks:
                c = sub[sub["block_size"] == bs].sort_values(d.cap)
                if c.empty:
                    continue
                ax.plot(c[d.cap], c["token_hit_rate"], "-o", color=colors[bs], ms=4, lw=1.8)
                if "belady_hit_rate" in c and c["belady_hit_rate"].notna().any():
                    ax.plot(c[d.cap], c["belady_hit_rate"], ":", color=colors[bs], lw=1.3)
            _log_axis(ax, caps)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel(d.cap_label + ", log scale")
            if j == 0:
                ax.set_ylabel("Hit rate (fraction of prompt tokens)")
            ax.set_title(f"{cfg}" + (f"\nsalt policy: {salt}" if d.salt else ""))
    handles = _style_handles([(f"block size {bs}", "-", colors[bs]) for bs in blocks])
    handles += _style_handles([("simulated vLLM LRU (token_hit_rate)", "-", "0.3"),
                               ("Belady offline optimal, same capacity", ":", "0.3")])
    return _finish(fig, f"{d.name}: prefix-cache hit rate vs KV pool capacity", handles, d.folder,
                   "hit_rate_vs_capacity", ncol=min(len(handles), 5))


_TTFT = (("ttft_p50_s", "TTFT p50"), ("ttft_p99_s", "TTFT p99"))


def _salt_note(d: SweepData) -> tuple[Any, str]:
    salt = d.salts()[0]
    return salt, (f" (salt policy: {salt})" if d.salt else "")


def ttft_vs_block_size(d: SweepData) -> Any:
    if not d.block:
        return None
    caps, blocks = d.caps(), d.blocks()
    salt, note = _salt_note(d)
    colors = dict(zip(d.configs, _colors(len(d.configs))))
    fig, axes = _grid(len(_TTFT), len(caps), sharey="row")
    shown = d.where(**{d.salt or "": salt})
    for i, (col, name) in enumerate(_TTFT):
        log = _time_axis(axes[i][0], "y", shown[col])
        for j, cap in enumerate(caps):
            ax = axes[i][j]
            sub = d.where(shown, **{d.cap or "": cap})
            for cfg in d.configs:
                c = sub[sub["_config"] == cfg].sort_values("block_size")
                if not c.empty:
                    ax.plot(c["block_size"], c[col], "-o", color=colors[cfg], ms=4, lw=1.8)
            _log2_axis(ax, blocks)
            ax.set_xlabel("Block size (tokens per block)")
            if j == 0:
                ax.set_ylabel(f"{name} (s{', log scale' if log else ''})")
            ax.set_title(f"{name}" + (f" -- {d.cap_title(cap)}" if cap is not None else ""))
    handles = _style_handles([(cfg, "-", colors[cfg]) for cfg in d.configs])
    return _finish(fig, f"{d.name}: time to first token vs block size{note}", handles, d.folder, "ttft_vs_block_size")


def ttft_vs_capacity(d: SweepData) -> Any:
    if d.cap is None or d.df[d.cap].nunique() < 2:
        return None
    caps, blocks = d.caps(), d.blocks()
    salt, note = _salt_note(d)
    colors = dict(zip(blocks, _colors(len(blocks), "viridis")))
    fig, axes = _grid(len(_TTFT), len(d.configs), sharey="row")
    shown = d.where(**{d.salt or "": salt})
    for i, (col, name) in enumerate(_TTFT):
        log = _time_axis(axes[i][0], "y", shown[col])
        for j, cfg in enumerate(d.configs):
            ax = axes[i][j]
            sub = shown[shown["_config"] == cfg]
            for bs in blocks:
                c = sub[sub["block_size"] == bs].sort_values(d.cap)
                if not c.empty:
                    ax.plot(c[d.cap], c[col], "-o", color=colors[bs], ms=4, lw=1.8)
            _log_axis(ax, caps)
            ax.set_xlabel(d.cap_label + ", log scale")
            if j == 0:
                ax.set_ylabel(f"{name} (s{', log scale' if log else ''})")
            ax.set_title(f"{name} -- {cfg}")
    handles = _style_handles([(f"block size {bs}", "-", colors[bs]) for bs in blocks])
    return _finish(fig, f"{d.name}: time to first token vs KV pool capacity{note}", handles, d.folder,
                   "ttft_vs_capacity", ncol=min(len(handles), 6))


def _ttft_values(d: SweepData, key: str) -> np.ndarray:
    p = d.folder / "points" / key / "requests.parquet"
    if not p.is_file():
        return np.zeros(0)
    t = pd.read_parquet(p, columns=["ttft"])["ttft"].dropna().to_numpy()
    return np.sort(t[t > 0])


def ttft_cdf(d: SweepData) -> Any:
    caps = d.caps()
    blocks = d.blocks()
    salt, note = _salt_note(d)
    colors = dict(zip(blocks, _colors(len(blocks), "viridis")))
    fig, axes = _grid(len(d.configs), len(caps), sharey=True)
    any_line = False
    lo, hi = math.inf, 0.0
    for i, cfg in enumerate(d.configs):
        for j, cap in enumerate(caps):
            ax = axes[i][j]
            sub = d.where(d.df[d.df["_config"] == cfg], **{d.salt or "": salt, d.cap or "": cap})
            for bs in blocks:
                for _, row in sub[sub["block_size"] == bs].iterrows():
                    t = _ttft_values(d, row["key"])
                    if t.size:
                        ax.step(t, np.arange(1, t.size + 1) / t.size, where="post", color=colors[bs], lw=1.5)
                        any_line = True
                        lo, hi = min(lo, float(t[0])), max(hi, float(t[-1]))
                    break  # one line per block size (the first matching point)
            ax.set_xscale("log")
            _log_ticks(ax.xaxis)
            ax.set_ylim(0, 1.01)
            ax.set_xlabel("TTFT (s, log scale)")
            if j == 0:
                ax.set_ylabel("Fraction of requests")
            ax.set_title(cfg + (f" -- {d.cap_title(cap)}" if cap is not None else ""))
    if not any_line:
        plt.close(fig)
        return None
    for row in axes:  # one TTFT range for every panel, so that panels compare
        for ax in row:
            ax.set_xlim(lo / 1.2, hi * 1.2)
            _log_ticks(ax.xaxis, hi / lo)
    handles = _style_handles([(f"block size {bs}", "-", colors[bs]) for bs in blocks])
    return _finish(fig, f"{d.name}: TTFT distribution per config{note}", handles, d.folder, "ttft_cdf",
                   ncol=min(len(handles), 6))


_SALT_METRICS = (("token_hit_rate", "Hit rate (fraction of prompt tokens)", False),
                 ("ttft_p50_s", "TTFT p50 (s)", True),
                 ("ttft_p99_s", "TTFT p99 (s)", True))


def _reference_block(d: SweepData) -> int | None:
    blocks = d.blocks()
    if not blocks:
        return None
    return 16 if 16 in blocks else blocks[0]


def salt_policy(d: SweepData) -> Any:
    if not d.salt or d.df["salt_policy"].nunique() < 2:
        return None
    salts = d.salts()
    bs = _reference_block(d)
    base = d.where(block_size=bs) if d.block else d.df
    colors = dict(zip(salts, _colors(len(salts), "Set2") if len(salts) <= 8 else _colors(len(salts))))
    if d.tenants and base["num_tenants"].nunique() > 1:
        caps = d.caps()
        cap = caps[-1]
        base = d.where(base, **{d.cap or "": cap})
        fig, axes = _grid(len(d.configs), len(_SALT_METRICS), sharey=False)
        tenants = sorted(int(t) for t in base["num_tenants"].unique())
        for i, cfg in enumerate(d.configs):
            for j, (col, label, logy) in enumerate(_SALT_METRICS):
                ax = axes[i][j]
                sub = base[base["_config"] == cfg]
                for k, s in enumerate(salts):  # distinct markers, earlier ones larger: equal lines stay visible
                    c = sub[sub["salt_policy"] == s].sort_values("num_tenants")
                    if not c.empty:
                        ax.plot(c["num_tenants"], c[col], "-", marker=MARKERS[k % len(MARKERS)], color=colors[s],
                                ms=max(3.0, 8.0 - 1.5 * k), lw=max(1.2, 3.0 - 0.5 * k))
                _log2_axis(ax, tenants)
                log = _time_axis(ax, "y", sub[col]) if logy else False
                if not logy:
                    ax.set_ylim(-0.02, 1.02)
                ax.set_xlabel("Tenants (count, log scale)")
                ax.set_ylabel(label.replace("(s)", "(s, log scale)") if log else label)
                ax.set_title(cfg)
        where = f"block size {bs}" + (f", {d.cap_title(cap)}" if cap is not None else "")
        handles = [Line2D([], [], color=colors[s], marker=MARKERS[k % len(MARKERS)], label=f"salt: {s}")
                   for k, s in enumerate(salts)]
        return _finish(fig, f"{d.name}: salt policies vs tenant count ({where})", handles, d.folder, "salt_policy")
    caps = d.caps()
    fig, axes = _grid(len(caps), len(_SALT_METRICS), w=max(3.9, 1.1 * len(d.configs) * len(salts) / 2), sharey=False)
    width = 0.8 / len(salts)
    x = np.arange(len(d.configs))
    for i, cap in enumerate(caps):
        sub = d.where(base, **{d.cap or "": cap})
        for j, (col, label, logy) in enumerate(_SALT_METRICS):
            ax = axes[i][j]
            for k, s in enumerate(salts):
                vals = [sub[(sub["_config"] == cfg) & (sub["salt_policy"] == s)][col].mean() for cfg in d.configs]
                ax.bar(x + (k - (len(salts) - 1) / 2) * width, vals, width, color=colors[s])
            ax.set_xticks(x, d.configs)
            ax.grid(axis="x", visible=False)
            log = _time_axis(ax, "y", sub[col]) if logy else False
            if not logy:
                ax.set_ylim(0, 1.02)
            ax.set_ylabel(label.replace("(s)", "(s, log scale)") if log else label)
            ax.set_title(d.cap_title(cap) if cap is not None else label.split(" (")[0])
    tenants = base["num_tenants"].dropna().unique() if "num_tenants" in base else []
    tn = f", {int(tenants[0])} tenants" if len(tenants) == 1 else ""
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[s], label=f"salt: {s}") for s in salts]
    return _finish(fig, f"{d.name}: salt policies (block size {bs}{tn})", handles, d.folder, "salt_policy")


FIGURES = {
    "hit_rate_vs_block_size": hit_rate_vs_block_size,
    "hit_rate_vs_capacity": hit_rate_vs_capacity,
    "ttft_vs_block_size": ttft_vs_block_size,
    "ttft_vs_capacity": ttft_vs_capacity,
    "ttft_cdf": ttft_cdf,
    "salt_policy": salt_policy,
}
"""Every figure: file stem -> builder (``builder(SweepData) -> Figure | None``, None when the sweep
lacks the axes it needs)."""


def plot_sweep(folder: str | Path) -> list[Path]:
    """Draw every applicable figure of a sweep folder; returns the files written."""
    d = SweepData(Path(folder))
    out: list[Path] = []
    if d.df.empty:
        return out
    for stem, build in FIGURES.items():
        fig = build(d)
        if fig is not None:
            out.extend(save_figure(fig, d.folder, stem))
    return out
