"""The ICE section of a report (family ``ice``), drawn from an :class:`probe.analysis.ice.IceResult`
(docs/records.md#report)."""

from __future__ import annotations

from functools import partial

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
from probe.report.blocks import Block, Bullets, Heading, Note, Plot, Text, table_of
from probe.report.blocks import Cell as BlockCell
from probe.report.retrieval import retrieval_blocks, retrieval_tables
from probe.report.sections import ReportSection, Rows
from probe.report.tables import rows_of

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


def _h2_sentence(rows: list[PairedComparison], alpha: float, what: str = "H2", measure: str = "EM") -> str:
    tested = [r for r in rows if r.test.is_test and r.test.p is not None and r.q is not None]
    untested = [r for r in rows if r not in tested]
    lead = (f"{what} (sign-flip test of per-question differences, Benjamini–Hochberg over the {len(tested)} tested "
            f"comparisons of this model)")
    parts = []
    if tested:
        sig = [r for r in tested if r.q < alpha]  # type: ignore[operator]
        if sig:
            items = []
            for r in sig:
                word = "lower" if (r.test.delta or 0) < 0 else "higher"
                t = r.test
                items.append(f"{_pair_label(r)}: {measure} {word} by {fmt.num(abs(t.delta or 0), '.2f')} "
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
                         + (f"; MDE {fmt.num(best.test.power.mde, '.2f')} {measure} at 80% power" if best.test.power else "")
                         + ").")
    undecided = [r for r in tested if r.verdict(alpha) != "different"]
    if undecided:
        margin = next((r.equivalence.margin for r in undecided if r.equivalence is not None), None)
        same = [r for r in undecided if r.verdict(alpha).startswith("equivalent")]
        within = "" if margin is None else f" within ±{margin:g} {measure}"
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
    strict = [r for r in result.h2_strict if r.model == model]
    if strict:
        out.append(_h2_sentence(strict, alpha, "H2 on strict EM", "strict EM"))
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


def summary_blocks(result: IceResult, settings: AnalysisSection) -> list[Block]:
    """Each model's summary sentences as a list under its name (nothing when no model has any)."""
    lists = [Bullets(tuple(sentences), m) for m in result.models if (sentences := model_summary(result, m, settings))]
    return [Heading("Summary"), *lists] if lists else []


def _em_cell(c: Cell | None) -> BlockCell:
    if c is None:
        return fmt.DASH
    if c.em_mean is None:
        return Text("", f"n=0 ({c.n_error} err, {c.n_skipped} skip)")
    extra = [f"n={c.n}"]
    if c.strict_em_mean is not None:
        extra.append(f"strict {fmt.num(c.strict_em_mean)}")
    if c.scoring_path_shift:
        extra.append(f"§ scoring path ≠ Control (p={fmt.p_value(c.scoring_path_p)})")
    if c.truncated_rate:
        extra.append(f"trunc {fmt.pct(c.truncated_rate)}")
    if c.n_error:
        extra.append(f"{c.n_error} err")
    return Text(f"{fmt.num(c.em_mean)} ({fmt.num(c.em_sem)})", ", ".join(extra))


def table1(result: IceResult) -> list[Block]:
    """Table 1: EM mean (SEM) per model (rows, with taxonomy marks) × condition and load (columns)."""
    keys = sorted({(c.condition, c.load or 0) for c in result.cells}, key=F.condition_order)
    by = {(c.model, c.condition, c.load or 0): c for c in result.cells}
    marks = taxonomy_marks(result)
    return [Heading("Table 1: exact match, mean (SEM)"),
            table_of(["model"] + [c if c == "Control" else f"{c} {ld}%" for c, ld in keys],
                     [[f"{m}{marks.get(m, '')}"] + [_em_cell(by.get((m, c, ld))) for c, ld in keys]
                      for m in result.models]),
            Note(f"{MARK_LEGEND}. SEM over trials; n = scored trials; strict = strict EM (box or Answer: line only); "
                 "§ = the mix of scoring rules differs from Control's (sign-flip test by question, p < α).")]


NO_H3 = "Not estimated: the run has no Residue trial paired with a Control trial of its question."
STATS_NOTE = ("Small-sample inference (docs/statistics.md): EM intervals are Wilson intervals at the Korn–Graubard "
              "effective size, inside [0, 1] and clustered by question; regressions use CR2 standard errors clustered "
              "by question with a t reference on Bell–McCaffrey df; with fewer than 6 questions a fit is described, "
              "not tested. q = Benjamini–Hochberg q-value within the family named in each heading; bold = below α.")


