"""The ICE section of a report (family ``ice``), drawn from an :class:`probe.analysis.ice.IceResult`.

- ``report.html``: a summary per model that claims only what the numbers support, Table 1 (EM mean (SEM) per model
  × condition and load, with taxonomy marks), the figures of :mod:`probe.report.ice_figures` and the H1, H2, H3 and
  taxonomy tables;
- ``analysis.md`` and ``tables/*.csv`` (cells, h1, h2, h3, h3_points, attention_layers, taxonomy);
- the main table's rows (with the taxonomy marks) and lines (taxonomy, H1);
- a ``probe compare`` part: Table 1, the saturation curve, EM by condition and forest plots of H1 and H3 across runs.

Summary rules: a model labelled intrinsic-load brittle, confounded or unscorable gets "no inference about
extraneous load" and no effect statements. A coefficient or difference is called a decline / increase / difference
only at p < α; otherwise it is reported as not significant, with the power to detect it.
"""

from __future__ import annotations

from dataclasses import replace

from probe import format as fmt
from probe.analysis.attention_link import AttentionBehaviour
from probe.analysis.estimates import Cell
from probe.analysis.hypotheses import H1Fit, H3Correlation, PairedComparison
from probe.analysis.ice import FAMILY, IceResult
from probe.config import AnalysisSection
from probe.report import ice_figures as F
from probe.report.figures import draw_forest, file_stem, short
from probe.report.html import esc, table
from probe.report.sections import ReportContext, ReportSection, Rows, register_section
from probe.report.tables import md_table, rows_of

TAXONOMY_MARKS = {"intrinsic-load brittle": " †", "confounded": " ‡", "unscorable": " ∅"}
MARK_LEGEND = ("† intrinsic-load brittle (Control EM below gate), ‡ confounded (truncated/uninterpretable "
               "outputs above gate), ∅ unscorable (no scored Control trial), * resilient and load-sensitive")


def taxonomy_marks(result: IceResult) -> dict[str, str]:
    """Mark appended to a model's name in tables: † brittle, ‡ confounded, ∅ unscorable, * load-sensitive."""
    return {t.model: TAXONOMY_MARKS.get(t.label, " *" if t.is_load_sensitive else "") for t in result.taxonomy}


def _p_cell(p: float | None, alpha: float) -> str:
    """A p-value table cell, bold where p < alpha."""
    text = fmt.p_value(p, html=True)
    return text if p is None or p >= alpha else f'<span class="sig">{text}</span>'


# ------------------------------------------------------------------------------------------------- summary


def _h1_sentence(h: H1Fit, alpha: float) -> str:
    name = {"Saturation": "Saturation (H1)", "Residue": "Residue", "LongControl": "LongControl"}[h.condition]
    if h.beta is None or h.p is None:
        return f"{name}: no load trend estimated ({h.reason})."
    ci = f"95% CI {fmt.ci(h.ci_low, h.ci_high, '+.4f')}"
    if h.p < alpha:
        direction = "declines" if h.beta < 0 else "rises"
        s = (f"{name}: EM {direction} with load, β = {fmt.num(h.beta, '+.4f')} per percentage point "
             f"({fmt.num(10 * h.beta, '+.3f')} per 10 points), {ci}, {fmt.p_phrase(h.p)}, n = {h.n} trials over "
             f"{h.n_clusters} questions.")
    else:
        s = (f"{name}: no significant change of EM with load, β = {fmt.num(h.beta, '+.4f')} per percentage point, "
             f"{ci}, {fmt.p_phrase(h.p)}.")
        if h.power is not None and h.power.power is not None:
            s += (f" Observed power {fmt.num(h.power.power, '.2f')}; a slope of ±{fmt.num(h.power.mde_80, '.4f')}/pp "
                  "would have been detected with 80% power.")
    lg = h.logit
    if lg is not None and lg.coef is not None and lg.p is not None:
        agrees = (lg.p < alpha) == (h.p < alpha)
        s += (f" Logistic check: {fmt.num(lg.coef, '+.4f')} log-odds/pp, {fmt.p_phrase(lg.p)}"
              f" ({'agrees' if agrees else 'does not agree'} on significance).")
    return s


