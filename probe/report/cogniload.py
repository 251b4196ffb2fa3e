"""The CogniLoad section of a report (family ``cogniload``), drawn from a
:class:`probe.analysis.cogniload.CogniloadResult` (docs/cogniload.md#report-and-experiments)."""

from __future__ import annotations

from functools import partial

from probe import formatting as fmt
from probe.analysis.cogniload import (FAMILY, KNOBS, CogniloadFits, CogniloadResult, DeltaRho, GlmFit, Threshold)
from probe.analysis.cogniload_attention import SERIES, NeedleHayModel, NeedleHaySummary
from probe.analysis.estimates import Cell
from probe.config import AnalysisSection
from probe.report.cogniload_figures import (KNOB_AXES, attention_of, draw_accuracy_by_knob, draw_needle_hay_heatmaps,
                                            draw_needle_hay_layers)
from probe.report.figures import file_stem
from probe.report.blocks import Block, Bullets, Heading, Note, Plot, Table, Text, table_of
from probe.report.blocks import Cell as Cell_
from probe.report.sections import ReportSection, Rows
from probe.report.tables import rows_of


KNOB_LABELS = {"d": "d", "N": "N", "rho": "ρ"}


THRESHOLDS: tuple[tuple[str, str], ...] = (("ECL50", "largest N with P(correct) ≥ 0.5"),
                                           ("NT50", "smallest ρ with P(correct) ≥ 0.5"),
                                           ("ID50", "largest d with P(correct) ≥ 0.5"))


TERM_LABELS = {"const": "intercept", "d": "β_d", "log10_N": "β_N (per log10 N)", "rho": "β_ρ (per pp)",
               "rho2": "β_ρ² (per pp²)", "d:log10_N": "β_d×N", "d:rho": "β_d×ρ"}


def _rho_shape_sentence(s: CogniloadFits, alpha: float) -> str:
    quad = s.fits["quadratic"]
    if quad.status != "ok":
        return f"Shape in ρ: the main GLM is {quad.status} ({quad.reason}); no statement about curvature."
    b2 = quad.params.get("rho2")
    if b2 is None:
        return f"Shape in ρ: not tested ({quad.dropped.get('rho2', 'no ρ² term')})."
    aic = ("" if s.delta_aic is None
           else f"; AIC prefers the {s.aic_preferred} fit (ΔAIC = {fmt.num(s.delta_aic, '+.1f')})")
    if b2.p is None:
        return (f"Shape in ρ: β_ρ² = {fmt.num(b2.value, '+.2e')}, described only, not tested "
                f"({quad.se_method}).")
    coef = f"β_ρ² = {fmt.num(b2.value, '+.2e')}, {fmt.p_phrase(b2.p)}"
    if b2.p < alpha:
        shape = "U-shaped" if (b2.value or 0) > 0 else "inverted-U-shaped"
        return f"Accuracy is {shape} in ρ ({coef}{aic})."
    return f"No significant curvature of accuracy in ρ ({coef}{aic})."


def _delta_rho_sentence(dr: DeltaRho) -> str:
    if dr.value is None:
        return "Δρ: not estimated (a ρ extreme has no scored trial)."
    s = (f"Δρ = Acc(ρ={dr.low_rho}%) − Acc(ρ={dr.high_rho}%) = {fmt.num(dr.value, '+.2f')} "
         f"({fmt.num(dr.acc_low, '.2f')} vs {fmt.num(dr.acc_high, '.2f')}")
    if dr.ci_low is None or dr.ci_high is None:
        return s + "; no bootstrap CI)."
    s += f"; bootstrap 95% CI {fmt.ci(dr.ci_low, dr.ci_high, '+.2f')})"
    if dr.ci_low > 0:
        return s + ": accuracy is higher at the lowest needle ratio."
    if dr.ci_high < 0:
        return s + ": accuracy is higher at the highest needle ratio."
    return s + ": the two extremes are not distinguishable."


