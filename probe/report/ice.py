"""The ICE section of a report (family ``ice``), drawn from an :class:`probe.analysis.ice.IceResult`
(docs/records.md#report)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from probe import formatting as fmt
from probe.analysis.attention_link import AttentionBehaviour, LayerTests, ResidueAttention
from probe.analysis.estimates import Cell
from probe.analysis.hypotheses import H1Fit, H3Correlation, PairedComparison
from probe.analysis.ice import FAMILY, H1_CONDITIONS, IceResult
from probe.config import AnalysisSection
from probe.report import ice_figures as F
from probe.report import ice_hops, ice_writing
from probe.report.figures import draw_forest, file_stem, ranges, short
from probe.report.html import esc, table
from probe.report.retrieval import retrieval_html, retrieval_markdown, retrieval_tables
from probe.report.sections import ReportContext, ReportSection, Rows
from probe.report.tables import md_table, rows_of

TAXONOMY_MARKS = {"intrinsic-load brittle": " †", "confounded": " ‡", "unscorable": " ∅"}
MARK_LEGEND = ("† intrinsic-load brittle (Control EM below gate), ‡ confounded (truncated/uninterpretable "
               "outputs above gate), ∅ unscorable (no scored Control trial), * resilient and load-sensitive")


def taxonomy_marks(result: IceResult) -> dict[str, str]:
    """Mark appended to a model's name in tables: † brittle, ‡ confounded, ∅ unscorable, * load-sensitive."""
    return {t.model: TAXONOMY_MARKS.get(t.label, " *" if t.is_load_sensitive else "") for t in result.taxonomy}


def _p_cell(p: float | None, alpha: float) -> str:
    """A p- or q-value table cell, bold where below alpha."""
    text = fmt.p_value(p, html=True)
    return text if p is None or p >= alpha else f'<span class="sig">{text}</span>'


def _q_phrase(q: float) -> str:
    """A BH q-value inside a sentence."""
    return "q < 0.001" if q < 0.001 else f"q = {q:.3f}"


def head_label(layer: int, head: int) -> str:
    """A head's name in text: ``L12.H3``."""
    return f"L{layer}.H{head}"


# ------------------------------------------------------------------------------------------------- summary


def _h1_sentence(h: H1Fit, alpha: float) -> str:
    name = {"Saturation": "Saturation (H1)", "Residue": "Residue", "LongControl": "LongControl"}[h.condition]
    e = h.estimate
    if e.value is None:
        return f"{name}: no load trend estimated ({e.reason})."
    if not e.is_test or e.p is None:
        return (f"{name}: β = {fmt.num(e.value, '+.4f')} per percentage point, described only, not tested "
                f"({e.reason}).")
    ci = f"95% CI {fmt.ci(e.ci_low, e.ci_high, '+.4f')}"
    ref = f"t with {fmt.num(e.df, '.1f')} df"
    if e.p < alpha:
        direction = "declines" if e.value < 0 else "rises"
        s = (f"{name}: EM {direction} with load, β = {fmt.num(e.value, '+.4f')} per percentage point "
             f"({fmt.num(10 * e.value, '+.3f')} per 10 points), {ci}, {fmt.p_phrase(e.p)} ({ref}), n = {h.n} "
             f"trials over {h.n_clusters} questions.")
    else:
        s = (f"{name}: no significant change of EM with load, β = {fmt.num(e.value, '+.4f')} per percentage point, "
             f"{ci}, {fmt.p_phrase(e.p)} ({ref}).")
        if h.power is not None and h.power.power is not None:
            s += (f" Power at this β {fmt.num(h.power.power, '.2f')}; a slope of ±{fmt.num(h.power.mde, '.4f')}/pp "
                  "would have been detected with 80% power (noncentral t on the same df).")
    lg = h.logit
    if lg is not None and lg.estimate.value is not None and lg.estimate.p is not None:
        agrees = (lg.estimate.p < alpha) == (e.p < alpha)
        s += (f" Logistic check: {fmt.num(lg.estimate.value, '+.4f')} log-odds/pp, {fmt.p_phrase(lg.estimate.p)}"
              f" ({'agrees' if agrees else 'does not agree'} on significance).")
    return s


def _pair_label(r: PairedComparison) -> str:
    return f"{r.a} vs {r.b}" + ("" if r.a == "LongControl" and r.load == 0 else f" at {r.load}%")


def _tost_note(r: PairedComparison) -> str | None:
    """Why a tested comparison has no equivalence test (None when it has one, or has no test at all)."""
    return r.equivalence.estimate.reason if r.test.is_test and r.equivalence is not None else None


