"""A planted retrieval head: a tiny Llama whose weights make one head attend a fixed distance back (RoPE) and copy
that key's token to the output, so that greedy decoding recites the germane segment; the analysis must find that head
as the top retrieval head, and a random-weight model must show no head above chance.

The answer capture is built here from an eager forward (``output_attentions``) over prompt + answer, row t being
the query that produced token t (docs/probes.md#retrieval-heads)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import transformers

from probe.analysis.retrieval import retrieval_heads
from probe.attention.retrieval import trial_retrieval
from probe.attention.answer import AnswerAttention

VOCAB, HEAD_DIM, N_HEADS, N_LAYERS = 16, 16, 2, 2
HIDDEN = HEAD_DIM * N_HEADS
THETA = 0.1  # rotation per position of the lowest RoPE frequency pair (the one the planted head uses)
PLANT = (1, 1)
KINDS = ("sink", "germane", "extraneous", "question")
SPANS = ((0, 1), (1, 9), (9, 17), (17, 21))
N_PROMPT = 21
DISTANCE = N_PROMPT - 2  # row 0 (position N - 1) reads position 1, the first germane token
N_GEN = 8


def planted_model(sign: float) -> "transformers.LlamaForCausalLM":
    """Zero everywhere except: token embeddings one-hot plus a constant coordinate (equal norms, so RMSNorm keeps the
    constant), head PLANT's q/k on the slowest RoPE pair, phased to peak at DISTANCE, its values the token one-hot,
    its output written back into the token coordinates, and a tied read-out of those coordinates."""
    base = THETA ** (-HEAD_DIM / (HEAD_DIM - 2))  # inv_freq of the last pair = base^(-(d-2)/d) = THETA
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=8,
                                   num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS,
                                   num_key_value_heads=N_HEADS, head_dim=HEAD_DIM, rope_theta=base,
                                   max_position_embeddings=64, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in [model.model.norm] + [m for layer in model.model.layers
                                          for m in (layer.input_layernorm, layer.post_attention_layernorm)]:
            norm.weight.fill_(1.0)
        emb = model.model.embed_tokens.weight
        emb[:, 0] = 1.0
        emb[torch.arange(VOCAB), 1 + torch.arange(VOCAB) % (HIDDEN - 1)] = 1.0
        attn = model.model.layers[PLANT[0]].self_attn
        h0 = PLANT[1] * HEAD_DIM
        pair = (HEAD_DIM // 2 - 1, HEAD_DIM - 1)  # rotate_half pairs i with i + d/2: the last pair
        scale = 60.0 / (1 - math.cos(THETA)) * math.sqrt(HEAD_DIM)  # neighbours of the peak 60 logits lower
        phase = sign * DISTANCE * THETA
        c = 1.0 / math.sqrt(2.0 / HIDDEN)  # RMSNorm of a vector with two ones in HIDDEN dims: each becomes c
        r = math.sqrt(scale) / c
        attn.q_proj.weight[h0 + pair[0], 0] = r * math.cos(phase)
        attn.q_proj.weight[h0 + pair[1], 0] = r * math.sin(phase)
        attn.k_proj.weight[h0 + pair[0], 0] = r
        for v in range(VOCAB):  # value = token one-hot in the head's other dims (VOCAB <= HEAD_DIM)
            attn.v_proj.weight[h0 + v, 1 + v] = 1.0
            attn.o_proj.weight[1 + v, h0 + v] = 50.0
        model.lm_head.weight[torch.arange(VOCAB), 1 + torch.arange(VOCAB)] = 1.0
    return model


def capture(model: "transformers.PreTrainedModel", prompt: np.ndarray) -> AnswerAttention:
    """Greedy answer, then the eager attention of prompt + answer reduced to the capture's aggregates."""
    ids = torch.tensor(prompt[None], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=N_GEN, do_sample=False, pad_token_id=0, eos_token_id=None)
        answer = out[0, len(prompt):].numpy().astype(np.int64)
        att = model(out, output_attentions=True).attentions  # per layer (1, H, T, T)
    rows = np.arange(N_PROMPT - 1, N_PROMPT - 1 + len(answer))
    a = np.stack([x[0].float().numpy() for x in att])[:, :, rows, :]  # (L, H, T_gen, T)
    a = a.transpose(2, 0, 1, 3)  # (T_gen, L, H, keys)
    cols = [a[..., s:e].sum(-1) for s, e in SPANS] + [a[..., N_PROMPT:].sum(-1)]
    return AnswerAttention(tokens=answer, mass=np.stack(cols, -1).astype(np.float32), vmass=None,
                           top_key=a.argmax(-1).astype(np.int32), prompt_ids=prompt.astype(np.int64),
                           segment_kinds=KINDS, segment_labels=KINDS, segment_spans=SPANS)


