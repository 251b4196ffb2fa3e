"""The probe engine against eager ``output_attentions`` on tiny random-weight models of every supported architecture.

Each model is built from a config with a few layers, a small hidden size and large initial weights (so attention
is far from uniform and soft-capping bites); prompts of 50-80 tokens with random sink / instruction / germane /
extraneous / filler / question spans. Sliding windows (16 tokens) are shorter than the prompts.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from transformers import (
    BloomConfig,
    BloomForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from probe.attention import probe_tokenized, reference_segment_attention
from probe.attention.capture import Capture
from probe.attention.implementation import attach_probe
from probe.attention.measures import measures
from probe.attention.plan import build_plan
from probe.probe_options import ProbeOptions
from probe.errors import HookError
from probe.types import Span, TokenizedPrompt

pytestmark = pytest.mark.integration

VOCAB = 128
ATOL = 1e-4
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.5)


def _build(name: str) -> torch.nn.Module:
    # a seed from the name that is the same in every process (str hash is salted per process: PYTHONHASHSEED)
    torch.manual_seed(zlib.crc32(name.encode()) % 1000)
    if name == "llama":
        m = LlamaForCausalLM(LlamaConfig(**SMALL))
    elif name == "llama-mha":
        m = LlamaForCausalLM(LlamaConfig(**{**SMALL, "num_key_value_heads": 4}))
    elif name == "llama-gqa3":  # 6 query heads over 2 key/value heads
        m = LlamaForCausalLM(LlamaConfig(**{**SMALL, "hidden_size": 48, "num_attention_heads": 6}))
    elif name == "mistral":
        m = MistralForCausalLM(MistralConfig(**SMALL, sliding_window=16))
    elif name == "qwen2":
        m = Qwen2ForCausalLM(Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=16, max_window_layers=1))
    elif name == "qwen3":
        m = Qwen3ForCausalLM(Qwen3Config(**SMALL, head_dim=8, use_sliding_window=True, sliding_window=16,
                                         max_window_layers=1))
    elif name == "gemma2":
        m = Gemma2ForCausalLM(Gemma2Config(**SMALL, head_dim=8, sliding_window=16, attn_logit_softcapping=2.0,
                                           query_pre_attn_scalar=8))
    elif name == "gemma3":
        m = Gemma3ForCausalLM(Gemma3TextConfig(**SMALL, head_dim=8, sliding_window=16, query_pre_attn_scalar=1,
                                               layer_types=["sliding_attention", "full_attention"]))
    elif name == "gpt2":
        m = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=256,
                                       initializer_range=0.5))
    else:
        raise KeyError(name)
    return m.eval()


ARCHS = ["llama", "llama-mha", "llama-gqa3", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gpt2"]


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {name: _build(name) for name in ARCHS}


def make_prompt(seed: int, layout: str = "saturation", n_tokens: int = 64) -> TokenizedPrompt:
    """Random token ids with a chat-like span layout: sink, instruction, body, question, sink.

    layout: ``saturation`` (germane and extraneous interleaved, sink markup in between), ``residue`` (extraneous
    first), ``control`` (germane only), ``filler`` (germane padded with filler).
    """
    rng = np.random.default_rng(seed)
    body = {
        "saturation": ["extraneous", "germane", "extraneous", "sink", "germane", "extraneous", "germane", "extraneous"],
        "residue": ["extraneous", "extraneous", "extraneous", "germane", "germane", "germane"],
        "control": ["germane", "germane", "germane"],
        "filler": ["filler", "germane", "filler", "germane"],
        "many": ["extraneous", "germane", "filler", "sink"] * 17,  # > 64 segments: segment sums by index_add_
    }[layout]
    kinds = ["sink", "instruction", *body, "question", "sink"]
    cuts = np.sort(rng.choice(np.arange(1, n_tokens), size=len(kinds) - 1, replace=False))
    bounds = [0, *cuts.tolist(), n_tokens]
    spans = tuple(Span(k, bounds[i], bounds[i + 1], label=f"{k}{i}") for i, k in enumerate(kinds))
    ids = tuple(int(x) for x in rng.integers(0, VOCAB, size=n_tokens))
    return TokenizedPrompt(input_ids=ids, spans=spans)


def assert_same(engine, ref, atol: float = ATOL) -> None:
    """Every stored measure of two SegmentAttention results agrees within ``atol`` (NaN where both are NaN)."""
    assert engine.segment_kinds == ref.segment_kinds
    assert engine.ar_targets == ref.ar_targets
    assert engine.n_queries == ref.n_queries
    assert set(engine.measures) == {m.id for m in measures()}  # every registered measure, held to its reference
    for field in [*engine.measures, "chance"]:
        a, b = engine.chance if field == "chance" else engine[field], ref.chance if field == "chance" else ref[field]
        assert a.shape == b.shape, field
        np.testing.assert_allclose(a, b, atol=atol, rtol=0, equal_nan=True, err_msg=field)
    np.testing.assert_allclose(engine.enrichment, ref.enrichment, atol=1e-3, rtol=1e-4, equal_nan=True)


OPTION_SETS = {
    "default": ProbeOptions(),
    "mass-blocks": ProbeOptions(residue_mode="mass", block_size=7, gamma=0.8),
    "last-with-sink": ProbeOptions(query="last", exclude_sink=False, block_size=1),
    "segment": ProbeOptions(query="segment:4", block_size=16, gamma=0.3),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("opts", list(OPTION_SETS), ids=list(OPTION_SETS))
def test_engine_equals_eager_reference(models, arch: str, opts: str) -> None:
    model = models[arch]
    tp = make_prompt(seed=len(arch) * 7 + len(opts), layout="saturation" if opts != "segment" else "residue",
                     n_tokens=72)
    options = OPTION_SETS[opts]
    got = probe_tokenized(model, tp, options)
    want = reference_segment_attention(model, tp, options)
    assert_same(got, want)


@pytest.mark.parametrize("arch", ["llama-gqa3", "mistral", "gemma2", "gpt2"])
@pytest.mark.parametrize("mode", ["cosine", "mass"])
def test_generated_query_set(models, arch: str, mode: str) -> None:
    model = models[arch]
    tp = make_prompt(seed=3, layout="residue", n_tokens=56)
    answer = [5, 17, 99, 3, 42, 8, 8, 1]
    options = ProbeOptions(query="generated", residue_mode=mode, block_size=5)
    got = probe_tokenized(model, tp, options, generated_ids=answer)
    want = reference_segment_attention(model, tp, options, generated_ids=answer)
    assert_same(got, want)
    assert got.n_queries == len(answer) and got.n_tokens == 56 + len(answer)
    assert got.segment_kinds[-1] == "generated"
    assert float(got.mass_of("generated").min()) > 0  # answer tokens attend to earlier answer tokens


@pytest.mark.parametrize("layout", ["filler", "many"])
def test_layouts(models, layout: str) -> None:
    tp = make_prompt(seed=15, layout=layout, n_tokens=100)
    for mode in ("cosine", "mass"):
        options = ProbeOptions(residue_mode=mode, block_size=32)
        assert_same(probe_tokenized(models["mistral"], tp, options), reference_segment_attention(models["mistral"], tp,
                                                                                                options))


def test_attention_is_not_trivial(models) -> None:
    """The tiny models' attention is far from uniform, so the comparisons above can tell rows apart."""
    tp = make_prompt(seed=1, n_tokens=72)
    for arch in ARCHS:
        res = probe_tokenized(models[arch], tp, ProbeOptions(query="last"))
        assert float(np.nanmax(np.abs(res.p_ext - res.chance[:, None]))) > 0.05, arch


