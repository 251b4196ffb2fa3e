"""The CogniLoad section of a report (SPEC §7), drawn from the ``cogniload`` part of ``analysis.json``.

Figures: accuracy against each knob (d, N, rho; Wilson 95 % CIs, the rho panel shows whether accuracy is U-shaped),
needle vs hay attention enrichment heatmaps (layer × rho, layer × N) and the layer-wise needle and hay curves.
Tables: accuracy per knob level, the capacity thresholds (ECL50, NT50, ID50 with CIs or the reason there is none,
delta rho, AIC comparison) and the GLM coefficients. Nothing is estimated here; colour scales show log2 of the stored
enrichment so that 0.5 and 2 lie equally far from 1.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from probe.report.figures import _palette, _short
from probe.report.html import esc, table

KNOBS: tuple[tuple[str, str, str], ...] = (("d", "difficulty d", ""), ("N", "length N (statements)", ""),
                                           ("rho", "needle ratio ρ (% of statements)", "%"))
THRESHOLDS: tuple[tuple[str, str], ...] = (("ECL50", "largest N with P(correct) ≥ 0.5"),
                                           ("NT50", "smallest ρ with P(correct) ≥ 0.5"),
                                           ("ID50", "largest d with P(correct) ≥ 0.5"))
TERM_LABELS = {"const": "intercept", "d": "β_d", "log10_N": "β_N (per log10 N)", "rho": "β_ρ (per pp)",
               "rho2": "β_ρ² (per pp²)", "d:log10_N": "β_d×N", "d:rho": "β_d×ρ"}
NEEDLE_COLOUR, HAY_COLOUR = "#1b9e77", "#d95f02"


def _section(analysis: dict) -> dict:
    return analysis.get("cogniload") or {}


def _stem(model: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model)


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _p(x: float | None) -> str:
    return "—" if x is None else ("&lt;0.001" if x < 0.001 else f"{x:.3f}")


# ------------------------------------------------------------------------------------------------- figures


def draw_accuracy_by_knob(analysis: dict) -> Figure | None:
    """Accuracy (Wilson 95 % CI) against d, N and rho, each pooled over the other two knobs; one colour per model."""
    cells = _section(analysis).get("cells") or {}
    models = [m for m in sorted(cells) if cells[m]["overall"]["em_mean"] is not None]
    if not models:
        return None
    fig = Figure(figsize=(13.0, 3.9), layout="constrained")
    axes = fig.subplots(1, 3, sharey=True)
    colours = dict(zip(models, _palette(len(models))))
    fits = _section(analysis).get("models") or {}
    for ax, (knob, label, unit) in zip(axes, KNOBS):
        levels = sorted({c["level"] for m in models for c in cells[m][knob]})
        pos = {v: i for i, v in enumerate(levels)}  # categorical x: levels equally spaced, labelled by value
        for k, model in enumerate(models):
            pts = [c for c in cells[model][knob] if c["em_mean"] is not None]
            if not pts:
                continue
            shift = (k - (len(models) - 1) / 2) * 0.08
            xs = [pos[c["level"]] + shift for c in pts]
            ys = [c["em_mean"] for c in pts]
            err = np.array([[c["em_mean"] - (c["em_ci_low"] if c["em_ci_low"] is not None else c["em_mean"])
                             for c in pts],
                            [(c["em_ci_high"] if c["em_ci_high"] is not None else c["em_mean"]) - c["em_mean"]
                             for c in pts]])
            ax.errorbar(xs, ys, yerr=err, color=colours[model], marker="o", capsize=3, lw=1.5,
                        label=_short(model))
        ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.set_xticks(range(len(levels)))
        if len(models) == 1:  # one model: n puzzles per level under its tick (several: see the accuracy table)
            n_at = {c["level"]: c["n"] for c in cells[models[0]][knob]}
            ax.set_xticklabels([f"{v}{unit}\nn={n_at.get(v, 0)}" for v in levels])
        else:
            ax.set_xticklabels([f"{v}{unit}" for v in levels])
        ax.set_xlim(-0.5, len(levels) - 0.5)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        if knob == "rho" and len(models) == 1:
            ax.set_title(_rho_title(fits.get(models[0])), fontsize=8.5)
    axes[0].set_ylim(-0.03, 1.03)
    axes[0].set_ylabel("accuracy (Wilson 95% CI)")
    if len(models) > 1:
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=min(len(models), 4),
                   fontsize=8)
    who = f"{_short(models[0])}: " if len(models) == 1 else ""
    fig.suptitle(f"{who}CogniLoad accuracy against each knob (pooled over the other two; dotted: P = 0.5)",
                 fontsize=11)
    return fig


def _rho_title(s: dict | None) -> str:
    """The rho panel's title: the rho^2 coefficient of the main fit and delta rho, or why there is none."""
    if not s:
        return ""
    quad = s["fits"]["quadratic"]
    b2 = quad["params"].get("rho2") if quad["status"] == "ok" else None
    dr = s["delta_rho"]
    delta = f"Δρ = {dr['value']:+.2f}" if dr["value"] is not None else "Δρ: —"
    if dr["ci_low"] is not None:
        delta += f" [{dr['ci_low']:+.2f}, {dr['ci_high']:+.2f}]"
    if b2 is None:
        why = "not fitted" if quad["status"] == "ok" else f"main fit {quad['status']}"
        return f"β_ρ²: {why}; {delta}"
    return f"β_ρ² = {b2['estimate']:+.2e} (p = {b2['p']:.2g}); {delta}"


