"""The "what the model wrote" part of the ICE report, drawn from ``IceResult.writing``: one table per cell and one
of the tests against Control (docs/method.md#what-the-model-wrote)."""

from __future__ import annotations

from probe import formatting as fmt
from probe.analysis.writing import MEASURES, WritingCell, WritingTest
from probe.report.blocks import Block, Heading, Note, Text, table_of
from probe.report.sections import Rows
from probe.report.tables import rows_of
from probe.scoring.writing import RESTATED

TITLE = "What the model wrote"
LEGEND = ("Over the outputs of each cell: length in tokens (median, mean in brackets) and sentences (median); the share "
          "of one-sentence outputs; which germane fact the answer line restates (first, bridge, last, all: the "
          "whole chain, none: no fact, e.g. a bare entity; docs/method.md#what-the-model-wrote) and EM among the "
          "scored outputs of each (n). The tests compare each cell with its model's Control cell question by "
          "question, and Saturation and Residue also with LongControl at the same load: Δ is the mean over questions "
          "of the cell's mean minus Control's (or LongControl's) (tokens; shares), with the sign-flip "
          "p and the Benjamini–Hochberg q across the model's writing tests (bold: q below α).")
SHORT = {"tokens": "output tokens", "one_sentence": "one-sentence share", "restates_last": "restates last fact",
         "restates_first": "restates first fact"}
TEST_HEADER = ["model", "cell", "questions"] + [f"Δ {SHORT[m]}" for m in MEASURES] + ["note"]


def _label(c: WritingCell) -> str:
    return c.condition if c.condition == "Control" else f"{c.condition} {c.load}%"


def _em(c: WritingCell, kind: str) -> str:
    n = (c.restated_n or {}).get(kind)
    if not n or c.restated_em is None or kind not in c.restated_em:
        return fmt.DASH
    return f"{fmt.num(c.restated_em[kind], '.2f')} ({n})"


def _kinds(cells: tuple[WritingCell, ...]) -> list[str]:
    """The restated facts that occur in some cell, in chain order (no "bridge" column for two-hop questions)."""
    return [k for k in RESTATED if any(k in (c.restated_shares or {}) for c in cells)]


def cell_header(cells: tuple[WritingCell, ...]) -> list[str]:
    """The per-cell table's header."""
    kinds = _kinds(cells)
    return (["model", "cell", "outputs", "tokens", "sentences", "one sentence"] + [f"restates {k}" for k in kinds]
            + [f"EM when restating {k}" for k in kinds])


def cell_rows(cells: tuple[WritingCell, ...]) -> list[list[str]]:
    """The per-cell table's rows (plain text), in the columns of :func:`cell_header`."""
    kinds = _kinds(cells)
    return [[c.model, _label(c), str(c.n_outputs),
             f"{fmt.num(c.tokens_median, '.0f')} ({fmt.num(c.tokens_mean, '.0f')})",
             fmt.num(c.sentences_median, ".1f"), fmt.pct(c.one_sentence_share)]
            + [fmt.pct((c.restated_shares or {}).get(k, 0.0)) if c.restated_shares is not None else fmt.DASH
               for k in kinds]
            + [_em(c, k) for k in kinds] for c in cells]


def _delta(t: WritingTest) -> str:
    if t.delta is None:
        return fmt.DASH
    spec = "+.1f" if t.measure == "tokens" else "+.2f"
    if t.p is None:
        return fmt.num(t.delta, spec)
    return f"{fmt.num(t.delta, spec)} (p {fmt.p_value(t.p)}, q {fmt.p_value(t.q)})"


def test_rows(cells: tuple[WritingCell, ...], part: str = "tests") -> list[list[str]]:
    """The tests' rows (plain text): one per cell with tests, one column per measure (Δ = cell − Control, or cell −
    LongControl for ``part="long_tests"``, per question, with its sign-flip p and BH q)."""
    return [[c.model, _label(c), str(max(t.n_questions for t in ts))] + [_delta(t) for t in ts]
            + ["; ".join(dict.fromkeys(f"{SHORT[t.measure]}: {t.reason}" for t in ts if t.reason))]
            for c in cells for ts in (getattr(c, part),) if ts]


def sentence(cells: tuple[WritingCell, ...], model: str, alpha: float) -> str | None:
    """The summary's sentence on what ``model`` wrote: the writing tests that pass BH, or that none does (None
    without tests)."""
    tests = [(c, t, against) for c in cells if c.model == model
             for ts, against in ((c.tests, "Control"), (c.long_tests, f"LongControl {c.load}%")) for t in ts]
    tested = [(c, t, against) for c, t, against in tests if t.p is not None]
    if not tested:
        return None
    passed = [(c, t, against) for c, t, against in tested if t.q is not None and t.q < alpha]
    head = (f"What the model wrote (sign-flip tests against Control{' and against LongControl' if any(c.long_tests for c in cells) else ''}, "
            f"Benjamini–Hochberg over the {len(tested)} writing tests of this model): ")
    if not passed:
        best = min(t.q for _, t, _ in tested if t.q is not None)
        return head + f"no difference survives the correction (smallest q = {fmt.p_value(best)})."
    return head + "; ".join(f"{_label(c)} vs {against}: {SHORT[t.measure]} {_delta(t)}"
                            for c, t, against in passed) + "."


def blocks(cells: tuple[WritingCell, ...], alpha: float) -> list[Block]:
    """The part of the ICE section (nothing when the result has no writing cells)."""
    if not cells:
        return []
    def table(part: str) -> Block:
        def passed(ts: tuple[WritingTest, ...], j: int) -> bool:  # column j of the tests' row holds test j - 3
            q = ts[j - 3].q if 3 <= j < 3 + len(ts) else None
            return q is not None and q < alpha

        rows = [[Text(x, strong=passed(getattr(c, part), j)) for j, x in enumerate(row)]
                for row, c in zip(test_rows(cells, part), [c for c in cells if getattr(c, part)])]
        return table_of(TEST_HEADER, rows, left=3, text=(10,))

    out: list[Block] = [Heading(TITLE), Note(LEGEND), table_of(cell_header(cells), cell_rows(cells), left=2),
           Heading("Against Control", 3), table("tests")]
    if any(c.long_tests for c in cells):
        out += [Heading("Against LongControl at the same load (same length, no distractors)", 3),
                table("long_tests")]
    return out


def tables(cells: tuple[WritingCell, ...]) -> list[tuple[str, Rows]]:
    """``tables/writing.csv`` (one row per cell) and ``tables/writing_tests.csv`` (one per cell and measure)."""
    if not cells:
        return []
    return [("writing", [{k: v for k, v in row.items() if k not in ("tests", "long_tests")} for row in rows_of(cells)]),
            ("writing_tests", [row for c in cells for ts, against in ((c.tests, "Control"), (c.long_tests, "LongControl"))
                               for row in rows_of(ts, model=c.model, condition=c.condition, load=c.load,
                                                  against=against)])]


__all__ = ["blocks", "cell_header", "cell_rows", "sentence", "tables", "test_rows"]