def test_softcap_and_window_matter(models) -> None:
    """Gemma 2's soft-capping and Mistral's window change the rows: a probe ignoring them would be caught."""
    tp = make_prompt(seed=2, n_tokens=72)
    gemma = models["gemma2"]
    capped = reference_segment_attention(gemma, tp)
    for layer in gemma.model.layers:  # the attention modules keep their own copy of the cap
        layer.self_attn.attn_logit_softcapping = None
    try:
        uncapped = reference_segment_attention(gemma, tp)
    finally:
        for layer in gemma.model.layers:
            layer.self_attn.attn_logit_softcapping = 2.0
    assert np.abs(capped.seg_mass - uncapped.seg_mass).max() > 1e-2
    mistral = models["mistral"]
    windowed = reference_segment_attention(mistral, tp)
    mistral.config.sliding_window = None
    try:
        full = reference_segment_attention(mistral, tp)
    finally:
        mistral.config.sliding_window = 16
    assert np.abs(windowed.seg_mass - full.seg_mass).max() > 1e-2


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
def test_forward_output_unchanged_by_probe(models, arch: str) -> None:
    """Under the probe the model computes the same hidden states as with eager attention."""
    model = models[arch]
    tp = make_prompt(seed=4, n_tokens=64)
    ids = torch.tensor([tp.input_ids])
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    with torch.no_grad():
        want = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
    model.set_attn_implementation(previous)
    plan = build_plan(tp, ProbeOptions(block_size=9))
    capture = Capture([plan], n_layers=2)
    with torch.no_grad(), attach_probe(model, capture):
        got = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
    capture.check()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert model.config._attn_implementation == previous