def _h2_sentence(rows: list[PairedComparison], alpha: float) -> str:
    sig, ns, none, same = [], [], [], []
    for r in rows:
        label = f"{r.a} vs {r.b}" + ("" if r.a == "LongControl" and r.load == 0 else f" at {r.load}%")
        if r.p is None or r.n_a_only is None or r.n_b_only is None or r.delta is None:
            none.append(f"{label} ({r.reason})")
        elif r.n_a_only + r.n_b_only == 0:
            same.append(f"{label} ({r.n_pairs} pairs)")
        elif r.p < alpha:
            word = "lower" if r.delta < 0 else "higher"
            sig.append(f"{label}: EM {word} by {fmt.num(abs(r.delta), '.2f')} ({r.n_a_only} vs {r.n_b_only} "
                       f"discordant pairs of {r.n_pairs}, {fmt.p_phrase(r.p)})")
        else:
            pw = r.power.power if r.power is not None else None
            ns.append(f"{label} (Δ = {fmt.num(r.delta, '+.2f')}, {fmt.p_phrase(r.p)}"
                      + (f", power {fmt.num(pw, '.2f')}" if pw is not None else "") + ")")
    parts = []
    if sig:
        parts.append("Significant paired differences (exact McNemar): " + "; ".join(sig) + ".")
    if ns:
        parts.append("Not significant: " + "; ".join(ns) + ".")
    if same:
        parts.append("Same outcome on every pair (no discordant pair, no information): " + "; ".join(same) + ".")
    if none:
        parts.append("Not tested: " + "; ".join(none) + ".")
    return " ".join(parts)


def _h3_sentence(h: H3Correlation, alpha: float) -> str:
    if h.r is None or h.p is None:
        return f"H3: no correlation estimated ({h.reason})."
    ci = "" if h.ci_low is None else f", 95% CI {fmt.ci(h.ci_low, h.ci_high, '+.2f')}"
    if h.p < alpha:
        word = "more" if h.r > 0 else "less"
        lead = f"H3: questions whose distractors are more similar degrade {word} under Residue"
    else:
        lead = "H3: no significant correlation between task similarity and degradation"
    sp = ("" if h.spearman_rho is None or h.spearman_p is None
          else f"; Spearman ρ = {fmt.num(h.spearman_rho, '+.2f')} ({fmt.p_phrase(h.spearman_p)})")
    return f"{lead} (Pearson r = {fmt.num(h.r, '+.2f')}{ci}, {fmt.p_phrase(h.p)}, {h.n_tasks} questions{sp})."


def _attention_sentence(a: AttentionBehaviour) -> str:
    if a.reason:
        return f"Attention ↔ behaviour: not estimated ({a.reason})."
    if a.tracking_layers:
        s = (f"Attention ↔ behaviour: in layers {', '.join(map(str, a.tracking_layers))} a higher share of attention"
             f" on extraneous text goes with wrong answers (Holm-adjusted p < α, {a.n_trials} trials)")
        adj = a.tracking_layers_adjusted
        s += (f"; with load and placement held fixed: layers {', '.join(map(str, adj))}." if adj
              else "; none of them once load and placement are held fixed.")
        return s
    return (f"Attention ↔ behaviour: no layer's P_ext predicts wrong answers after Holm adjustment "
            f"({a.n_trials} trials).")


