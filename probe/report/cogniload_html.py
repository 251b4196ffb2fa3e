"""The CogniLoad part of ``report.html`` (family ``cogniload``; docs/cogniload.md): the summary per model, the
figures of :mod:`probe.report.cogniload_figures` and the tables of accuracy per knob level, the capacity thresholds
(ECL50, NT50, ID50 with CIs or the reason there is none, delta rho, AIC comparison) and the GLM coefficients. It is
also the section's part of a ``probe compare`` page.
"""

from __future__ import annotations

from probe import formatting as fmt
from probe.analysis.cogniload import CogniloadResult, GlmFit, Threshold
from probe.analysis.cogniload_attention import NeedleHaySummary
from probe.analysis.estimates import Cell
from probe.report.figures import file_stem
from probe.report.html import esc, table
from probe.report.sections import ReportContext
from probe.report.cogniload_figures import draw_accuracy_by_knob, draw_needle_hay_heatmaps, draw_needle_hay_layers
from probe.report.cogniload_text import KNOB_AXES, KNOB_LABELS, TERM_LABELS, THRESHOLDS, model_summary


def _acc_row(model: str, knob: str, level: str, c: Cell) -> list[str]:
    return [esc(model), esc(knob), esc(level), str(c.n), fmt.num(c.em_mean), fmt.ci(c.em_ci_low, c.em_ci_high),
            fmt.pct(c.truncated_rate), fmt.pct(c.uninterpretable_rate), str(c.n_error), str(c.n_skipped)]


def accuracy_table_html(result: CogniloadResult) -> str:
    """Accuracy per model and knob level: n, accuracy, Wilson 95 % CI, truncated and uninterpretable shares."""
    rows = []
    for model in sorted(result.cells):
        rows.append(_acc_row(model, "all", "", result.cells[model].overall))
        for knob, _, unit in KNOB_AXES:
            for c in result.cells[model].by(knob):
                rows.append(_acc_row(model, KNOB_LABELS[knob], f"{c.level}{unit}", c))
    return table(["model", "knob", "level", "n", "accuracy", "95% CI", "truncated", "uninterp.", "errors",
                  "skipped"], rows, left=2)


def _threshold_cell(th: Threshold) -> str:
    if th.value is None:
        return f'{fmt.DASH}<br><span class="note">{esc(th.status.replace("_", " "))}: {esc(th.reason)}</span>'
    ci = "" if th.ci_low is None else f" {fmt.ci(th.ci_low, th.ci_high, '.3g')}"
    note = (f'<br><span class="note">{th.n_boot_defined} of {th.n_boot_defined + th.n_boot_undefined} '
            "bootstrap refits crossed 0.5" + (f"; {esc(th.ci_note)}" if th.ci_note else "") + "</span>")
    return f"{fmt.num(th.value, '.3g')} {esc(th.unit)}{ci}{note}"


def threshold_table_html(result: CogniloadResult) -> str:
    """Thresholds (value [bootstrap CI] or the reason), delta rho and the AIC comparison, one row per model."""
    rows = []
    for model in sorted(result.models):
        s = result.models[model]
        dr = s.delta_rho
        delta = fmt.num(dr.value, "+.3f") + ("" if dr.ci_low is None else f" {fmt.ci(dr.ci_low, dr.ci_high, '+.3f')}")
        delta += (f'<br><span class="note">Acc(ρ={dr.low_rho}%) = {fmt.num(dr.acc_low, ".2f")} (n={dr.n_low}), '
                  f'Acc(ρ={dr.high_rho}%) = {fmt.num(dr.acc_high, ".2f")} (n={dr.n_high})</span>')
        quad, lin = s.fits["quadratic"], s.fits["linear"]
        if s.delta_aic is None:
            aic = (f'{fmt.DASH}<br><span class="note">quadratic fit {esc(quad.status.replace("_", " "))}, linear fit '
                   f'{esc(lin.status.replace("_", " "))}'
                   + (f": {esc(quad.reason or lin.reason)}" if (quad.reason or lin.reason) else "")
                   + (f"; {esc(quad.dropped['rho2'])}" if "rho2" in quad.dropped else "") + "</span>")
        else:
            aic = (f"{fmt.num(quad.aic, '.1f')} vs {fmt.num(lin.aic, '.1f')}: ΔAIC = {fmt.num(s.delta_aic, '+.2f')}, "
                   f"{esc(s.aic_preferred)} preferred")
        rows.append([esc(model), str(s.n), str(s.n_puzzles),
                     *(_threshold_cell(s.thresholds[k]) for k, _ in THRESHOLDS), delta, aic])
    header = ["model", "n", "puzzles", *(f"{k}<br><span class=\"note\">{esc(d)}</span>" for k, d in THRESHOLDS),
              "Δρ = Acc(low ρ) − Acc(high ρ)", "AIC quadratic vs linear in ρ"]
    return table(header, rows, left=1)