def _log2(mat: list[list[float | None]]) -> np.ndarray:
    a = np.array([[np.nan if v is None else v for v in row] for row in mat], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(a > 0, np.log2(np.where(a > 0, a, 1.0)), np.nan)


def _ratio_ticks(v: float, _pos: int) -> str:
    return f"{2.0 ** v:.3g}"


def _log2_ticks(lim: float) -> np.ndarray:
    """Colour-bar ticks on a log2 scale within ±lim: whole powers of two (1/4, 1/2, 1, 2, 4...), halves if few."""
    step = 1.0 if lim >= 1.5 else 0.5
    k = math.floor(lim / step)
    return np.arange(-k, k + 1) * step


def draw_needle_hay_heatmaps(analysis: dict, model: str) -> Figure | None:
    """Layer × rho and layer × N heatmaps of needle and hay enrichment and of log2(needle / hay).

    A knob with one tested level has no row. Enrichment panels share one colour scale (log2, centred at 1 =
    uniform attention over tokens); the contrast panel has its own, centred at 0 (needle token = hay token).
    """
    att = ((_section(analysis).get("attention") or {}).get("models") or {}).get(model)
    if not att:
        return None
    rows = {k: (k, lab, unit) for k, lab, unit in KNOBS}
    knobs = [rows[k] for k in ("rho", "N") if len(att[f"by_{k}"]["levels"]) >= 2]  # rho first: the main knob
    if not knobs:
        return None
    enr = {(k, g): _log2(att[f"by_{k}"][g]) for k, _, _ in knobs for g in ("needle", "hay")}
    ratio = {k: np.array([[np.nan if v is None else v for v in row] for row in att[f"by_{k}"]["log2_ratio"]],
                         dtype=float) for k, _, _ in knobs}
    finite = np.concatenate([m[np.isfinite(m)] for m in enr.values()] + [np.zeros(1)])
    lim = max(1.0, float(np.percentile(np.abs(finite), 99)))
    finite_r = np.concatenate([m[np.isfinite(m)] for m in ratio.values()] + [np.zeros(1)])
    lim_r = max(0.25, float(np.percentile(np.abs(finite_r), 99)))
    n_layers = att["n_layers"]
    fig = Figure(figsize=(12.5, min(6.5, max(3.0, 0.13 * n_layers + 1.4)) * len(knobs)), layout="constrained")
    axes = fig.subplots(len(knobs), 3, squeeze=False)
    im_e = im_r = None
    for i, (knob, label, unit) in enumerate(knobs):
        levels = att[f"by_{knob}"]["levels"]
        counts = att[f"by_{knob}"]["n"]
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
        cb.set_ticks(_log2_ticks(lim))
        cb.set_label("enrichment (log scale; 1 = uniform over tokens)", fontsize=8)
    if im_r is not None:
        cb = fig.colorbar(im_r, ax=axes[:, 2], shrink=0.85, format=FuncFormatter(_ratio_ticks))
        cb.set_ticks(_log2_ticks(lim_r))
        cb.set_label("needle / hay per-token attention (log scale)", fontsize=8)
    fig.suptitle(f"{_short(model)}: attention from the question on needle vs hay statements, head mean per layer "
                 f"({att['n_prompts']} prompts)", fontsize=11)
    return fig


def draw_needle_hay_layers(analysis: dict, model: str) -> Figure | None:
    """Layer-wise needle and hay enrichment (95 % t-interval over prompts), and their log2 ratio."""
    att = ((_section(analysis).get("attention") or {}).get("models") or {}).get(model)
    if not att:
        return None
    layers = np.arange(att["n_layers"])

    def series(g: str, key: str) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in att["layer"][g][key]], dtype=float)

    fig = Figure(figsize=(12.0, 3.8), layout="constrained")
    ax, ax_r = fig.subplots(1, 2)
    for g, colour in (("needle", NEEDLE_COLOUR), ("hay", HAY_COLOUR)):
        mean, lo, hi = series(g, "mean"), series(g, "ci_low"), series(g, "ci_high")
        ax.plot(layers, mean, color=colour, marker=".", label=f"{g} statements")
        ax.fill_between(layers, np.where(lo > 0, lo, np.nan), hi, color=colour, alpha=0.18, lw=0)
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="uniform over tokens")
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:.3g}"))
    ax.set_ylabel("enrichment (per-token share / chance)")
    ax.set_title("needle and hay enrichment (band: 95% CI over prompts)", fontsize=9)
    ax.legend(fontsize=7.5)
    mean, lo, hi = series("log2_ratio", "mean"), series("log2_ratio", "ci_low"), series("log2_ratio", "ci_high")
    ax_r.plot(layers, mean, color="#7570b3", marker=".")
    ax_r.fill_between(layers, lo, hi, color="#7570b3", alpha=0.2, lw=0)
    ax_r.axhline(0.0, color="k", lw=0.8, ls="--")
    ax_r.set_ylabel("log2(needle / hay)")
    ax_r.set_title("needle vs hay per token: > 0 = needles get more (band: 95% CI)", fontsize=9)
    for a in (ax, ax_r):
        a.set_xlabel("layer")
        a.xaxis.set_major_locator(MaxNLocator(nbins=16, integer=True))
        a.grid(alpha=0.3)
    fig.suptitle(f"{_short(model)}: attention from the question on CogniLoad statements by layer "
                 f"({att['n_prompts']} prompts)", fontsize=11)
    return fig


