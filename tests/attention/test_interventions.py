"""Interventions (knockout, steer) against a hand-edited eager attention on tiny models of every supported architecture.

The reference is written independently of the engine: a second attention function computes each layer in float64
from q, k, v with the full (T × T) score matrix, then edits it by hand from the prompt's spans — knockout: −inf on the
(query, key) edges before the softmax; steer: the post-softmax weights of the keys multiplied by α and each row
renormalised. Logits of the intervened model must equal it; generation with the cache must equal generation
without it; one prompt alone must equal the same prompt in a left-padded batch.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from probe.attention.edits import row_edit
from probe.attention.engine import left_pad
from probe.attention.implementation import IMPLEMENTATION, attention_implementation
from probe.attention.intervention import apply_intervention
from probe.interventions import Intervention, RowEdit
from probe.probe_options import ProbeOptions
from probe.errors import ConfigError, SpanError
from probe.types import Span, TokenizedPrompt
from tests.attention.test_attention import _build, make_prompt

pytestmark = pytest.mark.integration

ARCHS = ["llama", "llama-gqa3", "mistral", "qwen2", "gemma2", "gemma3", "gpt2"]
REF = "ice_test_edited_eager"
ATOL = 1e-5


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {name: _build(name) for name in ARCHS}


@pytest.fixture(scope="module")
def models64() -> dict[str, torch.nn.Module]:
    """The same models in float64: float32 arithmetic alone differs from the float64 reference by ~1e-5 on these
    logits (magnitude 10-20), so the 1e-5 comparison runs in float64, where only the edit can differ; greedy
    tokens are compared in float64 too (``gen_models``)."""
    return {name: _build(name).double() for name in ARCHS}


@pytest.fixture(scope="module")
def gen_models(models, models64) -> dict[str, torch.nn.Module]:
    """Models for comparing greedy tokens across batch layouts and cache use: float64, so that no near-tie flips on
    rounding; Gemma 2 in float32, since its own eager attention (the unedited baseline) gives NaN for a
    left-padded row in float64."""
    return {name: models[name] if name == "gemma2" else models64[name] for name in ARCHS}


# ---------------------------------------------------------------------------------------------------------------
# The reference: eager attention in float64, edited by hand

_STATE: dict = {}


def _ref_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
    layer = module.layer_idx
    n_b, n_h, n_q, _ = query.shape
    n_k = key.shape[2]
    rep = n_h // key.shape[1]
    k = key.double().repeat_interleave(rep, dim=1)
    v = value.double().repeat_interleave(rep, dim=1)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    s = torch.matmul(query.double(), k.transpose(-1, -2)) * scaling
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    qpos = torch.arange(n_k - n_q, n_k)
    if attention_mask is None:
        allowed = (torch.arange(n_k)[None, :] <= qpos[:, None])[None, None]
    else:
        allowed = attention_mask[:, :, :, :n_k].bool()
    s = s.masked_fill(~allowed, float("-inf"))
    edit = _STATE.get("edit")
    edges = None
    if edit is not None and layer in edit["layers"]:
        edges = torch.zeros(n_b, n_h, n_q, n_k, dtype=torch.bool)
        for b in range(n_b):
            for qi in range(n_q):
                p = int(qpos[qi])
                if p < edit["qstart"][b]:
                    continue
                for kk in edit["keys"][b]:
                    if kk != p and kk < n_k:
                        for h in edit["layers"][layer]:
                            edges[b, h, qi, kk] = True
        if edit["kind"] == "knockout":
            s = s.masked_fill(edges, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num(p)
    if edges is not None and edit["kind"] == "steer":
        p = torch.where(edges, p * edit["alpha"], p)
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-300)
    out = torch.matmul(p, v).to(query.dtype)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(REF, _ref_attention)
AttentionMaskInterface.register(REF, sdpa_mask)


def _hand_edit(prompts, pads, spec: Intervention, n_layers: int, n_heads: int) -> dict:
    """The edit written out from the spans: key positions and first query per row (padded), heads per layer."""
    keys, qstart = [], []
    for tp, pad in zip(prompts, pads):
        keys.append([pad + p for s in tp.spans if s.kind == spec.keys for p in range(s.start, s.end)])
        first_q = min(s.start for s in tp.spans if s.kind == "question")
        qstart.append(pad + first_q)
    layers = range(n_layers) if spec.layers is None else spec.layers
    heads = {layer: list(range(n_heads)) for layer in layers}
    if spec.heads is not None:
        heads = {}
        for layer, head in spec.heads:
            heads.setdefault(layer, []).append(head)
    return {"keys": keys, "qstart": qstart, "layers": heads, "kind": spec.kind, "alpha": spec.alpha}


def _reference_logits(model, prompts, spec: Intervention | None) -> torch.Tensor:
    ids, mask, pads = left_pad([tp.input_ids for tp in prompts])
    cfg = model.config.get_text_config()
    _STATE["edit"] = None if spec is None else _hand_edit(prompts, pads, spec, cfg.num_hidden_layers,
                                                           cfg.num_attention_heads)
    try:
        with torch.no_grad(), attention_implementation(model, REF):
            return model(ids, attention_mask=mask, **_positions(mask)).logits
    finally:
        _STATE.clear()


def _positions(mask: torch.Tensor) -> dict:
    return {"position_ids": (mask.cumsum(-1) - 1).clamp_min(0)}


def _edited_logits(model, prompts, spec: Intervention) -> torch.Tensor:
    with torch.no_grad(), apply_intervention(model, prompts, spec) as batch:
        return model(batch.input_ids, attention_mask=batch.attention_mask, **_positions(batch.attention_mask)).logits


SPECS = {
    "knockout-all": Intervention(kind="knockout", keys="extraneous"),
    "knockout-layer1": Intervention(kind="knockout", keys="extraneous", layers=(1,)),
    "steer-0.3-heads": Intervention(kind="steer", alpha=0.3, keys="germane", heads=((0, 1), (1, 0), (1, 3))),
    "steer-2.5": Intervention(kind="steer", alpha=2.5, keys="extraneous"),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(SPECS))
def test_logits_equal_hand_edited_eager(models64, arch: str, name: str) -> None:
    model = models64[arch]
    prompts = [make_prompt(seed=3, layout="saturation", n_tokens=60), make_prompt(seed=4, layout="residue", n_tokens=44)]
    spec = SPECS[name]
    got = _edited_logits(model, prompts, spec)
    want = _reference_logits(model, prompts, spec)
    plain = _reference_logits(model, prompts, None)
    pads = [60 - 60, 60 - 44]
    for i, pad in enumerate(pads):  # padding rows are not compared
        torch.testing.assert_close(got[i, pad:], want[i, pad:].to(got.dtype), atol=ATOL, rtol=0)
        # the edit does change the logits (else the comparison above would prove nothing)
        assert (want[i, pad:] - plain[i, pad:]).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_steer_alpha_zero_is_the_knockout_and_alpha_one_is_nothing(models64, arch: str) -> None:
    model = models64[arch]
    prompts = [make_prompt(seed=5, layout="saturation", n_tokens=56)]
    knock = _edited_logits(model, prompts, Intervention(kind="knockout", keys="extraneous"))
    zero = _edited_logits(model, prompts, Intervention(kind="steer", alpha=0.0, keys="extraneous"))
    torch.testing.assert_close(zero, knock, atol=ATOL, rtol=0)
    one = _edited_logits(model, prompts, Intervention(kind="steer", alpha=1.0, keys="extraneous"))
    with torch.no_grad():
        base = model(torch.tensor([prompts[0].input_ids])).logits
    torch.testing.assert_close(one, base, atol=ATOL, rtol=0)


def _generate(model, prompts, spec: Intervention | None, n_new: int, use_cache: bool = True,
              scores: bool = False):
    """Greedy tokens of each row (and, with ``scores``, the (steps, B, vocab) logits of every step)."""
    kwargs = dict(max_new_tokens=n_new, do_sample=False, pad_token_id=0, use_cache=use_cache,
                  temperature=None, top_p=None, top_k=None, return_dict_in_generate=True, output_logits=True)
    if spec is None:
        ids, mask, pads = left_pad([tp.input_ids for tp in prompts])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, **kwargs)
    else:
        with torch.no_grad(), apply_intervention(model, prompts, spec) as batch:
            out = model.generate(batch.input_ids, attention_mask=batch.attention_mask, **kwargs)
            ids = batch.input_ids
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    # a row of a batch that ended (end token) is filled with padding up to the batch's length: cut it there
    tokens = [_until(row, eos) for row in out.sequences[:, ids.shape[1]:].tolist()]
    return (tokens, torch.stack(out.logits)) if scores else tokens


def _until(row: list[int], eos: set) -> list[int]:
    cut = next((i for i, t in enumerate(row) if t in eos), None)
    return row if cut is None else row[: cut + 1]


GEN_ARCHS = ["llama", "mistral", "qwen2", "gemma2", "gemma3", "gpt2"]


@pytest.mark.parametrize("arch", GEN_ARCHS)
@pytest.mark.parametrize("spec", [SPECS["knockout-all"], SPECS["steer-0.3-heads"]], ids=["knockout", "steer"])
def test_generation_with_cache_equals_without(gen_models, arch: str, spec: Intervention) -> None:
    model = gen_models[arch]
    prompts = [make_prompt(seed=11, layout="saturation", n_tokens=50), make_prompt(seed=12, layout="residue",
                                                                                  n_tokens=38)]
    cached, cached_logits = _generate(model, prompts, spec, 12, use_cache=True, scores=True)
    uncached, uncached_logits = _generate(model, prompts, spec, 12, use_cache=False, scores=True)
    assert cached == uncached
    torch.testing.assert_close(cached_logits, uncached_logits, atol=1e-5, rtol=0)
    _, plain_logits = _generate(model, prompts, None, 12, scores=True)
    steps = min(len(cached_logits), len(plain_logits))  # either run may stop early, once every row has ended
    diff = (cached_logits[:steps] - plain_logits[:steps]).abs().amax(dim=(0, 2))
    assert diff.min() > 1e-3  # the edit acts on every row


@pytest.mark.parametrize("arch", GEN_ARCHS)
def test_batch_of_one_equals_batch_of_eight(gen_models, arch: str) -> None:
    model = gen_models[arch]
    layouts = ["saturation", "residue", "control", "filler"]
    prompts = [make_prompt(seed=20 + i, layout=layouts[i % 4], n_tokens=30 + 5 * i) for i in range(8)]
    spec = Intervention(kind="knockout", keys="extraneous", layers=(1,))
    if arch == "gpt2":
        spec = Intervention(kind="steer", alpha=0.2, keys="germane")
    batched = _generate(model, prompts, spec, 10)
    alone = [_generate(model, [tp], spec, 10)[0] for tp in prompts]
    assert batched == alone


@pytest.mark.parametrize("arch", GEN_ARCHS)
def test_knockout_of_absent_keys_changes_nothing(gen_models, arch: str) -> None:
    model = gen_models[arch]
    prompts = [make_prompt(seed=31, layout="control", n_tokens=40), make_prompt(seed=32, layout="control",
                                                                               n_tokens=33)]
    spec = Intervention(kind="knockout", keys="extraneous")
    assert _generate(model, prompts, spec, 12) == _generate(model, prompts, None, 12)
    one = _generate(model, prompts, Intervention(kind="steer", alpha=1.0, keys="germane"), 12)
    assert one == _generate(model, prompts, None, 12)


@pytest.mark.parametrize("arch", ["llama-gqa3", "gemma2"])
def test_probe_measures_the_intervened_attention(models, arch: str) -> None:
    """Probe and intervention at once: the probe's segment masses are those of the hand-edited eager attention."""
    from probe.attention import probe_tokenized

    model = models[arch]
    tp = make_prompt(seed=41, layout="saturation", n_tokens=64)
    spec = Intervention(kind="steer", alpha=0.25, keys="extraneous", layers=(0,))
    options = ProbeOptions(query="question", exclude_sink=False)
    with apply_intervention(model, [tp], spec):
        got = probe_tokenized(model, tp, options)
    plain = probe_tokenized(model, tp, options)
    # the reference masses from the hand-edited eager attention (explicit weights)
    captured: dict = {}

    def grab(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kw):
        out, _ = _ref_attention(module, query, key, value, attention_mask, dropout, scaling, softcap)
        captured[module.layer_idx] = (query, key, attention_mask, scaling, softcap)
        return out, None

    ids, mask, pads = left_pad([tp.input_ids])
    cfg = model.config.get_text_config()
    _STATE["edit"] = _hand_edit([tp], pads, spec, cfg.num_hidden_layers, cfg.num_attention_heads)
    AttentionInterface.register(REF + "_grab", grab)
    AttentionMaskInterface.register(REF + "_grab", sdpa_mask)
    try:
        with torch.no_grad(), attention_implementation(model, REF + "_grab"):
            model(ids)
    finally:
        edit = _STATE.pop("edit")
    q_rows = sorted({p for s in tp.spans if s.kind == "question" for p in range(s.start, s.end)} | {63})
    ext = [p for s in tp.spans if s.kind == "extraneous" for p in range(s.start, s.end)]
    query, key, attention_mask, scaling, softcap = captured[0]
    rep = query.shape[1] // key.shape[1]
    s = torch.matmul(query.double(), key.double().repeat_interleave(rep, 1).transpose(-1, -2)) * scaling
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    n = s.shape[-1]
    causal = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    allowed = causal if attention_mask is None else attention_mask[0, 0, :, :n].bool()
    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)[0]  # (H, T, T)
    for qi in q_rows:
        if qi >= edit["qstart"][0]:
            w = torch.ones(n, dtype=torch.float64)
            w[[k for k in ext if k != qi]] = 0.25
            p[:, qi] = p[:, qi] * w / (p[:, qi] * w).sum(-1, keepdim=True)
    ext_mass = p[:, q_rows][:, :, ext].sum(-1).mean(-1).numpy()  # (H,)
    np.testing.assert_allclose(got.p_ext[0], ext_mass, atol=1e-5)
    assert np.abs(got.p_ext[0] - plain.p_ext[0]).max() > 1e-3