def _h2_sentence(rows: list[PairedComparison], alpha: float) -> str:
    tested = [r for r in rows if r.test.is_test and r.test.p is not None and r.q is not None]
    untested = [r for r in rows if r not in tested]
    lead = (f"H2 (sign-flip test of per-question differences, Benjamini–Hochberg over the {len(tested)} tested "
            f"comparisons of this model)")
    parts = []
    if tested:
        sig = [r for r in tested if r.q < alpha]  # type: ignore[operator]
        if sig:
            items = []
            for r in sig:
                word = "lower" if (r.test.delta or 0) < 0 else "higher"
                t = r.test
                items.append(f"{_pair_label(r)}: EM {word} by {fmt.num(abs(t.delta or 0), '.2f')} "
                             f"({t.n_questions} questions, {fmt.p_phrase(t.p)}, "  # type: ignore[arg-type]
                             f"{_q_phrase(r.q)})")  # type: ignore[arg-type]
            parts.append(f"{lead}: significant after correction: " + "; ".join(items) + ".")
            rest = len(tested) - len(sig)
            if rest:
                parts.append(f"No other comparison survives the correction ({rest} more).")
        else:
            best = min(tested, key=lambda r: r.q)  # type: ignore[arg-type, return-value]
            parts.append(f"{lead}: no comparison survives the correction (smallest q = {fmt.num(best.q, '.3f')}, "
                         f"{_pair_label(best)}, Δ = {fmt.num(best.test.delta, '+.2f')}, "
                         f"{fmt.p_phrase(best.test.p) if best.test.p is not None else fmt.DASH}"
                         + (f"; MDE {fmt.num(best.test.power.mde, '.2f')} EM at 80% power" if best.test.power else "")
                         + ").")
    undecided = [r for r in tested if r.verdict(alpha) != "different"]
    if undecided:
        margin = next((r.equivalence.margin for r in undecided if r.equivalence is not None), None)
        same = [r for r in undecided if r.verdict(alpha).startswith("equivalent")]
        within = "" if margin is None else f" within ±{margin:g} EM"
        if same:
            parts.append(f"Equivalent{within} (two one-sided tests, BH): " + "; ".join(
                f"{_pair_label(r)} (TOST {_q_phrase(r.equivalence.estimate.q)})"  # type: ignore[union-attr, arg-type]
                for r in same) + ".")
        if len(undecided) > len(same):
            parts.append(f"{len(undecided) - len(same)} comparison(s) show neither a difference nor equivalence"
                         f"{within}: no difference detected, which is not the same as no difference.")
    reasons = sorted({str(r.test.reason) for r in untested})
    if untested:
        parts.append(("H2 (paired comparisons): n" if not tested else "N") + f"ot tested ({len(untested)}): "
                     + "; ".join(reasons) + ".")
    return " ".join(parts)


def _h3_sentence(h: H3Correlation, alpha: float) -> str:
    c = h.correlation
    e, rank = c.estimate, c.spearman
    if e.value is None:
        return f"H3: no correlation estimated ({e.reason})."
    if not e.is_test or e.p is None or e.q is None:
        return f"H3: r = {fmt.num(e.value, '+.2f')} over {c.n} questions, described only, not tested ({e.reason})."
    ci = f", 95% CI {fmt.ci(e.ci_low, e.ci_high, '+.2f')}"
    if e.q < alpha:
        word = "more" if e.value > 0 else "less"
        lead = f"H3: questions whose distractors are more similar degrade {word} under Residue"
    else:
        lead = ("H3: no significant correlation between task similarity and degradation survives the correction "
                "over the H3 rows")
    sp = ("" if rank.value is None or rank.p is None
          else f"; Spearman ρ = {fmt.num(rank.value, '+.2f')} ({fmt.p_phrase(rank.p)})")
    return (f"{lead} (Pearson r = {fmt.num(e.value, '+.2f')}{ci}, {fmt.p_phrase(e.p)}, {_q_phrase(e.q)}, {c.n} "
            f"questions{sp}).")


def _layers_phrase(t: LayerTests, alpha: float, positive: str) -> str:
    """What a per-layer family says: the layers with q < alpha, or that none survived."""
    n = len(t.layers)
    if not t.is_test:
        return f"not tested ({t.reason})"
    hits = [x for x in t.layers if x.estimate.q is not None and x.estimate.q < alpha]
    if not hits:
        qs = [x.estimate.q for x in t.layers if x.estimate.q is not None]
        return (f"no layer survives Benjamini–Hochberg over the {n} layers"
                + (f" (smallest q = {fmt.num(min(qs), '.3f')})" if qs else ""))
    up = [x.layer for x in hits if (x.estimate.value or 0) > 0]
    down = [x.layer for x in hits if (x.estimate.value or 0) < 0]
    out = []
    if up:
        out.append(f"{positive} in layer{'s' if len(up) > 1 else ''} {ranges(up)}")
    if down:
        out.append(f"the opposite in layer{'s' if len(down) > 1 else ''} {ranges(down)}")
    return " and ".join(out) + f" (q < {alpha:g}, Benjamini–Hochberg over the {n} layers)"


