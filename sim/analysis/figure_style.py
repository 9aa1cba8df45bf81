"""The house style of apcsim's figures: headless matplotlib, axes, colours, legends, saving.

Mirrors nothing in vLLM. The rules every figure follows: colours from the Okabe-Ito palette
(distinguishable with the common colour-vision deficiencies; viridis past 7 lines), each line also
told apart by its marker, so equal lines stay visible; y axes fitted to the data *and* the
references drawn (:func:`fit_ylim`); log axes labelled 1-2-5 with the limits snapped to labelled
ticks, so no point lies below the lowest label (:func:`log_ticks`); one compact legend outside
the panels, on the right (:func:`finish`; constrained layout makes room for it).

Invariants: matplotlib runs headless (``Agg``, selected here before
pyplot is imported; nothing needs a display); this is the only ``sim.analysis`` module that
imports pyplot, so the figure modules build on axes and artists only; a saved figure is closed
and each file is written atomically (temporary name, then ``os.replace``).

Imports matplotlib, numpy and pandas; no simpy, no sim.experiment.
"""

from __future__ import annotations

import io
import math
import os
import textwrap
from collections.abc import Callable, Mapping, Sequence
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
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000")
"""Okabe & Ito's colour-blind-safe qualitative palette (its yellow left out: too pale on white)."""
REFERENCE_COLOR = "0.35"

plt.rcParams.update({
    "font.size": 10, "axes.titlesize": 10.5, "axes.labelsize": 10, "legend.fontsize": 9,
    "xtick.labelsize": 9, "ytick.labelsize": 9, "axes.grid": True, "grid.alpha": 0.3,
    "figure.dpi": 110, "savefig.dpi": 110,
})


def _snap_down(v: float, subs: Sequence[float]) -> float:
    e = math.floor(math.log10(v))
    cands = [m * 10.0 ** k for k in (e - 1, e) for m in subs]
    return max(c for c in cands if c <= v * (1 + 1e-9))


def _snap_up(v: float, subs: Sequence[float]) -> float:
    e = math.floor(math.log10(v))
    cands = [m * 10.0 ** k for k in (e, e + 1) for m in (*subs, 10.0)]
    return min(c for c in cands if c >= v * (1 - 1e-9))


def log_ticks(axis: Any, span: float = 100.0, limits: tuple[float, float] | None = None) -> None:
    """Plain labels on a log axis: 1-2-5 ticks (powers of ten only over more than 3 decades; 1-1.5-2-3-5-7
    within a factor of 10). With ``limits`` (the data's range) the axis is widened to the labelled ticks
    enclosing it, so every point lies between two labels."""
    if limits is not None and limits[0] > 0 and limits[1] > 0:
        span = limits[1] / limits[0]
    subs: tuple[float, ...] = (1.0,) if span > 1000 else (1.0, 2.0, 5.0) if span > 10 else (1.0, 1.5, 2.0, 3.0,
                                                                                           5.0, 7.0)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())
    if limits is not None and limits[0] > 0 and limits[1] > 0:
        lo, hi = _snap_down(limits[0], subs), _snap_up(limits[1], subs)
        (axis.axes.set_xlim if axis is axis.axes.xaxis else axis.axes.set_ylim)(lo, hi)


