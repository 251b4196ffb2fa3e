"""The ICE section's figures, drawn from an :class:`probe.analysis.ice.IceResult` and the arrays its results hold
(nothing is re-estimated)."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from probe import formatting as fmt
from probe.analysis.attention_link import AttentionBehaviour, LayerFit, LayerTest, LayerTests, MeasureLogit
from probe.analysis.estimates import Cell
from probe.analysis.ice import IceResult
from probe.report.figures import grid, layer_ticks, palette, ranges, short
from probe.types import CONDITIONS

COND_COLOURS = {"Control": "#4d4d4d", "LongControl": "#1b9e77", "Saturation": "#d95f02", "Residue": "#7570b3"}


def condition_order(key: tuple[str, int]) -> tuple[int, int]:
    """Sort key of (condition, load): the paper's condition order, then load."""
    return (CONDITIONS.index(key[0]) if key[0] in CONDITIONS else 99, key[1])


def _cells(result: IceResult, model: str, condition: str) -> list[Cell]:
    return sorted((c for c in result.cells if c.model == model and c.condition == condition),
                  key=lambda c: c.load or 0)


def _err(cells: list[Cell]) -> tuple[list[float], np.ndarray]:
    ys = [c.em_mean for c in cells]
    lo = [c.em_mean - c.em_ci_low if c.em_ci_low is not None else 0.0 for c in cells]  # type: ignore[operator]
    hi = [c.em_ci_high - c.em_mean if c.em_ci_high is not None else 0.0 for c in cells]  # type: ignore[operator]
    return ys, np.array([lo, hi])  # type: ignore[return-value]