def cogniload_figures(analysis: dict) -> list[tuple[str, str, Figure | None]]:
    """The section's figures as (file stem, caption, Figure or None)."""
    cl = _section(analysis)
    if not cl:
        return []
    out: list[tuple[str, str, Figure | None]] = [
        ("cogniload_accuracy", "CogniLoad accuracy against difficulty d, length N and needle ratio ρ, each pooled "
         "over the other knobs, with Wilson 95% CIs (n = scored puzzles per level). The ρ panel's title gives the "
         "ρ² coefficient of the main GLM (> 0 = U-shape) and Δρ = Acc(lowest ρ) − Acc(highest ρ) with its "
         "bootstrap CI.", draw_accuracy_by_knob(analysis))]
    for model in sorted(((cl.get("attention") or {}).get("models") or {})):
        stem = _stem(model)
        out.append((f"cogniload_needle_hay_heatmap_{stem}",
                    f"{model}: head-mean enrichment of attention from the question set on needle (germane) and hay "
                    "(extraneous) statements, per layer and tested ρ / N (mean over prompts; n = prompts per "
                    "column); red = more per-token attention than uniform over the non-sink tokens, blue = less "
                    "(the instruction and the question share the rest); right: needle vs hay per-token ratio "
                    "(orange = needles favoured, purple = hay). Knobs with one tested level have no row.",
                    draw_needle_hay_heatmaps(analysis, model)))
        out.append((f"cogniload_needle_hay_layers_{stem}",
                    f"{model}: needle and hay enrichment by layer over all prompts (left, log scale) and log2 of "
                    "their ratio (right), with 95% t-intervals over prompts.", draw_needle_hay_layers(analysis, model)))
    return out