HEADS_NAMED = 12  # heads named one by one in a sentence; above, counted per layer (the CSV lists each)


def _heads_phrase(hits: list, max_t: set[tuple[int, int]], what: str) -> str:
    """``what: L9.H7 (BH only)`` for a few heads, or their count per layer for many; "" without heads."""
    if not hits:
        return ""
    also = [x for x in hits if (x.layer, x.head) in max_t]
    if len(hits) <= HEADS_NAMED:
        return f"{what}: " + ", ".join(head_label(x.layer, x.head) + ("" if (x.layer, x.head) in max_t else
                                                                     " (BH only)") for x in hits)
    per_layer: dict[int, int] = {}
    for x in hits:
        per_layer[x.layer] = per_layer.get(x.layer, 0) + 1
    return (f"{what}: {len(hits)} heads in {len(per_layer)} layers (per layer: "
            + ", ".join(f"L{layer} {n}" for layer, n in sorted(per_layer.items()))
            + f"; {len(also)} of them also pass max-T; every head is in tables/attention_heads.csv)")


def _attention_sentences(a: AttentionBehaviour, alpha: float) -> list[str]:
    named = "" if a.measure == "p_ext" else f", {a.label}"
    if a.reason or a.layer_tests is None or a.heads is None:
        return [f"Attention ↔ behaviour{named}: not estimated ({a.reason})."]
    head = f"Attention ↔ behaviour{named} ({a.n_trials} Saturation/Residue trials, {a.n_questions} questions):"
    more = ("failed trials put more attention on extraneous text" if a.measure == "p_ext"
            else f"failed trials have a higher {a.label}")
    out = [f"{head} {_layers_phrase(a.layer_tests, alpha, more)} at equal load and placement."]
    h = a.heads
    grid = f"{h.n_layers} × {h.n_heads} grid"
    if not h.is_test:
        out.append(f"Per head: not tested ({h.reason}).")
    elif h.significant:
        max_t = {(x.layer, x.head) for x in (h.max_t.significant if h.max_t is not None else ())}
        by_place = sorted(h.significant, key=lambda x: (x.layer, x.head))
        text = [_heads_phrase([x for x in by_place if x.value > 0], max_t,
                              "distractor heads (more enrichment in failed trials)"),
                _heads_phrase([x for x in by_place if x.value < 0], max_t, "less enrichment in failed trials")]
        out.append(f"Per head, q < {alpha:g} over the {grid}: " + "; ".join(t for t in text if t)
                   + (f" (max-T over the grid: {len(max_t)} head{'s' if len(max_t) != 1 else ''})"
                      if h.max_t is not None else "") + ".")
    else:
        out.append(f"Per head: no head survives Benjamini–Hochberg over the {grid}.")
    fitted = [r for r in a.layers if r.fit.estimate.q is not None]
    if fitted:
        logit = ranges(a.logit_layers_adjusted)
        out.append(f"Logistic robustness (wrong answer on {a.label} with load and placement, BH over layers): "
                   + (f"layers {logit}." if a.logit_layers_adjusted else "no layer survives."))
    return out


def _residue_attention_sentence(rows: tuple[ResidueAttention, ...], alpha: float) -> str:
    parts = []
    for r in rows:
        if r.test is None:
            parts.append(f"{r.target}: not estimated ({r.reason})")
            continue
        parts.append(f"{r.target} target ({r.n_prompts} Residue prompts, {r.n_questions} questions): "
                     + _layers_phrase(r.test, alpha, "AR_k rises with S_sim"))
    return "H3 in attention: " + "; ".join(parts) + "."


def model_summary(result: IceResult, model: str, settings: AnalysisSection) -> list[str]:
    """Sentences about one model, in order: taxonomy, H1 (and Residue, LongControl), H2, what it wrote, H3,
    attention."""
    alpha = settings.alpha
    tax = result.taxonomy_of(model)
    out: list[str] = []
    if tax is not None:
        out.append(f"Classification: {tax.label}. {tax.reason[0].upper()}{tax.reason[1:]}.")
        if not tax.allows_inference:
            out.append("The numbers below are descriptive only; no inference about extraneous load is drawn.")
            return out
    for cond in H1_CONDITIONS:
        h = result.h1_of(model, cond)
        if h is not None:
            out.append(_h1_sentence(h, alpha))
    h2 = [r for r in result.h2 if r.model == model]
    if h2:
        out.append(_h2_sentence(h2, alpha))
    wrote = ice_writing.sentence(result.writing, model, alpha)
    if wrote is not None:
        out.append(wrote)
    h3 = next((x for x in result.h3 if x.model == model and x.load is None), None)
    if h3 is not None:
        out.append(_h3_sentence(h3, alpha))
    att = result.attention_of(model)
    if att is not None:
        out += _attention_sentences(att, alpha)
    ra = result.residue_attention_of(model)
    if ra:
        out.append(_residue_attention_sentence(ra, alpha))
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
    if c.strict_em_mean is not None:
        extra.append(f"strict {fmt.num(c.strict_em_mean)}")
    if c.scoring_path_shift:
        extra.append(f"§ scoring path ≠ Control (p={fmt.p_value(c.scoring_path_p)})")
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
    return table(header, rows) + (f'<p class="note">{esc(MARK_LEGEND)}. SEM over trials; n = scored trials; strict = '
                                  "strict EM (box or Answer: line only); § = the mix of scoring rules differs from "
                                  "Control's (sign-flip test by question, p &lt; α).</p>")