def draw_saturation_curve(result: IceResult, taxonomy: Mapping[str, str]) -> Figure | None:
    """EM vs load per model: Saturation and Residue with 95 % CIs; Control (band) and LongControl as references."""
    models = [m for m in result.models if any(c.em_mean is not None for c in _cells(result, m, "Saturation"))]
    if not models:
        return None
    rows, cols = grid(len(models))
    fig = Figure(figsize=(4.6 * cols, 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    for ax, model in zip(axes.flat, models):
        control = [c for c in _cells(result, model, "Control") if c.em_mean is not None]
        loads_all = sorted({c.load for c in result.cells if c.model == model and c.load})
        xmax = max(loads_all or [100]) + 10
        if control:
            c = control[0]
            ax.axhline(c.em_mean, color=COND_COLOURS["Control"], lw=1.5, label="Control (load 0)")
            if c.em_ci_low is not None:
                ax.axhspan(c.em_ci_low, c.em_ci_high, color=COND_COLOURS["Control"], alpha=0.12, lw=0)
        # three conditions side by side at each load (3 % of the load axis apart) so that no marker hides another;
        # LongControl is drawn unconnected but with its interval lines (elinewidth), on top
        spread = 0.03 * xmax
        for cond, marker, offset in (("Saturation", "o", -spread), ("Residue", "s", spread), ("LongControl", "^", 0.0)):
            cells = [c for c in _cells(result, model, cond) if c.em_mean is not None]
            if not cells:
                continue
            xs = [(c.load or 0) + offset for c in cells]
            ys, err = _err(cells)
            style = dict(color=COND_COLOURS[cond], marker=marker, capsize=3, lw=1.6, elinewidth=1.2)
            if cond == "LongControl":
                style.update(ls="none", mfc="white", mew=1.4, zorder=4)
            ax.errorbar(xs, ys, yerr=err, label=cond, **style)
        slopes = []
        for cond, abbr in (("Saturation", "Sat"), ("Residue", "Res")):
            fit = result.h1_of(model, cond)
            if fit is not None and fit.estimate.value is not None:
                test = f"p={fmt.num(fit.estimate.p, '.2g')}" if fit.estimate.is_test else "not tested"
                slopes.append(f"{abbr} β={fmt.num(fit.estimate.value, '+.4f')}/pp ({test})")
        title = f"{short(model)}{taxonomy.get(model, '')}"
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


def draw_em_by_condition(result: IceResult, taxonomy: Mapping[str, str]) -> Figure | None:
    """Grouped bars: EM (95 % CI) for every condition × load, one bar per model; the axis is [0, 1].

    Tick labels carry the load only; each condition's name is written once, centred under its group, and the groups
    are separated by thin lines, so that labels never overlap however many loads there are.
    """
    keys = sorted({(c.condition, c.load or 0) for c in result.cells}, key=condition_order)
    models = result.models
    if not keys or not models:
        return None
    by = {(c.model, c.condition, c.load or 0): c for c in result.cells}
    width = 0.8 / len(models)
    slot = max(0.55, 0.22 * len(models) + 0.3)  # inches per condition × load
    fig = Figure(figsize=(min(18.0, max(6.5, slot * len(keys) + 1.6)), 4.4 + 0.25 * math.ceil(len(models) / 4)),
                 layout="constrained")
    ax = fig.subplots()
    cmap = palette(len(models))
    handles = []
    no_trial = False  # a model with no trial in a cell, e.g. a comparison of runs whose designs differ
    for i, model in enumerate(models):
        xs, ys, lo, hi, missing = [], [], [], [], []
        for j, (cond, load) in enumerate(keys):
            c = by.get((model, cond, load))
            x = j - 0.4 + width * (i + 0.5)
            if c is None:
                no_trial = True
                continue
            if c.em_mean is None:
                missing.append(x)
                continue
            xs.append(x)
            ys.append(c.em_mean)
            lo.append(c.em_mean - (c.em_ci_low if c.em_ci_low is not None else c.em_mean))
            hi.append((c.em_ci_high if c.em_ci_high is not None else c.em_mean) - c.em_mean)
        if xs:
            ax.bar(xs, ys, width=width * 0.95, color=cmap[i], yerr=np.array([lo, hi]), capsize=2,
                   error_kw={"lw": 0.8})
        if missing:
            ax.scatter(missing, [0.02] * len(missing), marker="x", color=cmap[i], s=18)
        handles.append(Patch(color=cmap[i], label=f"{short(model)}{taxonomy.get(model, '')}"))
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels(["" if c == "Control" else f"{ld}%" for c, ld in keys], fontsize=8)
    ax.set_xlim(-0.6, len(keys) - 0.4)
    groups: dict[str, list[int]] = {}
    for j, (cond, _) in enumerate(keys):
        groups.setdefault(cond, []).append(j)
    for g, (cond, idx) in enumerate(groups.items()):
        ax.annotate(cond, xy=((min(idx) + max(idx)) / 2, 0), xycoords=("data", "axes fraction"),
                    xytext=(0, -18 if cond != "Control" else -6), textcoords="offset points", ha="center", va="top",
                    fontsize=9, color=COND_COLOURS.get(cond, "k"), fontweight="bold")
        if g:
            ax.axvline(min(idx) - 0.5, color="#bbbbbb", lw=0.8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("exact match (95% CI)")
    ax.set_title("EM by condition and load (x: no scored trial" + ("; empty slot: no trial, e.g. not in that run's "
                                                                    "design)" if no_trial else ")"), fontsize=11,
                 wrap=True)
    ax.grid(axis="y", alpha=0.3)
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(models), 4), fontsize=8)
    return fig


def draw_enrichment_heatmaps(result: IceResult, model: str,
                             behaviour: AttentionBehaviour | None = None, alpha: float = 0.05,
                             measure: str = "p_ext") -> Figure | None:
    """Layer × head enrichment of a measure (P_ext / chance) per condition and load; diverging, centred at 1.

    Heads whose failed − correct enrichment test passes Benjamini–Hochberg over the grid (``behaviour.heads``,
    q < ``alpha``) are outlined in black on every panel (the test pools the Saturation and Residue trials).
    """
    cells = [c for c in result.attention_cells if c.model == model and c.measure == measure
             and c.enrichment is not None and np.isfinite(c.enrichment.values).any()]
    if not cells:
        return None
    label = cells[0].label
    conds = [c for c in CONDITIONS if any(x.condition == c for x in cells)]
    loads = sorted({c.load for c in cells})
    mats = [c.enrichment.values for c in cells if c.enrichment is not None]
    finite = np.concatenate([m[np.isfinite(m)] for m in mats])
    lo, hi = np.percentile(finite, [1, 99])
    lo, hi = min(lo, 0.95), max(hi, 1.05)
    norm = TwoSlopeNorm(vmin=lo, vcenter=1.0, vmax=hi)
    n_layers, n_heads = mats[0].shape
    outlined = [h for h in (behaviour.heads.significant if behaviour is not None and behaviour.heads is not None
                            else ()) if h.q < alpha]
    panel_h = min(7.0, max(2.6, 0.12 * n_layers + 1.2))
    panel_w = min(5.0, max(2.2, 0.12 * n_heads + 1.4))
    fig = Figure(figsize=(panel_w * len(loads) + 1.2, panel_h * len(conds)), layout="constrained")
    axes = fig.subplots(len(conds), len(loads), squeeze=False)
    image = None
    for i, cond in enumerate(conds):
        for j, load in enumerate(loads):
            ax = axes[i, j]
            cell = next((c for c in cells if c.condition == cond and c.load == load), None)
            if cell is None:
                ax.set_visible(False)
                continue
            assert cell.enrichment is not None
            mat = cell.enrichment.values
            image = ax.imshow(mat, aspect="auto", cmap="RdBu_r", norm=norm, origin="lower", interpolation="nearest")
            for hit in outlined:
                ax.add_patch(Rectangle((hit.head - 0.5, hit.layer - 0.5), 1, 1, fill=False, edgecolor="black",
                                       lw=1.3))
            ax.set_title(f"{cond} {load}% (n={cell.n_prompts})", fontsize=9)
            layer_ticks(ax, n_layers)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=min(n_heads, 8), integer=True))
            if j == 0:
                ax.set_ylabel("layer")
            if i == len(conds) - 1:
                ax.set_xlabel("head")
    if image is not None:
        cbar = fig.colorbar(image, ax=axes, shrink=0.8)
        cbar.set_label(f"{label} / chance (1 = uniform over tokens)")
    boxed = (f"\nboxed: {len(outlined)} head(s) whose enrichment differs between failed and correct trials "
             f"(q < {alpha:g})" if outlined
             else "\nno head's enrichment differs between failed and correct trials after correction"
             if behaviour is not None and behaviour.heads is not None and behaviour.heads.is_test else "")
    what = "attention to extraneous text" if measure == "p_ext" else label
    fig.suptitle(f"{short(model)}: {what} relative to chance{boxed}", fontsize=10, wrap=True)
    return fig


