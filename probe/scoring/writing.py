"""What the model wrote (docs/method.md#what-the-model-wrote): how long an output is, and which germane fact its
answer line restates.

Both are read from recorded text only (the output, the answer the scorer extracted, the task's facts), so the
analysis derives them from any run folder; nothing is recorded for them at run time.

*Sentences* (:func:`count_sentences`): the output is cut after ``.``, ``!`` or ``?`` followed by white space, and at
every line break; a piece counts when it holds a letter or a digit and is not only a list marker (``1.``, ``-``).
So "Vorlan was born in Molvia. Its capital is Tesh." is two sentences, "3.5 km" does not break, and an
``Answer:`` line of its own is a sentence. An abbreviation followed by a space ("e.g. the") also breaks: the count
is a measure of length and shape, not a parser.

*Restated fact* (:func:`restated_fact`): the answer line is the text the scorer extracted (a box's content, an
``Answer:`` line, or the last line). A fact's *content words* are its normalised words (the normaliser of exact
match) less the function words of :data:`probe.scoring.answers.ECHO_FILLER`. The line restates a fact when it holds
at least :data:`RESTATE_SHARE` of the fact's content words and at least two of them. A line that restates every fact
of a chain of two or more is ``all`` (the chain copied out); otherwise, among the facts it restates, the one with the
largest share is named (on a tie, the later fact in the chain) by its place in the chain: ``first`` (hop 1),
``bridge`` (any hop between), ``last`` (the last hop, whose fact holds the gold; a one-hop question's only fact is
``last``); ``none`` when the line restates no fact (a bare entity such as ``\\boxed{Molvia}``, or no answer at all).
A task without facts gives None (not known).
"""

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
    """Sentences in ``text`` (module docstring); 0 for a missing or blank text."""
    if not text:
        return 0
    return sum(1 for piece in _BREAK.split(text)
               if re.search(r"\w", piece) and not _LIST_MARKER.match(piece))


def _content_words(text: str) -> set[str]:
    return {w for w in normalize_answer(text).split() if w not in ECHO_FILLER}


def restated_fact(line: str | None, hops: Sequence[Hop]) -> Restated | None:
    """Which germane fact the answer line restates (module docstring).

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