def positive_range(values: Any) -> tuple[float, float] | None:
    """The smallest and largest positive finite value, or None."""
    v = np.asarray(pd.Series(np.ravel(np.asarray(values, dtype=object))).dropna(), dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    return (float(v.min()), float(v.max())) if v.size else None


def time_axis(ax: Any, which: str, values: Any) -> bool:
    """Log scale with labelled limits (:func:`log_ticks`) when the values span more than a factor of 4,
    else linear and, on the y axis, from zero: a fitted linear axis would magnify a spread of a
    millisecond (run-to-run noise) into what looks like a trend. Returns whether it is logarithmic."""
    rng = positive_range(values)
    axis = ax.yaxis if which == "y" else ax.xaxis
    if rng is not None and rng[1] / rng[0] > 4:
        (ax.set_yscale if which == "y" else ax.set_xscale)("log")
        log_ticks(axis, limits=rng)
        return True
    if which == "y" and rng is not None:
        ax.set_ylim(0.0, rng[1] * 1.08)
    return False


def fit_ylim(ax: Any, values: Any, *, lo: float = 0.0, hi: float = 1.0, min_span: float = 0.05) -> None:
    """A linear y range fitted to ``values`` (the data and every reference drawn), padded, within
    ``[lo, hi]``; at least ``min_span`` wide, so a flat line is not magnified into noise."""
    v = np.asarray(pd.Series(np.ravel(np.asarray(values, dtype=object))).dropna(), dtype=float)
    v = v[np.isfinite(v)]
    if not v.size:
        return
    a, b = float(v.min()), float(v.max())
    if b - a < min_span:
        mid = (a + b) / 2
        a, b = mid - min_span / 2, mid + min_span / 2
    pad = 0.08 * (b - a)
    a, b = max(lo, a - pad), min(hi, b + pad)
    if b - a < min_span:  # pushed against a limit
        a, b = (lo, lo + min_span) if a <= lo else (hi - min_span, hi)
    edge = 0.03 * (b - a)  # markers on a limit (a hit rate of 0 or 1) stay visible
    ax.set_ylim(a - edge if a <= lo else a, b + edge if b >= hi else b)


def colors(n: int, cmap: str = "okabe_ito") -> list[Any]:
    """``n`` distinguishable colours: the Okabe-Ito palette when it has enough, else viridis."""
    if n <= len(OKABE_ITO):
        return list(OKABE_ITO[:n])
    cm = plt.get_cmap("viridis")
    return [cm(x) for x in np.linspace(0.0, 0.85, max(n, 1))]


def line_marks(n: int) -> list[dict[str, Any]]:
    """Per line ``k`` of ``n``: a marker of its own, earlier lines larger and wider, so that lines
    drawn on top of each other all stay visible."""
    return [{"marker": MARKERS[k % len(MARKERS)], "ms": max(3.5, 8.5 - 1.0 * k), "lw": max(1.3, 2.6 - 0.25 * k),
             "mfc": "none" if k % 2 == 0 else None} for k in range(n)]


def note_coinciding(ax: Any, curves: Sequence[Any], what: str, tol: float = 0.002) -> bool:
    """Write "<n> <what> coincide" in the panel when every curve (a sequence of y values over the same
    x) lies within ``tol`` of the first: the lines are drawn on top of each other, and the reader
    should not look for the hidden ones."""
    arrays = [np.asarray(c, dtype=float) for c in curves if len(c)]
    if len(arrays) < 2 or len({a.size for a in arrays}) != 1:
        return False
    if max(float(np.nanmax(np.abs(a - arrays[0]))) for a in arrays[1:]) > tol:
        return False
    ax.text(0.98, 0.04, f"all {len(arrays)} {what} coincide", transform=ax.transAxes, ha="right", va="bottom",
            fontsize=8.5, color="0.25", bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "0.7"})
    return True


def log2_axis(ax: Any, values: Sequence[float]) -> None:
    """A log2 x axis labelled at exactly ``values`` (the swept ones), padded so end markers show."""
    log_axis(ax, values, base=2)


def log_axis(ax: Any, values: Sequence[float], base: int = 10) -> None:
    """A log x axis labelled at exactly ``values`` (the swept ones), padded so end markers show."""
    ax.set_xscale("log", base=base)
    ax.xaxis.set_major_locator(FixedLocator(list(values)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: num_label(v)))
    ax.xaxis.set_minor_locator(NullLocator())
    v = [float(x) for x in values if x is not None and float(x) > 0]
    if v:
        pad = (max(v) / min(v)) ** 0.06 if max(v) > min(v) else 1.5
        ax.set_xlim(min(v) / pad, max(v) * pad)


