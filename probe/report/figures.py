"""Figures of a report, drawn from ``analysis.json`` and ``attention_summary.npz`` (nothing is re-estimated).

Each ``draw_*`` function returns a matplotlib :class:`~matplotlib.figure.Figure` (no pyplot state, Agg canvas),
or None when the analysis holds nothing to draw for it.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from probe.types import CONDITIONS

COND_COLOURS = {"Control": "#4d4d4d", "LongControl": "#1b9e77", "Saturation": "#d95f02", "Residue": "#7570b3"}
TARGET_STYLES = ("-", "--", ":", "-.")


def _cells(analysis: dict, model: str, condition: str) -> list[dict]:
    return sorted((c for c in analysis["cells"] if c["model"] == model and c["condition"] == condition),
                  key=lambda c: c["load"])


def _err(cells: list[dict]) -> tuple[list[float], np.ndarray]:
    ys = [c["em_mean"] for c in cells]
    lo = [c["em_mean"] - c["em_ci_low"] if c["em_ci_low"] is not None else 0.0 for c in cells]
    hi = [c["em_ci_high"] - c["em_mean"] if c["em_ci_high"] is not None else 0.0 for c in cells]
    return ys, np.array([lo, hi])


def _grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(n, max_cols)
    return math.ceil(n / cols), cols


def _short(model: str) -> str:
    """A model name without its organisation (``run: org/name`` -> ``run: name``)."""
    prefix, sep, name = model.rpartition(": ")
    return f"{prefix}{sep}{name.split('/')[-1]}"


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0–2, 5, 7–8"`` (so that long layer lists stay short)."""
    if not values:
        return "none"
    out, start, prev = [], values[0], values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}–{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


def draw_saturation_curve(analysis: dict, taxonomy: dict[str, str]) -> Figure | None:
    """EM vs load per model: Saturation and Residue with 95 % CIs; Control (band) and LongControl as references."""
    models = [m for m in analysis["models"] if any(c["em_mean"] is not None for c in _cells(analysis, m, "Saturation"))]
    if not models:
        return None
    rows, cols = _grid(len(models))
    fig = Figure(figsize=(4.6 * cols, 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    h1 = {(h["model"], h["condition"]): h for h in analysis["h1"]}
    for ax, model in zip(axes.flat, models):
        control = [c for c in _cells(analysis, model, "Control") if c["em_mean"] is not None]
        loads_all = sorted({c["load"] for c in analysis["cells"] if c["model"] == model and c["load"] > 0})
        xmax = max(loads_all or [100]) + 10
        if control:
            c = control[0]
            ax.axhline(c["em_mean"], color=COND_COLOURS["Control"], lw=1.5, label="Control (load 0)")
            if c["em_ci_low"] is not None:
                ax.axhspan(c["em_ci_low"], c["em_ci_high"], color=COND_COLOURS["Control"], alpha=0.12, lw=0)
        for cond, marker, offset in (("Saturation", "o", -1.2), ("Residue", "s", 1.2), ("LongControl", "^", 0.0)):
            cells = [c for c in _cells(analysis, model, cond) if c["em_mean"] is not None]
            if not cells:
                continue
            xs = [c["load"] + offset for c in cells]
            ys, err = _err(cells)
            style = dict(color=COND_COLOURS[cond], marker=marker, capsize=3, lw=1.6 if cond != "LongControl" else 0)
            if cond == "LongControl":
                style.update(ls="none", mfc="white")
            ax.errorbar(xs, ys, yerr=err, label=cond, **style)
        slopes = []
        for cond, short in (("Saturation", "Sat"), ("Residue", "Res")):
            fit = h1.get((model, cond))
            if fit and fit.get("beta") is not None:
                slopes.append(f"{short} β={fit['beta']:+.4f}/pp (p={fit['p']:.2g})")
        title = f"{_short(model)}{taxonomy.get(model, '')}"
        ax.set_title(title + ("\n" + ", ".join(slopes) if slopes else ""), fontsize=9)
        ax.set_xlim(-5, xmax)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xticks([0, *loads_all])
        ax.set_xlabel("extraneous load (% of content tokens)")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("exact match (95% CI)")
    for ax in list(axes.flat)[len(models):]:
        ax.set_visible(False)
    handles: dict = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center", ncols=len(handles),
               fontsize=8)
    fig.suptitle("Saturation curve: EM vs load (Control band = its 95% CI)", fontsize=11)
    return fig


def draw_em_by_condition(analysis: dict, taxonomy: dict[str, str]) -> Figure | None:
    """Grouped bars: EM (95 % CI) for every condition × load, one bar per model."""
    keys = sorted({(c["condition"], c["load"]) for c in analysis["cells"]},
                  key=lambda k: (CONDITIONS.index(k[0]) if k[0] in CONDITIONS else 99, k[1]))
    models = analysis["models"]
    if not keys or not models:
        return None
    by = {(c["model"], c["condition"], c["load"]): c for c in analysis["cells"]}
    width = 0.8 / len(models)
    width_in = min(18.0, max(6.0, 0.25 * len(keys) * len(models) + 2))
    fig = Figure(figsize=(width_in, 4.6 + 0.25 * math.ceil(len(models) / 4)), layout="constrained")
    ax = fig.subplots()
    cmap = _palette(len(models))
    handles = []
    top = 1.0
    for i, model in enumerate(models):
        xs, ys, lo, hi, missing = [], [], [], [], []
        for j, (cond, load) in enumerate(keys):
            c = by.get((model, cond, load))
            x = j - 0.4 + width * (i + 0.5)
            if c is None or c["em_mean"] is None:
                missing.append(x)
                continue
            xs.append(x)
            ys.append(c["em_mean"])
            lo.append(c["em_mean"] - (c["em_ci_low"] if c["em_ci_low"] is not None else c["em_mean"]))
            hi.append((c["em_ci_high"] if c["em_ci_high"] is not None else c["em_mean"]) - c["em_mean"])
            top = max(top, c["em_mean"] + hi[-1])
        if xs:
            ax.bar(xs, ys, width=width * 0.95, color=cmap[i], yerr=np.array([lo, hi]), capsize=2,
                   error_kw={"lw": 0.8})
        if missing:
            ax.scatter(missing, [0.02] * len(missing), marker="x", color=cmap[i], s=18)
        handles.append(Patch(color=cmap[i], label=f"{_short(model)}{taxonomy.get(model, '')}"))
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([c if c == "Control" else f"{c}\n{ld}%" for c, ld in keys], fontsize=8)
    ax.set_ylim(0, top + 0.05)
    ax.set_ylabel("exact match (95% CI)")
    ax.set_title("EM by condition and load (x: no scored trial)", fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(models), 4), fontsize=8)
    return fig


def _palette(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _layer_ticks(ax, n_layers: int) -> None:
    ax.yaxis.set_major_locator(MaxNLocator(nbins=min(n_layers, 12), integer=True))


def draw_enrichment_heatmaps(analysis: dict, arrays: dict[str, np.ndarray], model: str) -> Figure | None:
    """Layer × head P_ext enrichment (P_ext / chance) per condition and load; diverging, centred at 1."""
    cells = [c for c in analysis.get("attention_cells", []) if c["model"] == model and c.get("enrichment")
             and np.isfinite(arrays[c["enrichment"]]).any()]
    if not cells:
        return None
    conds = [c for c in CONDITIONS if any(x["condition"] == c for x in cells)]
    loads = sorted({c["load"] for c in cells})
    mats = [arrays[c["enrichment"]] for c in cells]
    finite = np.concatenate([m[np.isfinite(m)] for m in mats])
    lo, hi = np.percentile(finite, [1, 99])
    lo, hi = min(lo, 0.95), max(hi, 1.05)
    norm = TwoSlopeNorm(vmin=lo, vcenter=1.0, vmax=hi)
    n_layers, n_heads = mats[0].shape
    panel_h = min(7.0, max(2.6, 0.12 * n_layers + 1.2))
    panel_w = min(5.0, max(2.2, 0.12 * n_heads + 1.4))
    fig = Figure(figsize=(panel_w * len(loads) + 1.2, panel_h * len(conds)), layout="constrained")
    axes = fig.subplots(len(conds), len(loads), squeeze=False)
    image = None
    for i, cond in enumerate(conds):
        for j, load in enumerate(loads):
            ax = axes[i, j]
            cell = next((c for c in cells if c["condition"] == cond and c["load"] == load), None)
            if cell is None:
                ax.set_visible(False)
                continue
            mat = arrays[cell["enrichment"]]
            image = ax.imshow(mat, aspect="auto", cmap="RdBu_r", norm=norm, origin="lower", interpolation="nearest")
            ax.set_title(f"{cond} {load}% (n={cell['n_prompts']})", fontsize=9)
            _layer_ticks(ax, n_layers)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=min(n_heads, 8), integer=True))
            if j == 0:
                ax.set_ylabel("layer")
            if i == len(conds) - 1:
                ax.set_xlabel("head")
    if image is not None:
        cbar = fig.colorbar(image, ax=axes, shrink=0.8)
        cbar.set_label("P_ext / chance (1 = uniform over tokens)")
    fig.suptitle(f"{_short(model)}: attention to extraneous text relative to chance", fontsize=11)
    return fig