def draw_measure_layers(result: IceResult, model: str,
                        measure: str = "p_ext") -> Figure | None:
    """Head-mean value of a (layer, head) measure (P_ext) per layer for each condition × load, with its chance level
    dashed where it has one."""
    cells = [c for c in result.attention_cells if c.model == model and c.measure == measure
             and c.condition in ("Saturation", "Residue")]
    if not cells:
        return None
    label = cells[0].label
    loads = sorted({c.load for c in cells})
    # one panel per load, wide enough for the figure title when there is a single load
    fig = Figure(figsize=(max(6.4, 4.2 * len(loads)), 3.6), layout="constrained")
    axes = fig.subplots(1, len(loads), squeeze=False, sharey=True)[0]
    absent: set[int] | None = None
    for ax, load in zip(axes, loads):
        for cell in (c for c in cells if c.load == load):
            values = np.asarray(cell.values.values, dtype=float)
            has = np.isfinite(values).any(axis=1)
            curve = np.full(len(values), np.nan)
            curve[has] = np.nanmean(values[has], axis=1)
            empty = set(np.flatnonzero(~has).tolist())
            absent = empty if absent is None else absent & empty
            layers = np.arange(len(curve))
            colour = COND_COLOURS.get(cell.condition, "k")
            ax.plot(layers, curve, color=colour, marker=".", label=f"{cell.condition} {label}")
            if cell.chance is not None:
                ax.plot(layers, cell.chance.values, color=colour, ls="--", lw=1,
                        label=f"{cell.condition} chance")
        ax.set_title(f"load {load}%", fontsize=10)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"head-mean {label}")
    axes[0].legend(fontsize=7)
    what = "share of (non-sink) attention on extraneous text" if measure == "p_ext" else f"head-mean {label}"
    fig.suptitle(f"{short(model)}: {what}, by layer{no_attention_note(absent)}", fontsize=11, wrap=True)
    return fig