def prompts(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        p = rng.integers(1, VOCAB, size=N_PROMPT)
        p[0] = 0
        p[1:9] = rng.permutation(np.arange(1, VOCAB))[:8]  # germane tokens distinct: each copy has one source
        out.append(p)
    return out


def study(model: "transformers.PreTrainedModel", n: int = 8, seed: int = 0) -> tuple[pd.DataFrame, list]:
    caps = [capture(model, p) for p in prompts(n, seed)]
    sub = pd.DataFrame({"task_id": [f"q{i}" for i in range(n)], "condition": "Control", "load": 0, "em": 1.0})
    return sub, caps


def working_plant() -> tuple["transformers.PreTrainedModel", AnswerAttention]:
    p = prompts(1, 99)[0]
    for sign in (1.0, -1.0):  # RoPE's rotation direction fixes the phase sign; take the one that peaks at DISTANCE
        model = planted_model(sign)
        cap = capture(model, p)
        if np.array_equal(cap.top_key[:, PLANT[0], PLANT[1]], 1 + np.arange(N_GEN)):
            return model, cap
    raise AssertionError("the planted head attends neither phase sign's DISTANCE back")


def test_planted_copy_head_is_the_top_retrieval_head():
    model, cap = working_plant()
    np.testing.assert_array_equal(cap.tokens, cap.prompt_ids[1:9])  # the model recites the germane segment
    sub, caps = study(model)
    res = retrieval_heads(sub, [trial_retrieval(c) for c in caps], "planted", k=3, n_boot=50)
    assert res.control is not None
    best = res.control.top[0]
    assert (best.layer, best.head) == PLANT and best.score == pytest.approx(1.0)
    others = np.delete(res.control.score.values.ravel(), PLANT[0] * N_HEADS + PLANT[1])
    assert np.all(others <= res.control.chance + 0.1)  # heads with no q/k attend uniformly: first key = argmax


def test_random_model_has_no_head_above_chance():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64,
                                   num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS,
                                   num_key_value_heads=N_HEADS, head_dim=HEAD_DIM, max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg).eval()
    sub, caps = study(model, n=16, seed=1)
    trials = [trial_retrieval(c) for c in caps]
    res = retrieval_heads(sub, trials, "random", k=3, n_boot=50)
    assert res.control is not None and res.control.chance is not None and res.control.n_copyable >= 30
    score = res.control.score.values
    se = math.sqrt(res.control.chance * (1 - res.control.chance) / res.control.n_copyable)
    assert np.all(score <= res.control.chance + 4 * se)


def test_planted_head_is_found_from_the_capture_made_during_generation():
    """End to end: the toolkit's answer capture (decode steps of ``generate``, no second forward) on the planted
    model, a left-padded batch of prompts of two lengths; the capture equals the eager one built here, and the
    analysis ranks the planted head first."""
    from probe.attention import left_pad
    from probe.attention.engine import probe_generation
    from probe.probe_options import ProbeOptions
    from probe.types import Span, TokenizedPrompt

    model, _ = working_plant()
    ps = prompts(4, 5)
    tps = [TokenizedPrompt(input_ids=tuple(int(x) for x in p),
                           spans=tuple(Span(k, a, b, label=k) for k, (a, b) in zip(KINDS, SPANS))) for p in ps]
    tps[1] = TokenizedPrompt(input_ids=(0,) + tps[1].input_ids,  # one token longer: the others are left-padded
                             spans=(Span("sink", 0, 2, label="sink"),
                                    *(Span(k, a + 1, b + 1, label=k) for k, (a, b) in zip(KINDS[1:], SPANS[1:]))))
    ids, mask, pads = left_pad([tp.input_ids for tp in tps])
    with torch.no_grad(), probe_generation(model, tps, pads, ProbeOptions(answer=True)) as cap:
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=N_GEN, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    answers = [out[i, ids.shape[1]:].tolist() for i in range(len(tps))]
    assert cap.answer is not None
    caps = cap.answer.results(answers, [tp.input_ids for tp in tps])
    for i in (0, 2, 3):
        eager = capture(model, ps[i])
        np.testing.assert_array_equal(caps[i].tokens, eager.tokens)
        np.testing.assert_allclose(caps[i].mass, eager.mass, atol=1e-4)
        np.testing.assert_array_equal(caps[i].top_key[:, PLANT[0], PLANT[1]], eager.top_key[:, PLANT[0], PLANT[1]])
    sub = pd.DataFrame({"task_id": [f"q{i}" for i in range(4)], "condition": "Control", "load": 0, "em": 1.0})
    res = retrieval_heads(sub, [trial_retrieval(c) for c in caps], "planted", k=3, n_boot=20)
    assert res.control is not None and (res.control.top[0].layer, res.control.top[0].head) == PLANT
    assert res.control.top[0].score == pytest.approx(1.0)