def _threshold_sentence(s: CogniloadFits) -> str:
    parts = []
    for name, _ in THRESHOLDS:
        th = s.thresholds[name]
        if th.value is None:
            parts.append(f"{name} not given ({th.reason})")
        else:
            ci = "" if th.ci_low is None else f", bootstrap 95% CI {fmt.ci(th.ci_low, th.ci_high, '.3g')}"
            parts.append(f"{name} = {fmt.num(th.value, '.3g')} {th.unit}{ci}")
    return "Thresholds: " + "; ".join(parts) + "."


def _needle_hay_sentence(att: NeedleHayModel) -> str:
    ratio = att.layer["log2_ratio"]
    above = [i for i, lo in enumerate(ratio.ci_low) if lo is not None and lo > 0]
    below = [i for i, hi in enumerate(ratio.ci_high) if hi is not None and hi < 0]
    s = (f"Attention from the question ({att.n_prompts} prompts, {att.n_layers} layers): per token, needle "
         f"statements get more attention than hay in {len(above)} layers and less in {len(below)} "
         "(pointwise 95% CI of log2(needle/hay) above / below 0)")
    by = att.by_rho
    if len(by.levels) >= 2:
        means = by.layer_mean["log2_ratio"]
        s += "; layer-mean log2(needle/hay) by ρ: " + ", ".join(
            f"{v}%: {fmt.num(m, '+.2f')}" for v, m in zip(by.levels, means))
    return s + "."


def _acc_ci(c: Cell) -> str:
    ci = "" if c.em_ci_low is None else f", 95% CI {fmt.ci(c.em_ci_low, c.em_ci_high, '.2f')}"
    return f"{fmt.num(c.em_mean, '.2f')}{ci}"


def model_summary(result: CogniloadResult, model: str, settings: AnalysisSection) -> list[str]:
    """Sentences on one model's CogniLoad results: accuracy, output quality, shape in ρ, Δρ, thresholds, attention."""
    cells = result.cells.get(model)
    if cells is None:
        return []
    c = cells.overall
    if c.em_mean is None:
        return [f"CogniLoad: no scored trial ({c.n_error} errors, {c.n_skipped} skipped)."]
    out = [f"CogniLoad: accuracy {_acc_ci(c)} over {c.n} puzzles."]
    bad = [x for x in (c.truncated_rate, c.uninterpretable_rate) if x is not None]
    gate = settings.confound_rate
    if bad and max(bad) > gate:
        out.append(f"{fmt.pct(c.truncated_rate or 0)} of outputs were truncated and "
                   f"{fmt.pct(c.uninterpretable_rate or 0)} uninterpretable (gate {fmt.pct(gate)}): "
                   "accuracy here also measures the output budget and format, not only reasoning.")
    s = result.models.get(model)
    if s is not None:
        out += [_rho_shape_sentence(s, settings.alpha), _delta_rho_sentence(s.delta_rho), _threshold_sentence(s)]
    att = attention_of(result, model)
    if att is not None:
        out.append(_needle_hay_sentence(att))
    return out


def threshold_text(th: Threshold, name: str) -> str:
    """One threshold as text: value [CI] or why there is none."""
    if th.value is None:
        return f"{name} — ({th.status}: {th.reason})"
    ci = "" if th.ci_low is None else f" {fmt.ci(th.ci_low, th.ci_high, '.3g')}"
    note = f" ({th.ci_note})" if th.ci_note else ""
    return f"{name} = {fmt.num(th.value, '.3g')} {th.unit}{ci}{note}"


def _level_list(cells: tuple[Cell, ...], knob: str) -> str:
    unit = "%" if knob == "rho" else ""
    return "; ".join(f"{KNOB_LABELS[knob]}={c.level}{unit}: {fmt.num(c.em_mean, '.2f')}"
                     + ("" if c.em_ci_low is None else f" {fmt.ci(c.em_ci_low, c.em_ci_high, '.2f')}")
                     + f" (n={c.n})" for c in cells)