NO_H3 = "Not estimated: the run has no Residue trial paired with a Control trial of its question."
STATS_NOTE = ("Small-sample inference (docs/statistics.md): EM intervals are Wilson intervals at the Korn–Graubard "
              "effective size, inside [0, 1] and clustered by question; regressions use CR2 standard errors clustered "
              "by question with a t reference on Bell–McCaffrey df; with fewer than 6 questions a fit is described, "
              "not tested. q = Benjamini–Hochberg q-value within the family named in each heading; bold = below α.")


def stats_html(result: IceResult, settings: AnalysisSection) -> str:
    """H1, H2, H3, attention and taxonomy tables."""
    alpha = settings.alpha
    h1 = table(["model", "condition", "β (EM/pp)", "95% CI", "p", "df", "logit coef", "logit p", "power", "MDE80",
                "n", "questions", "note"],
               [[esc(h.model), esc(h.condition), fmt.num(h.estimate.value, "+.5f"),
                 fmt.ci(h.estimate.ci_low, h.estimate.ci_high, "+.5f"), _p_cell(h.estimate.p, alpha),
                 fmt.num(h.estimate.df, ".1f"), fmt.num(h.logit.estimate.value if h.logit else None, "+.4f"),
                 fmt.p_value(h.logit.estimate.p if h.logit else None, html=True),
                 fmt.num(h.power.power if h.power else None, ".2f"),
                 fmt.num(h.power.mde if h.power else None, ".4f"), str(h.n), str(h.n_clusters),
                 esc(h.estimate.reason or (h.logit.estimate.reason if h.logit else None) or "")]
                for h in result.h1], left=2, text=(12,))
    h2 = table(["model", "a vs b", "load", "pairs", "questions", "EM a", "EM b", "Δ per question", "p (sign flip)",
                "q (BH)", "TOST q (±δ)", "verdict", "McNemar a only / b only", "McNemar p", "MDE80", "note"],
               [[esc(r.model), esc(f"{r.a} vs {r.b}"), str(r.load), str(r.test.n_pairs), str(r.test.n_questions),
                 fmt.num(r.test.em_a), fmt.num(r.test.em_b), fmt.num(r.test.delta, "+.3f"),
                 fmt.p_value(r.test.p, html=True),
                 _p_cell(r.q, alpha), _p_cell(r.equivalence.estimate.q if r.equivalence else None, alpha), esc(r.verdict(alpha)),
                 f"{r.test.mcnemar.n_a_only} / {r.test.mcnemar.n_b_only}" if r.test.mcnemar else fmt.DASH,
                 fmt.p_value(r.test.mcnemar.p if r.test.mcnemar else None, html=True),
                 fmt.num(r.test.power.mde if r.test.power else None, ".2f"),
                 esc("; ".join(x for x in (r.note, r.test.reason, _tost_note(r)) if x))]
                for r in result.h2], left=2, text=(11, 15))
    h3 = table(["model", "Residue load", "questions", "Pearson r", "95% CI (Fisher z)", "p", "q (BH)", "Spearman ρ",
                "p (ρ)", "S_sim range", "degradation by S_sim third (low / mid / high, n)", "note"],
               [[esc(r.model), "pooled" if r.load is None else str(r.load), str(c.n), fmt.num(e.value, "+.3f"),
                 fmt.ci(e.ci_low, e.ci_high, "+.3f"), fmt.p_value(e.p, html=True), _p_cell(e.q, alpha),
                 fmt.num(c.spearman.value, "+.3f"), fmt.p_value(c.spearman.p, html=True), *h3_spread(r),
                 esc(e.reason or "")]
                for r in result.h3 for c in (r.correlation,) for e in (c.estimate,)], left=2, text=(11,)) \
        if result.h3 else f'<p class="note">{esc(NO_H3)}</p>'
    tax = table(["model", "label", "Control EM", "trunc./uninterp.", "gates", "reason"],
                [[esc(t.model), esc(t.label), fmt.num(t.control_em), fmt.pct(t.confound_rate_observed),
                  esc(f"EM<{t.gates.brittle_em}, rate>{t.gates.confound_rate}, α={t.gates.alpha}"), esc(t.reason)]
                 for t in result.taxonomy], left=2, text=(4, 5))
    return (f'<p class="note">{esc(STATS_NOTE)}</p>'
            f"<h3>H1: EM per percentage point of load (Control as load 0; one test per condition)</h3>{h1}"
            f"<h3>H2: paired comparisons (sign-flip test of per-question differences; McNemar beside it; TOST "
            f"against ±δ; each its own BH family over the model's comparisons)</h3>{h2}"
            f"<h3>H3: S_sim vs degradation EM(Control) − EM(Residue) (BH family: the model's rows)</h3>{h3}"
            f"{attention_tables_html(result, alpha)}"
            f"<h3>Taxonomy</h3>{tax}")