# -------------------------------------------------------------------------------------------------- tables


def accuracy_table_html(analysis: dict) -> str:
    """Accuracy per model and knob level: n, accuracy, Wilson 95 % CI, truncated and uninterpretable shares."""
    cells = _section(analysis).get("cells") or {}
    rows = []
    for model in sorted(cells):
        c = cells[model]["overall"]
        rows.append(_acc_row(model, "all", "", c))
        for knob, _, unit in KNOBS:
            for c in cells[model][knob]:
                rows.append(_acc_row(model, "ρ" if knob == "rho" else knob, f"{c['level']}{unit}", c))
    return table(["model", "knob", "level", "n", "accuracy", "95% CI", "truncated", "uninterp.", "errors",
                  "skipped"], rows, left=2)


def _acc_row(model: str, knob: str, level: str, c: dict) -> list[str]:
    ci = "—" if c["em_ci_low"] is None else f"[{c['em_ci_low']:.3f}, {c['em_ci_high']:.3f}]"
    pct = (lambda x: "—" if x is None else f"{100 * x:.0f}%")
    return [esc(model), esc(knob), esc(level), str(c["n"]), _fmt(c["em_mean"], ".3f"), ci,
            pct(c["truncated_rate"]), pct(c["uninterpretable_rate"]), str(c["n_error"]), str(c["n_skipped"])]


def _threshold_cell(th: dict) -> str:
    if th["value"] is None:
        return f'—<br><span class="note">{esc(th["status"].replace("_", " "))}: {esc(th["reason"])}</span>'
    ci = "" if th["ci_low"] is None else f" [{th['ci_low']:.3g}, {th['ci_high']:.3g}]"
    note = (f'<br><span class="note">{th["n_boot_defined"]} of {th["n_boot_defined"] + th["n_boot_undefined"]} '
            "bootstrap refits crossed 0.5" + (f"; {esc(th['ci_note'])}" if th.get("ci_note") else "") + "</span>")
    return f"{th['value']:.3g} {esc(th['unit'])}{ci}{note}"


def threshold_table_html(analysis: dict) -> str:
    """Thresholds (value [bootstrap CI] or the reason), delta rho and the AIC comparison, one row per model."""
    models = _section(analysis).get("models") or {}
    rows = []
    for model in sorted(models):
        s = models[model]
        dr = s["delta_rho"]
        delta = _fmt(dr["value"], "+.3f") + ("" if dr["ci_low"] is None else
                                              f" [{dr['ci_low']:+.3f}, {dr['ci_high']:+.3f}]")
        delta += (f'<br><span class="note">Acc(ρ={dr["low_rho"]}%) = {_fmt(dr["acc_low"], ".2f")} (n={dr["n_low"]}), '
                  f'Acc(ρ={dr["high_rho"]}%) = {_fmt(dr["acc_high"], ".2f")} (n={dr["n_high"]})</span>')
        quad, lin = s["fits"]["quadratic"], s["fits"]["linear"]
        if s["delta_aic"] is None:
            aic = (f'—<br><span class="note">quadratic fit {esc(quad["status"].replace("_", " "))}, linear fit '
                   f'{esc(lin["status"].replace("_", " "))}'
                   + (f": {esc(quad['reason'] or lin['reason'])}" if (quad["reason"] or lin["reason"]) else "")
                   + (f"; {esc(quad['dropped']['rho2'])}" if "rho2" in quad["dropped"] else "") + "</span>")
        else:
            aic = (f"{quad['aic']:.1f} vs {lin['aic']:.1f}: ΔAIC = {s['delta_aic']:+.2f}, "
                   f"{esc(s['aic_preferred'])} preferred")
        rows.append([esc(model), str(s["n"]), str(s["n_puzzles"]),
                     *(_threshold_cell(s["thresholds"][k]) for k, _ in THRESHOLDS), delta, aic])
    header = ["model", "n", "puzzles", *(f"{k}<br><span class=\"note\">{esc(d)}</span>" for k, d in THRESHOLDS),
              "Δρ = Acc(low ρ) − Acc(high ρ)", "AIC quadratic vs linear in ρ"]
    return table(header, rows, left=1)