def model_summary(result: IceResult, model: str, settings: AnalysisSection) -> list[str]:
    """Sentences about one model, in order: taxonomy, H1 (and Residue, LongControl), H2, H3, attention."""
    alpha = settings.alpha
    tax = result.taxonomy_of(model)
    out: list[str] = []
    if tax is not None:
        out.append(f"Classification: {tax.label}. {tax.reason[0].upper()}{tax.reason[1:]}.")
        if not tax.allows_inference:
            out.append("The numbers below are descriptive only; no inference about extraneous load is drawn.")
            return out
    for cond in ("Saturation", "Residue", "LongControl"):
        h = result.h1_of(model, cond)
        if h is not None:
            out.append(_h1_sentence(h, alpha))
    h2 = [r for r in result.h2 if r.model == model]
    if h2:
        out.append(_h2_sentence(h2, alpha))
    h3 = next((x for x in result.h3 if x.model == model and x.load is None), None)
    if h3 is not None:
        out.append(_h3_sentence(h3, alpha))
    att = result.attention_of(model)
    if att is not None:
        out.append(_attention_sentence(att))
    return out


def summary_html(result: IceResult, settings: AnalysisSection) -> str:
    """Each model's summary sentences as a list under its name ("" when no model has any)."""
    return "".join(f"<h3>{esc(m)}</h3><ul>" + "".join(f"<li>{esc(s)}</li>" for s in sentences) + "</ul>"
                   for m in result.models if (sentences := model_summary(result, m, settings)))


# --------------------------------------------------------------------------------------------------- html


def _em_cell(c: Cell | None) -> str:
    if c is None:
        return fmt.DASH
    if c.em_mean is None:
        return f'<span class="note">n=0 ({c.n_error} err, {c.n_skipped} skip)</span>'
    extra = []
    if c.truncated_rate:
        extra.append(f"trunc {fmt.pct(c.truncated_rate)}")
    if c.n_error:
        extra.append(f"{c.n_error} err")
    tail = f'<br><span class="note">{", ".join(extra)}</span>' if extra else ""
    return f"{fmt.num(c.em_mean)} ({fmt.num(c.em_sem)})<br><span class=\"note\">n={c.n}</span>{tail}"


def table1_html(result: IceResult) -> str:
    """Table 1: EM mean (SEM) per model (rows, with taxonomy marks) × condition and load (columns)."""
    keys = sorted({(c.condition, c.load or 0) for c in result.cells}, key=F.condition_order)
    by = {(c.model, c.condition, c.load or 0): c for c in result.cells}
    marks = taxonomy_marks(result)
    header = ["model"] + [esc(c if c == "Control" else f"{c} {ld}%") for c, ld in keys]
    rows = [[esc(f"{m}{marks.get(m, '')}")] + [_em_cell(by.get((m, c, ld))) for c, ld in keys]
            for m in result.models]
    return table(header, rows) + f'<p class="note">{esc(MARK_LEGEND)}. SEM over trials; n = scored trials.</p>'


def stats_html(result: IceResult, settings: AnalysisSection) -> str:
    """H1, H2, H3 and taxonomy tables."""
    alpha = settings.alpha
    h1 = table(["model", "condition", "β (EM/pp)", "95% CI", "p", "logit coef", "logit p", "power", "MDE80", "n",
                "questions", "note"],
               [[esc(h.model), esc(h.condition), fmt.num(h.beta, "+.5f"), fmt.ci(h.ci_low, h.ci_high, "+.5f"),
                 _p_cell(h.p, alpha), fmt.num(h.logit.coef if h.logit else None, "+.4f"),
                 fmt.p_value(h.logit.p if h.logit else None, html=True),
                 fmt.num(h.power.power if h.power else None, ".2f"),
                 fmt.num(h.power.mde_80 if h.power else None, ".4f"), str(h.n), str(h.n_clusters),
                 esc(h.reason or (h.logit.reason if h.logit else None) or "")]
                for h in result.h1], left=2)
    h2 = table(["model", "a vs b", "load", "pairs", "EM a", "EM b", "a only", "b only", "p", "power", "note"],
               [[esc(r.model), esc(f"{r.a} vs {r.b}"), str(r.load), str(r.n_pairs), fmt.num(r.em_a), fmt.num(r.em_b),
                 fmt.count(r.n_a_only), fmt.count(r.n_b_only), _p_cell(r.p, alpha),
                 fmt.num(r.power.power if r.power else None, ".2f"),
                 esc("; ".join(x for x in (r.note, r.reason) if x))]
                for r in result.h2], left=2)
    h3 = table(["model", "Residue load", "questions", "Pearson r", "95% CI (Fisher z)", "p", "Spearman ρ", "p (ρ)",
                "note"],
               [[esc(r.model), "pooled" if r.load is None else str(r.load), str(r.n_tasks), fmt.num(r.r, "+.3f"),
                 fmt.ci(r.ci_low, r.ci_high, "+.3f"), _p_cell(r.p, alpha), fmt.num(r.spearman_rho, "+.3f"),
                 fmt.p_value(r.spearman_p, html=True), esc(r.reason or "")]
                for r in result.h3], left=2)
    tax = table(["model", "label", "Control EM", "trunc./uninterp.", "gates", "reason"],
                [[esc(t.model), esc(t.label), fmt.num(t.control_em), fmt.pct(t.confound_rate_observed),
                  esc(f"EM<{t.gates.brittle_em}, rate>{t.gates.confound_rate}, α={t.gates.alpha}"), esc(t.reason)]
                 for t in result.taxonomy], left=2)
    return (f"<h3>H1: EM per percentage point of load (Control as load 0)</h3>{h1}"
            f"<h3>H2: paired comparisons (exact McNemar, pairs = question × replication)</h3>{h2}"
            f"<h3>H3: S_sim vs degradation EM(Control) − EM(Residue)</h3>{h3}"
            f"<h3>Taxonomy</h3>{tax}")