# ---------------------------------------------------------------------------------------------------------------
# Keys and queries from spans


def _spans_prompt() -> TokenizedPrompt:
    kinds = [("sink", 2), ("instruction", 4), ("germane", 5), ("extraneous", 3), ("germane", 4), ("extraneous", 2),
             ("filler", 3), ("question", 4), ("sink", 3)]
    spans, pos = [], 0
    for k, n in kinds:
        spans.append(Span(k, pos, pos + n))
        pos += n
    return TokenizedPrompt(input_ids=tuple(range(pos)), spans=tuple(spans))


def test_row_edit_keys_and_queries() -> None:
    tp = _spans_prompt()
    ext = row_edit(tp, Intervention(kind="knockout", keys="extraneous"))
    assert np.flatnonzero(ext.keys).tolist() == [11, 12, 13, 18, 19]
    assert ext.query_start == 23  # the question's first token
    after = row_edit(tp, Intervention(kind="knockout", keys="extraneous", queries="after"))
    assert after.query_start == 12
    rnd = row_edit(tp, Intervention(kind="knockout", keys="matched-random"), seed=7, prompt_id="p1")
    drawn = np.flatnonzero(rnd.keys)
    assert len(drawn) == 5 and rnd.short == 0
    allowed = set(range(2, 11)) | set(range(14, 18)) | set(range(20, 23))  # instruction, germane, filler
    assert set(drawn.tolist()) <= allowed
    again = row_edit(tp, Intervention(kind="knockout", keys="matched-random"), seed=7, prompt_id="p1")
    assert np.array_equal(again.keys, rnd.keys)
    other = row_edit(tp, Intervention(kind="knockout", keys="matched-random"), seed=7, prompt_id="p2")
    assert not np.array_equal(other.keys, rnd.keys)
    assert row_edit(tp, Intervention(kind="knockout", keys="matched-random", queries="after")).query_start == 12