def _p(p: float | None, alpha: float) -> Text:
    """A p- or q-value cell, strong where below alpha."""
    return Text(fmt.p_value(p), strong=p is not None and p < alpha)


def stats_blocks(result: IceResult, settings: AnalysisSection) -> list[Block]:
    """H1, H2, H3, attention and taxonomy tables."""
    alpha = settings.alpha
    h1 = table_of(["model", "condition", "β (EM/pp)", "95% CI", "p", "df", "logit coef", "logit p", "power", "MDE80",
                   "n", "questions", "note"],
                  [[h.model, h.condition, fmt.num(h.estimate.value, "+.5f"),
                    fmt.ci(h.estimate.ci_low, h.estimate.ci_high, "+.5f"), _p(h.estimate.p, alpha),
                    fmt.num(h.estimate.df, ".1f"), fmt.num(h.logit.estimate.value if h.logit else None, "+.4f"),
                    fmt.p_value(h.logit.estimate.p if h.logit else None),
                    fmt.num(h.power.power if h.power else None, ".2f"),
                    fmt.num(h.power.mde if h.power else None, ".4f"), str(h.n), str(h.n_clusters),
                    h.estimate.reason or (h.logit.estimate.reason if h.logit else None) or ""]
                   for h in result.h1], left=2, text=(12,))
    def h2_table(rows: tuple[PairedComparison, ...]) -> Block:
        return table_of(["model", "a vs b", "load", "pairs", "questions", "EM a", "EM b", "Δ per question",
                         "p (sign flip)", "q (BH)", "TOST q (±δ)", "TOST 90% CI", "verdict", "McNemar a only / b only",
                         "McNemar p", "MDE80", "note"],
                        [[r.model, f"{r.a} vs {r.b}", str(r.load), str(r.test.n_pairs), str(r.test.n_questions),
                          fmt.num(r.test.em_a), fmt.num(r.test.em_b), fmt.num(r.test.delta, "+.3f"),
                          fmt.p_value(r.test.p), _p(r.q, alpha),
                          _p(r.equivalence.estimate.q if r.equivalence else None, alpha),
                          fmt.ci(r.equivalence.estimate.ci_low, r.equivalence.estimate.ci_high, "+.3f")
                          if r.equivalence and r.equivalence.estimate.is_test else fmt.DASH, r.verdict(alpha),
                          f"{r.test.mcnemar.n_a_only} / {r.test.mcnemar.n_b_only}" if r.test.mcnemar else fmt.DASH,
                          fmt.p_value(r.test.mcnemar.p if r.test.mcnemar else None),
                          fmt.num(r.test.power.mde if r.test.power else None, ".2f"),
                          "; ".join(x for x in (r.note, r.test.reason, _tost_note(r)) if x)]
                         for r in rows], left=2, text=(12, 16))

    h2 = h2_table(result.h2)
    h3: Block = table_of(["model", "Residue load", "questions", "Pearson r", "95% CI (Fisher z)", "p", "q (BH)",
                          "Spearman ρ", "p (ρ)", "S_sim range", "degradation by S_sim third (low / mid / high, n)",
                          "note"],
                         [[r.model, "pooled" if r.load is None else str(r.load), str(c.n), fmt.num(e.value, "+.3f"),
                           fmt.ci(e.ci_low, e.ci_high, "+.3f"), fmt.p_value(e.p), _p(e.q, alpha),
                           fmt.num(c.spearman.value, "+.3f"), fmt.p_value(c.spearman.p), *h3_spread(r), e.reason or ""]
                          for r in result.h3 for c in (r.correlation,) for e in (c.estimate,)], left=2, text=(11,)) \
        if result.h3 else Note(NO_H3)
    tax = table_of(["model", "label", "Control EM", "trunc./uninterp.", "gates", "reason"],
                   [[t.model, t.label, fmt.num(t.control_em), fmt.pct(t.confound_rate_observed),
                     f"EM<{t.gates.brittle_em}, rate>{t.gates.confound_rate}, α={t.gates.alpha}", t.reason]
                    for t in result.taxonomy], left=2, text=(4, 5))
    return [Heading("Statistics"), Note(STATS_NOTE),
            Heading("H1: EM per percentage point of load (Control as load 0; one test per condition)", 3), h1,
            Heading("H2: paired comparisons (sign-flip test of per-question differences; McNemar beside it; TOST "
                    "against ±δ; each its own BH family over the model's comparisons)", 3), h2,
            *([Heading("H2 on strict EM (correct and decided by a box or an answer line; the same tests, their own BH "
                       "families)", 3), h2_table(result.h2_strict)] if result.h2_strict else []),
            Heading("H3: S_sim vs degradation EM(Control) − EM(Residue) (BH family: the model's rows)", 3), h3,
            *attention_blocks(result, alpha), Heading("Taxonomy", 3), tax]


