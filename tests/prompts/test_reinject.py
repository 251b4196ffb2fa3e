"""Re-injection (probe.prompts.reinject): the germane facts, or as many neutral sentences, repeated right before the
question of a built prompt, everything else kept."""

from __future__ import annotations

import pytest

from probe.errors import ConfigError
from probe.prompts.builder import DEFAULT_INSTRUCTION, Piece, assemble
from probe.prompts.filler import neutral_filler
from probe.prompts.reinject import reinject
from probe.types import Prompt, Segment

FACTS = ("Vorlan was born in the city of Molvia.", "The city of Molvia lies in the valley of Tesh.")


def _prompt(prompt_id: str = "t1|Saturation|L80|r0") -> Prompt:
    body = [Piece("germane", FACTS[0], "hop0"), Piece("extraneous", "Kel owns a red boat.", "d0"),
            Piece("germane", FACTS[1], "hop1"), Piece("extraneous", "The mill grinds oats.", "d1")]
    text, segs = assemble(DEFAULT_INSTRUCTION, body, "Which valley holds the birthplace of Vorlan?")
    return Prompt(prompt_id=prompt_id, task_id="t1", source="synthetic", condition="Saturation", load=80,
                  achieved_load=80.0, replication=0, text=text, segments=segs)


def test_germane_facts_are_repeated_in_order_right_before_the_question():
    p = _prompt()
    r = reinject(p, "germane", seed=3)
    assert [s.kind for s in r.segments] == [s.kind for s in p.segments[:-1]] + ["germane", "germane", "question"]
    assert [s.label for s in r.segments[-3:-1]] == ["re-hop0", "re-hop1"]
    assert [r.segment_text(s) for s in r.segments[-3:-1]] == list(FACTS)
    head = p.text[:p.segments[-2].char_end]  # everything up to the last body segment is the prompt's own
    assert r.text.startswith(head) and r.text.endswith("\n\nQuestion: Which valley holds the birthplace of Vorlan?")
    assert r.text == head + "\n" + FACTS[0] + "\n" + FACTS[1] + "\n\nQuestion: Which valley holds the birthplace of Vorlan?"
    assert (r.prompt_id, r.condition, r.load) == (p.prompt_id, p.condition, p.load)


def test_the_control_repeats_as_many_neutral_sentences_drawn_per_prompt():
    p = _prompt()
    r = reinject(p, "filler", seed=3)
    added = [s for s in r.segments if s.label.startswith("re-")]
    assert [s.kind for s in added] == ["filler", "filler"] and r.segments[-1].kind == "question"
    texts = [r.segment_text(s) for s in added]
    assert all(t in neutral_filler_pool() for t in texts)
    assert reinject(p, "filler", seed=3) == r  # the same sentences for the same seed and prompt
    other = reinject(_prompt("t1|Saturation|L80|r1"), "filler", seed=3)
    assert [other.segment_text(s) for s in other.segments if s.label.startswith("re-")] != texts


def neutral_filler_pool() -> set[str]:
    import numpy as np

    return set(neutral_filler(np.random.default_rng(0), 3000))


def test_what_cannot_be_reinjected_is_refused():
    p = _prompt()
    with pytest.raises(ConfigError, match="repeat \"germane\" facts or as many \"filler\" sentences"):
        reinject(p, "extraneous", seed=0)
    native = Prompt(prompt_id="c", task_id="c", source="cogniload", condition="Custom", load=0, achieved_load=0.0,
                    replication=0, text="state. statement.", segments=(Segment("germane", 0, 6),
                                                                        Segment("extraneous", 7, 17)))
    with pytest.raises(ConfigError, match="not laid out as instruction, body, question"):
        reinject(native, "germane", seed=0)
    body = [Piece("extraneous", "Kel owns a red boat.", "d0")]
    text, segs = assemble(DEFAULT_INSTRUCTION, body, "Who owns the boat?")
    bare = Prompt(prompt_id="b", task_id="b", source="s", condition="Saturation", load=80, achieved_load=80.0,
                  replication=0, text=text, segments=segs)
    with pytest.raises(ConfigError, match="no germane fact"):
        reinject(bare, "germane", seed=0)
