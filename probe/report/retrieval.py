"""The retrieval-head part of the ICE report (:class:`probe.analysis.retrieval.RetrievalHeads`; definitions in
docs/probes.md#retrieval-heads): per model a layer × head map of the Control retrieval score with the top-k heads
marked, beside the Saturation answer-time P_ext of every head against its Control score; the ranking, stability and
per-head test tables; ``tables/retrieval_*.csv``. A probed run without answer capture gets one line saying so."""

from __future__ import annotations

from functools import partial

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from probe import formatting as fmt
from probe.analysis.ice import IceResult
from probe.analysis.head_tests import HeadTests
from probe.analysis.retrieval import RetrievalHeads
from probe.report.figures import file_stem, layer_ticks
from probe.report.blocks import Block, Heading, Note, Plot, table_of
from probe.report.sections import Rows
from probe.report.tables import rows_of

NO_CAPTURE = ("Retrieval heads: not computed: no probe record of this run holds an answer capture (the attention "
              "while the answer is written); probe with answer capture on to get them.")


def _label(layer: int, head: int) -> str:
    return f"L{layer}.H{head}"


def draw_retrieval_map(r: RetrievalHeads) -> Figure | None:
    """Left: Control retrieval score per layer × head, top-k boxed; right: per head, Control score vs Saturation
    answer-time P_ext (pooled over loads), top-k in orange."""
    if r.control is None:
        return None
    score = r.control.score.values
    n_layers, n_heads = score.shape
    sat = [c for c in r.cells if c.condition == "Saturation"]
    p_ext = None
    if sat:
        with np.errstate(invalid="ignore"):
            stack = np.stack([c.p_ext.values for c in sat])
            weights = np.array([c.n_trials for c in sat], dtype=float)[:, None, None]
            p_ext = np.nansum(stack * weights, axis=0) / np.sum(np.isfinite(stack) * weights, axis=0)
    fig = Figure(figsize=(9.5 if p_ext is not None else 5.2, min(7.0, max(3.0, 0.14 * n_layers + 1.4))),
                 layout="constrained")
    axes = fig.subplots(1, 2 if p_ext is not None else 1, squeeze=False)[0]
    image = axes[0].imshow(score, aspect="auto", cmap="viridis", origin="lower", interpolation="nearest", vmin=0)
    for h in r.control.top:
        axes[0].add_patch(Rectangle((h.head - 0.5, h.layer - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.4))
    axes[0].set_title(f"Control retrieval score (n={r.control.n_trials}; chance "
                      f"{fmt.num(r.control.chance, '.3f')})", fontsize=9)
    axes[0].set_xlabel("head")
    axes[0].set_ylabel("layer")
    layer_ticks(axes[0], n_layers)
    axes[0].xaxis.set_major_locator(MaxNLocator(nbins=min(n_heads, 8), integer=True))
    fig.colorbar(image, ax=axes[0], shrink=0.8, label="copied / copyable")
    if p_ext is not None:
        ax = axes[1]
        top = np.zeros(score.shape, dtype=bool)
        for h in r.control.top:
            top[h.layer, h.head] = True
        ax.scatter(score[~top], p_ext[~top], s=10, color="0.5", label="other heads")
        ax.scatter(score[top], p_ext[top], s=22, color="tab:orange", label=f"top {r.top_k} (Control)")
        link = next((d for d in r.distraction if d.load is None), None)
        rho = "" if link is None or link.spearman is None else (
            f"; Spearman ρ = {link.spearman:+.2f} {fmt.ci(link.spearman_ci_low, link.spearman_ci_high, '+.2f')}")
        ax.set_title(f"Control retrieval vs Saturation P_ext\nwhile answering{rho}", fontsize=9)
        ax.set_xlabel("Control retrieval score")
        ax.set_ylabel("Saturation answer-time P_ext")
        ax.legend(fontsize=8, frameon=False)
    return fig


STABILITY_HEADER = ["condition", "load", "Spearman ρ", "95% CI", "top-k overlap", "95% CI", "questions", "note"]
DISTRACTION_HEADER = ["Saturation load", "Spearman ρ", "95% CI", "Pearson r", "P_ext top k", "P_ext other heads",
                      "questions", "note"]
TESTS_HEADER = ["model", "test", "head", "estimate", "p", "q (BH)", "p (max-T)", "passes"]


def _stability_rows(r: RetrievalHeads) -> list[list[str]]:
    """Each cell's ranking against Control's (plain text)."""
    return [[s.condition, str(s.load), fmt.num(s.spearman, "+.2f"), fmt.ci(s.spearman_ci_low, s.spearman_ci_high, "+.2f"),
             fmt.num(s.overlap, ".2f"), fmt.ci(s.overlap_ci_low, s.overlap_ci_high, ".2f"), str(s.n_questions),
             s.reason or ""] for s in r.stability]


def _distraction_rows(r: RetrievalHeads) -> list[list[str]]:
    """Control retrieval against Saturation P_ext across heads, pooled and per load (plain text)."""
    return [["pooled" if d.load is None else str(d.load), fmt.num(d.spearman, "+.2f"),
             fmt.ci(d.spearman_ci_low, d.spearman_ci_high, "+.2f"), fmt.num(d.pearson, "+.2f"),
             fmt.num(d.top_k_p_ext, ".3f"), fmt.num(d.other_p_ext, ".3f"), str(d.n_questions), d.reason or ""]
            for d in r.distraction]


def _test_rows(r: RetrievalHeads, test: HeadTests | None) -> list[list[str]]:
    """The heads that pass either correction of a per-head test (plain text)."""
    if test is None:
        return []
    return [[r.model, test.measure, _label(h.layer, h.head), fmt.num(h.estimate.value, "+.3f"),
             fmt.p_value(h.estimate.p), fmt.p_value(h.estimate.q), fmt.p_value(h.p_max_t), passed]
            for h, passed in test.listed()]


def _header(header: list[str], r: RetrievalHeads) -> list[str]:
    return [h.replace("top-k", f"top-{r.top_k}").replace("top k", f"top {r.top_k}") for h in header]


def _test_note(r: RetrievalHeads, test: HeadTests | None) -> str:
    if test is None:
        return ""
    what = f"{test.measure}: {test.n_questions} questions" + ("" if test.is_test else f", not tested ({test.reason})")
    return f"{r.model}: {what}"


TESTS_NOTE = ('A head is listed when it passes either correction and the "passes" column says which: the union of '
              "the two lists is not a corrected family.")


def retrieval_blocks(result: IceResult) -> list[Block]:
    """The retrieval-head part of the ICE section (nothing for a run without probe records)."""
    if not result.retrieval:
        return [Heading("Retrieval heads"), Note(NO_CAPTURE)] if result.attention_cells else []
    out: list[Block] = [Heading("Retrieval heads")]
    for r in result.retrieval:
        if r.reason is not None or r.control is None:
            out.append(Note(f"{r.model}: {r.reason or 'no Control trial with an answer capture'}"))
            continue
        out += [Plot(f"retrieval_{file_stem(r.model)}", f"{r.model}: retrieval score (Wu et al. 2024) per layer × "
                     f"head over the Control answers, the top {r.top_k} boxed; right, every head's Control score "
                     "against its mean P_ext while writing Saturation answers.", partial(draw_retrieval_map, r)),
                Heading(f"{r.model}: top {r.top_k} retrieval heads (Control; chance "
                        f"{fmt.num(r.control.chance, '.3f')})", 3),
                table_of(["rank", "head", "score", "copied"], [[str(h.rank + 1), _label(h.layer, h.head),
                                                                 fmt.num(h.score, ".3f"), str(h.copied)]
                                                                for h in r.control.top], left=2)]
        if r.stability:
            out += [Heading(f"{r.model}: stability of the ranking against Control (question bootstrap)", 3),
                    table_of(_header(STABILITY_HEADER, r), _stability_rows(r), left=2)]
        if r.distraction:
            out += [Heading(f"{r.model}: do Control's retrieval heads attend to distractors under Saturation? "
                            "(across heads)", 3),
                    Note(f"Mean Saturation P_ext while answering of Control's top {r.top_k} heads and of the others."),
                    table_of(_header(DISTRACTION_HEADER, r), _distraction_rows(r))]
        tests = (*r.failed_vs_correct, r.saturation_drop)
        rows = [row for t in tests for row in _test_rows(r, t)]
        notes = "; ".join(x for x in (_test_note(r, t) for t in tests) if x)
        out += [Heading(f"{r.model}: per-head tests (BH over the layer × head map; max-T family-wise)", 3),
                Note(f"{notes}. {TESTS_NOTE}"),
                table_of(TESTS_HEADER, rows, left=3) if rows else Note("No head passes either correction.")]
    return out


def retrieval_tables(result: IceResult) -> list[tuple[str, Rows]]:
    """``tables/retrieval_*.csv``: top heads per cell, stability, distraction link, per-head test hits."""
    top = [row for r in result.retrieval for c in ([r.control] if r.control else []) + list(r.cells)
           for row in rows_of(c.top, model=r.model, condition=c.condition, load=c.load)]
    if not result.retrieval:
        return []
    tests = [row for r in result.retrieval for t in (*r.failed_vs_correct, r.saturation_drop) if t is not None
             for h, passed in t.listed() for row in rows_of([h], model=r.model, test=t.measure, passes=passed)]
    return [("retrieval_top_heads", top),
            ("retrieval_stability", [row for r in result.retrieval for row in rows_of(r.stability, model=r.model)]),
            ("retrieval_distraction",
             [row for r in result.retrieval for row in rows_of(r.distraction, model=r.model)]),
            ("retrieval_head_tests", tests)]


__all__ = ["NO_CAPTURE", "draw_retrieval_map", "retrieval_blocks", "retrieval_tables"]
