"""What the model wrote: how long an output is, and which germane fact its answer line restates
(docs/method.md#what-the-model-wrote)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal, get_args

from probe.scoring.answers import ECHO_FILLER, normalize_answer
from probe.types import Hop

Restated = Literal["first", "bridge", "last", "all", "none"]
RESTATED: tuple[str, ...] = get_args(Restated)
RESTATE_SHARE = 0.6  # share of a fact's content words the answer line must hold to restate it
RESTATE_MIN_WORDS = 2  # and at least this many of them

_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")
_LIST_MARKER = re.compile(r"^\s*(?:[-*•#>]+|\d+[.)])?\s*$")


def count_sentences(text: str | None) -> int:
    """Sentences in ``text`` (docs/method.md#what-the-model-wrote); 0 for a missing or blank text."""
    if not text:
        return 0
    return sum(1 for piece in _BREAK.split(text)
               if re.search(r"\w", piece) and not _LIST_MARKER.match(piece))


def _content_words(text: str) -> set[str]:
    return {w for w in normalize_answer(text).split() if w not in ECHO_FILLER}


def restated_fact(line: str | None, hops: Sequence[Hop]) -> Restated | None:
    """Which germane fact the answer line restates (docs/method.md#what-the-model-wrote).

    Args:
        line: the extracted answer; None when the scorer found none.
        hops: the task's hops in chain order.

    Returns:
        ``first``, ``bridge``, ``last``, ``all`` or ``none``; None when no hop has a fact.
    """
    facts = [h.fact for h in hops]
    if not any(f.strip() for f in facts):
        return None
    if not line:
        return "none"
    said = _content_words(line)
    shares: dict[int, float] = {}
    for i, fact in enumerate(facts):
        words = _content_words(fact)
        held = len(words & said)
        if held >= RESTATE_MIN_WORDS and held / len(words) >= RESTATE_SHARE:
            shares[i] = held / len(words)
    if not shares:
        return "none"
    if len(facts) > 1 and len(shares) == len(facts):
        return "all"
    best = max(shares, key=lambda i: (shares[i], i))
    if best == len(facts) - 1:
        return "last"
    return "first" if best == 0 else "bridge"


__all__ = ["RESTATED", "RESTATE_MIN_WORDS", "RESTATE_SHARE", "Restated", "count_sentences", "restated_fact"]
