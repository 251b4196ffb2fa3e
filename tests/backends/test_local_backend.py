"""The pure pieces of ``LocalBackend.generate``: cutting an answer at its end token and the decoding arguments.

The whole of ``generate`` (batching, padding, edits, probes) is covered by tests/runs/test_runner.py,
tests/attention/test_attention_batch.py and tests/runs/test_interventions_run.py; these pin the rules the split made separate.
"""

from __future__ import annotations

import dataclasses

import pytest

from probe.backends.local import _cut, decoding_kwargs, sample_seed
from probe.config import GenerationSection

EOS = {2, 9}


@pytest.mark.parametrize(("new", "max_new", "ids", "truncated"), [
    ([5, 7, 2, 4], 4, [5, 7], False),  # the first end token ends the answer; what follows is dropped
    ([5, 9, 2], 3, [5], False),  # either end id
    ([2, 5, 6], 3, [], False),  # an empty answer
    ([5, 6, 7], 3, [5, 6, 7], True),  # no end token within the budget: cut off
    ([5, 6], 3, [5, 6], False),  # generation stopped early without an end id (another stopping rule)
])
def test_cut(new: list[int], max_new: int, ids: list[int], truncated: bool) -> None:
    a = _cut(new, EOS, max_new)
    assert (a.ids, a.truncated) == (ids, truncated)


def test_decoding_kwargs_greedy_unsets_sampling_knobs() -> None:
    gen = GenerationSection()
    greedy = decoding_kwargs(dataclasses.replace(gen, temperature=0.0, max_new_tokens=12), pad_token_id=0)
    assert greedy == {"max_new_tokens": 12, "pad_token_id": 0, "do_sample": False, "temperature": None,
                      "top_p": None, "top_k": None}
    sampled = decoding_kwargs(dataclasses.replace(gen, temperature=0.7, top_p=0.9, max_new_tokens=12), 0)
    assert sampled == {"max_new_tokens": 12, "pad_token_id": 0, "do_sample": True, "temperature": 0.7, "top_p": 0.9}


def test_sample_seed_depends_on_the_batch_alone() -> None:
    assert sample_seed(1, ["a", "b"]) == sample_seed(1, ["a", "b"])
    assert len({sample_seed(1, ["a", "b"]), sample_seed(2, ["a", "b"]), sample_seed(1, ["b", "a"])}) == 3
