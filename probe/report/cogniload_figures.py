"""The CogniLoad figures (family ``cogniload``; docs/cogniload.md), drawn from a
:class:`probe.analysis.cogniload.CogniloadResult`: accuracy against each knob (d, N, rho; Wilson 95 % CIs, the rho
panel shows whether accuracy is U-shaped), needle vs hay attention enrichment heatmaps (layer × rho, layer × N) and
the layer-wise needle and hay curves. Nothing is estimated here; colour scales show log2 of the stored enrichment so
that 0.5 and 2 lie equally far from 1.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from probe import formatting as fmt
from probe.analysis.cogniload import CogniloadFits, CogniloadResult, DeltaRho
from probe.analysis.cogniload_attention import NeedleHayModel
from probe.report.figures import palette, short


# the three knobs: name, axis label, unit of a level (the report's tables use the same)
KNOB_AXES: tuple[tuple[str, str, str], ...] = (("d", "difficulty d", ""), ("N", "length N (statements)", ""),
                                               ("rho", "needle ratio ρ (% of statements)", "%"))


def attention_of(result: CogniloadResult, model: str) -> NeedleHayModel | None:
    """The needle/hay attention summary of ``model``, None when the run has none."""
    return result.attention.models.get(model) if result.attention is not None else None


NEEDLE_COLOUR, HAY_COLOUR = "#1b9e77", "#d95f02"


def draw_accuracy_by_knob(result: CogniloadResult) -> Figure | None:
    """Accuracy (Wilson 95 % CI) against d, N and rho, each pooled over the other two knobs; one colour per model."""
    cells = result.cells
    models = [m for m in sorted(cells) if cells[m].overall.em_mean is not None]
    if not models:
        return None
    fig = Figure(figsize=(13.0, 3.9), layout="constrained")
    axes = fig.subplots(1, 3, sharey=True)
    colours = dict(zip(models, palette(len(models))))
    for ax, (knob, label, unit) in zip(axes, KNOB_AXES):
        levels = sorted({c.level for m in models for c in cells[m].by(knob) if c.level is not None})
        pos = {v: i for i, v in enumerate(levels)}  # categorical x: levels equally spaced, labelled by value
        for k, model in enumerate(models):
            pts = [(c.level, c.em_mean, c.em_mean if c.em_ci_low is None else c.em_ci_low,
                    c.em_mean if c.em_ci_high is None else c.em_ci_high)
                   for c in cells[model].by(knob) if c.em_mean is not None and c.level is not None]
            if not pts:
                continue
            shift = (k - (len(models) - 1) / 2) * 0.08
            xs = [pos[level] + shift for level, *_ in pts]
            ys = [y for _, y, _, _ in pts]
            err = np.array([[y - lo for _, y, lo, _ in pts], [hi - y for _, y, _, hi in pts]])
            ax.errorbar(xs, ys, yerr=err, color=colours[model], marker="o", capsize=3, lw=1.5, label=short(model))
        ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.set_xticks(range(len(levels)))
        if len(models) == 1:  # one model: n puzzles per level under its tick (several: see the accuracy table)
            n_at = {c.level: c.n for c in cells[models[0]].by(knob)}
            ax.set_xticklabels([f"{v}{unit}\nn={n_at.get(v, 0)}" for v in levels])
        else:
            ax.set_xticklabels([f"{v}{unit}" for v in levels])
        ax.set_xlim(-0.5, len(levels) - 0.5)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        if knob == "rho" and len(models) == 1:
            ax.set_title(_rho_title(result.models.get(models[0])), fontsize=8.5)
    axes[0].set_ylim(-0.03, 1.03)
    axes[0].set_ylabel("accuracy (Wilson 95% CI)")
    if len(models) > 1:
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=min(len(models), 4),
                   fontsize=8)
    who = f"{short(models[0])}: " if len(models) == 1 else ""
    fig.suptitle(f"{who}CogniLoad accuracy against each knob (pooled over the other two; dotted: P = 0.5)",
                 fontsize=11)
    return fig


def _delta_text(dr: DeltaRho) -> str:
    delta = f"Δρ = {fmt.num(dr.value, '+.2f')}" if dr.value is not None else f"Δρ: {fmt.DASH}"
    if dr.ci_low is not None:
        delta += f" {fmt.ci(dr.ci_low, dr.ci_high, '+.2f')}"
    return delta


def _rho_title(s: CogniloadFits | None) -> str:
    """The rho panel's title: the rho^2 coefficient of the main fit and delta rho, or why there is none."""
    if s is None:
        return ""
    quad = s.fits["quadratic"]
    b2 = quad.params.get("rho2") if quad.status == "ok" else None
    if b2 is None:
        why = "not fitted" if quad.status == "ok" else f"main fit {quad.status}"
        return f"β_ρ²: {why}; {_delta_text(s.delta_rho)}"
    return f"β_ρ² = {fmt.num(b2.value, '+.2e')} (p = {fmt.num(b2.p, '.2g')}); {_delta_text(s.delta_rho)}"


