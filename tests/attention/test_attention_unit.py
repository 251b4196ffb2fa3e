"""Probe bookkeeping without a model: query sets, AR distances, the reducer on hand-made rows, files, capacity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probe.attention import SegmentAttention, build_plan, max_probe_context, probe_memory_bytes
from probe.attention.capacity import LLAMA3_8B
from probe.attention.reduce import LayerReducer, assemble_result
from probe.attention.segments import PlanTensors
from probe.probe_options import ProbeOptions
from probe.errors import ConfigError, SpanError
from probe.types import Span, TokenizedPrompt


def tp_from(kinds_lengths: list[tuple[str, int]]) -> TokenizedPrompt:
    spans, pos = [], 0
    for kind, n in kinds_lengths:
        spans.append(Span(kind, pos, pos + n))
        pos += n
    return TokenizedPrompt(input_ids=tuple(range(pos)), spans=tuple(spans))


LAYOUT = [("sink", 2), ("instruction", 3), ("extraneous", 4), ("sink", 1), ("germane", 3), ("extraneous", 2),
          ("germane", 2), ("question", 3), ("sink", 2)]


def test_query_sets() -> None:
    tp = tp_from(LAYOUT)  # 22 tokens; question at 17..19, closing sink 20..21
    assert build_plan(tp, ProbeOptions()).query_positions.tolist() == [17, 18, 19, 21]
    assert build_plan(tp, ProbeOptions(query="last")).query_positions.tolist() == [21]
    assert build_plan(tp, ProbeOptions(query="segment:4")).query_positions.tolist() == [10, 11, 12]
    plan = build_plan(tp, ProbeOptions(query="generated"), n_generated=3)
    assert plan.query_positions.tolist() == [22, 23, 24]
    assert plan.segment_kinds[-1] == "generated" and plan.n_tokens == 25


def test_query_set_errors() -> None:
    tp = tp_from(LAYOUT)
    with pytest.raises(ConfigError, match="generated"):
        build_plan(tp, ProbeOptions(query="generated"))
    with pytest.raises(SpanError, match="9 segments"):
        build_plan(tp, ProbeOptions(query="segment:9"))
    no_question = tp_from([("sink", 1), ("germane", 3)])
    with pytest.raises(SpanError, match="no question segment"):
        build_plan(no_question, ProbeOptions())


def test_residue_distances_skip_sink_segments() -> None:
    plan = build_plan(tp_from(LAYOUT), ProbeOptions(gamma=0.5))
    # Non-sink order: instruction 0, extraneous(2) 1, germane(4) 2, extraneous(5) 3, germane(6) 4, question(7) 5.
    assert plan.ar_targets == (4, 6, 7)
    assert plan.ar_sources == (((2, 0.5),), ((2, 0.125), (5, 0.5)), ((2, 0.0625), (5, 0.25)))
    # Cosine residue needs the rows of the targets, of both extraneous segments and of the query set.
    assert set(plan.row_positions.tolist()) == set(range(5, 20)) - {9} | {21}
    mass = build_plan(tp_from(LAYOUT), ProbeOptions(residue_mode="mass"))
    assert set(mass.row_positions.tolist()) == set(range(10, 13)) | set(range(15, 20)) | {21}


def _causal_rows(n: int, logits: np.ndarray) -> np.ndarray:
    """(H, T, T) causal softmax of ``logits``."""
    masked = np.where(np.tril(np.ones((n, n), dtype=bool)), logits, -np.inf)
    e = np.exp(masked - masked.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _reduce(tp: TokenizedPrompt, options: ProbeOptions, att: np.ndarray, matmul: bool = True) -> SegmentAttention:
    """Run the reducer over full (H, T, T) rows of one layer, block by block."""
    plan = build_plan(tp, options)
    n = plan.n_tokens
    tensors = PlanTensors(plan, torch.device("cpu"))
    tensors.use_matmul = matmul
    reducer = LayerReducer(plan, att.shape[0], tensors)
    probs = torch.tensor(np.array(att), dtype=torch.float32)
    for block in tensors.blocks:
        reducer.add(block, probs[:, block.positions])
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))[tensors.query_positions]
    return assemble_result(plan, [reducer.finish(tensors.chance(allowed, options.exclude_sink))])


@pytest.mark.parametrize("matmul", [True, False], ids=["onehot-matmul", "index-add"])
def test_reducer_on_hand_made_rows(matmul: bool) -> None:
    """A 9-token prompt: every measure recomputed here directly from the rows."""
    tp = tp_from([("sink", 1), ("extraneous", 3), ("germane", 2), ("question", 2), ("sink", 1)])
    rng = np.random.default_rng(0)
    att = _causal_rows(9, rng.normal(size=(2, 9, 9)) * 2)
    res = _reduce(tp, ProbeOptions(block_size=2, gamma=0.5), att, matmul)
    q = [6, 7, 8]
    ext = att[:, q, 1:4].sum(-1).mean(-1)
    sink = (att[:, q, 0] + att[:, q, 8]).mean(-1)
    np.testing.assert_allclose(res.p_ext[0], ext / (1 - sink), atol=1e-6)
    np.testing.assert_allclose(res.sink_mass[0], sink, atol=1e-6)
    # chance: query 6 and 7 see 3 extraneous of 5 / 6 non-sink tokens; query 8 sees 3 of 7.
    want_c = np.mean([3 / 7, 3 / 8, 3 / 9]) / np.mean([6 / 7, 7 / 8, 7 / 9])
    np.testing.assert_allclose(res.chance[0], want_c, atol=1e-6)
    # AR of the germane segment (tokens 4-5) and the question (6-7): one extraneous source (tokens 1-3).
    for ti, (a, b, dist) in enumerate([(4, 6, 1), (6, 8, 2)]):
        e = att[:, 1:4, 1:4].mean(1)  # keys [0, 4) without the sink key 0
        s = att[:, a:b, 1:4].mean(1)
        e /= e.sum(-1, keepdims=True)
        s /= s.sum(-1, keepdims=True)
        cos = (e * s).sum(-1) / np.linalg.norm(e, axis=-1) / np.linalg.norm(s, axis=-1)
        np.testing.assert_allclose(res.ar_k[0, :, ti], 0.5**dist * cos, atol=1e-6)
    mass = _reduce(tp, ProbeOptions(residue_mode="mass", block_size=4, gamma=0.5), att, matmul)
    np.testing.assert_allclose(mass.ar_k[0, :, 1], 0.25 * att[:, 6:8, 1:4].sum(-1).mean(-1), atol=1e-6)


def test_reducer_uniform_rows_give_chance() -> None:
    tp = tp_from(LAYOUT)
    n = len(tp.input_ids)
    att = np.broadcast_to(_causal_rows(n, np.zeros((n, n))), (3, n, n))
    for exclude in (True, False):
        res = _reduce(tp, ProbeOptions(exclude_sink=exclude, block_size=5), att)
        np.testing.assert_allclose(res.p_ext, res.chance[:, None].repeat(3, 1), atol=1e-6)


def _result(ar: bool = True) -> SegmentAttention:
    rng = np.random.default_rng(1)
    arrays = {"seg_mass": rng.random((2, 3, 7)).astype(np.float32),
              "seg_mass_segment": rng.random((2, 3, 4)).astype(np.float32),
              "p_ext": np.array([[0.1, np.nan, 0.3], [0.2, 0.2, 0.2]], dtype=np.float32)}
    if ar:
        arrays["ar_k"] = rng.random((2, 3, 2)).astype(np.float32)
    return SegmentAttention(
        measures=arrays,
        chance=np.array([0.0, 0.25], dtype=np.float32),
        kinds=("instruction", "germane", "extraneous", "filler", "question", "sink", "generated"),
        segment_labels=("s", "e0", "g0", "q"),
        segment_kinds=("sink", "extraneous", "germane", "question"),
        segment_spans=((0, 1), (1, 4), (4, 6), (6, 9)),
        ar_targets=(2, 3),
        options={"query": "question", "gamma": 0.5, "residue_mode": "cosine", "exclude_sink": True},
        n_tokens=9,
        n_prompt_tokens=9,
        n_queries=3,
    )


@pytest.mark.parametrize("ar", [True, False])
def test_save_load_round_trip(tmp_path, ar: bool) -> None:
    res = _result(ar)
    path = tmp_path / "attention" / "m" / "p1.npz"
    res.save(path)
    res.save(path)  # overwriting goes through a temporary file and a rename
    assert sorted(p.name for p in path.parent.iterdir()) == ["p1.npz"]
    back = SegmentAttention.load(path)
    for f in ("seg_mass", "seg_mass_segment", "p_ext", "chance"):
        np.testing.assert_array_equal(getattr(back, f), getattr(res, f))
        assert getattr(back, f).dtype == np.float32
    assert (back.ar_k is None) == (not ar)
    if ar:
        np.testing.assert_array_equal(back.ar_k, res.ar_k)
    assert back.meta() == res.meta()
    assert back.ar_target_labels == ("g0", "q")


def test_enrichment_is_nan_where_chance_is_zero() -> None:
    res = _result()
    e = res.enrichment
    assert np.all(np.isnan(e[0]))
    np.testing.assert_allclose(e[1], 0.2 / 0.25, rtol=1e-6)


def test_capacity_estimate() -> None:
    t = 5000
    oa = probe_memory_bytes(LLAMA3_8B, t, "output_attentions")
    assert oa["attention_weights"] == 32 * 32 * t * t * 2
    budget = 141e9
    n_oa = max_probe_context(LLAMA3_8B, budget, "output_attentions")
    n_engine = max_probe_context(LLAMA3_8B, budget, "engine")
    for method, n in (("output_attentions", n_oa), ("engine", n_engine)):
        assert probe_memory_bytes(LLAMA3_8B, n, method)["total"] <= budget
        assert probe_memory_bytes(LLAMA3_8B, n + 1, method)["total"] > budget
    assert 7000 < n_oa < 8000
    assert n_engine > 50 * n_oa
    # Engine memory is linear in T: doubling T at most doubles the T-dependent part.
    e1 = probe_memory_bytes(LLAMA3_8B, 100_000, "engine")
    e2 = probe_memory_bytes(LLAMA3_8B, 200_000, "engine")
    assert e2["total"] - e2["weights"] == pytest.approx(2 * (e1["total"] - e1["weights"]), rel=1e-9)


def test_a_format_1_record_still_reads_with_the_same_values() -> None:
    """``attention_record_format1.npz`` was written by the engine before measures were a registry (format 1): it
    reads, and its arrays equal a fresh probe of the same prompt with the same tiny model to 1e-5. The record is
    float32 from another machine: the same sums in another order differ there by ~1e-7 to 5e-7 (a CPU's kernels, a
    thread count); a change of what a measure means (its mask, its sink, its normalisation) moves values by 1e-2."""
    import dataclasses
    from pathlib import Path

    from probe.attention import probe_tokenized
    from tests.attention.test_attention import _build, make_prompt

    old = SegmentAttention.load(Path(__file__).parent.parent / "fixtures" / "attention_record_format1.npz")
    assert set(old.measures) == {"seg_mass", "seg_mass_segment", "p_ext", "ar_k"}
    new = probe_tokenized(_build("llama"), make_prompt(3, layout="saturation", n_tokens=57))
    same = dataclasses.replace(new, measures={k: new[k] for k in old.measures})  # measures added since: not in it
    diffs = same.max_differences(old)
    assert set(diffs) == {*old.measures, "chance"} and max(diffs.values()) <= 1e-5, diffs
    assert old.segment_labels == new.segment_labels
    assert old.options == new.options
