"""Batched probing and probing during generation, against eager ``output_attentions`` one prompt at a time.

The tiny random-weight models and prompt layouts are those of ``test_attention``: sliding windows of 16 tokens,
Gemma 2's soft-capping, grouped-query heads. Batches hold prompts of different lengths, so every row but the
longest is left-padded.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probe.attention import left_pad, probe_batch, probe_generation, probe_tokenized, reference_segment_attention
from probe.attention.masks import BlockMask, block_mask, causal_block_mask
from probe.attention.plan import build_plan
from probe.attention.segments import PlanTensors
from probe.probe_options import ProbeOptions
from probe.errors import ConfigError
from tests.attention.test_attention import ARCHS, _build, assert_same, make_prompt

pytestmark = pytest.mark.integration

LENGTHS = (72, 50, 61)


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {name: _build(name) for name in ARCHS}


def batch_prompts(seed: int) -> list:
    layouts = ("saturation", "residue", "filler")
    return [make_prompt(seed=seed + i, layout=layouts[i], n_tokens=n) for i, n in enumerate(LENGTHS)]


@pytest.mark.parametrize("arch", ARCHS)
def test_batch_equals_eager_one_prompt_at_a_time(models, arch: str) -> None:
    model = models[arch]
    prompts = batch_prompts(seed=len(arch))
    for options in (ProbeOptions(block_size=16), ProbeOptions(residue_mode="mass", block_size=5, gamma=0.7)):
        got = probe_batch(model, prompts, options)
        assert len(got) == len(prompts)
        for tp, res in zip(prompts, got):
            assert_same(res, reference_segment_attention(model, tp, options))
            assert_same(res, probe_tokenized(model, tp, options), atol=1e-5)


@pytest.mark.parametrize("arch", ["llama-gqa3", "mistral", "gemma2", "gpt2"])
def test_batch_with_generated_answers(models, arch: str) -> None:
    model = models[arch]
    prompts = batch_prompts(seed=40)
    answers = [[5, 17, 99], [3, 42, 8, 8, 1, 7, 2], [11]]  # rows end at different lengths: more padding
    options = ProbeOptions(query="generated", block_size=4)
    got = probe_batch(model, prompts, options, answers)
    for tp, ans, res in zip(prompts, answers, got):
        assert res.n_queries == len(ans)
        assert_same(res, reference_segment_attention(model, tp, options, generated_ids=ans))


def _generate(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, n_new: int) -> torch.Tensor:
    with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_new, do_sample=False,
                              temperature=None, top_p=None, top_k=None, pad_token_id=0)


@pytest.mark.parametrize("arch", ["llama", "llama-gqa3", "mistral", "qwen2", "gemma2", "gemma3", "gpt2"])
@pytest.mark.parametrize("query", ["question", "segment:3"])
def test_probe_rides_on_generation(models, arch: str, query: str) -> None:
    """The prefill of generate gives each row the one-prompt probe; decode steps are ignored; tokens unchanged."""
    model = models[arch]
    prompts = batch_prompts(seed=60 + len(arch))
    ids, mask, pads = left_pad([tp.input_ids for tp in prompts])
    assert pads == [0, 22, 11]
    options = ProbeOptions(query=query, block_size=16)
    # Gemma 2's soft-capping: the probe computes the exact (eager) output, which SDPA cannot; compare with eager.
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager" if arch == "gemma2" else "sdpa")
    try:
        plain = _generate(model, ids, mask, n_new=6)
        with probe_generation(model, prompts, pads, options) as capture:
            probed = _generate(model, ids, mask, n_new=6)
        results = capture.results()
    finally:
        model.set_attn_implementation(previous)
    assert torch.equal(plain, probed)
    assert all(n == 1 for n in capture.calls.values()) and len(capture.calls) == model.config.num_hidden_layers
    for tp, res in zip(prompts, results):
        assert_same(res, probe_tokenized(model, tp, options), atol=1e-5)
        assert_same(res, reference_segment_attention(model, tp, options))


def test_generation_probe_refuses_the_generated_query(models) -> None:
    prompts = batch_prompts(seed=1)
    with pytest.raises(ConfigError, match="generated"):
        with probe_generation(models["llama"], prompts, [0, 22, 11], ProbeOptions(query="generated")):
            pass


# ---------------------------------------------------------------------------------------------------------------
# Block masks on synthetic masks


def _blocks(n: int, block_size: int, positions: np.ndarray | None = None) -> PlanTensors:
    """Row blocks over ``positions`` (all tokens by default) of an n-token prompt."""
    from probe.types import Span, TokenizedPrompt

    tp = TokenizedPrompt(input_ids=tuple(range(n)), spans=(Span("sink", 0, 1), Span("segment", 1, n)))
    plan = build_plan(tp, ProbeOptions(query="segment:1", block_size=block_size, residue=False))
    if positions is not None:
        object.__setattr__(plan, "row_positions", positions)
    return PlanTensors(plan, torch.device("cpu"))


def _masked_rows(bm: BlockMask, scores: torch.Tensor) -> torch.Tensor:
    """(H, B, n) scores with the block mask applied on keys [lo, hi) and -inf elsewhere."""
    out = torch.full_like(scores, float("-inf"))
    part = scores[:, :, bm.lo : bm.hi].clone()
    bm.apply(part)
    out[:, :, bm.lo : bm.hi] = part
    return out


@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("gaps", [False, True])
def test_block_masks_hide_exactly_what_the_mask_hides(window: int | None, gaps: bool) -> None:
    n = 60
    rng = np.random.default_rng(window or 0)
    q = np.arange(n)[:, None]
    k = np.arange(n)[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= q - k < window
    positions = np.sort(rng.choice(n, size=35, replace=False)) if gaps else None
    tensors = _blocks(n, block_size=8, positions=positions)
    mask = torch.as_tensor(allowed)
    additive = torch.where(mask, 0.0, torch.finfo(torch.float32).min)
    biased = additive + torch.as_tensor(rng.normal(size=(n, n)), dtype=torch.float32) * mask
    scores = torch.as_tensor(rng.normal(size=(2, n, n)), dtype=torch.float32)
    for block in tensors.blocks:
        pos = block.positions
        want = torch.where(mask[pos], scores[:, pos], float("-inf"))
        for source in (mask, additive):
            bm = block_mask(source, block)
            assert bm.additive is None
            assert bm.hi == block.last + 1 and bm.lo == int(np.flatnonzero(allowed[pos.numpy()].any(0))[0])
            torch.testing.assert_close(_masked_rows(bm, scores[:, pos]), want)
        if window is None:
            torch.testing.assert_close(_masked_rows(causal_block_mask(block), scores[:, pos]), want)
        bm = block_mask(biased, block)  # a float mask with a bias: its rows are added as they are
        assert bm.additive is not None
        torch.testing.assert_close(_masked_rows(bm, scores[:, pos]).softmax(-1),
                                   (scores[:, pos] + biased[pos]).softmax(-1))


def test_block_mask_of_a_scattered_mask() -> None:
    """A mask whose visible keys are not one interval per row (e.g. packed documents) is applied key by key."""
    n = 30
    rng = np.random.default_rng(3)
    allowed = np.tril(rng.random((n, n)) < 0.6)
    np.fill_diagonal(allowed, True)
    tensors = _blocks(n, block_size=6)
    scores = torch.as_tensor(rng.normal(size=(3, n, n)), dtype=torch.float32)
    mask = torch.as_tensor(allowed)
    for block in tensors.blocks:
        bm = block_mask(mask, block)
        pos = block.positions
        torch.testing.assert_close(_masked_rows(bm, scores[:, pos]), torch.where(mask[pos], scores[:, pos],
                                                                                 float("-inf")))
    assert any(block_mask(mask, b).blocked is not None for b in tensors.blocks)
