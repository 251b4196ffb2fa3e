"""What the model wrote, per cell, tested against Control (docs/method.md#what-the-model-wrote;
docs/statistics.md#what-the-model-wrote-against-control)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from probe.analysis.estimates import AMBIGUOUS_PAIRS, against_control, cell_groups, finite
from probe.analysis.inference import bh_qvalues
from probe.codec import OMIT
from probe.records import TrialRecord
from probe.scoring.writing import RESTATED, count_sentences, restated_fact
from probe.types import Task

# measure id -> (trial-table column, what it is)
MEASURES: dict[str, tuple[str, str]] = {
    "tokens": ("completion_tokens", "output tokens"),
    "one_sentence": ("one_sentence", "share of one-sentence outputs"),
    "restates_last": ("restates_last", "share whose answer line restates the last fact"),
    "restates_first": ("restates_first", "share whose answer line restates the first fact"),
}


@dataclass(frozen=True)
class WritingTest:
    """One measure of a cell against its model's Control cell.

    Attributes:
        measure: a key of :data:`MEASURES`.
        n_pairs, n_questions: (question, replication) pairs with an output in both cells, and their questions.
        mean_a, mean_b: the measure's mean over the pairs in the cell and in Control.
        delta: mean over questions of the per-question mean difference (cell − Control).
        p: two-sided sign-flip p-value; None without a test (see ``reason``).
        q: Benjamini–Hochberg q-value across the model's writing tests.
        reason: why there is no test, else None.
    """

    measure: str
    n_pairs: int
    n_questions: int
    mean_a: float | None
    mean_b: float | None
    delta: float | None
    p: float | None
    q: float | None
    reason: str | None


@dataclass(frozen=True)
class WritingCell:
    """What the model wrote in one model × condition × load cell (docs/statistics.md#what-the-model-wrote-against-control).

    Attributes:
        model, condition, load: the cell.
        n_outputs: trials with an output (not skipped, no backend error).
        tokens_median, tokens_mean: output length in tokens; None where the backend counted none.
        sentences_median, sentences_mean: output length in sentences.
        one_sentence_share: share of outputs of one sentence.
        restated_shares: share of outputs per restated fact (``first``, ``bridge``, ``last``, ``all``, ``none``; the
            kinds that occur); None where the run folder holds no task facts.
        restated_em: EM among the scored outputs of each restated fact (same keys).
        restated_n: scored outputs of each restated fact.
        tests: the cell against Control, one per measure (empty for Control).
        long_tests: a Saturation or Residue cell against LongControl at the same load (length matched), one per
            measure; empty for other cells or without such a LongControl cell.
    """

    model: str
    condition: str
    load: int
    n_outputs: int
    tokens_median: float | None
    tokens_mean: float | None
    sentences_median: float | None
    sentences_mean: float | None
    one_sentence_share: float | None
    restated_shares: dict[str, float] | None
    restated_em: dict[str, float] | None
    restated_n: dict[str, int] | None
    tests: tuple[WritingTest, ...] = ()
    long_tests: tuple[WritingTest, ...] = field(default=(), metadata={OMIT: True})


# the conditions whose writing is also tested against LongControl at the same load (same length, no distractors)
LENGTH_MATCHED = ("Saturation", "Residue")


def writing_columns(df: pd.DataFrame, trials: tuple[TrialRecord, ...], tasks: dict[str, Task] | None
                    ) -> pd.DataFrame:
    """The trial table with the per-trial columns of :mod:`probe.scoring.writing` added.

    Adds ``sentences``, ``restated`` (None without the task's facts), ``one_sentence``, ``restates_last`` and
    ``restates_first`` (floats: 1/0, NaN where not known). ``trials`` are in the table's row order.
    """
    restated = [restated_fact(t.answer, tasks[t.task_id].hops) if tasks and t.task_id in tasks else None
                for t in trials]
    sentences = [count_sentences(t.output) for t in trials]
    known = pd.Series([r is not None for r in restated], index=df.index)
    return df.assign(
        sentences=sentences,
        restated=pd.Series(restated, index=df.index, dtype=object),
        one_sentence=[float(s == 1) for s in sentences],
        restates_last=pd.Series([float(r == "last") for r in restated], index=df.index).where(known),
        restates_first=pd.Series([float(r == "first") for r in restated], index=df.index).where(known),
        completion_tokens=pd.to_numeric(df["completion_tokens"], errors="coerce").astype(float),
    )


def _median(x: pd.Series) -> float | None:
    x = x.dropna()
    return finite(x.median()) if len(x) else None


def _mean(x: pd.Series) -> float | None:
    x = x.dropna()
    return finite(x.mean()) if len(x) else None


def _cell(model: str, condition: str, load: int, g: pd.DataFrame) -> WritingCell:
    out = g[g["has_output"]]
    known = out[out["restated"].notna()]
    scored = known[known["is_scored"]]
    kinds = [k for k in RESTATED if (known["restated"] == k).any()]
    em = {k: scored.loc[scored["restated"] == k, "em"] for k in kinds}
    return WritingCell(
        model=model, condition=condition, load=load, n_outputs=int(len(out)),
        tokens_median=_median(out["completion_tokens"]), tokens_mean=_mean(out["completion_tokens"]),
        sentences_median=_median(out["sentences"].astype(float)), sentences_mean=_mean(out["sentences"].astype(float)),
        one_sentence_share=_mean(out["one_sentence"]),
        restated_shares={k: float((known["restated"] == k).mean()) for k in kinds} if len(known) else None,
        restated_em={k: float(e.mean()) for k, e in em.items() if len(e)} if len(known) else None,
        restated_n={k: int(len(e)) for k, e in em.items()} if len(known) else None,
    )


def _test(measure: str, g: pd.DataFrame, control: pd.DataFrame, alpha: float, seed: int,
          against: str = "Control") -> WritingTest:
    t = against_control(g, control, MEASURES[measure][0], alpha, seed)
    if isinstance(t, str):
        return WritingTest(measure, 0, 0, None, None, None, None, None,
                           AMBIGUOUS_PAIRS if t == "ambiguous" else f"no {MEASURES[measure][1]} paired with a "
                                                                    f"{against} output")
    return WritingTest(measure, t.n_pairs, t.n_questions, t.em_a, t.em_b, t.delta, t.p, None,
                       t.reason if t.p is None else None)


def writing_cells(df: pd.DataFrame, alpha: float = 0.05, seed: int = 0) -> list[WritingCell]:
    """One :class:`WritingCell` per model × condition × load of a trial table with :func:`writing_columns`.

    Returns:
        Cells sorted by model, condition (paper order), load; each non-Control cell carries its tests against the
        model's Control cell, with BH q across the model's writing tests.
    """
    groups = cell_groups(df)
    controls = {model: g for (model, condition, _), g in groups.items() if condition == "Control"}
    cells: list[WritingCell] = []
    for (model, condition, load), g in groups.items():
        cell = _cell(model, condition, load, g)
        if condition != "Control" and model in controls:
            cell = replace(cell, tests=tuple(_test(m, g, controls[model], alpha, seed) for m in MEASURES))
        long = groups.get((model, "LongControl", load))
        if condition in LENGTH_MATCHED and long is not None:
            cell = replace(cell, long_tests=tuple(_test(m, g, long, alpha, seed, "LongControl") for m in MEASURES))
        cells.append(cell)
    return _with_q(cells)


def _with_q(cells: list[WritingCell]) -> list[WritingCell]:
    """BH q-values across each model's writing tests (against Control and against LongControl: one family)."""
    out = list(cells)
    for model in dict.fromkeys(c.model for c in cells):
        idx = [(i, part, j) for i, c in enumerate(out) if c.model == model
               for part in ("tests", "long_tests") for j in range(len(getattr(c, part)))]
        q = bh_qvalues(np.array([np.nan if (p := getattr(out[i], part)[j].p) is None else p for i, part, j in idx]))
        for (i, part, j), qv in zip(idx, q):
            tests = list(getattr(out[i], part))
            tests[j] = replace(tests[j], q=finite(qv))
            out[i] = replace(out[i], tests=tuple(tests)) if part == "tests" else replace(out[i], long_tests=tuple(tests))
    return out


__all__ = ["MEASURES", "WritingCell", "WritingTest", "writing_cells", "writing_columns"]