def no_attention_note(layers: set[int] | None) -> str:
    """``; layers 0-3, 5 have no attention (not measured)`` for a hybrid model's layers without attention, else ``""``
    (docs/probes.md#architectures)."""
    if not layers:
        return ""
    return f"; {fmt.layers_have(sorted(layers))} no attention (not measured)"


def draw_ar_k(result: IceResult, model: str) -> Figure | None:
    """Head-mean AR_k by layer for each target segment, Residue (solid) vs Saturation (dashed), per load."""
    cells = [c for c in result.attention_cells if c.model == model and c.measure == "ar_k"
             and c.condition in ("Saturation", "Residue")]
    if not cells:
        return None
    loads = sorted({c.load for c in cells})
    targets: list[str] = []
    for c in cells:
        targets += [t for t in c.targets if t not in targets]
    colours = dict(zip(targets, palette(len(targets))))
    # one panel per load, wide enough for the figure title when there is a single load
    fig = Figure(figsize=(max(6.4, 4.2 * len(loads)), 4.2), layout="constrained")
    axes = fig.subplots(1, len(loads), squeeze=False, sharey=True)[0]
    handles: dict = {}
    for ax, load in zip(axes, loads):
        counts = []
        for cell in (c for c in cells if c.load == load):
            mat = cell.values.values  # (layer, target)
            ls = "-" if cell.condition == "Residue" else "--"
            for j, t in enumerate(cell.targets):
                (ln,) = ax.plot(np.arange(mat.shape[0]), mat[:, j], ls=ls, color=colours[t])
                handles.setdefault(f"{cell.condition}: {t}", ln)
            counts.append(f"{cell.condition} {cell.n_prompts}")
        # how many prompts each line averages, per panel (the cells of one load)
        ax.set_title(f"load {load}%: mean over prompts ({', '.join(counts)})", fontsize=9, wrap=True)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("AR_k (head mean)")
    # below the panels, never over the curves
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", fontsize=7,
               ncol=min(len(handles), 3), frameon=False)
    fig.suptitle(f"{short(model)}: attentional residue per target segment (solid Residue, dashed Saturation)",
                 fontsize=11, wrap=True)
    return fig


