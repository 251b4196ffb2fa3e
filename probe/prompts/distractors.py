"""The distractor pool of the ICE builder: extraneous sentences that are facts of other fictional tasks.

Distractors are drawn from the synthetic source's generator (:mod:`probe.tasks.synthetic`), from topics other than
the task's own, so they read like germane facts but belong to no question asked. Every draw comes from the seeded
``numpy.random.Generator`` the builder passes in.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from probe.rng import scalar_draws
from probe.tasks.synthetic import TOPIC_TEMPLATES, NameDraw, draw_chain, render_facts


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
    facts: list[str] = []
    with scalar_draws(rng) as draws:  # numpy's draws, without numpy's cost per scalar call
        names = NameDraw(draws, avoid)
        while len(facts) < n:
            topic = allowed[int(draws.integers(len(allowed)))]
            entities, extras = draw_chain(topic, names, draws)
            facts += render_facts(topic, entities, extras, draws)
    return facts[:n]