def _matrix(mat: tuple[tuple[float | None, ...], ...]) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in mat], dtype=float)


def _log2(mat: tuple[tuple[float | None, ...], ...]) -> np.ndarray:
    a = _matrix(mat)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(a > 0, np.log2(np.where(a > 0, a, 1.0)), np.nan)


def _ratio_ticks(v: float, _pos: int) -> str:
    return fmt.num(2.0 ** v, ".3g")


def _log2_ticks(lim: float) -> np.ndarray:
    """Colour-bar ticks on a log2 scale within ±lim: whole powers of two (1/4, 1/2, 1, 2, 4...), halves if few."""
    step = 1.0 if lim >= 1.5 else 0.5
    k = math.floor(lim / step)
    return np.arange(-k, k + 1) * step


def draw_needle_hay_heatmaps(result: CogniloadResult, model: str) -> Figure | None:
    """Layer × rho and layer × N heatmaps of needle and hay enrichment and of log2(needle / hay).

    A knob with one tested level has no row. Enrichment panels share one colour scale (log2, centred at 1 =
    uniform attention over tokens); the contrast panel has its own, centred at 0 (needle token = hay token).
    """
    att = attention_of(result, model)
    if att is None:
        return None
    axes_of = {k: (k, lab, unit) for k, lab, unit in KNOB_AXES}
    knobs = [axes_of[k] for k in ("rho", "N") if len(att.by(k).levels) >= 2]  # rho first: the main knob
    if not knobs:
        return None
    enr = {(k, g): _log2(att.by(k).series(g)) for k, _, _ in knobs for g in ("needle", "hay")}
    ratio = {k: _matrix(att.by(k).log2_ratio) for k, _, _ in knobs}
    finite = np.concatenate([m[np.isfinite(m)] for m in enr.values()] + [np.zeros(1)])
    lim = max(1.0, float(np.percentile(np.abs(finite), 99)))
    finite_r = np.concatenate([m[np.isfinite(m)] for m in ratio.values()] + [np.zeros(1)])
    lim_r = max(0.25, float(np.percentile(np.abs(finite_r), 99)))
    n_layers = att.n_layers
    fig = Figure(figsize=(12.5, min(6.5, max(3.0, 0.13 * n_layers + 1.4)) * len(knobs)), layout="constrained")
    axes = fig.subplots(len(knobs), 3, squeeze=False)
    im_e = im_r = None
    for i, (knob, label, unit) in enumerate(knobs):
        levels, counts = att.by(knob).levels, att.by(knob).n
        panels = ((enr[(knob, "needle")], "needle statements", "e"), (enr[(knob, "hay")], "hay statements", "e"),
                  (ratio[knob], "needle vs hay: log2(needle / hay)", "r"))
        for j, (mat, title, kind) in enumerate(panels):
            ax = axes[i, j]
            norm = Normalize(-lim, lim) if kind == "e" else Normalize(-lim_r, lim_r)
            cmap = "RdBu_r" if kind == "e" else "PuOr_r"
            im = ax.imshow(mat, aspect="auto", origin="lower", cmap=cmap, norm=norm, interpolation="nearest")
            if kind == "e":
                im_e = im
            else:
                im_r = im
            ax.set_xticks(range(len(levels)))
            ax.set_xticklabels([f"{v}{unit}\nn={n}" for v, n in zip(levels, counts)], fontsize=7.5)
            ax.set_xlabel(label, fontsize=8.5)
            ax.yaxis.set_major_locator(MaxNLocator(nbins=min(n_layers, 12), integer=True))
            ax.set_title(f"{title}, by {'ρ' if knob == 'rho' else knob}", fontsize=9)
            if j == 0:
                ax.set_ylabel("layer")
    if im_e is not None:
        cb = fig.colorbar(im_e, ax=axes[:, :2], shrink=0.85, format=FuncFormatter(_ratio_ticks))
        cb.set_ticks(_log2_ticks(lim).tolist())
        cb.set_label("enrichment (log scale; 1 = uniform over tokens)", fontsize=8)
    if im_r is not None:
        cb = fig.colorbar(im_r, ax=axes[:, 2], shrink=0.85, format=FuncFormatter(_ratio_ticks))
        cb.set_ticks(_log2_ticks(lim_r).tolist())
        cb.set_label("needle / hay per-token attention (log scale)", fontsize=8)
    fig.suptitle(f"{short(model)}: attention from the question on needle vs hay statements, head mean per layer "
                 f"({att.n_prompts} prompts)", fontsize=11)
    return fig