def attention_measures(result: IceResult, model: str) -> list[tuple[str, str]]:
    """(measure id, label) of the model's attention cells on (layer, head), in the order the analysis wrote them."""
    out: list[tuple[str, str]] = []
    for c in result.attention_cells:
        if c.model == model and c.measure != "ar_k" and (c.measure, c.label) not in out:
            out.append((c.measure, c.label))
    return out


def attention_tables_html(result: IceResult, alpha: float) -> str:
    """The layers and heads that pass their family's correction (attention ↔ behaviour, H3 in attention)."""
    parts = []
    tested = [(a.model, f"{a.label}, failed − correct", a.layer_tests) for a in result.attention_behaviour]
    tested += [(r.model, f"AR_k ({r.target}) per unit S_sim", r.test) for r in result.residue_attention]
    rows = [[esc(model), esc(label), str(t.layer), fmt.num(e.value, "+.4f"), fmt.ci(e.ci_low, e.ci_high, "+.4f"),
             fmt.p_value(e.p, html=True), _p_cell(e.q, alpha), fmt.num(e.df, ".1f")]
            for model, label, tests in tested if tests is not None
            for t in tests.layers if (e := t.estimate).q is not None and e.q < alpha]
    if result.attention_behaviour or result.residue_attention:
        body = (table(["model", "test", "layer", "estimate", "95% CI", "p", "q (BH)", "df"], rows, left=2) if rows
                else '<p class="note">No layer passes its family\'s correction.</p>')
        parts.append("<h3>Layers that pass Benjamini–Hochberg (family: the layers of one model and test)</h3>" + body)
    heads = []
    for a in result.attention_behaviour:
        if a.heads is None:
            continue
        for h in a.heads.significant:
            heads.append([esc(a.model), esc(a.label), esc(head_label(h.layer, h.head)),
                          "distractor head" if h.value > 0 else "less enrichment when failing",
                          fmt.num(h.value, "+.3f"), fmt.ci(h.estimate.ci_low, h.estimate.ci_high, "+.3f"),
                          fmt.p_value(h.estimate.p, html=True), _p_cell(h.q, alpha),
                          fmt.p_value(h.p_max_t, html=True)])
    if result.attention_behaviour:
        grids = "; ".join(f"{esc(a.model)} {esc(a.label)}: {a.heads.n_tested} heads tested"
                          + ("" if a.heads.is_test else f" (not tested: {esc(a.heads.reason)})")
                          for a in result.attention_behaviour if a.heads is not None)
        body = (table(["model", "measure", "head (layer.head)", "kind", "failed − correct enrichment", "95% CI", "p",
                       "q (BH)", "max-T p"], heads, left=4) if heads else
                '<p class="note">No head passes the correction.</p>')
        max_t = "; ".join(f"{esc(a.model)} {esc(a.label)}: {len(a.heads.max_t.significant)} head(s) with max-T p < "
                          f"{alpha:g} over {a.heads.max_t.n_questions} questions with both outcomes"
                          for a in result.attention_behaviour
                          if a.heads is not None and a.heads.max_t is not None and a.heads.max_t.p_max_t is not None)
        parts.append("<h3>Distractor heads: enrichment (P_ext / chance), failed − correct at equal load and placement "
                     f"(BH family: the model's layer × head grid)</h3><p class=\"note\">{grids}."
                     + (f" Family-wise over the grid (max-T sign flip of whole questions, "
                        f"docs/statistics.md#hop-mass-tests): {max_t}." if max_t else "") + f"</p>{body}")
    return "".join(parts)