def test_matched_germane_draws_as_many_filler_or_extraneous_tokens_as_the_facts_hold() -> None:
    kinds = [("sink", 2), ("instruction", 4), ("germane", 2), ("extraneous", 5), ("germane", 2), ("filler", 3),
             ("question", 4), ("sink", 3)]
    spans, pos = [], 0
    for k, n in kinds:
        spans.append(Span(k, pos, pos + n))
        pos += n
    tp = TokenizedPrompt(input_ids=tuple(range(pos)), spans=tuple(spans))
    spec = Intervention(kind="steer", alpha=4.0, keys="matched-germane")
    e = row_edit(tp, spec, seed=7, prompt_id="p1")
    drawn = np.flatnonzero(e.keys)
    assert len(drawn) == 4 == e.wanted and e.short == 0  # the germane spans hold 2 + 2 tokens
    assert set(drawn.tolist()) <= set(range(8, 13)) | set(range(15, 18))  # extraneous and filler, before the question
    assert np.array_equal(row_edit(tp, spec, seed=7, prompt_id="p1").keys, e.keys)
    assert not all(np.array_equal(row_edit(tp, spec, seed=7, prompt_id=f"p{i}").keys, e.keys) for i in range(2, 6))
    germane = row_edit(tp, Intervention(kind="steer", alpha=4.0, keys="germane"))
    assert np.flatnonzero(germane.keys).tolist() == [6, 7, 13, 14]
    # queries "after": after the first germane token, as the germane steer it controls
    after = Intervention(kind="steer", alpha=4.0, keys="matched-germane", queries="after")
    assert row_edit(tp, after).query_start == 7 == row_edit(tp, dataclasses.replace(after, keys="germane")).query_start
    # a Control prompt has neither filler nor extraneous tokens: nothing to draw, and the edit says so
    control = TokenizedPrompt(input_ids=tuple(range(8)), spans=(Span("germane", 0, 5), Span("question", 5, 8)))
    empty = row_edit(control, spec, prompt_id="c")
    assert empty.n_keys == 0 and empty.short == 5