def fit_lines(s: CogniloadFits, model: str) -> list[str]:
    dr = s.delta_rho
    ci = "" if dr.ci_low is None else f" {fmt.ci(dr.ci_low, dr.ci_high, '+.2f')}"
    aic = ("AIC: no comparison (" + "; ".join(f"{k} fit {s.fits[k].status}" for k in ("quadratic", "linear")) + ")"
           if s.delta_aic is None else
           f"AIC(linear) − AIC(quadratic) = {fmt.num(s.delta_aic, '+.2f')}, {s.aic_preferred} preferred")
    return [f"CogniLoad {model}: " + "; ".join(threshold_text(s.thresholds[k], k) for k, _ in THRESHOLDS),
            f"CogniLoad {model}: Δρ = Acc(ρ={dr.low_rho}%) − Acc(ρ={dr.high_rho}%) = {fmt.num(dr.value, '+.3f')}{ci}; "
            f"{aic}"]


def main_lines(result: CogniloadResult, settings: AnalysisSection) -> list[str]:
    """Accuracy per knob level, thresholds, Δρ and the AIC comparison, per model."""
    lines: list[str] = []
    for model, cells in sorted(result.cells.items()):
        lines += [f"CogniLoad {model}: accuracy by {KNOB_LABELS[knob]} — {_level_list(cells.by(knob), knob)}"
                  for knob in KNOBS if cells.by(knob)]
        if model in result.models:
            lines += fit_lines(result.models[model], model)
    return lines


def accuracy_rows(result: CogniloadResult) -> Rows:
    """Accuracy cells as rows: ``model``, ``knob`` (d, N, rho) and the cell's fields."""
    return [row for m in sorted(result.cells) for k in KNOBS for row in rows_of(result.cells[m].by(k), knob=k)]


def fit_rows(result: CogniloadResult) -> Rows:
    """One row per model × fit × term of the GLMs (a fit without terms gives one row with its reason)."""
    rows: Rows = []
    for model, s in sorted(result.models.items()):
        for fit, f in s.fits.items():
            dropped = "; ".join(f"{t} left out: {why}" for t, why in f.dropped.items())
            note = "; ".join(x for x in (f.reason, dropped) if x) or None
            base = {"model": model, "fit": fit, "status": f.status, "aic": f.aic, "n": f.n}
            if not f.params:
                rows.append({**base, "term": None, "estimate": None, "se": None, "ci_low": None, "ci_high": None,
                             "p": None, "note": note})
            for i, (term, v) in enumerate(f.params.items()):
                rows.append({**base, "term": term, "estimate": v.value, "se": v.se, "ci_low": v.ci_low,
                             "ci_high": v.ci_high, "p": v.p, "df": v.df, "note": note if i == 0 else None})
    return rows


def threshold_rows(result: CogniloadResult) -> Rows:
    """One row per model × threshold (ECL50, NT50, ID50) and one for Δρ."""
    rows: Rows = []
    for model, s in sorted(result.models.items()):
        for name, th in s.thresholds.items():
            rows += rows_of([th], model=model, threshold=name)
        dr = s.delta_rho
        rows.append({"model": model, "threshold": "delta_rho", "value": dr.value, "ci_low": dr.ci_low,
                     "ci_high": dr.ci_high, "status": None, "unit": "accuracy",
                     "reason": f"Acc(rho={dr.low_rho}) - Acc(rho={dr.high_rho})"})
    return rows


def attention_rows(result: CogniloadResult) -> Rows:
    """Per model × layer: needle and hay enrichment and log2(needle / hay), means with their 95 % intervals."""
    rows: Rows = []
    for model, a in sorted((result.attention.models if result.attention is not None else {}).items()):
        for layer in range(a.n_layers):
            row: dict = {"model": model, "layer": layer}
            for g in SERIES:
                s = a.layer[g]
                row.update({f"{g}_mean": s.mean[layer], f"{g}_ci_low": s.ci_low[layer],
                            f"{g}_ci_high": s.ci_high[layer], f"{g}_n": s.n[layer]})
            rows.append(row)
    return rows


def tables(result: CogniloadResult) -> list[tuple[str, Rows]]:
    """``tables/*.csv`` of the CogniLoad result."""
    return [("cogniload_accuracy", accuracy_rows(result)), ("cogniload_fits", fit_rows(result)),
            ("cogniload_thresholds", threshold_rows(result)), ("cogniload_attention_layers", attention_rows(result))]