def attention_measures(result: IceResult, model: str) -> list[tuple[str, str]]:
    """(measure id, label) of the model's attention cells on (layer, head), in the order the analysis wrote them."""
    out: list[tuple[str, str]] = []
    for c in result.attention_cells:
        if c.model == model and c.measure != "ar_k" and (c.measure, c.label) not in out:
            out.append((c.measure, c.label))
    return out


def attention_blocks(result: IceResult, alpha: float) -> list[Block]:
    """The layers and heads that pass their family's correction (attention ↔ behaviour, H3 in attention)."""
    out: list[Block] = []
    tested = [(a.model, f"{a.label}, failed − correct", a.layer_tests) for a in result.attention_behaviour]
    tested += [(r.model, f"AR_k ({r.target}) per unit S_sim", r.test) for r in result.residue_attention]
    rows: list[list[BlockCell]] = [
        [model, label, str(t.layer), fmt.num(e.value, "+.4f"), fmt.ci(e.ci_low, e.ci_high, "+.4f"),
         fmt.p_value(e.p), _p(e.q, alpha), fmt.num(e.df, ".1f")]
        for model, label, tests in tested if tests is not None
        for t in tests.layers if (e := t.estimate).q is not None and e.q < alpha]
    if result.attention_behaviour or result.residue_attention:
        out += [Heading("Layers that pass Benjamini–Hochberg (family: the layers of one model and test)", 3),
                table_of(["model", "test", "layer", "estimate", "95% CI", "p", "q (BH)", "df"], rows, left=2) if rows
                else Note("No layer passes its family's correction.")]
    if not result.attention_behaviour:
        return out
    heads = [[a.model, a.label, head_label(h.layer, h.head),
              "distractor head" if h.value > 0 else "less enrichment when failing", fmt.num(h.value, "+.3f"),
              fmt.ci(h.estimate.ci_low, h.estimate.ci_high, "+.3f"), fmt.p_value(h.estimate.p), _p(h.q, alpha),
              fmt.p_value(h.p_max_t)]
             for a in result.attention_behaviour if a.heads is not None for h in a.heads.significant]
    grids = "; ".join(f"{a.model} {a.label}: {a.heads.n_tested} heads tested"
                      + ("" if a.heads.is_test else f" (not tested: {a.heads.reason})")
                      for a in result.attention_behaviour if a.heads is not None)
    max_t = "; ".join(f"{a.model} {a.label}: {len(a.heads.max_t.significant)} head(s) with max-T p < {alpha:g} over "
                      f"{a.heads.max_t.n_questions} questions with both outcomes"
                      for a in result.attention_behaviour
                      if a.heads is not None and a.heads.max_t is not None and a.heads.max_t.p_max_t is not None)
    return out + [
        Heading("Distractor heads: enrichment (P_ext / chance), failed − correct at equal load and placement (BH "
                "family: the model's layer × head grid)", 3),
        Note(f"{grids}." + (f" Family-wise over the grid (max-T sign flip of whole questions, "
                            f"docs/statistics.md#hop-mass-tests): {max_t}." if max_t else "")),
        table_of(["model", "measure", "head (layer.head)", "kind", "failed − correct enrichment", "95% CI", "p",
                  "q (BH)", "max-T p"], heads, left=4) if heads else Note("No head passes the correction.")]


def h1_forest_rows(result: IceResult, marks: dict[str, str]) -> list[tuple[str, float | None, float | None,
                                                                        float | None]]:
    """The H1 forest: one row per model and condition with an H1 fit (a run may have Residue cells alone, as a
    knockout run has), labelled ``model · condition``."""
    return [(f"{short(m)}{marks.get(m, '')} · {cond}", h.estimate.value, h.estimate.ci_low, h.estimate.ci_high)
            for m in result.models for cond in H1_CONDITIONS
            if (h := result.h1_of(m, cond)) is not None]


