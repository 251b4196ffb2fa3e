"""The value-weighted segment share and P_ext (probe.attention.measures.value): the per-key norms ‖v_j W_O^h‖ with
grouped-query heads, the engine against its independent eager reference on every tiny architecture (float32,
1e-4), and a planted case: keys whose value vectors are zero get no value-weighted share whatever their weight."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probe.attention import probe_batch, probe_tokenized, reference_segment_attention
from probe.attention.measures.value import value_norms
from probe.probe_options import ProbeOptions
from probe.types import TokenizedPrompt
from tests.attention.test_attention import ARCHS, _build, make_prompt

IDS = ("value_share_segment", "value_p_ext")


def test_value_norms_read_each_heads_kv_values_and_its_own_output_rows() -> None:
    rng = np.random.default_rng(0)
    n_heads, n_kv, n_keys, dim, hidden = 6, 2, 11, 4, 24
    values = rng.normal(size=(n_kv, n_keys, dim))
    w = rng.normal(size=(n_heads * dim, hidden))
    got = value_norms(torch.tensor(values, dtype=torch.float32), torch.tensor(w, dtype=torch.float32), n_heads)
    rep = n_heads // n_kv
    want = np.array([[np.linalg.norm(values[h // rep, j] @ w[h * dim:(h + 1) * dim]) for j in range(n_keys)]
                     for h in range(n_heads)])
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("options", [ProbeOptions(), ProbeOptions(query="last", exclude_sink=False, block_size=3)],
                         ids=["question", "last-with-sink"])
def test_value_weighted_share_equals_eager(arch: str, options: ProbeOptions) -> None:
    model = _build(arch)
    tp = make_prompt(7, layout="saturation", n_tokens=58)
    got = probe_tokenized(model, tp, options)
    ref = reference_segment_attention(model, tp, options)
    for name in IDS:
        np.testing.assert_allclose(got[name], ref[name], atol=1e-4, rtol=0, equal_nan=True, err_msg=name)
    np.testing.assert_allclose(got["value_share_segment"].sum(-1), 1.0, atol=1e-5)
    batched = probe_batch(model, [tp, make_prompt(8, n_tokens=40)], options)[0]  # left-padded beside another
    for name in IDS:
        np.testing.assert_allclose(batched[name], got[name], atol=1e-5, rtol=0, equal_nan=True, err_msg=name)


def test_keys_with_zero_values_get_no_value_weighted_share() -> None:
    """Token 0's embedding is zeroed, so layer 0's value states (RMSNorm of zero, then v_proj) vanish on the
    extraneous tokens, which all are token 0: their raw mass stays, their value-weighted share is 0."""
    model = _build("llama")
    with torch.no_grad():
        model.model.embed_tokens.weight[0] = 0.0
    tp = make_prompt(5, layout="saturation", n_tokens=60)
    ext = {p for s in tp.spans if s.kind == "extraneous" for p in range(s.start, s.end)}
    ids = tuple(0 if p in ext else max(1, t) for p, t in enumerate(tp.input_ids))
    res = probe_tokenized(model, TokenizedPrompt(input_ids=ids, spans=tp.spans))
    assert res.p_ext[0].min() > 1e-5  # the extraneous tokens are attended to
    assert (res["value_p_ext"][0] == 0.0).all()
    assert res["value_p_ext"][1].max() > 0.0  # later layers see their (no longer zero) residual stream