def grid(nrows: int, ncols: int, *, w: float = 3.6, h: float = 2.9,
         sharey: bool | Literal["none", "all", "row", "col"] = True) -> tuple[Figure, Any]:
    """A figure of ``nrows x ncols`` panels (always a 2-D array of axes), sized per panel, laid out
    by matplotlib's constrained layout (room for the title and the legend outside)."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(4.5, w * ncols), h * nrows + 0.5), squeeze=False,
                             sharey=sharey, layout="constrained")
    return fig, axes


_SECTION = "apcsim-legend-section"


def finish(fig: Figure, title: str, handles: Sequence[Artist], ncol: int | None = None) -> Figure:
    """Title and one compact legend outside the panels, on the right (``ncol`` columns, default 1;
    :func:`section` entries in bold); the figure is widened by the legend's width, so the panels
    keep theirs. Returns the figure (saved by the caller)."""
    fig.suptitle(title, fontsize=12)
    w, h = fig.get_size_inches()
    _wrap_panel_titles(fig, w)
    if handles and ncol and ncol > 1:  # a legend in several columns goes below the panels, not beside
        fig.set_size_inches(max(w, 0.09 * len(title) + 0.4), h + 0.25 * math.ceil(len(handles) / ncol))
        fig.legend(handles=handles, loc="outside lower center", ncol=ncol, frameon=False, handlelength=2.6)
        return fig
    legend_w = 0.0
    if handles:
        ncol = ncol or 1
        longest = max(len(line) for h in handles for line in str(h.get_label()).splitlines())
        legend_w = ncol * (0.55 + 0.072 * longest)
    fig.set_size_inches(max(w + legend_w, 0.09 * len(title) + 0.4), h)  # the title fits too
    if handles:
        leg = fig.legend(handles=handles, loc="outside right center", ncol=ncol, frameon=False,
                         handlelength=2.6)
        for handle, text in zip(handles, leg.get_texts()):
            if handle.get_gid() == _SECTION:
                text.set_fontweight("bold")
    return fig


def _wrap_panel_titles(fig: Figure, width_in: float) -> None:
    """Wrap each panel's title to its panel's width (about 12 characters an inch at the title size),
    so that the titles of neighbouring panels never run into each other."""
    for ax in fig.axes:
        spec = ax.get_subplotspec()
        if spec is None or not ax.get_title():
            continue
        cols = spec.get_gridspec().ncols
        chars = max(12, int(width_in / cols * 12))
        lines = ax.get_title().splitlines()
        ax.title.set_text("\n".join(textwrap.fill(line, chars) for line in lines))  # keeps its font


def section(label: str) -> Artist:
    """A legend entry without a line: a bold heading for the entries after it."""
    return Line2D([], [], linestyle="none", label=label, gid=_SECTION)


def note(label: str) -> Artist:
    """A legend entry without a line: a remark on the entries before it."""
    return Line2D([], [], linestyle="none", label=label)


def style_handles(entries: Sequence[tuple[str, LineStyle, Any]]) -> list[Artist]:
    """Legend entries ``(label, line style, colour)``; solid lines get a marker."""
    return [Line2D([], [], color=c, linestyle=ls, lw=2.0 if ls == "-" else 1.4, label=label)
            for label, ls, c in entries]


def mark_handles(entries: Sequence[tuple[str, Any]]) -> list[Artist]:
    """Legend entries ``(label, colour)`` for the lines drawn with :func:`line_marks`, in order."""
    marks = line_marks(len(entries))
    return [Line2D([], [], color=c, linestyle="-", label=label, **m) for (label, c), m in zip(entries, marks)]


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


def draw_figures(builders: Mapping[str, Callable[[Any], Figure | None]], data: Any, folder: Path) -> list[Path]:
    """Build and save every figure of ``builders`` (file stem -> builder, which returns None when
    ``data`` lacks what its figure needs) into ``folder``; returns the files written, in order."""
    out: list[Path] = []
    for stem, build in builders.items():
        fig = build(data)
        if fig is not None:
            out.extend(save_figure(fig, folder, stem))
    return out