def _acc_row(model: str, knob: str, level: str, c: Cell) -> list[str]:
    return [model, knob, level, str(c.n), fmt.num(c.em_mean), fmt.ci(c.em_ci_low, c.em_ci_high),
            fmt.pct(c.truncated_rate), fmt.pct(c.uninterpretable_rate), str(c.n_error), str(c.n_skipped)]


def accuracy_table(result: CogniloadResult) -> Table:
    """Accuracy per model and knob level: n, accuracy, Wilson 95 % CI, truncated and uninterpretable shares."""
    rows = []
    for model in sorted(result.cells):
        rows.append(_acc_row(model, "all", "", result.cells[model].overall))
        for knob, _, unit in KNOB_AXES:
            for c in result.cells[model].by(knob):
                rows.append(_acc_row(model, KNOB_LABELS[knob], f"{c.level}{unit}", c))
    return table_of(["model", "knob", "level", "n", "accuracy", "95% CI", "truncated", "uninterp.", "errors",
                     "skipped"], rows, left=2)


def _threshold_cell(th: Threshold) -> Text:
    if th.value is None:  # the reason's first clause: a degenerate fit's whole reason is in the GLM table below
        status, why = th.status.replace("_", " "), fmt.first_clause(th.reason) if th.reason else ""
        return Text(fmt.DASH, why if status in why else f"{status}: {why}")  # "the main fit is degenerate"
    ci = "" if th.ci_low is None else f" {fmt.ci(th.ci_low, th.ci_high, '.3g')}"
    return Text(f"{fmt.num(th.value, '.3g')} {th.unit}{ci}",
                f"{th.n_boot_defined} of {th.n_boot_defined + th.n_boot_undefined} bootstrap refits crossed 0.5"
                + (f"; {th.ci_note}" if th.ci_note else ""))


def threshold_table(result: CogniloadResult) -> Table:
    """Thresholds (value [bootstrap CI] or the reason), delta rho and the AIC comparison, one row per model."""
    rows: list[list[Cell_]] = []
    for model in sorted(result.models):
        s = result.models[model]
        dr = s.delta_rho
        delta = Text(fmt.num(dr.value, "+.3f") + ("" if dr.ci_low is None else f" {fmt.ci(dr.ci_low, dr.ci_high, '+.3f')}"),
                     f"Acc(ρ={dr.low_rho}%) = {fmt.num(dr.acc_low, '.2f')} (n={dr.n_low}), "
                     f"Acc(ρ={dr.high_rho}%) = {fmt.num(dr.acc_high, '.2f')} (n={dr.n_high})")
        quad, lin = s.fits["quadratic"], s.fits["linear"]
        if s.delta_aic is None:
            why = quad.reason or lin.reason
            aic: Cell_ = Text(fmt.DASH, f"quadratic fit {quad.status.replace('_', ' ')}, linear fit "
                                        f"{lin.status.replace('_', ' ')}"
                              + (f": {fmt.first_clause(why)}" if why else "")
                              + (f"; {quad.dropped['rho2']}" if "rho2" in quad.dropped else ""))
        else:
            aic = (f"{fmt.num(quad.aic, '.1f')} vs {fmt.num(lin.aic, '.1f')}: ΔAIC = {fmt.num(s.delta_aic, '+.2f')}, "
                   f"{s.aic_preferred} preferred")
        rows.append([model, str(s.n), str(s.n_puzzles), *(_threshold_cell(s.thresholds[k]) for k, _ in THRESHOLDS),
                     delta, aic])
    return table_of(["model", "n", "puzzles", *(Text(k, d) for k, d in THRESHOLDS), "Δρ = Acc(low ρ) − Acc(high ρ)",
                     "AIC quadratic vs linear in ρ"], rows)


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