def _fit_note(f: dict) -> str:
    """A fit's reason and its left-out terms, each distinct reason said once."""
    by_why: dict[str, list[str]] = {}
    for term, why in f["dropped"].items():
        by_why.setdefault(why, []).append(TERM_LABELS.get(term, term))
    parts = [] if f["reason"] is None or f["reason"] in by_why else [f["reason"]]
    parts += [f"left out {', '.join(terms)}: {why}" for why, terms in by_why.items()]
    return "; ".join(parts)


def glm_table_html(analysis: dict) -> str:
    """Every GLM's coefficients (estimate, 95 % CI, p) with its status, AIC and the terms it left out."""
    alpha = analysis.get("config", {}).get("alpha", 0.05)
    rows = []
    for model, s in sorted((_section(analysis).get("models") or {}).items()):
        for fit, f in s["fits"].items():
            note = esc(_fit_note(f))
            if not f["params"]:
                rows.append([esc(model), esc(fit), esc(f["status"]), "—", "—", "—", "—", "—", note])
                continue
            for i, (term, v) in enumerate(f["params"].items()):
                p = _p(v["p"]) if v["p"] >= alpha else f'<span class="sig">{_p(v["p"])}</span>'
                rows.append([esc(model) if i == 0 else "", esc(fit) if i == 0 else "", esc(f["status"]) if i == 0
                             else "", esc(TERM_LABELS.get(term, term)), f"{v['estimate']:+.4g}",
                             f"[{v['ci_low']:+.4g}, {v['ci_high']:+.4g}]", p,
                             _fmt(f["aic"], ".1f") if i == 0 else "", note if i == 0 else ""])
    return table(["model", "fit", "status", "term", "estimate (logit)", "95% CI", "p", "AIC", "note"], rows, left=4)


def attention_note_html(analysis: dict) -> str:
    """The enrichment definition and any per-model note of the attention summary."""
    att = _section(analysis).get("attention") or {}
    if not att:
        return ('<p class="note">No attention records for the CogniLoad prompts (run with <code>[probe] enabled = '
                "true</code> for the needle vs hay figures).</p>")
    notes = [f"{m}: {n}" for m, a in sorted(att["models"].items()) for n in a["notes"]]
    return (f'<p class="note">Enrichment: {esc(att["definition"])}.</p>'
            + ("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>" if notes else ""))


def section_html(analysis: dict, blocks: dict[str, str], summary: str) -> str:
    """The whole CogniLoad section; ``blocks`` maps figure stems to their rendered ``<figure>`` HTML."""
    acc = blocks.get("cogniload_accuracy", "")
    att = "".join(v for k, v in blocks.items() if k.startswith("cogniload_needle_hay"))
    return ("<h2>CogniLoad</h2>" + summary
            + "<h3>Accuracy against each knob</h3>" + acc + accuracy_table_html(analysis)
            + "<h3>Capacity thresholds (P(correct) = 0.5, other knobs at their means)</h3>"
            + threshold_table_html(analysis)
            + "<h3>GLM fits: logit P(correct) = β0 + β_d d + β_N log10 N + β_ρ ρ + β_ρ² ρ²</h3>"
            + glm_table_html(analysis)
            + "<h3>Attention on needle vs hay statements</h3>" + attention_note_html(analysis) + att)