def draw_h3_scatter(result: IceResult, taxonomy: Mapping[str, str]) -> Figure | None:
    """S_sim vs degradation per question (pooled over loads), least-squares line and Pearson r, per model."""
    rows = [h for h in result.h3 if h.load is None and h.points]
    if not rows:
        return None
    r_, c_ = grid(len(rows))
    fig = Figure(figsize=(max(5.6, 4.4 * c_), 3.8 * r_), layout="constrained")
    axes = fig.subplots(r_, c_, squeeze=False)
    for ax, h in zip(axes.flat, rows):
        xs = np.array([p.s_sim for p in h.points])
        ys = np.array([p.degradation for p in h.points])
        ax.scatter(xs, ys, s=16, alpha=0.7, color=COND_COLOURS["Residue"])
        c = h.correlation
        e = c.estimate
        if c.slope is not None and c.intercept is not None:
            line = np.linspace(xs.min(), xs.max(), 50)
            ax.plot(line, c.intercept + c.slope * line, color="k", lw=1.2)
        if e.value is not None:
            ci = "" if e.ci_low is None else f" {fmt.ci(e.ci_low, e.ci_high, '+.2f')}"
            text = (f"r = {fmt.num(e.value, '+.2f')}{ci}, p = {fmt.num(e.p, '.3g')}, q = {fmt.num(e.q, '.3g')}, "
                    f"n = {c.n}" if e.is_test
                    else f"r = {fmt.num(e.value, '+.2f')}, n = {c.n}: described only, not tested")
        else:
            text = f"no r: {e.reason}"
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("S_sim (question vs mean extraneous embedding)")
        ax.set_ylabel("degradation EM(Control) − EM(Residue)")
        # the r / p line sits in the title, outside the data, so it can never cover a point
        ax.set_title(f"{short(h.model)}{taxonomy.get(h.model, '')}\n{text}", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(rows):]:
        ax.set_visible(False)
    fig.suptitle("H3: similarity vs degradation, one point per question", fontsize=11)
    return fig


def _layer_series(ax: Axes, tests: LayerTests, alpha: float, shift: float, marker: str, label: str) -> bool:
    """Per-layer estimates with 95 % CIs on ``ax``; filled orange where q < alpha. Returns whether anything was drawn."""
    drawn = [t for t in tests.layers if t.estimate.value is not None]
    if not drawn:
        return False
    xs = np.array([t.layer for t in drawn], dtype=float) + shift
    est = np.array([t.estimate.value for t in drawn], dtype=float)
    with_ci = [i for i, t in enumerate(drawn) if t.estimate.ci_low is not None and t.estimate.ci_high is not None]
    if with_ci:
        lo = np.array([np.nan if (v := drawn[i].estimate.ci_low) is None else v for i in with_ci], dtype=float)
        hi = np.array([np.nan if (v := drawn[i].estimate.ci_high) is None else v for i in with_ci], dtype=float)
        err = np.array([est[with_ci] - lo, hi - est[with_ci]])
        ax.errorbar(xs[with_ci], est[with_ci], yerr=err, fmt="none", ecolor="#aaaaaa", capsize=2)
    sig = np.array([t.estimate.q is not None and t.estimate.q < alpha for t in drawn])
    ax.scatter(xs[~sig], est[~sig], marker=marker, zorder=3, s=22, facecolors="white", edgecolors="#4d4d4d",
               label=label)
    if sig.any():
        ax.scatter(xs[sig], est[sig], marker=marker, zorder=4, s=30, color="#d95f02")
    return True


def draw_residue_attention(result: IceResult, alpha: float = 0.05) -> Figure | None:
    """H3 in attention: per layer the slope of head-mean AR_k on S_sim with 95 % CI, one panel per model, the two
    targets side by side; filled orange where q < alpha (BH across layers)."""
    models = [m for m in result.models
              if any(r.test is not None and any(t.estimate.value is not None for t in r.test.layers)
                     for r in result.residue_attention_of(m))]
    if not models:
        return None
    n_layers = max(len(r.test.layers) for m in models for r in result.residue_attention_of(m) if r.test is not None)
    fig = Figure(figsize=(max(6.5, 0.22 * n_layers + 3), 3.3 * len(models)), layout="constrained")
    axes = fig.subplots(len(models), 1, squeeze=False)[:, 0]
    for ax, model in zip(axes, models):
        notes = []
        for r, (shift, marker) in zip(result.residue_attention_of(model), ((-0.15, "o"), (0.15, "s"))):
            if r.test is None:
                notes.append(f"{r.target}: {r.reason}")
                continue
            _layer_series(ax, r.test, alpha, shift, marker, f"{r.target} target ({r.n_prompts} prompts)")
            hits = [t.layer for t in r.test.layers if t.estimate.q is not None and t.estimate.q < alpha]
            notes.append(f"{r.target}: q<{alpha:g} in {ranges(hits)}" if r.test.is_test
                         else f"{r.target}: not tested ({r.test.reason.split(':')[0] if r.test.reason else ''})")
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xlabel("layer")
        ax.set_ylabel("ΔAR_k per unit S_sim")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=16, integer=True))
        ax.set_title(f"{short(model)}: " + "; ".join(notes), fontsize=9, wrap=True)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
    fig.suptitle("H3 in attention: does residue grow with similarity? (orange: q < α over layers)", fontsize=11)
    return fig


