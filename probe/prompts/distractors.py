"""The distractor pool of the ICE builder: extraneous sentences that are facts of other fictional tasks
(docs/method.md#distractors-and-replications)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from probe.tasks.synthetic import (NAME_KINDS, TOPIC_TEMPLATES, NameDraw, _Topic, draw_chain, name_words,
                                   render_facts)


def distractor_facts(
    rng: np.random.Generator, exclude_topic: str, n: int, avoid: Iterable[str] = ()
) -> list[str]:
    """Facts of other fictional chains, from topics other than ``exclude_topic``: an extraneous pool.

    Chains are drawn one after another (topic uniform over the allowed ones) and their three facts appended in
    chain order until ``n`` facts are collected. A topic name that is not a synthetic topic (a FanOutQA category,
    a user's own topic) excludes nothing.

    Args:
        rng: the seeded generator.
        exclude_topic: the task's topic; no distractor comes from it.
        n: number of facts (>= 0).
        avoid: texts whose words must not be reused as names (pass the task's question and hop facts, so that no
            distractor mentions an entity of the task).

    Returns:
        ``n`` fact sentences.
    """
    allowed = [t for t in TOPIC_TEMPLATES if t.name != exclude_topic]
    return [fact for fact, _ in _draw_facts(rng, allowed, n, avoid)]


def _draw_facts(rng: np.random.Generator, topics: Sequence[_Topic], n: int,
                avoid: Iterable[str] = ()) -> list[tuple[str, frozenset[str]]]:
    """``n`` facts of chains drawn one after another (topic uniform over ``topics``), each with the lowercased
    words of its chain's invented names; no name word repeats, nor is a word of ``avoid``."""
    out: list[tuple[str, frozenset[str]]] = []
    namer = NameDraw(rng, avoid)
    while len(out) < n:
        topic = topics[int(rng.integers(len(topics)))]
        entities, extras = draw_chain(topic, namer, rng)
        chain_names = frozenset(name_words(e for e, kind in zip(entities, topic.kinds) if kind in NAME_KINDS))
        out += [(fact, chain_names) for fact in render_facts(topic, entities, extras, rng)]
    return out[:n]


@dataclass(frozen=True)
class FactPool:
    """Facts of fictional chains, each with the lowercased words of its chain's invented names.

    Attributes:
        facts: the fact sentences, three per chain in chain order.
        names: for each fact, the name words of its chain (a fact that shares one with a task must not be its
            distractor).
    """

    facts: tuple[str, ...]
    names: tuple[frozenset[str], ...]

    def eligible(self, avoid: Iterable[str]) -> np.ndarray:
        """Indices of the facts whose chain names no word of ``avoid`` (the task's question and hop facts)."""
        words = frozenset(name_words(avoid))
        return np.array([i for i, n in enumerate(self.names) if not (n & words)], dtype=np.int64)


def fact_pool(rng: np.random.Generator, n: int) -> FactPool:
    """``n`` facts of fictional chains of any topic, no name word repeated across the pool.

    Args:
        rng: the seeded generator.
        n: number of facts (>= 0).

    Returns:
        The pool, facts in draw order.
    """
    drawn = _draw_facts(rng, TOPIC_TEMPLATES, n)
    return FactPool(tuple(f for f, _ in drawn), tuple(names for _, names in drawn))