def _fit_note(f: GlmFit) -> str:
    """A fit's reason and its left-out terms, each distinct reason said once."""
    by_why: dict[str, list[str]] = {}
    for term, why in f.dropped.items():
        by_why.setdefault(why, []).append(TERM_LABELS.get(term, term))
    parts = [] if f.reason is None or f.reason in by_why else [f.reason]
    parts += [f"left out {', '.join(terms)}: {why}" for why, terms in by_why.items()]
    if f.se_method:
        parts.append(f"SE: {f.se_method}")
    return "; ".join(parts)


def glm_table_html(result: CogniloadResult, alpha: float) -> str:
    """Every GLM's coefficients (estimate, 95 % CI, p) with its status, AIC and the terms it left out."""
    rows = []
    for model, s in sorted(result.models.items()):
        for fit, f in s.fits.items():
            note = esc(_fit_note(f))
            if not f.params:
                rows.append([esc(model), esc(fit), esc(f.status), *[fmt.DASH] * 5, note])
                continue
            for i, (term, v) in enumerate(f.params.items()):
                p = fmt.p_value(v.p, html=True)
                if v.p is not None and v.p < alpha:
                    p = f'<span class="sig">{p}</span>'
                rows.append([esc(model) if i == 0 else "", esc(fit) if i == 0 else "", esc(f.status) if i == 0
                             else "", esc(TERM_LABELS.get(term, term)), fmt.num(v.value, "+.4g"),
                             fmt.ci(v.ci_low, v.ci_high, "+.4g"), p,
                             fmt.num(f.aic, ".1f") if i == 0 else "", note if i == 0 else ""])
    return table(["model", "fit", "status", "term", "estimate (logit)", "95% CI", "p", "AIC", "note"], rows, left=4)


def attention_note_html(attention: NeedleHaySummary | None) -> str:
    """The enrichment definition and any per-model note of the attention summary."""
    if attention is None:
        return ('<p class="note">No attention records for the CogniLoad prompts (run with <code>[probe] enabled = '
                "true</code> for the needle vs hay figures).</p>")
    notes = [f"{m}: {n}" for m, a in sorted(attention.models.items()) for n in a.notes]
    return (f'<p class="note">Enrichment: {esc(attention.definition)}.</p>'
            + ("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>" if notes else ""))


def section_html(result: CogniloadResult, ctx: ReportContext) -> str:
    """The CogniLoad part of a report: summary, accuracy, thresholds, GLMs and needle vs hay attention."""
    summary = "".join(f"<h3>{esc(m)}</h3><ul>" + "".join(f"<li>{esc(s)}</li>" for s in sentences) + "</ul>"
                      for m in sorted(result.cells) if (sentences := model_summary(result, m, ctx.settings)))
    accuracy = ctx.figure(
        "cogniload_accuracy", "CogniLoad accuracy against difficulty d, length N and needle ratio ρ, each pooled "
        "over the other knobs, with Wilson 95% CIs (n = scored puzzles per level). The ρ panel's title gives the "
        "ρ² coefficient of the main GLM (> 0 = U-shape) and Δρ = Acc(lowest ρ) − Acc(highest ρ) with its "
        "bootstrap CI.", draw_accuracy_by_knob(result))
    attention = "".join(
        ctx.figure(f"cogniload_needle_hay_heatmap_{file_stem(model)}",
                   f"{model}: head-mean enrichment of attention from the question set on needle (germane) and hay "
                   "(extraneous) statements, per layer and tested ρ / N (mean over prompts; n = prompts per column); "
                   "red = more per-token attention than uniform over the non-sink tokens, blue = less (the "
                   "instruction and the question share the rest); right: needle vs hay per-token ratio (orange = "
                   "needles favoured, purple = hay). Knobs with one tested level have no row.",
                   draw_needle_hay_heatmaps(result, model))
        + ctx.figure(f"cogniload_needle_hay_layers_{file_stem(model)}",
                     f"{model}: needle and hay enrichment by layer over all prompts (left, log scale) and log2 of "
                     "their ratio (right), with 95% t-intervals over prompts.", draw_needle_hay_layers(result, model))
        for model in sorted(result.attention.models if result.attention is not None else {}))
    return ("<h2>CogniLoad</h2>" + summary
            + "<h3>Accuracy against each knob</h3>" + accuracy + accuracy_table_html(result)
            + "<h3>Capacity thresholds (P(correct) = 0.5, other knobs at their means)</h3>"
            + threshold_table_html(result)
            + "<h3>GLM fits: logit P(correct) = β0 + β_d d + β_N log10 N + β_ρ ρ + β_ρ² ρ²</h3>"
            + glm_table_html(result, ctx.settings.alpha)
            + "<h3>Attention on needle vs hay statements</h3>" + attention_note_html(result.attention) + attention)
