"""The fused path (segment sums from the attention kernel, probe.attention.fused) against the float64 reference from
eager attention and against the block engine, on the tiny architectures of test_attention.py.

Tolerance 1e-5 absolute on every stored measure: both paths compute in float32 from the same query and key states, so
what separates them is float32 rounding in a different order (seen up to ~1e-6 here); 1e-5 still catches a row
off by one key, a mask transposed, a log-sum-exp off by a sign or a head reading the wrong KV head (each moves some
measure by 1e-3 or more on these models, whose attention is far from uniform).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import probe.attention.capture as capture_module
from probe.attention import probe_batch, probe_tokenized, reference_segment_attention
from probe.attention.fused import _column_sums
from probe.attention.intervention import apply_intervention
from probe.interventions import Intervention
from probe.probe_options import ProbeOptions
from tests.attention.test_attention import ARCHS, OPTION_SETS, _build, assert_same, make_prompt

pytestmark = pytest.mark.integration

ATOL = 1e-5


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {name: _build(name) for name in ARCHS}


@pytest.fixture
def fused_calls(monkeypatch) -> list[int]:
    """Counts the layers the capture hands to the fused path."""
    calls: list[int] = []
    real = capture_module.fused_layer

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(capture_module, "fused_layer", counted)
    return calls


def _both(model, tp, options, **kw):
    fused = probe_tokenized(model, tp, replace(options, kernel="fused"), **kw)
    rows = probe_tokenized(model, tp, replace(options, kernel="rows"), **kw)
    return fused, rows


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("opts", list(OPTION_SETS), ids=list(OPTION_SETS))
def test_fused_equals_reference_and_block_engine(models, fused_calls, arch: str, opts: str) -> None:
    model = models[arch]
    tp = make_prompt(seed=len(arch) * 5 + len(opts), layout="saturation" if opts != "segment" else "residue",
                     n_tokens=80)
    options = OPTION_SETS[opts]
    fused, rows = _both(model, tp, options)
    assert (fused.options["kernel"], rows.options["kernel"]) == ("fused", "rows")  # the record says how
    softcapped = arch == "gemma2"
    # every layer of the fused probe took the kernel's sums, except where logits are soft-capped (block engine)
    assert len(fused_calls) == (0 if softcapped else model.config.num_hidden_layers)
    assert_same(fused, reference_segment_attention(model, tp, options), atol=ATOL)
    assert_same(fused, rows, atol=ATOL)


@pytest.mark.parametrize("arch", ["llama-gqa3", "mistral", "qwen3", "gemma3", "gpt2"])
@pytest.mark.parametrize("mode", ["cosine", "mass"])
def test_fused_generated_query_set(models, arch: str, mode: str) -> None:
    """Query set = the answer tokens (a last ``generated`` segment), keys over prompt + answer."""
    model = models[arch]
    tp = make_prompt(seed=9, layout="residue", n_tokens=60)
    answer = [5, 17, 99, 3, 42, 8, 8, 1, 77]
    options = ProbeOptions(query="generated", residue_mode=mode, block_size=6)
    fused, rows = _both(model, tp, options, generated_ids=answer)
    assert_same(fused, reference_segment_attention(model, tp, options, generated_ids=answer), atol=ATOL)
    assert_same(fused, rows, atol=ATOL)


@pytest.mark.parametrize("layout", ["many", "filler", "control"])
def test_fused_layouts(models, layout: str) -> None:
    """Over 64 segments (values split over several kernel calls), filler, and no extraneous segment (no residue)."""
    tp = make_prompt(seed=21, layout=layout, n_tokens=110)
    for mode in ("cosine", "mass"):
        options = ProbeOptions(residue_mode=mode, block_size=24)
        fused, rows = _both(models["qwen2"], tp, options)
        assert_same(fused, reference_segment_attention(models["qwen2"], tp, options), atol=ATOL)
        assert_same(fused, rows, atol=ATOL)


@pytest.mark.parametrize("arch", ["llama-gqa3", "mistral", "gemma3"])
def test_fused_left_padded_batch(models, arch: str) -> None:
    """A batch of prompts of different lengths (left padding, the model's own mask) equals each prompt alone."""
    model = models[arch]
    prompts = [make_prompt(seed=30 + i, n_tokens=n) for i, n in enumerate((48, 75, 61))]
    options = ProbeOptions(kernel="fused", block_size=16)
    batched = probe_batch(model, prompts, options)
    for tp, got in zip(prompts, batched):
        assert_same(got, reference_segment_attention(model, tp, options), atol=ATOL)
        assert_same(got, probe_tokenized(model, tp, replace(options, kernel="rows")), atol=ATOL)


def test_fused_bfloat16_model_upcasts_query_and_key(fused_calls) -> None:
    """A bfloat16 model: both paths read the same bfloat16 states and compute in float32, so they agree to 1e-5."""
    model = _build("llama-gqa3").to(torch.bfloat16)
    tp = make_prompt(seed=4, n_tokens=90)
    fused, rows = _both(model, tp, ProbeOptions())
    assert fused_calls
    assert_same(fused, rows, atol=ATOL)


def test_edited_layers_take_the_block_engine(models, fused_calls) -> None:
    """Under an intervention the layer it edits is probed from rows (its bias on the scores), the others fused; the
    result equals the block engine's throughout."""
    model = models["llama"]
    tp = make_prompt(seed=41, n_tokens=64)
    spec = Intervention(kind="steer", alpha=0.25, keys="extraneous", layers=(0,))
    options = ProbeOptions(kernel="fused")
    with apply_intervention(model, [tp], spec):
        fused = probe_tokenized(model, tp, options)
        n_fused = len(fused_calls)
        rows = probe_tokenized(model, tp, replace(options, kernel="rows"))
    assert n_fused == model.config.num_hidden_layers - 1
    assert_same(fused, rows, atol=ATOL)


def test_the_block_engine_is_the_default(models, fused_calls) -> None:
    tp = make_prompt(seed=2, n_tokens=50)
    probe_tokenized(models["llama"], tp, ProbeOptions())
    assert not fused_calls
    probe_tokenized(models["llama"], tp, ProbeOptions(kernel="fused"))
    assert len(fused_calls) == models["llama"].config.num_hidden_layers


@pytest.mark.parametrize("mask_kind", ["causal", "window", "bias"])
def test_column_sums_equal_direct_sums(mask_kind: str) -> None:
    """The swapped call's column sums equal Σ_{i∈[a,b)} softmax rows computed directly in float64."""
    g = torch.Generator().manual_seed(7)
    n_heads, n, dim, a, b = 3, 40, 8, 22, 31
    qs = torch.randn(n_heads, n, dim, generator=g) * 1.5
    kh = torch.randn(n_heads, n, dim, generator=g) * 1.5
    causal = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    mask: torch.Tensor | None = None
    scores_mask = torch.zeros(n, n, dtype=torch.float64).masked_fill(~causal, -torch.inf)
    if mask_kind == "window":
        allowed = causal & (torch.arange(n)[:, None] - torch.arange(n)[None, :] < 6)
        mask = allowed
        scores_mask = torch.zeros(n, n, dtype=torch.float64).masked_fill(~allowed, -torch.inf)
    elif mask_kind == "bias":
        bias = -0.3 * (torch.arange(n)[:, None] - torch.arange(n)[None, :]).float()  # ALiBi-like
        mask = bias.masked_fill(~causal, torch.finfo(torch.float32).min)
        scores_mask = bias.double().masked_fill(~causal, -torch.inf)
    s = qs.double() @ kh.double().transpose(1, 2) + scores_mask
    probs = torch.softmax(s, dim=-1)
    lse = torch.logsumexp(s, dim=-1).float()
    for n_keys in (b, a - 3):
        got = _column_sums(qs, kh, lse, mask, a, b, n_keys)
        want = probs[:, a:b, :n_keys].sum(dim=1)
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=1e-5)
    if mask_kind == "window":  # keys no row of [a, b) reads sum to 0, not exp(0)
        assert float(_column_sums(qs, kh, lse, mask, a, b, b)[:, : a - 6].abs().max()) == 0.0