def figures_html(result: IceResult, ctx: ReportContext) -> str:
    """Every ICE figure of a report, written through ``ctx.figure`` (absent figures are left out)."""
    marks = taxonomy_marks(result)
    arrays = ctx.arrays
    h1 = [h for h in result.h1 if h.condition == "Saturation"]
    blocks = [
        ctx.figure("saturation_curve", "EM vs extraneous load with 95% CIs (clustered by question). Control: line and "
                   "band; LongControl: open triangles at the load it is length-matched to.",
                   F.draw_saturation_curve(result, marks)),
        ctx.figure("em_by_condition", "EM for every condition × load and model (95% CIs).",
                   F.draw_em_by_condition(result, marks)),
        ctx.figure("h1_forest", "H1 slope β (EM per percentage point of load) with 95% CI, per model.",
                   draw_forest([(f"{short(h.model)}{marks.get(h.model, '')}", h.beta, h.ci_low, h.ci_high) for h in h1],
                               "β (EM per pp of load)", "H1: load trend under Saturation") if h1 else None),
        ctx.figure("h3_scatter", "H3: per question S_sim vs degradation, least-squares line, Pearson r with Fisher-z "
                   "CI.", F.draw_h3_scatter(result, marks)),
    ]
    for model in result.models:
        stem = file_stem(model)
        blocks += [
            ctx.figure(f"enrichment_{stem}", f"{model}: P_ext enrichment (P_ext / chance) per layer × head; red = more "
                       "attention on extraneous text than its token share, blue = less, white = chance.",
                       F.draw_enrichment_heatmaps(result, arrays, model)),
            ctx.figure(f"p_ext_layers_{stem}", f"{model}: head-mean P_ext per layer; dashed = chance level.",
                       F.draw_p_ext_layers(result, arrays, model)),
            ctx.figure(f"ar_k_{stem}", f"{model}: head-mean attentional residue AR_k per layer and target segment.",
                       F.draw_ar_k(result, arrays, model)),
        ]
    blocks.append(ctx.figure("attention_behaviour", "Per layer: log-odds of a wrong answer per unit of head-mean "
                             "P_ext (Saturation and Residue trials), 95% CI clustered by question; orange = "
                             "significant after Holm adjustment.", F.draw_attention_behaviour(result)))
    return "".join(blocks)


