"""One attention per probed layer (docs/probes.md#one-attention-per-layer): where the probe forms most rows anyway
(AR_k), it forms all of them, gives each layer its output ``A·V`` from them, and the model's own kernel is not called.

Held here, on the tiny random-weight architectures of test_attention.py:
- the model's kernel is called on no probed layer of such a pass, and on every layer of a question-rows pass (the
  path is taken where it should be, and only there);
- the pass's hidden states equal the model's own SDPA forward to 2e-5 relative to their scale (float32: the two
  orders of summation differ by rounding only; a row off by one key, a head reading the wrong value head or a
  padding row leaking into a prompt moves them by 1e-2 or more on these models);
- the measures equal the eager float64 reference (test_attention's tolerance, 1e-4) with the path on, in a single
  prompt, a left-padded batch and a teacher-forced pass over prompt + answer (whose answer positions take the
  model's kernel on their own rows).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import probe.attention.implementation as implementation
from probe.attention import probe_batch, probe_forced, probe_tokenized, reference_segment_attention
from probe.attention.capture import Capture
from probe.attention.implementation import attach_probe
from probe.attention.plan import build_plan
from probe.probe_options import ProbeOptions
from tests.attention.test_attention import ARCHS, _build, assert_same, make_prompt

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {name: _build(name) for name in ARCHS}


@pytest.fixture
def kernel_calls(monkeypatch) -> list[int]:
    """The (batch rows, query positions) of every call of the model's own attention (SDPA, or the blocked attention
    where SDPA cannot)."""
    calls: list[tuple[int, int]] = []
    real = implementation._model_attention

    def counted(module, query, *args, **kwargs):
        calls.append((int(query.shape[0]), int(query.shape[2])))
        return real(module, query, *args, **kwargs)

    monkeypatch.setattr(implementation, "_model_attention", counted)
    return calls


def _hidden(model, tp, options: ProbeOptions | None) -> torch.Tensor:
    """The base model's last hidden state over ``tp``: plain SDPA (options None) or with the probe attached."""
    ids = torch.tensor([list(tp.input_ids)])
    with torch.no_grad():
        if options is None:
            return model.base_model(input_ids=ids, use_cache=False).last_hidden_state
        capture = Capture([build_plan(tp, options)], model.config.num_hidden_layers)
        with attach_probe(model, capture):
            out = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
        assert capture.one_attention
        return out


@pytest.mark.parametrize("arch", ARCHS)
def test_probed_layers_skip_the_models_kernel(models, kernel_calls, arch: str) -> None:
    model = models[arch]
    tp = make_prompt(seed=3, n_tokens=72)
    probe_tokenized(model, tp, ProbeOptions(block_size=16))
    assert kernel_calls == []
    probe_tokenized(model, tp, ProbeOptions(residue=False))  # question rows only: the model's kernel runs
    assert len(kernel_calls) == model.config.num_hidden_layers


@pytest.mark.parametrize("arch", ARCHS)
def test_hidden_states_equal_the_models_forward(models, arch: str) -> None:
    model = models[arch]
    tp = make_prompt(seed=5, n_tokens=80)
    plain = _hidden(model, tp, None)
    probed = _hidden(model, tp, ProbeOptions(block_size=8))
    scale = float(plain.abs().max())
    assert float((probed - plain).abs().max()) <= 2e-5 * scale


@pytest.mark.parametrize("arch", ["llama-gqa3", "mistral", "gemma2", "gemma3"])
def test_padded_batch_with_one_attention(models, kernel_calls, arch: str) -> None:
    model = models[arch]
    prompts = [make_prompt(seed=40 + i, n_tokens=n) for i, n in enumerate((52, 77, 63))]
    options = ProbeOptions(block_size=16)
    batched = probe_batch(model, prompts, options)
    assert kernel_calls == []
    for tp, got in zip(prompts, batched):
        assert_same(got, reference_segment_attention(model, tp, options))


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma2", "gpt2"])
@pytest.mark.parametrize("lengths", [(58, 70), (70,)], ids=["padded", "alone"])
def test_forced_pass_with_one_attention(models, kernel_calls, arch: str, lengths) -> None:
    """Stage two's teacher-forced pass: the prompts' rows from the probe, the answers' rows by the model's kernel
    (one call per layer over the answer positions only; alone, under a causal mask the caller builds); the measures
    and the answer capture equal the same pass with the model's kernel on every row."""
    model = models[arch]
    prompts = [make_prompt(seed=64 + 70 - n, n_tokens=n) for n in lengths]  # rows: 71 % of 58, 83 % of 70
    answers = [[5, 9, 11, 2], [7, 3]][: len(prompts)]
    options = ProbeOptions(answer=True, block_size=16)
    one = probe_forced(model, prompts, answers, options)
    n_answer, width = len(answers[0]), max(lengths) + len(answers[0])
    assert kernel_calls == [(len(prompts), n_answer)] * model.config.num_hidden_layers  # the answer positions alone
    kernel_calls.clear()
    two = probe_forced(model, prompts, answers, options, one_attention=False)  # the model's kernel on every row
    assert kernel_calls == [(len(prompts), width)] * model.config.num_hidden_layers
    for a, b, tp in zip(one, two, prompts):
        assert_same(a, b, atol=2e-5)
        assert_same(a, reference_segment_attention(model, tp, options))
        np.testing.assert_allclose(a.answer.mass, b.answer.mass, atol=2e-5, rtol=0)
        np.testing.assert_allclose(a.answer.vmass, b.answer.vmass, atol=2e-5, rtol=0)


@pytest.mark.parametrize("arch", ["llama-gqa3", "gemma2", "gemma3"])
def test_a_batch_of_rows_formed_and_rows_not(models, kernel_calls, arch: str) -> None:
    """A batch mixing prompts whose rows the probe forms (AR_k over extraneous segments) with prompts it does not (a
    Control layout: no extraneous segment, so only the question's rows): the model's kernel runs on the latter
    rows alone, and every prompt's measures equal the eager reference."""
    model = models[arch]
    prompts = [make_prompt(seed=40, n_tokens=52), make_prompt(seed=70, layout="control", n_tokens=66),
               make_prompt(seed=42, n_tokens=63)]
    options = ProbeOptions(block_size=16)
    shares = [len(build_plan(tp, options).row_positions) / len(tp.input_ids) for tp in prompts]
    assert shares[0] >= 0.5 and shares[1] < 0.5 and shares[2] >= 0.5, shares
    batched = probe_batch(model, prompts, options)
    assert kernel_calls == [(1, 66)] * model.config.num_hidden_layers
    for tp, got in zip(prompts, batched):
        assert_same(got, reference_segment_attention(model, tp, options))