def test_masses_sum_to_one_including_sink(models) -> None:
    for arch in ("llama", "gemma3"):
        res = probe_tokenized(models[arch], make_prompt(seed=5, n_tokens=80))
        np.testing.assert_allclose(res.seg_mass.sum(-1), 1.0, atol=1e-5)
        np.testing.assert_allclose(res.seg_mass_segment.sum(-1), 1.0, atol=1e-5)
        sink_direct = sum(res.seg_mass_segment[..., i] for i, k in enumerate(res.segment_kinds) if k == "sink")
        np.testing.assert_allclose(res.sink_mass, sink_direct, atol=1e-6)


@pytest.mark.parametrize("mode", ["cosine", "mass"])
def test_control_has_no_residue_and_no_chance(models, mode: str) -> None:
    res = probe_tokenized(models["mistral"], make_prompt(seed=6, layout="control"), ProbeOptions(residue_mode=mode))
    assert res.ar_k is not None and res.ar_k.shape[-1] == 4  # three germane segments and the question
    assert np.all(res.ar_k == 0)
    assert np.all(res.chance == 0) and np.all(res.p_ext == 0)
    assert np.all(np.isnan(res.enrichment))


def test_residue_is_positive_after_extraneous_segments(models) -> None:
    res = probe_tokenized(models["llama"], make_prompt(seed=7, layout="residue"))
    assert res.ar_k is not None and float(res.ar_k.min()) > 0  # every target has earlier extraneous segments


@pytest.mark.parametrize("arch", ["llama", "mistral"])
@pytest.mark.parametrize("exclude_sink", [True, False])
@pytest.mark.parametrize("query", ["question", "segment:5", "last"])
def test_uniform_attention_gives_chance(arch: str, exclude_sink: bool, query: str) -> None:
    """With all scores equal (q projection zeroed) attention is uniform over visible keys: P_ext = chance."""
    model = _build(arch)
    for layer in model.model.layers:
        torch.nn.init.zeros_(layer.self_attn.q_proj.weight)
    tp = make_prompt(seed=8, n_tokens=70)
    res = probe_tokenized(model, tp, ProbeOptions(query=query, exclude_sink=exclude_sink))
    np.testing.assert_allclose(res.p_ext, np.broadcast_to(res.chance[:, None], res.p_ext.shape), atol=1e-5)
    np.testing.assert_allclose(res.enrichment, 1.0, atol=1e-4)
    # Independent count for the last token without a window: extraneous / non-sink tokens it sees.
    if query == "last" and arch == "llama":
        n_ext = tp.count("extraneous")
        den = len(tp.input_ids) - (tp.count("sink") if exclude_sink else 0)
        np.testing.assert_allclose(res.chance, n_ext / den, atol=1e-6)


def test_without_residue_same_masses(models) -> None:
    tp = make_prompt(seed=9)
    full = probe_tokenized(models["qwen2"], tp)
    lean = probe_tokenized(models["qwen2"], tp, ProbeOptions(residue=False))
    assert lean.ar_k is None
    assert lean.options["residue"] is False and full.options["residue"] is True  # the record says which
    np.testing.assert_allclose(lean.seg_mass, full.seg_mass, atol=1e-6)
    np.testing.assert_allclose(lean.chance, full.chance, atol=1e-7)


def test_layer_that_does_not_report_raises(models) -> None:
    model = _build("llama")
    attn = model.model.layers[1].self_attn

    def bypass(hidden_states: torch.Tensor, *args: object, **kwargs: object) -> tuple[torch.Tensor, None]:
        return torch.zeros_like(hidden_states), None

    attn.forward = bypass
    with pytest.raises(HookError, match=r"layers \[1\] did not report"):
        probe_tokenized(model, make_prompt(seed=10))
    assert model.config._attn_implementation == "sdpa"  # restored despite the error


def test_layer_reporting_twice_raises() -> None:
    plan = build_plan(make_prompt(seed=11), ProbeOptions())
    capture = Capture([plan], n_layers=2)
    capture.calls.update([0, 1, 1])
    with pytest.raises(HookError, match=r"layers \[1\] reported more than once"):
        capture.check()


def test_a_refused_architecture_is_named_with_the_suites_reason() -> None:
    model = BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=4)).eval()
    with pytest.raises(HookError, match=r"model_type 'bloom'.*AttentionInterface"):
        probe_tokenized(model, make_prompt(seed=12))
    assert model.config._attn_implementation != "ice_probe"


def test_an_architecture_the_suite_never_saw_is_refused(monkeypatch) -> None:
    model = _build("llama")
    monkeypatch.setattr(model.config, "model_type", "llama-from-the-future")
    with pytest.raises(HookError, match=r"'llama-from-the-future' was not checked by the conformance suite"):
        probe_tokenized(model, make_prompt(seed=12))