def section_html(result: IceResult, ctx: ReportContext) -> str:
    """The ICE part of ``report.html``: summary, Table 1, figures, statistics."""
    summary = summary_html(result, ctx.settings)
    return ((f"<h2>Summary</h2>{summary}" if summary else "")
            + f"<h2>Table 1: exact match, mean (SEM)</h2>{table1_html(result)}"
            + f"<h2>Figures</h2>{figures_html(result, ctx)}"
            + f"<h2>Statistics</h2>{stats_html(result, ctx.settings)}")


# ----------------------------------------------------------------------------------------- markdown, csv


def markdown(result: IceResult, settings: AnalysisSection) -> list[str]:
    """The ICE part of ``analysis.md``: legend, H1, H2, H3, attention and taxonomy tables."""
    parts: list[str] = [MARK_LEGEND, ""]
    parts += ["## H1: EM per percentage point of load (Control = load 0)", "",
              md_table(["model", "condition", "β (EM/pp)", "95% CI", "p", "logit coef", "logit p", "power", "n", "G",
                        "note"],
                       [[h.model, h.condition, fmt.num(h.beta, "+.5f"), fmt.ci(h.ci_low, h.ci_high, "+.5f"),
                         fmt.p_value(h.p), fmt.num(h.logit.coef if h.logit else None, "+.4f"),
                         fmt.p_value(h.logit.p if h.logit else None),
                         fmt.num(h.power.power if h.power else None, ".2f"), str(h.n), str(h.n_clusters),
                         h.reason or (h.logit.reason if h.logit else None) or ""] for h in result.h1]), ""]
    parts += ["## H2: paired comparisons (exact McNemar)", "",
              md_table(["model", "comparison", "load", "pairs", "EM a", "EM b", "a only", "b only", "p", "power",
                        "note"],
                       [[r.model, f"{r.a} vs {r.b}", str(r.load), str(r.n_pairs), fmt.num(r.em_a), fmt.num(r.em_b),
                         fmt.count(r.n_a_only), fmt.count(r.n_b_only), fmt.p_value(r.p),
                         fmt.num(r.power.power if r.power else None, ".2f"),
                         "; ".join(x for x in (r.note, r.reason) if x)] for r in result.h2]), ""]
    parts += ["## H3: S_sim vs degradation (Control − Residue)", "",
              md_table(["model", "load", "questions", "r", "95% CI (Fisher z)", "p", "Spearman ρ", "note"],
                       [[r.model, "pooled" if r.load is None else str(r.load), str(r.n_tasks), fmt.num(r.r, "+.3f"),
                         fmt.ci(r.ci_low, r.ci_high, "+.3f"), fmt.p_value(r.p), fmt.num(r.spearman_rho, "+.3f"),
                         r.reason or ""] for r in result.h3]), ""]
    if result.attention_behaviour:
        parts += ["## Attention ↔ behaviour (wrong answer ~ head-mean P_ext, per layer)", ""]
        for a in result.attention_behaviour:
            tracking = ", ".join(str(x) for x in a.tracking_layers) or "none"
            parts.append(f"- {a.model}: {a.n_trials} trials; layers tracking failure (Holm p < α, coef > 0): "
                         f"{tracking}" + (f" — {a.reason}" if a.reason else ""))
        parts.append("")
    parts += ["## Taxonomy", "",
              md_table(["model", "label", "Control EM", "trunc./uninterp. rate", "reason"],
                       [[t.model, t.label, fmt.num(t.control_em), fmt.pct(t.confound_rate_observed), t.reason]
                        for t in result.taxonomy]), ""]
    return parts


def tables(result: IceResult) -> list[tuple[str, Rows]]:
    """``tables/*.csv`` of the ICE result."""
    layers = [row for a in result.attention_behaviour for row in rows_of(a.layers, model=a.model)]
    points = [row for h in result.h3 for row in rows_of(h.points, model=h.model, load=h.load)]
    return [("cells", rows_of(result.cells)), ("h1", rows_of(result.h1)), ("h2", rows_of(result.h2)),
            ("h3", rows_of(result.h3)), ("h3_points", points), ("attention_layers", layers),
            ("taxonomy", rows_of(result.taxonomy))]


# -------------------------------------------------------------------------------------------- main table


