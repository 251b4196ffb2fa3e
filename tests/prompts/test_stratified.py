"""Stratified distractor draws (docs/method.md#distractors-and-replications): one fact pool per experiment, embedded
once; each (task, load, replication) samples it, leaves out facts naming an entity of the task and keeps one similarity
tercile."""

from __future__ import annotations

import re
from dataclasses import replace
import zlib

import numpy as np
import pytest

from probe.config import IceSection
from probe.prompts.builder import IceBuilder, draw_rng
from probe.prompts.distractors import distractor_facts, fact_pool
from probe.prompts.filler import neutral_filler
from probe.tasks.synthetic import _TEMPLATE_WORDS, generate_synthetic

pytestmark = pytest.mark.integration

WORD = re.compile(r"[A-Za-z]+")


def _words(text: str) -> set[str]:
    return {w.lower() for w in WORD.findall(text)}


def _fake_similarity(calls: list[int]):
    """A similarity that is a fixed function of the text (uniform in [-1, 1] by crc32), counting its calls."""

    def similarity(question: str, texts: list[str]) -> np.ndarray:
        calls.append(len(texts))
        return np.array([zlib.crc32(t.encode()) / 2**31 - 1.0 for t in texts])

    return similarity


@pytest.fixture(scope="module")
def tokenizer():
    from probe.loading import get_card, load_tokenizer

    return load_tokenizer(get_card("smollm2-135m-instruct"))


def _builder(tokenizer, calls: list[int], seed: int = 5) -> IceBuilder:
    return IceBuilder(ice=IceSection(distractor_strategy="stratified", loads=[20, 50, 80], replications=3),
                      tokenizer=tokenizer, tokenizer_name="smollm2-135m-instruct", seed=seed,
                      distractors=distractor_facts, filler=neutral_filler, similarity=_fake_similarity(calls))


def test_fact_pool_is_the_generator_stream_with_each_chains_names() -> None:
    pool = fact_pool(np.random.default_rng(3), 600)
    # the same facts as the per-draw generator gives from the same state (any topic, nothing to avoid)
    assert list(pool.facts) == distractor_facts(np.random.default_rng(3), "", 600)
    # names re-derived from the text: a chain's words that no template uses (years are digits, not words)
    for start in range(0, 600, 3):
        chain = pool.facts[start:start + 3]
        derived = set().union(*(_words(f) for f in chain)) - _TEMPLATE_WORDS
        assert all(n == frozenset(derived) for n in pool.names[start:start + 3]), chain
    # no name word is shared by two chains
    chains = pool.names[::3]
    assert sum(len(n) for n in chains) == len(frozenset().union(*chains))


def test_stratified_draws_keep_one_tercile_and_avoid_the_tasks_entities(tokenizer) -> None:
    calls: list[int] = []
    b = _builder(tokenizer, calls)
    tasks = generate_synthetic(6, 2, np.random.default_rng(9))
    pool = b.stratified_pool()
    # invented names rarely collide by chance: one task asks about the entities of a third of the pool's chains
    named = " ".join(sorted(pool.names[i])[0] for i in range(0, len(pool.facts), 9))
    tasks.append(replace(tasks[0], task_id="syn2-named", question=f"Which of {named} is oldest?"))
    sim_of = dict(zip(pool.facts, _fake_similarity([])("q", list(pool.facts))))
    ranked = np.sort(list(sim_of.values()))
    for task in tasks:
        task_words = _words(task.question) | set().union(*(_words(h.fact) for h in task.hops))
        for load in (20, 50, 80):
            for rep in range(3):
                seq = b.candidates(task, load, rep)
                assert len(seq) == len(set(seq)) == 64
                for fact in seq:
                    assert not (pool.names[pool.facts.index(fact)] & task_words)
                # the tercile of a 192-fact sample of the pool: its facts' quantiles in the whole pool lie in
                # that third, give or take the sample's own spread
                stratum = (int.from_bytes(__import__("hashlib").sha256(task.task_id.encode()).digest()[:8],
                                          "little") + rep) % 3
                q = np.searchsorted(ranked, [sim_of[f] for f in seq]) / len(ranked)
                assert q.min() >= stratum / 3 - 0.08 and q.max() <= (stratum + 1) / 3 + 0.08, (stratum, q.min(),
                                                                                                q.max())
    # the pool is scored once per task (not once per draw), whole
    assert calls == [len(pool.facts)] * len(tasks)


def test_stratified_draws_do_not_depend_on_the_builder_or_the_order(tokenizer) -> None:
    tasks = generate_synthetic(3, 2, np.random.default_rng(9))
    one, two = _builder(tokenizer, []), _builder(tokenizer, [])
    forward = {(t.task_id, r): one.candidates(t, 50, r) for t in tasks for r in range(3)}
    backward = {(t.task_id, r): two.candidates(t, 50, r) for t in reversed(tasks) for r in reversed(range(3))}
    assert forward == backward
    assert forward[(tasks[0].task_id, 0)] != forward[(tasks[0].task_id, 1)]
    other_seed = _builder(tokenizer, [], seed=6)
    assert other_seed.candidates(tasks[0], 50, 0) != forward[(tasks[0].task_id, 0)]
    # the pool is a function of the experiment seed alone
    assert one.stratified_pool() == _builder(tokenizer, []).stratified_pool()
    assert fact_pool(draw_rng(5, "stratified-pool"), 30).facts == one.stratified_pool().facts[:30]
