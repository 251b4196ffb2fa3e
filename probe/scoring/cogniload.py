"""Scoring of CogniLoad answers: an explicit final answer first, then progressive exact match
(docs/cogniload.md#scoring)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from probe.errors import ProbeError
from probe.scoring.answers import extract_final_answer
from probe.tasks.cogniload import CATEGORY_BY_NAME, SOURCE, Category, PuzzleParams
from probe.types import Task

MatchCase = Literal["boxed", "answer_line", "poi_category", "poi", "last"]
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_NON_WORD = re.compile(r"[^0-9a-z]+")
_TOKEN = re.compile(r"->|=>|→|⇒|[0-9a-z]+")
_ARROWS = frozenset({"->", "=>", "→", "⇒"})
_NEGATIONS = frozenset({"not", "no", "never", "nor", "neither"})
_FORMER = frozenset({"from", "than", "except"})
_STOPS = frozenset({"but", "and", "so", "now", "to", "is", "are", "becomes"})
_LOOKBACK = 3


@dataclass(frozen=True)
class CogniloadScore:
    """The verdict on one output.

    Attributes:
        em: 1.0 if the judged string gives the gold value, else 0.0.
        case: where the judged string came from: ``boxed``, ``answer_line``, ``poi_category``, ``poi`` or
            ``last``; None when no rule found a string giving a value (and there was no box or answer line).
        answer: exactly the judged string (the box's content, the answer line's text, or the sentence); None when
            nothing was judged, or the box or answer slot is empty.
        value: the category value the judged string gives, or None.
        uninterpretable: nothing could be judged: an empty box or answer slot, or no box, no answer line and no
            value of the asked category mentioned in any sentence the three rules looked at.
    """

    em: float
    case: MatchCase | None
    answer: str | None
    value: str | None
    uninterpretable: bool


def split_sentences(text: str) -> list[str]:
    """Non-empty sentences of ``text`` in order (breaks at newlines and after ``.!?`` plus white space)."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def normalise(text: str) -> str:
    """Lower case, every non-alphanumeric run to one space, padded with a space on both sides."""
    return " " + _NON_WORD.sub(" ", text.lower()).strip() + " "


def _contains(norm_sentence: str, phrase: str) -> bool:
    return normalise(phrase) in norm_sentence


def _tokens(text: str) -> list[str]:
    """Lower-case word tokens and arrows; "n't" becomes the token "not" ("isn't" -> "is", "not")."""
    text = re.sub(r"n['’]t\b", " not", text.lower())
    return _TOKEN.findall(text)


def _counts(tokens: list[str], i: int, values: frozenset[str]) -> bool:
    """Whether the value mention at ``tokens[i]`` asserts the value (not negated, not a former value)."""
    after = tokens[i + 1 : i + 3]
    if after[:1] and after[0] in _ARROWS:
        return False
    if len(after) == 2 and after[0] == "to" and after[1] in values:  # "teal to beige": teal is the former value
        return False
    for j in range(i - 1, max(-1, i - 1 - _LOOKBACK), -1):
        tok = tokens[j]
        if tok in _NEGATIONS or tok in _FORMER:
            return False
        if tok == "of" and j > 0 and tokens[j - 1] == "instead":
            return False
        if tok in _STOPS or tok in values or tok in _ARROWS:
            break
    return True


def values_given(text: str, category: Category) -> tuple[list[str], bool]:
    """The values of ``category`` that ``text`` asserts, and whether it mentions any value at all.

    Args:
        text: one sentence, box content or answer line.
        category: the asked category.

    Returns:
        (asserted values in order of first assertion, whether any value is mentioned at all); see the module
        docstring for which mentions count.
    """
    pool = {v.lower(): v for v in category.values}
    values = frozenset(pool)
    tokens = _tokens(text)
    given: list[str] = []
    mentioned = False
    for i, tok in enumerate(tokens):
        if tok in values:
            mentioned = True
            if _counts(tokens, i, values) and pool[tok] not in given:
                given.append(pool[tok])
    return given, mentioned


def score_cogniload(output: str, task: Task) -> CogniloadScore:
    """Score one model output against a CogniLoad task (docs/cogniload.md#scoring).

    Args:
        output: the model's generated text.
        task: a task made by ``probe.tasks.cogniload`` (``meta`` must carry ``poi`` and ``category``).

    Returns:
        The verdict; see ``CogniloadScore``.

    Raises:
        ProbeError: the task is not a CogniLoad task, its meta lacks a knob or ``poi``/``category``
            (:class:`~probe.tasks.cogniload.PuzzleParamsError`), or names an unknown category.
    """
    if task.source != SOURCE:
        raise ProbeError(f"task {task.task_id}: score_cogniload needs a cogniload task (source {task.source!r})")
    params = PuzzleParams.from_meta(task.meta, f"task {task.task_id}", needs=("poi", "category"))
    poi, category = str(params.poi), CATEGORY_BY_NAME.get(str(params.category))
    if category is None:
        raise ProbeError(f"task {task.task_id}: unknown category {params.category!r} in meta")
    gold = str(task.gold).lower()

    def verdict(case: MatchCase, judged: str) -> CogniloadScore:
        given, _ = values_given(judged, category)
        value = given[0] if len(given) == 1 else None
        em = 1.0 if value is not None and value.lower() == gold else 0.0
        return CogniloadScore(em=em, case=case, answer=judged, value=value, uninterpretable=False)

    explicit, how = extract_final_answer(output or "")
    if how in ("boxed", "answer_line"):
        if explicit is None:  # an empty box or answer slot: the model announced an answer and gave none
            return CogniloadScore(em=0.0, case=how, answer=None, value=None, uninterpretable=True)
        return verdict(how, explicit)

    statements = [s for s in split_sentences(output or "") if not s.endswith("?")]
    about_poi = [s for s in statements if _contains(normalise(s), poi)]
    about_poi_cat = [s for s in about_poi if any(_contains(normalise(s), a) for a in category.aliases)]
    rules: list[tuple[MatchCase, list[str]]] = [("poi_category", about_poi_cat), ("poi", about_poi),
                                                ("last", statements)]
    any_value = False
    for case, pool in rules:
        if not pool:
            continue
        given, mentioned = values_given(pool[-1], category)
        any_value = any_value or mentioned
        if len(given) == 1:
            return verdict(case, pool[-1])
    return CogniloadScore(em=0.0, case=None, answer=None, value=None, uninterpretable=not any_value)