def figure_blocks(result: IceResult, alpha: float) -> list[Block]:
    """Every ICE figure (each drawn where it is shown; an empty one is left out)."""
    marks = taxonomy_marks(result)
    h1 = h1_forest_rows(result, marks)
    h3 = [(short(m), e.value, e.ci_low, e.ci_high) for m in result.models for h in result.h3
          if h.model == m and h.load is None for e in (h.correlation.estimate,)]
    out: list[Block] = [
        Heading("Figures"),
        Plot("saturation_curve", "EM vs extraneous load with 95% CIs (Wilson at the effective sample size, clustered "
             "by question). Control: line and band; LongControl: open triangles at the load it is length-matched to.",
             partial(F.draw_saturation_curve, result, marks)),
        Plot("em_by_condition", "EM for every condition × load and model (95% CIs, inside [0, 1]).",
             partial(F.draw_em_by_condition, result, marks)),
        Plot("h1_forest", "H1 slope β (EM per percentage point of load, Control as load 0) per model and condition, "
             "with 95% CI (CR2, t on Bell–McCaffrey df).",
             partial(draw_forest, h1, "β (EM per pp of load)", "H1: load trend") if h1 else lambda: None),
        Plot("h3_scatter", "H3: per question S_sim vs degradation, least-squares line, Pearson r with Fisher-z CI and "
             "the p of the same pivot.", partial(F.draw_h3_scatter, result, marks)),
        Plot("h3_forest", "H3 Pearson r (pooled over loads) per model, Fisher-z 95% CI.",
             partial(draw_forest, h3, "Pearson r (S_sim vs degradation)", "H3 per model") if len(h3) > 1
             else lambda: None),
        Plot("h3_attention", "H3 in attention: per layer, the change in head-mean AR_k per unit of S_sim over the "
             "Residue prompts (at equal load), 95% CI clustered by question; filled orange = q < α after "
             "Benjamini–Hochberg over the layers.", partial(F.draw_residue_attention, result, alpha)),
    ]
    for model in result.models:
        stem = file_stem(model)
        for measure, label in attention_measures(result, model):
            prefix = "" if measure == "p_ext" else f"{measure}_"
            out += [
                Plot(f"{prefix}enrichment_{stem}", f"{model}: {label} enrichment ({label} / chance) per layer × head; "
                     "red = more than attention spread uniformly over tokens would give, blue = less, white = chance. "
                     "Black boxes: heads whose enrichment differs between failed and correct trials (q < α over the "
                     "grid).", partial(F.draw_enrichment_heatmaps, result, model, result.attention_of(model, measure),
                                       alpha, measure)),
                Plot(f"{measure}_layers_{stem}", f"{model}: head-mean {label} per layer; dashed = chance level.",
                     partial(F.draw_measure_layers, result, model, measure)),
            ]
        out.append(Plot(f"ar_k_{stem}", f"{model}: head-mean attentional residue AR_k per layer and target segment.",
                        partial(F.draw_ar_k, result, model)))
    out.append(Plot("attention_behaviour", "Per layer, top: failed − correct difference in head-mean P_ext at equal "
                    "load and placement (the test); bottom: log-odds of a wrong answer per unit of P_ext (logistic "
                    "robustness line). 95% CIs clustered by question; orange = q < α after Benjamini–Hochberg over "
                    "the layers.", partial(F.draw_attention_behaviour, result, alpha)))
    return out


def blocks(result: IceResult, settings: AnalysisSection) -> list[Block]:
    """The ICE section: summary, Table 1, what the model wrote, figures, statistics, hop tracking, retrieval heads."""
    return (summary_blocks(result, settings) + table1(result) + ice_writing.blocks(result.writing, settings.alpha)
            + figure_blocks(result, settings.alpha) + stats_blocks(result, settings)
            + ice_hops.blocks(result.hop_tracking, settings.alpha) + retrieval_blocks(result))


# ----------------------------------------------------------------------------------------- csv


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
             ("h2_strict", rows_of(result.h2_strict)), ("h3", rows_of(result.h3)), ("h3_points", points), ("attention_layers", layer_tests),
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


SECTION = ReportSection(family=FAMILY, blocks=blocks, tables=tables, main_rows=main_rows, main_lines=main_lines)