def main_rows(result: IceResult) -> list[tuple[Cell, str]]:
    """Every cell, its model marked with its taxonomy."""
    marks = taxonomy_marks(result)
    return [(c, marks.get(c.model, "")) for c in result.cells]


def main_lines(result: IceResult, settings: AnalysisSection) -> list[str]:
    """Taxonomy and H1 (Saturation) lines, and the marks' legend."""
    lines = [f"{t.model}: {t.label} — {t.reason}" for t in result.taxonomy]
    for h in result.h1:
        if h.condition != "Saturation":
            continue
        if h.beta is None:
            lines.append(f"H1 {h.model}: no estimate ({h.reason})")
        else:
            lines.append(f"H1 {h.model}: β = {fmt.num(h.beta, '+.5f')} EM/pp {fmt.ci(h.ci_low, h.ci_high, '+.5f')}, "
                         f"p = {fmt.p_value(h.p)}, n = {h.n}")
    if result.cells:
        lines.append(MARK_LEGEND)
    return lines


# ----------------------------------------------------------------------------------------------- compare


def merge(named: list[tuple[str, IceResult]]) -> IceResult:
    """Several runs' ICE results as one, each model renamed ``<run>: <model>``.

    Attention cells are left out: their arrays live in each run's own ``attention_summary.npz``.
    """
    def renamed(label: str, items: tuple) -> tuple:
        return tuple(replace(x, model=f"{label}: {x.model}") for x in items)

    return IceResult(
        models=tuple(f"{label}: {m}" for label, r in named for m in r.models),
        cells=sum((renamed(label, r.cells) for label, r in named), ()),
        h1=sum((renamed(label, r.h1) for label, r in named), ()),
        h2=sum((renamed(label, r.h2) for label, r in named), ()),
        h3=sum((renamed(label, r.h3) for label, r in named), ()),
        attention_cells=(),
        attention_behaviour=sum((renamed(label, r.attention_behaviour) for label, r in named), ()),
        taxonomy=sum((renamed(label, r.taxonomy) for label, r in named), ()),
    )


def compare_html(result: IceResult, ctx: ReportContext) -> str:
    """The ICE part of a comparison page: Table 1, figures across runs, summaries, statistics."""
    marks = taxonomy_marks(result)
    h1 = [(f"{m}{marks.get(m, '')}", h.beta, h.ci_low, h.ci_high) for m in result.models
          if (h := result.h1_of(m)) is not None]
    h3 = [(m, h.r, h.ci_low, h.ci_high) for m in result.models for h in result.h3 if h.model == m and h.load is None]
    blocks = "".join([
        ctx.figure("saturation_curve", "EM vs load per model and run, 95% CIs.", F.draw_saturation_curve(result, marks)),
        ctx.figure("em_by_condition", "EM per condition × load, all models and runs.",
                   F.draw_em_by_condition(result, marks)),
        ctx.figure("h1_forest", "H1 slope β per model and run (Saturation; Control as load 0), 95% CI.",
                   draw_forest(h1, "β (EM per pp of load)", "H1 across runs")),
        ctx.figure("h3_forest", "H3 Pearson r (pooled over loads) per model and run, Fisher-z 95% CI.",
                   draw_forest(h3, "Pearson r (S_sim vs degradation)", "H3 across runs")),
    ])
    summary = "".join(f"<h3>{esc(m)}</h3><ul>" + "".join(f"<li>{esc(s)}</li>"
                                                         for s in model_summary(result, m, ctx.settings)) + "</ul>"
                      for m in result.models)
    return (f"<h2>Table 1: exact match, mean (SEM)</h2>{table1_html(result)}"
            f"<h2>Figures</h2>{blocks}<h2>Summary</h2>{summary}"
            f"<h2>Statistics</h2>{stats_html(result, ctx.settings)}")


SECTION = register_section(ReportSection(
    family=FAMILY, html=section_html, markdown=markdown, tables=tables, main_rows=main_rows, main_lines=main_lines,
    merge=merge, compare_html=compare_html))