def draw_p_ext_layers(analysis: dict, arrays: dict[str, np.ndarray], model: str) -> Figure | None:
    """Head-mean P_ext per layer for each condition × load, with the chance level dashed."""
    cells = [c for c in analysis.get("attention_cells", []) if c["model"] == model and c.get("p_ext")
             and c["condition"] in ("Saturation", "Residue")]
    if not cells:
        return None
    loads = sorted({c["load"] for c in cells})
    fig = Figure(figsize=(4.2 * len(loads), 3.6), layout="constrained")
    axes = fig.subplots(1, len(loads), squeeze=False, sharey=True)[0]
    for ax, load in zip(axes, loads):
        for cell in (c for c in cells if c["load"] == load):
            with np.errstate(all="ignore"):
                curve = np.nanmean(arrays[cell["p_ext"]], axis=1)
            layers = np.arange(len(curve))
            colour = COND_COLOURS.get(cell["condition"], "k")
            ax.plot(layers, curve, color=colour, marker=".", label=f"{cell['condition']} P_ext")
            ax.plot(layers, arrays[cell["chance"]], color=colour, ls="--", lw=1, label=f"{cell['condition']} chance")
        ax.set_title(f"load {load}%", fontsize=10)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("head-mean P_ext")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{_short(model)}: share of (non-sink) attention on extraneous text, by layer", fontsize=11)
    return fig