def draw_attention_behaviour(result: IceResult, alpha: float = 0.05) -> Figure | None:
    """Per model and linked measure, top: the per-layer failed − correct difference of the head-mean measure (P_ext;
    95 % CI, the test); bottom: the logistic robustness line (log-odds of a wrong answer per unit of it, adjusted for
    load and placement; the unadjusted fit, confounded by load, only where nothing could be adjusted, and then
    labelled so). Orange: q < alpha after BH across the layers."""
    rows = [a for a in result.attention_behaviour if a.layer_tests is not None]
    if not rows:
        return None
    n_layers = max(len(a.layer_tests.layers) for a in rows if a.layer_tests is not None)
    fig = Figure(figsize=(max(6.5, 0.22 * n_layers + 3), 5.6 * len(rows)), layout="constrained")
    axes = fig.subplots(2 * len(rows), 1, squeeze=False)[:, 0]
    for k, a in enumerate(rows):
        top, bottom = axes[2 * k], axes[2 * k + 1]
        assert a.layer_tests is not None
        _layer_series(top, a.layer_tests, alpha, 0.0, "o", "failed − correct")
        top.axhline(0, color="k", lw=0.8)
        top.set_ylabel(f"Δ head-mean {a.label}\n(failed − correct)")
        what = (f"layers with q<{alpha:g}: {ranges(list(a.layer_tests.significant))}" if a.layer_tests.is_test
                else f"not tested: {a.layer_tests.reason}")
        top.set_title(f"{short(a.model)}: {a.label} in failed vs correct trials at equal load and placement; {what}",
                      fontsize=9, wrap=True)
        # only the load-adjusted fit: without the adjustment the fit is confounded by load (it named a layer in
        # 29 % of no-effect studies at G = 20); where no fit could be adjusted (one load, one placement) the
        # unadjusted one is drawn and labelled so
        adjusted = any(r.adjusted is not None for r in a.layers)
        fits = [(r.layer, r.adjusted if adjusted else r) for r in a.layers]
        tests = LayerTests(measure="", estimand="", n=0, n_questions=0, is_test=True, method="", reason=None,
                           layers=tuple(_as_layer_test(layer, f) for layer, f in fits if f is not None),
                           significant=())
        label = ("adjusted for load and placement" if adjusted
                 else "NOT adjusted for load (one load and placement only)")
        _layer_series(bottom, tests, alpha, 0.0, "s" if adjusted else "o", label)
        bottom.axhline(0, color="k", lw=0.8)
        bottom.set_ylabel(f"log-odds wrong\nper unit {a.label}")
        hits = a.logit_layers_adjusted if adjusted else a.logit_layers
        bottom.set_title(f"logistic robustness line, {label}: q<{alpha:g} in {ranges(hits)}", fontsize=9)
        if bottom.get_legend_handles_labels()[0]:
            bottom.legend(fontsize=7, loc="best")
        for ax in (top, bottom):
            ax.set_xlabel("layer")
            ax.xaxis.set_major_locator(MaxNLocator(nbins=16, integer=True))
            ax.grid(alpha=0.3)
    return fig


def _as_layer_test(layer: int, f: LayerFit | MeasureLogit) -> LayerTest:
    """A logistic fit as a :class:`LayerTest` (for drawing with :func:`_layer_series`)."""
    return LayerTest(layer=layer, n=0, estimate=(f.fit if isinstance(f, LayerFit) else f).estimate)
