"""The house style of apcsim's figures: headless matplotlib, axes, colours, legends, saving.

Mirrors nothing in vLLM. Invariants: matplotlib runs headless (``Agg``, selected here before
pyplot is imported; nothing needs a display); this is the only ``sim.analysis`` module that
imports pyplot, so the figure modules build on axes and artists only; a saved figure is closed
and each file is written atomically (temporary name, then ``os.replace``).

Imports matplotlib, numpy and pandas; no simpy, no sim.experiment.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

from sim.analysis.sweep_data import num_label

FORMATS = ("png", "svg")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LineStyle = Literal["-", "--", ":"]
_QUALITATIVE = {"tab10": 10, "Set2": 8, "Dark2": 8}

plt.rcParams.update({
    "font.size": 10, "axes.titlesize": 10.5, "axes.labelsize": 10, "legend.fontsize": 9,
    "xtick.labelsize": 9, "ytick.labelsize": 9, "axes.grid": True, "grid.alpha": 0.3,
    "figure.dpi": 110, "savefig.dpi": 110,
})


def log_ticks(axis: Any, span: float = 100.0) -> None:
    """1-2-5 ticks (powers of ten only over more than 3 decades) with plain labels on a log axis."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0,) if span > 1000 else (1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def time_axis(ax: Any, which: str, values: Any) -> bool:
    """Log scale with 1-2-5 labels when the values span more than a factor of 4, else linear."""
    v = np.asarray(pd.Series(values).dropna(), dtype=float)
    v = v[v > 0]
    axis = ax.yaxis if which == "y" else ax.xaxis
    if v.size and v.max() / v.min() > 4:
        (ax.set_yscale if which == "y" else ax.set_xscale)("log")
        log_ticks(axis, v.max() / v.min())
        return True
    return False


def colors(n: int, cmap: str = "tab10") -> list[Any]:
    """``n`` colours: by index from a qualitative map when it has enough, else spread over viridis."""
    size = _QUALITATIVE.get(cmap)
    if size is not None and n <= size:
        return [plt.get_cmap(cmap)(i) for i in range(n)]
    cm = plt.get_cmap("viridis" if size is not None else cmap)
    return [cm(x) for x in np.linspace(0.0, 0.9, max(n, 1))]


def log2_axis(ax: Any, values: Sequence[float]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(list(values)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: num_label(v)))
    ax.xaxis.set_minor_locator(NullLocator())


def log_axis(ax: Any, values: Sequence[float]) -> None:
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(list(values)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: num_label(v)))
    ax.xaxis.set_minor_locator(NullLocator())


def grid(nrows: int, ncols: int, *, w: float = 3.9, h: float = 3.0,
         sharey: bool | Literal["none", "all", "row", "col"] = True) -> tuple[Figure, Any]:
    """A figure of ``nrows x ncols`` panels (always a 2-D array of axes), sized per panel."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(7.0, w * ncols), h * nrows + 1.2), squeeze=False,
                             sharey=sharey)
    return fig, axes


def finish(fig: Figure, title: str, handles: Sequence[Artist], ncol: int | None = None) -> Figure:
    """Title, layout and the legend below the panels; returns the figure (saved by the caller)."""
    fig.suptitle(title, fontsize=12)
    n = len(handles)
    longest = max((len(str(h.get_label())) for h in handles), default=10)
    fits = max(1, int(fig.get_size_inches()[0] * 72 / (longest * 6.3 + 45)))
    ncol = min(ncol or 4, n, fits) if n else 1
    rows = math.ceil(n / max(ncol, 1))
    height = fig.get_size_inches()[1]
    bottom = min(0.45, (0.35 + 0.22 * rows) / height)
    fig.tight_layout(rect=(0, bottom, 1, 0.96))
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=ncol, frameon=False,
                   bbox_to_anchor=(0.5, 0.0))
    return fig


def style_handles(entries: Sequence[tuple[str, LineStyle, Any]]) -> list[Artist]:
    """Legend entries ``(label, line style, colour)``; solid lines get a marker."""
    return [Line2D([], [], color=c, linestyle=ls, marker="o" if ls == "-" else None, label=label)
            for label, ls, c in entries]


def discard(fig: Figure) -> None:
    """Close a figure that will not be saved."""
    plt.close(fig)


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes, then closed (for notebooks: ``IPython.display.Image(data=...)``)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def save_figure(fig: Figure, folder: Path, stem: str) -> list[Path]:
    """Write ``<folder>/<stem>.png`` and ``.svg`` (each atomically) and close the figure."""
    out = []
    for ext in FORMATS:
        p = Path(folder) / f"{stem}.{ext}"
        tmp = p.with_name(f".{p.name}.tmp")
        fig.savefig(tmp, format=ext)
        os.replace(tmp, p)
        out.append(p)
    plt.close(fig)
    return out