def glm_table(result: CogniloadResult, alpha: float) -> Table:
    """Every GLM's coefficients (estimate, 95 % CI, p) with its status, AIC and the terms it left out."""
    rows: list[list[Cell_]] = []
    for model, s in sorted(result.models.items()):
        for fit, f in s.fits.items():
            note = _fit_note(f)
            if not f.params:
                rows.append([model, fit, f.status, *[fmt.DASH] * 5, note])
                continue
            for i, (term, v) in enumerate(f.params.items()):
                first = i == 0
                rows.append([model if first else "", fit if first else "", f.status if first else "",
                             TERM_LABELS.get(term, term), fmt.num(v.value, "+.4g"), fmt.ci(v.ci_low, v.ci_high, "+.4g"),
                             Text(fmt.p_value(v.p), strong=v.p is not None and v.p < alpha),
                             fmt.num(f.aic, ".1f") if first else "", note if first else ""])
    return table_of(["model", "fit", "status", "term", "estimate (logit)", "95% CI", "p", "AIC", "note"], rows, left=4,
                    text=(8,))


def attention_notes(attention: NeedleHaySummary | None) -> list[Block]:
    """The enrichment definition and any per-model note of the attention summary."""
    if attention is None:
        return [Note("No attention records for the CogniLoad prompts (run with [probe] enabled = true for the needle "
                     "vs hay figures).")]
    notes = tuple(f"{m}: {n}" for m, a in sorted(attention.models.items()) for n in a.notes)
    return [Note(f"Enrichment: {attention.definition}."), *([Bullets(notes)] if notes else [])]


def blocks(result: CogniloadResult, settings: AnalysisSection) -> list[Block]:
    """The CogniLoad section: summary, accuracy, thresholds, GLMs and needle vs hay attention."""
    summary = [Bullets(tuple(sentences), m) for m in sorted(result.cells)
               if (sentences := model_summary(result, m, settings))]
    attention = [b for model in sorted(result.attention.models if result.attention is not None else {}) for b in (
        Plot(f"cogniload_needle_hay_heatmap_{file_stem(model)}",
             f"{model}: head-mean enrichment of attention from the question set on needle (germane) and hay "
             "(extraneous) statements, per layer and tested ρ / N (mean over prompts; n = prompts per column); red = "
             "more per-token attention than uniform over the non-sink tokens, blue = less (the instruction and the "
             "question share the rest); right: needle vs hay per-token ratio (orange = needles favoured, purple = "
             "hay). Knobs with one tested level have no row.", partial(draw_needle_hay_heatmaps, result, model)),
        Plot(f"cogniload_needle_hay_layers_{file_stem(model)}",
             f"{model}: needle and hay enrichment by layer over all prompts (left, log scale) and log2 of their ratio "
             "(right), with 95% t-intervals over prompts.", partial(draw_needle_hay_layers, result, model)))]
    return [Heading("CogniLoad"), *summary, Heading("Accuracy against each knob", 3),
            Plot("cogniload_accuracy", "CogniLoad accuracy against difficulty d, length N and needle ratio ρ, each "
                 "pooled over the other knobs, with Wilson 95% CIs (n = scored puzzles per level). The ρ panel's "
                 "title gives the ρ² coefficient of the main GLM (> 0 = U-shape) and Δρ = Acc(lowest ρ) − "
                 "Acc(highest ρ) with its bootstrap CI.", partial(draw_accuracy_by_knob, result)),
            accuracy_table(result),
            Heading("Capacity thresholds (P(correct) = 0.5, other knobs at their means)", 3), threshold_table(result),
            Note("A threshold that is not given says why in its first clause; the GLM table below gives each fit's "
                 "whole reason, tables/cogniload_thresholds.csv each threshold's."),
            Heading("GLM fits: logit P(correct) = β0 + β_d d + β_N log10 N + β_ρ ρ + β_ρ² ρ²", 3),
            glm_table(result, settings.alpha),
            Heading("Attention on needle vs hay statements", 3), *attention_notes(result.attention), *attention]


def main_rows(result: CogniloadResult) -> list[tuple[Cell, str]]:
    """Each model's pooled accuracy cell (condition ``CogniLoad``, load ``all``)."""
    return [(result.cells[m].overall, "") for m in sorted(result.cells)]


SECTION = ReportSection(family=FAMILY, blocks=blocks, tables=tables, main_rows=main_rows, main_lines=main_lines)


__all__ = ["KNOB_LABELS", "SECTION", "blocks", "fit_rows", "main_lines", "model_summary", "tables"]