def draw_ar_k(analysis: dict, arrays: dict[str, np.ndarray], model: str) -> Figure | None:
    """Head-mean AR_k by layer for each target segment, Residue (solid) vs Saturation (dashed), per load."""
    cells = [c for c in analysis.get("attention_cells", []) if c["model"] == model and c.get("ar_k")
             and c["condition"] in ("Saturation", "Residue")]
    if not cells:
        return None
    loads = sorted({c["load"] for c in cells})
    targets: list[str] = []
    for c in cells:
        targets += [t for t in c["ar_targets"] if t not in targets]
    palette = dict(zip(targets, _palette(len(targets))))
    fig = Figure(figsize=(4.2 * len(loads), 3.6), layout="constrained")
    axes = fig.subplots(1, len(loads), squeeze=False, sharey=True)[0]
    for ax, load in zip(axes, loads):
        for cell in (c for c in cells if c["load"] == load):
            mat = arrays[cell["ar_k"]]  # (layer, target)
            ls = "-" if cell["condition"] == "Residue" else "--"
            for j, t in enumerate(cell["ar_targets"]):
                ax.plot(np.arange(mat.shape[0]), mat[:, j], ls=ls, color=palette[t], label=f"{cell['condition']}: {t}")
        ax.set_title(f"load {load}%", fontsize=10)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("AR_k (head mean)")
    axes[-1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{_short(model)}: attentional residue per target segment (solid Residue, dashed Saturation)",
                 fontsize=11)
    return fig


