"""Plotting helpers shared by the report sections (no figure of a family here; see :mod:`probe.report.ice_figures`
and :mod:`probe.report.cogniload_figures`).

Every figure is a matplotlib :class:`~matplotlib.figure.Figure` (no pyplot state, Agg canvas); a ``draw_*`` function
returns None when there is nothing to draw. Numbers written on figures go through :mod:`probe.formatting`.
"""

from __future__ import annotations

import math

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    """(rows, columns) of a panel grid for ``n`` panels, at most ``max_cols`` wide."""
    cols = min(n, max_cols)
    return math.ceil(n / cols), cols


def short(model: str) -> str:
    """A model name without its organisation (``run: org/name`` -> ``run: name``)."""
    prefix, sep, name = model.rpartition(": ")
    return f"{prefix}{sep}{name.split('/')[-1]}"


def file_stem(name: str) -> str:
    """A figure file stem for a model name: letters, digits and ``-_.`` kept, anything else ``_``."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def ranges(values: list[int] | tuple[int, ...]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0–2, 5, 7–8"`` (so that long layer lists stay short)."""
    if not values:
        return "none"
    values = list(values)
    out, start, prev = [], values[0], values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}–{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


def palette(n: int) -> list:
    """``n`` distinct colours (tab10, or tab20 beyond ten)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def layer_ticks(ax: Axes, n_layers: int) -> None:
    """At most 12 integer layer ticks on the y axis."""
    ax.yaxis.set_major_locator(MaxNLocator(nbins=min(n_layers, 12), integer=True))


def draw_forest(rows: list[tuple[str, float | None, float | None, float | None]], xlabel: str, title: str,
                ref: float = 0.0) -> Figure | None:
    """A forest plot: one (label, estimate, ci_low, ci_high) row per line; rows without an estimate are listed."""
    if not any(r[1] is not None for r in rows):
        return None
    fig = Figure(figsize=(6.5, 0.45 * len(rows) + 1.4), layout="constrained")
    ax = fig.subplots()
    for i, (label, est, lo, hi) in enumerate(rows):
        y = len(rows) - 1 - i
        if est is None:
            ax.text(ref, y, "no estimate", va="center", ha="center", fontsize=8, color="grey")
            continue
        ax.plot([lo if lo is not None else est, hi if hi is not None else est], [y, y], color="#4d4d4d")
        ax.plot([est], [y], "o", color="#d95f02")
    ax.axvline(ref, color="k", lw=0.8, ls="--")
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([short(r[0]) for r in reversed(rows)], fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=11)
    ax.grid(axis="x", alpha=0.3)
    return fig


__all__ = ["draw_forest", "file_stem", "grid", "layer_ticks", "palette", "ranges", "short"]
