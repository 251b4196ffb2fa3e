"""The ICE builder on the real default tokenizer: exact spans, load accounting, conditions, seeding."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from probe.config import IceSection
from probe.errors import SpanError
from probe.prompts.builder import BuildError, IceBuilder, Piece, assemble, place_uniform
from probe.prompts.tokenize import encode_prompt
from probe.prompts.filler import neutral_filler
from probe.prompts.distractors import distractor_facts
from probe.runfolder import PromptKey, make_prompt_id, parse_prompt_id
from probe.tasks.synthetic import generate_synthetic
from probe.types import Prompt, Segment

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tokenizer():
    from probe.loading import get_card, load_tokenizer

    return load_tokenizer(get_card("smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def tasks():
    two = generate_synthetic(4, 2, np.random.default_rng(7))
    three = generate_synthetic(2, 3, np.random.default_rng(8))
    return two + three


def make_builder(tokenizer, seed: int = 11, **ice) -> IceBuilder:
    return IceBuilder(ice=IceSection(**ice), tokenizer=tokenizer, tokenizer_name="smollm2-135m-instruct", seed=seed,
                      distractors=distractor_facts, filler=neutral_filler)


@pytest.fixture(scope="module")
def prompts(tokenizer, tasks):
    return make_builder(tokenizer).build_all(tasks)


def _token_kinds_independent(prompt: Prompt, tokenizer) -> dict[str, int]:
    """Count tokens per kind a second way: a token belongs to the segment whose characters contain its last
    visible character (offset arithmetic only; no code shared with the builder)."""
    full = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], tokenize=False,
                                         add_generation_prompt=True)
    base = full.index(prompt.text)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    counts: dict[str, int] = {}
    for s, e in enc["offset_mapping"]:
        piece = full[s:e]
        if not piece.strip():  # whitespace counts only strictly inside a segment (e.g. a space before a digit)
            inside = [g.kind for g in prompt.segments if g.char_start <= s - base and e - base <= g.char_end]
            if inside:
                counts[inside[0]] = counts.get(inside[0], 0) + 1
            continue
        last = s + max(i for i, ch in enumerate(piece) if not ch.isspace()) - base
        for seg in prompt.segments:
            if seg.char_start <= last < seg.char_end:
                counts[seg.kind] = counts.get(seg.kind, 0) + 1
    return counts


def test_every_content_token_in_exactly_one_segment_and_spans_decode_back(prompts, tokenizer):
    for p in prompts:
        tp = encode_prompt(p, tokenizer)
        covered = np.zeros(len(tp.input_ids), dtype=int)
        for s in tp.spans:
            covered[s.start : s.end] += 1
        assert (covered == 1).all(), p.prompt_id
        content = [s for s in tp.spans if s.kind != "sink"]
        assert [s.label for s in content] == [g.label for g in p.segments]
        for span, seg in zip(content, p.segments):
            decoded = tokenizer.decode(list(tp.input_ids[span.start : span.end]))
            assert decoded.strip() == p.segment_text(seg).strip(), (p.prompt_id, seg.label)
        for s in tp.spans:
            if s.kind == "sink" and s.label == "separator":
                assert tokenizer.decode(list(tp.input_ids[s.start : s.end])).strip() == ""


def test_template_markup_is_sink(prompts, tokenizer):
    tp = encode_prompt(prompts[0], tokenizer)
    first, last = tp.spans[0], tp.spans[-1]
    assert first.kind == "sink" and last.kind == "sink"
    head = tokenizer.decode(list(tp.input_ids[first.start : first.end]))
    assert "<|im_start|>" in head and "user" in head
    assert "assistant" in tokenizer.decode(list(tp.input_ids[last.start : last.end]))


def test_loads_within_tolerance_counted_independently(prompts, tokenizer):
    for p in prompts:
        counts = _token_kinds_independent(p, tokenizer)
        ger, ext, fil = counts.get("germane", 0), counts.get("extraneous", 0), counts.get("filler", 0)
        if p.condition == "Control":
            assert ext == 0 and fil == 0 and p.achieved_load == 0
            continue
        share = 100 * (fil if p.condition == "LongControl" else ext) / (ger + (fil or ext))
        assert abs(share - p.achieved_load) < 1e-2, p.prompt_id
        assert abs(share - p.load) <= 5.0, (p.prompt_id, share)


def test_saturation_and_residue_share_segments_and_differ_in_placement(prompts):
    by_id = {p.prompt_id: p for p in prompts}
    n_checked = 0
    for p in prompts:
        if p.condition != "Saturation":
            continue
        res = by_id[p.prompt_id.replace("Saturation", "Residue")]
        ext = lambda q: [q.segment_text(s) for s in q.segments if s.kind == "extraneous"]  # noqa: E731
        ger = lambda q: [q.segment_text(s) for s in q.segments if s.kind == "germane"]  # noqa: E731
        assert ext(p) == ext(res) and ger(p) == ger(res)
        kinds_res = [s.kind for s in res.segments if s.kind in ("germane", "extraneous")]
        n_ext = kinds_res.count("extraneous")
        assert kinds_res == ["extraneous"] * n_ext + ["germane"] * (len(kinds_res) - n_ext)
        kinds_sat = [s.kind for s in p.segments if s.kind in ("germane", "extraneous")]
        # uniform interleaving: the extraneous segments per gap differ by at most one
        gaps, cur = [], 0
        for k in kinds_sat:
            if k == "germane":
                gaps.append(cur)
                cur = 0
            else:
                cur += 1
        gaps.append(cur)
        assert max(gaps) - min(gaps) <= 1, kinds_sat
        n_checked += 1
    assert n_checked > 0


def test_long_control_is_length_matched_with_filler(prompts, tokenizer):
    by_id = {p.prompt_id: p for p in prompts}
    for p in prompts:
        if p.condition != "LongControl":
            continue
        sat = by_id[p.prompt_id.replace("LongControl", "Saturation")]
        n_lc = len(encode_prompt(p, tokenizer).input_ids)
        n_sat = len(encode_prompt(sat, tokenizer).input_ids)
        assert 0 <= n_sat - n_lc <= 2, (p.prompt_id, n_lc, n_sat)
        kinds = {s.kind for s in p.segments}
        assert "extraneous" not in kinds and "filler" in kinds


def test_replications_draw_differently_and_seed_is_deterministic(tokenizer, tasks):
    a = make_builder(tokenizer).build_all(tasks[:2])
    b = make_builder(tokenizer).build_all(tasks[:2])
    assert [p.to_dict() for p in a] == [p.to_dict() for p in b]
    by_id = {p.prompt_id: p for p in a}
    for p in a:
        if p.condition == "Saturation" and p.replication == 0:
            assert by_id[make_prompt_id(p.task_id, p.condition, p.load, 1)].text != p.text
    c = make_builder(tokenizer, seed=12).build_all(tasks[:1])
    assert {p.text for p in c if p.condition == "Saturation"} != {p.text for p in a if p.condition == "Saturation"
                                                                  and p.task_id == tasks[0].task_id}


@pytest.mark.parametrize("id_tokenizer", [None, "smollm2-135m-instruct"])
def test_prompt_ids_follow_the_run_folder_grammar(tokenizer, id_tokenizer):
    """Every prompt's id parses back to its own task, condition, load and replication (and the tokenizer, when an
    experiment has several), for task ids holding the grammar's separator, escapes, slashes and non-Latin text."""
    ids = ["a/b c:d|L5", "100%|r1", "Zürich-東京-" + "x" * 200]
    awkward = [replace(t, task_id=tid) for t, tid in zip(generate_synthetic(3, 2, np.random.default_rng(3)), ids)]
    builder = replace(make_builder(tokenizer, loads=(50,), replications=1), id_tokenizer=id_tokenizer)
    prompts = builder.build_all(awkward)
    assert len(prompts) == 3 * 4 and len({p.prompt_id for p in prompts}) == len(prompts)
    for p in prompts:
        assert parse_prompt_id(p.prompt_id) == PromptKey(p.task_id, p.condition, p.load, p.replication, id_tokenizer)