def test_matched_random_short_of_tokens_says_so(caplog) -> None:
    spans = (Span("sink", 0, 1), Span("germane", 1, 3), Span("extraneous", 3, 9), Span("question", 9, 11))
    tp = TokenizedPrompt(input_ids=tuple(range(11)), spans=spans)
    with caplog.at_level("WARNING"):
        e = row_edit(tp, Intervention(kind="knockout", keys="matched-random"), prompt_id="short")
    assert e.n_keys == 2 and e.wanted == 6 and e.short == 4
    assert "only 2" in caplog.text


def test_answer_queries_need_a_question() -> None:
    tp = TokenizedPrompt(input_ids=(1, 2, 3), spans=(Span("germane", 0, 2), Span("extraneous", 2, 3)))
    with pytest.raises(SpanError, match="question"):
        row_edit(tp, Intervention(kind="knockout"))


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="cut"), "kind"),
    (dict(kind="knockout", alpha=0.5), "alpha"),
    (dict(kind="steer"), "alpha"),
    (dict(kind="steer", alpha=-1.0), "alpha"),
    (dict(kind="knockout", keys="noise"), "keys"),
    (dict(kind="knockout", queries="all"), "queries"),
    (dict(kind="knockout", layers=(1,), heads=((2, 0),)), "layers"),
    (dict(kind="reinject", keys="extraneous"), "keys"),
    (dict(kind="reinject", keys="germane", alpha=2.0), "alpha"),
    (dict(kind="reinject", keys="germane", queries="after"), "queries"),
])
def test_intervention_refuses_bad_values(kwargs, match) -> None:
    with pytest.raises(ConfigError, match=match):
        Intervention(**kwargs)