def figures_html(result: IceResult, ctx: ReportContext) -> str:
    """Every ICE figure of a report, written through ``ctx.figure`` (absent figures are left out)."""
    marks = taxonomy_marks(result)
    alpha = ctx.settings.alpha
    h1 = [h for h in result.h1 if h.condition == "Saturation"]
    blocks = [
        ctx.figure("saturation_curve", "EM vs extraneous load with 95% CIs (Wilson at the effective sample size, "
                   "clustered by question). Control: line and band; LongControl: open triangles at the load it is "
                   "length-matched to.", F.draw_saturation_curve(result, marks)),
        ctx.figure("em_by_condition", "EM for every condition × load and model (95% CIs, inside [0, 1]).",
                   F.draw_em_by_condition(result, marks)),
        ctx.figure("h1_forest", "H1 slope β (EM per percentage point of load) with 95% CI (CR2, t on Bell–McCaffrey "
                   "df), per model.",
                   draw_forest([(f"{short(h.model)}{marks.get(h.model, '')}", h.estimate.value, h.estimate.ci_low,
                                 h.estimate.ci_high) for h in h1],
                               "β (EM per pp of load)", "H1: load trend under Saturation") if h1 else None),
        ctx.figure("h3_scatter", "H3: per question S_sim vs degradation, least-squares line, Pearson r with Fisher-z "
                   "CI and the p of the same pivot.", F.draw_h3_scatter(result, marks)),
        ctx.figure("h3_attention", "H3 in attention: per layer, the change in head-mean AR_k per unit of S_sim over "
                   "the Residue prompts (at equal load), 95% CI clustered by question; filled orange = q < α after "
                   "Benjamini–Hochberg over the layers.", F.draw_residue_attention(result, alpha)),
    ]
    for model in result.models:
        stem = file_stem(model)
        for measure, label in attention_measures(result, model):
            att = result.attention_of(model, measure)
            prefix = "" if measure == "p_ext" else f"{measure}_"
            blocks += [
                ctx.figure(f"{prefix}enrichment_{stem}", f"{model}: {label} enrichment ({label} / chance) per layer × "
                           "head; red = more than attention spread uniformly over tokens would give, blue = less, "
                           "white = chance. Black boxes: heads whose enrichment differs between failed and correct "
                           "trials (q < α over the grid).",
                           F.draw_enrichment_heatmaps(result, model, att, alpha, measure)),
                ctx.figure(f"{measure}_layers_{stem}", f"{model}: head-mean {label} per layer; dashed = chance level.",
                           F.draw_measure_layers(result, model, measure)),
            ]
        blocks += [
            ctx.figure(f"ar_k_{stem}", f"{model}: head-mean attentional residue AR_k per layer and target segment.",
                       F.draw_ar_k(result, model)),
        ]
    blocks.append(ctx.figure("attention_behaviour", "Per layer, top: failed − correct difference in head-mean P_ext "
                             "at equal load and placement (the test); bottom: log-odds of a wrong answer per unit of "
                             "P_ext (logistic robustness line). 95% CIs clustered by question; orange = q < α after "
                             "Benjamini–Hochberg over the layers.", F.draw_attention_behaviour(result, alpha)))
    return "".join(blocks)


def section_html(result: IceResult, ctx: ReportContext) -> str:
    """The ICE part of ``report.html``: summary, Table 1, figures, statistics."""
    summary = summary_html(result, ctx.settings)
    return ((f"<h2>Summary</h2>{summary}" if summary else "")
            + f"<h2>Table 1: exact match, mean (SEM)</h2>{table1_html(result)}"
            + ice_writing.html(result.writing, ctx.settings.alpha)
            + f"<h2>Figures</h2>{figures_html(result, ctx)}"
            + f"<h2>Statistics</h2>{stats_html(result, ctx.settings)}"
            + ice_hops.html(result.hop_tracking, ctx)
            + retrieval_html(result, ctx))


# ----------------------------------------------------------------------------------------- markdown, csv