def test_previous_implementation_restored(models) -> None:
    gemma = models["gemma2"]
    before = gemma.config._attn_implementation
    probe_tokenized(gemma, make_prompt(seed=13))
    assert gemma.config._attn_implementation == before
    assert gemma.model.layers[0].self_attn.config._attn_implementation == before


def test_transformer_lens_bridge_agrees_with_engine() -> None:
    """TransformerLens 4 (TransformerBridge over the same HF weights, offline) gives the engine's numbers."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    from transformer_lens.model_bridge import TransformerBridge

    from probe.attention import probe_transformer_lens

    model = _build("llama-gqa3")
    tp = make_prompt(seed=14, layout="residue", n_tokens=64)
    results = {mode: probe_tokenized(model, tp, ProbeOptions(residue_mode=mode)) for mode in ("cosine", "mass")}
    vocab = {f"t{i}": i for i in range(VOCAB)}
    # No BOS token: TransformerLens would otherwise reload the tokenizer from the hub by name.
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")), unk_token="t0",
                                  pad_token="t1", eos_token="t2")
    bridge = TransformerBridge.boot_transformers("tiny-llama", hf_model=model, tokenizer=tok, device="cpu")
    for mode, engine in results.items():
        lens = probe_transformer_lens(bridge, tp, ProbeOptions(residue_mode=mode))
        assert_same(lens, engine)
    # The bridge replaces the attention modules, which then bypass the AttentionInterface: caught loudly.
    with pytest.raises(HookError, match="did not report"):
        probe_tokenized(model, tp)


def test_bench_rows_on_tiny_model() -> None:
    from benchmarks.attention import format_attention_bench, run_attention_bench

    model = _build("llama")
    rows = run_attention_bench(lengths=(60, 96), model=model, model_name="tiny", include_lens=False, repeats=3,
                               full_attention_limit_gb=2e-4)  # L·H·T²·4 B: 0.12 MB at 60, 0.29 MB at 96
    assert [r["n_tokens"] for r in rows] == [60, 96]
    assert rows[0]["eager_s"] is not None and rows[1]["eager_s"] is None
    for r in rows:
        assert r["plain_s"] > 0 and r["engine_s"] > 0 and r["engine_ar_s"] > 0 and r["rounds"] == 3
        assert r["engine_time_ratio"] == pytest.approx(r["engine_s"] / r["plain_s"])
        for arm in ("engine", "engine_ar", "value"):  # the spread of the per-round ratios
            lo, hi = r[f"{arm}_time_ratio_range"]
            assert 0 < lo <= hi
        assert r["engine_raw_s"] > 0 and r["value_time_ratio"] == pytest.approx(r["engine_s"] / r["engine_raw_s"])
    table = format_attention_bench(rows)
    assert max(len(line) for line in table.splitlines()) <= 100  # fits a terminal, one column per T
    text = " ".join(table.split())
    assert "skipped" in text and "eager/lens skipped" in text and "fastest of 3 round(s)" in text
    assert "engine/engine_raw" in text and "per-round time ratios" in text
    lo, hi = rows[0]["engine_time_ratio_range"]
    assert f"{rows[0]['engine_time_ratio']:.2f} ({lo:.2f}-{hi:.2f})" in table


def test_probe_without_value_weighted_measures() -> None:
    """``value_weighted=False`` (the bench's engine_raw arm) leaves out exactly the measures that read value states;
    every other array is the same."""
    model = _build("llama")
    tp = make_prompt(seed=5, n_tokens=48)
    full = probe_tokenized(model, tp, ProbeOptions(residue=False))
    raw = probe_tokenized(model, tp, ProbeOptions(residue=False), value_weighted=False)
    assert {"value_share_segment", "value_p_ext"} <= set(full.measures)
    assert set(raw.measures) == set(full.measures) - {"value_share_segment", "value_p_ext"}
    for k in raw.measures:
        np.testing.assert_array_equal(raw.measures[k], full.measures[k])


def test_probe_batch_bench_on_tiny_model() -> None:
    from benchmarks.attention import format_probe_batch_bench, run_probe_batch_bench

    row = run_probe_batch_bench(_build("llama"), model_name="tiny", n_prompts=5, batch_size=3, lengths=(60, 90),
                                repeats=1)
    assert row["b1_pps"] > 0 and row["batched_pps"] > 0
    assert row["speedup"] == pytest.approx(row["b1_s"] / row["batched_s"])
    assert row["max_abs_diff"] < 1e-5  # the batched arm gives the one-at-a-time results
    assert "prompts/s" in format_probe_batch_bench(row)