def test_each_tested_key_set_names_its_matched_control() -> None:
    assert Intervention(kind="knockout", keys="extraneous").control_keys == "matched-random"
    assert Intervention(kind="steer", alpha=4.0, keys="germane").control_keys == "matched-germane"
    assert Intervention(kind="reinject", keys="germane").control_keys == "filler"
    for spec in (Intervention(kind="knockout", keys="matched-random"), Intervention(kind="reinject", keys="filler"),
                 Intervention(kind="knockout", keys="filler")):
        assert spec.control_keys is None  # a control, or an arm with no matched control
    assert not Intervention(kind="reinject", keys="germane").edits_attention


def test_layer_outside_the_model_is_refused(models) -> None:
    tp = make_prompt(seed=1)
    with pytest.raises(ConfigError, match="layer 5"):
        with apply_intervention(models["llama"], [tp], Intervention(kind="knockout", layers=(5,))):
            pass


def test_key_mask_form_on_arbitrary_spans(models64) -> None:
    """A RowEdit with any key mask: knocking out every key before the query start equals the reference of the
    same edges written as extraneous spans."""
    model = models64["llama"]
    tp = make_prompt(seed=51, layout="saturation", n_tokens=48)
    keys = np.zeros(48, dtype=bool)
    keys[5:15] = True
    spec = Intervention(kind="knockout", keys="extraneous")
    with torch.no_grad(), apply_intervention(model, [tp], spec, row_edits=[RowEdit(keys=keys, query_start=30)]) as b:
        got = model(b.input_ids).logits
    relabelled = TokenizedPrompt(input_ids=tp.input_ids, spans=(
        Span("sink", 0, 5), Span("extraneous", 5, 15), Span("germane", 15, 30), Span("question", 30, 48)))
    want = _reference_logits(model, [relabelled], spec)
    torch.testing.assert_close(got, want.to(got.dtype), atol=ATOL, rtol=0)