def h3_spread(row: H3Correlation) -> tuple[str, str]:
    """How far S_sim varied over an H3 row's questions (lowest to highest), and the mean degradation of the
    questions in the lowest, middle and highest third of them by S_sim (descriptive: the test is the correlation)."""
    points = sorted((p for p in row.points if np.isfinite(p.s_sim) and np.isfinite(p.degradation)),
                    key=lambda p: p.s_sim)
    if len(points) < 3:
        return "", ""
    thirds = [points[i * len(points) // 3 : (i + 1) * len(points) // 3] for i in range(3)]
    means = " / ".join(f"{float(np.mean([p.degradation for p in t])):+.2f} ({len(t)})" for t in thirds)
    return f"{points[0].s_sim:+.2f} to {points[-1].s_sim:+.2f}", means


def markdown(result: IceResult, settings: AnalysisSection) -> list[str]:
    """The ICE part of ``analysis.md``: legend, H1, H2, H3, attention and taxonomy tables."""
    alpha = settings.alpha
    parts: list[str] = [MARK_LEGEND, "", STATS_NOTE, ""]
    parts += ["## H1: EM per percentage point of load (Control = load 0)", "",
              md_table(["model", "condition", "β (EM/pp)", "95% CI", "p", "df", "logit coef", "logit p", "power",
                        "MDE80", "n", "G", "note"],
                       [[h.model, h.condition, fmt.num(h.estimate.value, "+.5f"),
                         fmt.ci(h.estimate.ci_low, h.estimate.ci_high, "+.5f"), fmt.p_value(h.estimate.p),
                         fmt.num(h.estimate.df, ".1f"), fmt.num(h.logit.estimate.value if h.logit else None, "+.4f"),
                         fmt.p_value(h.logit.estimate.p if h.logit else None),
                         fmt.num(h.power.power if h.power else None, ".2f"),
                         fmt.num(h.power.mde if h.power else None, ".4f"), str(h.n), str(h.n_clusters),
                         h.estimate.reason or (h.logit.estimate.reason if h.logit else None) or ""]
                        for h in result.h1]), ""]
    parts += ["## H2: paired comparisons (sign-flip test; McNemar secondary; TOST against ±δ; BH per model)", "",
              md_table(["model", "comparison", "load", "pairs", "G", "EM a", "EM b", "Δ", "p", "q", "TOST q", "verdict",
                        "McNemar p", "MDE80", "note"],
                       [[r.model, f"{r.a} vs {r.b}", str(r.load), str(r.test.n_pairs), str(r.test.n_questions),
                         fmt.num(r.test.em_a), fmt.num(r.test.em_b), fmt.num(r.test.delta, "+.3f"),
                         fmt.p_value(r.test.p),
                         fmt.p_value(r.q), fmt.p_value(r.equivalence.estimate.q if r.equivalence else None), r.verdict(settings.alpha),
                         fmt.p_value(r.test.mcnemar.p if r.test.mcnemar else None),
                         fmt.num(r.test.power.mde if r.test.power else None, ".2f"),
                         "; ".join(x for x in (r.note, r.test.reason, _tost_note(r)) if x)] for r in result.h2]), ""]
    parts += ["## H3: S_sim vs degradation (Control − Residue; BH per model)", "",
              md_table(["model", "load", "questions", "r", "95% CI (Fisher z)", "p", "q", "Spearman ρ", "S_sim range",
                        "degradation by S_sim third (low / mid / high, n)", "note"],
                       [[r.model, "pooled" if r.load is None else str(r.load), str(c.n), fmt.num(e.value, "+.3f"),
                         fmt.ci(e.ci_low, e.ci_high, "+.3f"), fmt.p_value(e.p), fmt.p_value(e.q),
                         fmt.num(c.spearman.value, "+.3f"), *h3_spread(r), e.reason or ""]
                        for r in result.h3 for c in (r.correlation,) for e in (c.estimate,)])
              if result.h3 else NO_H3, ""]
    if result.attention_behaviour:
        parts += ["## Attention ↔ behaviour (BH across layers; across the layer × head grid)", ""]
        for a in result.attention_behaviour:
            parts += [f"- {a.model}: " + " ".join(_attention_sentences(a, alpha))]
        parts.append("")
    if result.residue_attention:
        parts += ["## H3 in attention (AR_k on S_sim per layer, BH across layers per target)", ""]
        for m in result.models:
            rows = result.residue_attention_of(m)
            if rows:
                parts.append(f"- {m}: {_residue_attention_sentence(rows, alpha)}")
        parts.append("")
    parts += ["## Taxonomy", "",
              md_table(["model", "label", "Control EM", "trunc./uninterp. rate", "reason"],
                       [[t.model, t.label, fmt.num(t.control_em), fmt.pct(t.confound_rate_observed), t.reason]
                        for t in result.taxonomy]), ""]
    return (parts + ice_writing.markdown(result.writing) + ice_hops.markdown(result.hop_tracking)
            + retrieval_markdown(result))


def tables(result: IceResult) -> list[tuple[str, Rows]]:
    """``tables/*.csv`` of the ICE result."""
    layer_tests = [row for a in result.attention_behaviour if a.layer_tests is not None
                   for row in rows_of(a.layer_tests.layers, model=a.model, measure=a.measure)]
    logit_layers = [row for a in result.attention_behaviour
                    for row in rows_of(a.layers, model=a.model, measure=a.measure)]
    heads = [row for a in result.attention_behaviour if a.heads is not None
             for row in rows_of(a.heads.significant, model=a.model, measure=a.measure)]
    residue = [{**row, "pearson_r": pr} for r in result.residue_attention if r.test is not None
               for row, pr in zip(rows_of(r.test.layers, model=r.model, target=r.target), r.pearson_r)]
    points = [row for h in result.h3 for row in rows_of(h.points, model=h.model, load=h.load)]
    return ([("cells", rows_of(result.cells)), ("h1", rows_of(result.h1)), ("h2", rows_of(result.h2)),
             ("h3", rows_of(result.h3)), ("h3_points", points), ("attention_layers", layer_tests),
             ("attention_logit_layers", logit_layers), ("attention_heads", heads), ("residue_attention", residue),
             ("taxonomy", rows_of(result.taxonomy))] + ice_writing.tables(result.writing)
            + ice_hops.tables(result.hop_tracking) + retrieval_tables(result))


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
        e = h.estimate
        if e.value is None:
            lines.append(f"H1 {h.model}: no estimate ({e.reason})")
        elif not e.is_test:
            lines.append(f"H1 {h.model}: β = {fmt.num(e.value, '+.5f')} EM/pp, not tested ({e.reason})")
        else:
            lines.append(f"H1 {h.model}: β = {fmt.num(e.value, '+.5f')} EM/pp {fmt.ci(e.ci_low, e.ci_high, '+.5f')}, "
                         f"p = {fmt.p_value(e.p)} (CR2, t on {fmt.num(e.df, '.1f')} df), n = {h.n} over "
                         f"{h.n_clusters} questions")
    if result.cells:
        lines.append(MARK_LEGEND)
    return lines


# ----------------------------------------------------------------------------------------------- compare


def merge(named: list[tuple[str, IceResult]]) -> IceResult:
    """Several runs' ICE results as one, each model renamed ``<run>: <model>``.

    Attention cells are left out: a comparison draws no attention figure.
    """
    def renamed(label: str, items: tuple) -> tuple:
        return tuple(replace(x, model=f"{label}: {x.model}") for x in items)

    return IceResult(
        models=tuple(f"{label}: {m}" for label, r in named for m in r.models),
        cells=sum((renamed(label, r.cells) for label, r in named), ()),
        h1=sum((renamed(label, r.h1) for label, r in named), ()),
        h2=sum((renamed(label, r.h2) for label, r in named), ()),
        h3=sum((renamed(label, r.h3) for label, r in named), ()),
        residue_attention=sum((renamed(label, r.residue_attention) for label, r in named), ()),
        attention_cells=(),
        attention_behaviour=sum((renamed(label, r.attention_behaviour) for label, r in named), ()),
        taxonomy=sum((renamed(label, r.taxonomy) for label, r in named), ()),
        hop_tracking=ice_hops.merge([(label, r.hop_tracking) for label, r in named]),
        writing=sum((renamed(label, r.writing) for label, r in named), ()),
    )


def h1_forest_rows(result: IceResult, marks: dict[str, str]) -> list[tuple[str, float | None, float | None,
                                                                        float | None]]:
    """The comparison's H1 forest: one row per model and condition with an H1 fit (a run may have Residue cells
    alone, as a knockout run has), labelled ``run: model · condition``."""
    return [(f"{m}{marks.get(m, '')} · {cond}", h.estimate.value, h.estimate.ci_low, h.estimate.ci_high)
            for m in result.models for cond in H1_CONDITIONS
            if (h := result.h1_of(m, cond)) is not None]


def compare_html(result: IceResult, ctx: ReportContext) -> str:
    """The ICE part of a comparison page: Table 1, figures across runs, summaries, statistics."""
    marks = taxonomy_marks(result)
    h1 = h1_forest_rows(result, marks)
    h3 = [(m, e.value, e.ci_low, e.ci_high) for m in result.models for h in result.h3 if h.model == m and h.load is None
          for e in (h.correlation.estimate,)]
    blocks = "".join([
        ctx.figure("saturation_curve", "EM vs load per model and run, 95% CIs.", F.draw_saturation_curve(result, marks)),
        ctx.figure("em_by_condition", "EM per condition × load, all models and runs.",
                   F.draw_em_by_condition(result, marks)),
        ctx.figure("h1_forest", "H1 slope β per model, run and condition (Control as load 0), 95% CI.",
                   draw_forest(h1, "β (EM per pp of load)", "H1 across runs")),
        ctx.figure("h3_forest", "H3 Pearson r (pooled over loads) per model and run, Fisher-z 95% CI.",
                   draw_forest(h3, "Pearson r (S_sim vs degradation)", "H3 across runs")),
    ])
    summary = "".join(f"<h3>{esc(m)}</h3><ul>" + "".join(f"<li>{esc(s)}</li>"
                                                         for s in model_summary(result, m, ctx.settings)) + "</ul>"
                      for m in result.models)
    return (f"<h2>Table 1: exact match, mean (SEM)</h2>{table1_html(result)}"
            f"<h2>Figures</h2>{blocks}<h2>Summary</h2>{summary}"
            f"{ice_writing.html(result.writing, ctx.settings.alpha)}"
            f"<h2>Statistics</h2>{stats_html(result, ctx.settings)}{ice_hops.html(result.hop_tracking)}")


SECTION = ReportSection(family=FAMILY, html=section_html, tables=tables, merge=merge, markdown=markdown,
                        main_rows=main_rows, main_lines=main_lines, compare_html=compare_html)