def test_distractor_sequence_does_not_depend_on_the_tokenizer_count(tokenizer, tasks):
    """Two token counts (with and without the chat template) take prefixes of one seeded sequence."""
    task = tasks[0]
    b1 = make_builder(tokenizer)
    b2 = replace(make_builder(tokenizer), use_chat_template=False)
    seq = b1.candidates(task, 80, 0)
    assert seq == b2.candidates(task, 80, 0)
    for b in (b1, b2):
        p = b.build(task, "Saturation", 80, 0)
        ext = [p.segment_text(s) for s in p.segments if s.kind == "extraneous"]
        # all but the last are whole sentences of the sequence, in sequence order; the last may be cut
        idx = [seq.index(t) for t in ext[:-1]]
        assert idx == sorted(idx)
        assert any(c.startswith(ext[-1][:-1]) for c in seq)


def test_place_uniform_spreads_evenly():
    rng = np.random.default_rng(0)
    for n_items in range(0, 12):
        for n_slots in range(1, 5):
            slots = place_uniform(n_items, n_slots, rng)
            counts = np.bincount(slots, minlength=n_slots) if slots else np.zeros(n_slots, int)
            assert counts.sum() == n_items and counts.max() - counts.min() <= 1
            assert slots == sorted(slots)


def test_a_token_crossing_two_segments_is_refused(tokenizer):
    text, segs = assemble("Read.", [Piece("germane", "Alpha beta.", "hop0")], "Why?")
    # split "Alpha" in the middle: one token's characters now belong to two segments
    cut = segs[1].char_start + 2
    bad = segs[:1] + (Segment("germane", segs[1].char_start, cut, "a"), Segment("extraneous", cut, segs[1].char_end, "b"))
    p = Prompt("x", "t", "synthetic", "Saturation", 50, 0.0, 0, text, bad + segs[2:])
    with pytest.raises(SpanError, match="spans more than one segment"):
        encode_prompt(p, tokenizer)


def test_a_control_only_grid_builds_no_saturation_prompt(tokenizer, tasks):
    """Control does not depend on the loads: a Control-only experiment that also lists loads builds Control alone,
    and a load its tasks cannot reach (99 % within 0.001 points) refuses nothing."""
    ice = {"conditions": ["Control"], "loads": [99], "load_tolerance": 0.001, "replications": 2}
    built = make_builder(tokenizer, **ice).build_all(tasks[:2])
    assert [(p.condition, p.replication) for p in built] == [("Control", 0), ("Control", 1)] * 2
    with pytest.raises(BuildError, match="short of the target"):  # the same grid with Saturation is refused, by load
        make_builder(tokenizer, **(ice | {"conditions": ["Control", "Saturation"]})).build_all(tasks[:2])