def test_attention_implementation_is_restored(models) -> None:
    model = models["llama"]
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError):
        with apply_intervention(model, [make_prompt(seed=2)], SPECS["knockout-all"]):
            assert model.config._attn_implementation == IMPLEMENTATION
            raise RuntimeError("stop")
    assert model.config._attn_implementation == before


def test_public_api_on_built_prompts(tiny_card) -> None:
    """``probe.intervention`` on built prompts of a loaded model: a Control prompt under the extraneous knockout
    generates what it generates without it; a Residue prompt's logits change."""
    import probe

    lm = probe.load_model(str(tiny_card), device="cpu")
    task = probe.load_tasks("synthetic", n=1, seed=5)[0]
    control = lm.build_prompt(task, "Control", load=50)
    residue = lm.build_prompt(task, "Residue", load=50)
    kw = dict(max_new_tokens=5, do_sample=False, temperature=None, top_p=None, top_k=None,
              pad_token_id=lm.tokenizer.pad_token_id)
    with torch.no_grad(), lm.intervention(control, kind="knockout", keys="extraneous") as b:
        out = lm.model.generate(b.input_ids, attention_mask=b.attention_mask, **kw)
    assert b.rows[0].n_keys == 0
    plain = lm.model.generate(b.input_ids, attention_mask=b.attention_mask, **kw)
    assert out.tolist() == plain.tolist()
    spec = probe.Intervention(kind="steer", alpha=0.1, keys="extraneous", layers=(1,))
    with torch.no_grad(), lm.intervention([residue], spec) as b:
        edited = lm.model(b.input_ids).logits
    assert b.rows[0].n_keys > 0
    with torch.no_grad():
        base = lm.model(b.input_ids).logits
    assert (edited[0, -1] - base[0, -1]).abs().max() > 1e-4
    torch.testing.assert_close(edited[0, : b.rows[0].query_start], base[0, : b.rows[0].query_start])
