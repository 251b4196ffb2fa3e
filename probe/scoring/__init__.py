"""Scoring: a generation + its task -> answer, EM and the rates of docs/method.md#scoring (and CogniLoad's progressive
match, docs/cogniload.md#scoring), by the scorer registered for the task's family."""

from __future__ import annotations

from typing import Callable

from probe.registry import Registry
from probe.scoring.answers import Score, score_output
from probe.types import Task

Scorer = Callable[[str | None, Task, bool], Score]
SCORERS: Registry[Scorer] = Registry("scorer of a task family")


def register_scorer(family: str, scorer: Scorer) -> Scorer:
    """Register how a family's outputs are scored: ``(output, task, truncated) -> Score``. Returns it.

    Raises:
        DuplicateEntryError: the family has a scorer already.
    """
    return SCORERS.register(family, scorer)


def _score_cogniload(output: str | None, task: Task, truncated: bool) -> Score:
    from probe.scoring.cogniload import score_cogniload

    s = score_cogniload(output or "", task)
    return Score(answer=s.answer, em=bool(s.em), hop_recall=None, truncated=truncated,
                 uninterpretable=s.uninterpretable, extraction=s.case or "none")


def score(family: str, output: str | None, task: Task, truncated: bool) -> Score:
    """Score one output by its family's scorer (the toolkit's are registered on first use).

    Raises:
        UnknownNameError: no scorer is registered for the family (the close names suggested).
    """
    if "ice" not in SCORERS:
        register_scorer("ice", score_output)
        register_scorer("cogniload", _score_cogniload)
    return SCORERS.get(family)(output, task, truncated)


__all__ = ["SCORERS", "Score", "Scorer", "register_scorer", "score"]