def draw_needle_hay_layers(result: CogniloadResult, model: str) -> Figure | None:
    """Layer-wise needle and hay enrichment (95 % t-interval over prompts), and their log2 ratio."""
    att = attention_of(result, model)
    if att is None:
        return None
    layers = np.arange(att.n_layers)

    def series(g: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = att.layer[g]
        return tuple(np.array([np.nan if v is None else v for v in vals], dtype=float)  # type: ignore[return-value]
                     for vals in (s.mean, s.ci_low, s.ci_high))

    fig = Figure(figsize=(12.0, 3.8), layout="constrained")
    ax, ax_r = fig.subplots(1, 2)
    for g, colour in (("needle", NEEDLE_COLOUR), ("hay", HAY_COLOUR)):
        mean, lo, hi = series(g)
        ax.plot(layers, mean, color=colour, marker=".", label=f"{g} statements")
        ax.fill_between(layers, np.where(lo > 0, lo, np.nan), hi, color=colour, alpha=0.18, lw=0)
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="uniform over tokens")
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: fmt.num(v, ".3g")))
    ax.set_ylabel("enrichment (per-token share / chance)")
    ax.set_title("needle and hay enrichment (band: 95% CI over prompts)", fontsize=9)
    ax.legend(fontsize=7.5)
    mean, lo, hi = series("log2_ratio")
    ax_r.plot(layers, mean, color="#7570b3", marker=".")
    ax_r.fill_between(layers, lo, hi, color="#7570b3", alpha=0.2, lw=0)
    ax_r.axhline(0.0, color="k", lw=0.8, ls="--")
    ax_r.set_ylabel("log2(needle / hay)")
    ax_r.set_title("needle vs hay per token: > 0 = needles get more (band: 95% CI)", fontsize=9)
    for a in (ax, ax_r):
        a.set_xlabel("layer")
        a.xaxis.set_major_locator(MaxNLocator(nbins=16, integer=True))
        a.grid(alpha=0.3)
    fig.suptitle(f"{short(model)}: attention from the question on CogniLoad statements by layer "
                 f"({att.n_prompts} prompts)", fontsize=11)
    return fig