def draw_h3_scatter(analysis: dict, taxonomy: dict[str, str]) -> Figure | None:
    """S_sim vs degradation per question (pooled over loads), least-squares line and Pearson r, per model."""
    rows = [h for h in analysis["h3"] if h["load"] is None and h["points"]]
    if not rows:
        return None
    r_, c_ = _grid(len(rows))
    fig = Figure(figsize=(max(5.6, 4.4 * c_), 3.8 * r_), layout="constrained")
    axes = fig.subplots(r_, c_, squeeze=False)
    for ax, h in zip(axes.flat, rows):
        xs = np.array([p["s_sim"] for p in h["points"]])
        ys = np.array([p["degradation"] for p in h["points"]])
        ax.scatter(xs, ys, s=16, alpha=0.7, color=COND_COLOURS["Residue"])
        if h["slope"] is not None:
            grid = np.linspace(xs.min(), xs.max(), 50)
            ax.plot(grid, h["intercept"] + h["slope"] * grid, color="k", lw=1.2)
        if h["r"] is not None:
            ci = "" if h["ci_low"] is None else f" [{h['ci_low']:+.2f}, {h['ci_high']:+.2f}]"
            text = f"r = {h['r']:+.2f}{ci}\np = {h['p']:.3g}, n = {h['n_tasks']}"
        else:
            text = f"no r: {h['reason']}"
        ax.text(0.02, 0.98, text, transform=ax.transAxes, va="top", fontsize=8,
                bbox={"facecolor": "white", "alpha": 0.8, "lw": 0})
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("S_sim (question vs mean extraneous embedding)")
        ax.set_ylabel("degradation EM(Control) − EM(Residue)")
        ax.set_title(f"{_short(h['model'])}{taxonomy.get(h['model'], '')}", fontsize=10)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(rows):]:
        ax.set_visible(False)
    fig.suptitle("H3: similarity vs degradation, one point per question", fontsize=11)
    return fig


def draw_attention_behaviour(analysis: dict) -> Figure | None:
    """Per-layer log-odds of a wrong answer per unit head-mean P_ext (95 % CI), alone and adjusted for load."""
    rows = [a for a in analysis.get("attention_behaviour", []) if any(r["coef"] is not None for r in a["layers"])]
    if not rows:
        return None
    fig = Figure(figsize=(max(6.0, 0.2 * max(len(a["layers"]) for a in rows) + 3), 3.4 * len(rows)),
                 layout="constrained")
    axes = fig.subplots(len(rows), 1, squeeze=False)[:, 0]
    for ax, a in zip(axes, rows):
        for key, shift, marker, tracking in (
            (None, -0.15, "o", set(a["tracking_layers"])),
            ("adjusted", 0.15, "s", set(a.get("tracking_layers_adjusted", []))),
        ):
            fits = [(r["layer"], r if key is None else (r.get(key) or {})) for r in a["layers"]]
            fits = [(layer, f) for layer, f in fits if f.get("coef") is not None]
            if not fits:
                continue
            xs = np.array([layer for layer, _ in fits]) + shift
            coef = np.array([f["coef"] for _, f in fits])
            err = np.array([[f["coef"] - f["ci_low"] for _, f in fits], [f["ci_high"] - f["coef"] for _, f in fits]])
            colours = ["#d95f02" if layer in tracking else "#4d4d4d" for layer, _ in fits]
            ax.errorbar(xs, coef, yerr=err, fmt="none", ecolor="#aaaaaa", capsize=2)
            ax.scatter(xs, coef, c=colours, marker=marker, zorder=3, s=20)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xlabel("layer")
        ax.set_ylabel("log-odds wrong per unit P_ext")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=16, integer=True))
        named = _ranges(a["tracking_layers"])
        adj = _ranges(a.get("tracking_layers_adjusted", []))
        ax.set_title(f"{_short(a['model'])}: layers tracking failure (orange, Holm p<α): {named}; "
                     f"with load and placement fixed: {adj}", fontsize=9)
        ax.legend(handles=[
            Line2D([], [], ls="none", marker="o", color="#4d4d4d", label="P_ext alone"),
            Line2D([], [], ls="none", marker="s", color="#4d4d4d", label="adjusted for load and placement"),
            Line2D([], [], ls="none", marker="o", color="#d95f02", label="Holm-adjusted p < α"),
        ], fontsize=7, loc="best")
        ax.grid(alpha=0.3)
    return fig


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
    ax.set_yticklabels([_short(r[0]) for r in reversed(rows)], fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=11)
    ax.grid(axis="x", alpha=0.3)
    return fig
