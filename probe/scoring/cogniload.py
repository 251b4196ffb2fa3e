"""Progressive exact match for CogniLoad answers (SPEC §7).

An output is split into sentences (at line breaks, and after ``.``, ``!`` or ``?`` followed by white space or the
end). Three sentences are looked at:

1. ``poi_category``: the last sentence that names the PoI *and* the asked category;
2. ``poi``: the last sentence that names the PoI;
3. ``last``: the output's last sentence.

The answer is correct if any of them *gives the gold value*. A sentence gives the gold value when, after
normalisation (lower case; every character other than a letter or digit becomes a space), it contains the gold
value as a whole word and no other value of the asked category. The second condition stops a sentence that
lists several candidates ("Lena's hobby is chess, archery or fencing") or a transition ("changes from archery
to chess") from counting as the gold value; such a sentence gives no value.

Because only the *last* sentence of each kind is used, a right value stated early and a wrong one stated later
(about the PoI and category, or about the PoI, and in the final sentence) is wrong. Where the final sentence is
about someone else, the last sentence about the PoI still decides.

"Names the PoI": the PoI's name appears as a whole word. "Names the category": one of the category's aliases
(``probe.tasks.cogniload.CATEGORIES``; e.g. "sock colour", "sock color", "socks") appears as a whole phrase.
"Other values of the category": the category's whole value pool, not only the values used in the puzzle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from probe.errors import ProbeError
from probe.tasks.cogniload import CATEGORY_BY_NAME, SOURCE
from probe.types import Task

MatchCase = Literal["poi_category", "poi", "last"]
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_NON_WORD = re.compile(r"[^0-9a-z]+")


@dataclass(frozen=True)
class CogniloadScore:
    """The verdict on one output.

    Attributes:
        em: 1.0 if one of the three sentences gives the gold value, else 0.0.
        case: the first of ``poi_category``, ``poi``, ``last`` whose sentence gives the gold value (None if wrong).
        answer: the value given by the first of the three sentences (in that order) that gives exactly one value
            of the category; None if none does.
        uninterpretable: no value of the asked category appears in any of the three sentences.
    """

    em: float
    case: MatchCase | None
    answer: str | None
    uninterpretable: bool


def split_sentences(text: str) -> list[str]:
    """Non-empty sentences of ``text`` in order (breaks at newlines and after ``.!?`` plus white space)."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def normalise(text: str) -> str:
    """Lower case, every non-alphanumeric run to one space, padded with a space on both sides."""
    return " " + _NON_WORD.sub(" ", text.lower()).strip() + " "


def _contains(norm_sentence: str, phrase: str) -> bool:
    return normalise(phrase) in norm_sentence


def _values_given(norm_sentence: str, pool: tuple[str, ...]) -> list[str]:
    return [v for v in pool if _contains(norm_sentence, v)]


def score_cogniload(output: str, task: Task) -> CogniloadScore:
    """Score one model output against a CogniLoad task by progressive exact match (module docstring).

    Args:
        output: the model's generated text.
        task: a task made by ``probe.tasks.cogniload`` (``meta`` must carry ``poi`` and ``category``).

    Returns:
        The verdict; see ``CogniloadScore``.

    Raises:
        ProbeError: the task is not a CogniLoad task or lacks ``poi``/``category`` in its meta.
    """
    if task.source != SOURCE or "poi" not in task.meta or "category" not in task.meta:
        raise ProbeError(
            f"task {task.task_id}: score_cogniload needs a cogniload task with meta 'poi' and 'category' "
            f"(source {task.source!r}, meta keys {sorted(task.meta)})"
        )
    category = CATEGORY_BY_NAME.get(str(task.meta["category"]))
    if category is None:
        raise ProbeError(f"task {task.task_id}: unknown category {task.meta['category']!r} in meta")
    gold = str(task.gold)
    poi = str(task.meta["poi"])
    sentences = [normalise(s) for s in split_sentences(output)]

    about_poi = [s for s in sentences if _contains(s, poi)]
    about_poi_cat = [s for s in about_poi if any(_contains(s, a) for a in category.aliases)]
    candidates: list[tuple[MatchCase, str | None]] = [
        ("poi_category", about_poi_cat[-1] if about_poi_cat else None),
        ("poi", about_poi[-1] if about_poi else None),
        ("last", sentences[-1] if sentences else None),
    ]
    case: MatchCase | None = None
    answer: str | None = None
    any_value = False
    for name, sentence in candidates:
        if sentence is None:
            continue
        given = _values_given(sentence, category.values)
        any_value = any_value or bool(given)
        if len(given) == 1:
            if answer is None:
                answer = given[0]
            if case is None and given[0] == gold:
                case = name
    return CogniloadScore(em=1.0 if case else 0.0, case=case, answer=answer, uninterpretable=not any_value)
