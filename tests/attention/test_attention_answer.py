"""Answer capture (the attention while the answer is written) against a post-hoc eager forward over prompt + answer.

On tiny random-weight models of every supported architecture (tests/attention/test_attention.py), left-padded batches generate
under the engine's attention with ``answer`` on; each row's per-token masses, value-weighted masses and top keys
must equal :func:`reference_answer_attention` (eager ``output_attentions`` rows of the answer positions, value
states and output projection read from the model, float64 numpy) to ATOL (5e-5; why that tolerance: below).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probe.attention import left_pad
from probe.attention.answer import AnswerAttention
from probe.attention.call import LayerCall
from probe.attention.decode import reference_answer_attention
from probe.attention.engine import probe_forced, probe_generation
from probe.attention.intervention import apply_intervention
from probe.interventions import Intervention
from probe.attention.result import SegmentAttention
from probe.probe_options import ProbeOptions
from probe.errors import ConfigError
from tests.attention.test_attention import ARCHS, _build, make_prompt
from tests.attention.test_attention_smollm2 import (  # noqa: F401 (smollm2: a fixture)
    CLOSE,
    GERMANE,
    INSTRUCTION,
    OPEN,
    QUESTION,
    assemble,
    saturation,
    smollm2,
)

pytestmark = pytest.mark.integration

# Two float32 computations of one softmax row (the capture against eager attention, a batch against one prompt at a
# time, decode steps folded 16 at a time against one at a time) sum the same products in other orders, and which
# order a kernel takes depends on the CPU and the thread count. The scores of these random tiny models are large
# (|s| up to ~30), so a score's rounding alone moves a mass p by p(1 - p)·Δs: 1.2e-5 to 1.6e-5 seen between such
# paths on two machines. ATOL = 5e-5 lets that through and still catches what the tests guard: a wrong or missing
# mask, a fold that lets a step see its future, a row of another position move masses by 1e-2 and more.
ATOL = 5e-5
N_NEW = 6


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {a: _build(a).eval() for a in ARCHS}


def _prompts() -> list:
    return [make_prompt(seed=11, n_tokens=40), make_prompt(seed=12, layout="residue", n_tokens=54)]


def _capture(model: torch.nn.Module, prompts: list, sample: bool = False, n_new: int = N_NEW,
             ids: torch.Tensor | None = None, mask: torch.Tensor | None = None, inference: bool = False
             ) -> tuple[list[list[int]], list[AnswerAttention], list[SegmentAttention]]:
    """Generate the batch with the answer capture on; each row's answer (every new token), capture and prefill probe."""
    if ids is None:
        ids, mask, pads = left_pad([tp.input_ids for tp in prompts])
    else:
        pads = [int((mask[i] == 0).sum()) for i in range(len(prompts))]
    kwargs = dict(do_sample=True, temperature=1.5) if sample else dict(do_sample=False)
    grad_mode = torch.inference_mode() if inference else torch.no_grad()  # the runner generates in inference mode
    with grad_mode, probe_generation(model, prompts, pads, ProbeOptions(answer=True)) as cap:
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_new, pad_token_id=0, **kwargs)
    probes = cap.results()
    answers = [out[i, ids.shape[1]:].tolist() for i in range(len(prompts))]
    assert cap.answer is not None
    return answers, cap.answer.results(answers, [tp.input_ids for tp in prompts]), probes


def _assert_equal_reference(model: torch.nn.Module, tp, answer: list[int], got: AnswerAttention,
                            atol: float = ATOL) -> None:
    ref = reference_answer_attention(model, tp, answer)
    assert got.mass.shape == ref.mass.shape
    np.testing.assert_allclose(got.mass, ref.mass, atol=atol, rtol=0)
    assert got.vmass is not None and ref.vmass is not None
    np.testing.assert_allclose(got.vmass, ref.vmass, atol=atol, rtol=0)
    np.testing.assert_allclose(got.mass.sum(-1), 1.0, atol=1e-5)
    assert (got.top_key == ref.top_key).mean() > 0.99  # a near-tie may fall either way
    np.testing.assert_array_equal(got.tokens, answer)
    np.testing.assert_array_equal(got.prompt_ids, tp.input_ids)


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_capture_equals_eager_reference(models, arch: str) -> None:
    prompts = _prompts()
    answers, got, _ = _capture(models[arch], prompts)
    for tp, a, g in zip(prompts, answers, got):
        assert len(a) == N_NEW
        _assert_equal_reference(models[arch], tp, a, g)
        # the answer column is used (the query sees the tokens written so far) and row 0 sees no answer token
        assert (g.mass[0, ..., -1] == 0).all() and (g.mass[1:, ..., -1] > 0).all()
        # attention is not uniform: the top key differs between heads or tokens
        assert len(np.unique(g.top_key)) > 1


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma2", "gpt2"])
def test_batch_equals_one_prompt_at_a_time(models, arch: str) -> None:
    prompts = _prompts()
    answers, batched, _ = _capture(models[arch], prompts)
    for i, tp in enumerate(prompts):
        alone_answers, alone, _ = _capture(models[arch], [tp])
        assert alone_answers[0] == answers[i]
        np.testing.assert_allclose(batched[i].mass, alone[0].mass, atol=ATOL, rtol=0)
        np.testing.assert_allclose(batched[i].vmass, alone[0].vmass, atol=ATOL, rtol=0)  # type: ignore[arg-type]
        assert (batched[i].top_key == alone[0].top_key).mean() > 0.99  # a near-tie may fall either way


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_sampled_generation(models, arch: str) -> None:
    prompts = _prompts()
    torch.manual_seed(5)
    answers, got, _ = _capture(models[arch], prompts, sample=True)
    torch.manual_seed(5)
    again, _, _ = _capture(models[arch], prompts, sample=True)
    assert again == answers  # seeded: the same samples
    for tp, a, g in zip(prompts, answers, got):
        _assert_equal_reference(models[arch], tp, a, g)


def test_prefill_probe_unchanged_by_answer_capture(models) -> None:
    prompts = _prompts()
    model = models["qwen2"]
    _, _, with_answer = _capture(model, prompts)
    ids, mask, pads = left_pad([tp.input_ids for tp in prompts])
    with torch.no_grad(), probe_generation(model, prompts, pads, ProbeOptions()) as cap:
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=N_NEW, do_sample=False, pad_token_id=0)
    assert cap.answer is None
    for a, b in zip(with_answer, cap.results()):
        assert max(a.max_differences(b).values()) == 0.0


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_capture_measures_the_edited_attention(models, arch: str) -> None:
    """Knocking out the extraneous keys in layer 1: the answer rows of layer 1 put no mass on extraneous segments
    (without the edit they do), layer 0 of the prefill is as without the edit, and the rows still sum to 1."""
    model = models[arch]
    prompts = _prompts()
    _, plain, _ = _capture(model, prompts)
    spec = Intervention(kind="knockout", keys="extraneous", layers=(1,))
    with apply_intervention(model, prompts, spec) as batch:
        _, got, _ = _capture(model, prompts, ids=batch.input_ids, mask=batch.attention_mask)
    for p, g in zip(plain, got):
        ext = [s for s, k in enumerate(g.segment_kinds) if k == "extraneous"]
        assert ext
        assert p.mass[:, 1][..., ext].sum(-1).max() > 1e-2
        assert g.mass[:, 1][..., ext].max() == 0.0
        assert g.vmass is not None and g.vmass[:, 1][..., ext].max() == 0.0
        # layer 0 of row 0 (the prefill's last position) runs before any edited layer: as without the edit
        np.testing.assert_allclose(g.mass[0, 0], p.mass[0, 0], atol=1e-6, rtol=0)
        np.testing.assert_allclose(g.mass.sum(-1), 1.0, atol=1e-5)


def test_record_round_trip_and_older_records(models, tmp_path) -> None:
    prompts = _prompts()
    _, got, probes = _capture(models["llama"], prompts)
    probes[0].answer = got[0]
    path = probes[0].save(tmp_path / "p.npz")
    back = SegmentAttention.load(path)
    assert back.answer is not None
    for name in ("tokens", "mass", "vmass", "top_key", "prompt_ids"):
        np.testing.assert_array_equal(getattr(back.answer, name), getattr(got[0], name))
    assert back.answer.segment_spans == got[0].segment_spans
    # float members are stored (float32 weights do not compress, and deflating them cost a tenth of a probed run),
    # the integer members and the header deflated; np.load reads both
    import zipfile
    with zipfile.ZipFile(path) as z:
        kinds = {i.filename: i.compress_type for i in z.infolist()}
    assert kinds["answer_mass.npy"] == kinds["answer_vmass.npy"] == kinds["p_ext.npy"] == zipfile.ZIP_STORED
    assert kinds["answer_top_key.npy"] == kinds["answer_tokens.npy"] == kinds["meta.npy"] == zipfile.ZIP_DEFLATED
    probes[1].save(tmp_path / "q.npz")
    assert SegmentAttention.load(tmp_path / "q.npz").answer is None
    # a format-2 record (before the answer capture) reads with answer = None
    import json
    with np.load(tmp_path / "q.npz") as z:
        members = {k: z[k] for k in z.files}
    meta = json.loads(str(members["meta"]))
    del meta["answer"]
    meta["format"] = 2
    members["meta"] = np.array(json.dumps(meta))
    np.savez(tmp_path / "old.npz", **members)
    old = SegmentAttention.load(tmp_path / "old.npz")
    assert old.answer is None and max(old.max_differences(probes[1]).values()) == 0.0


def test_answer_with_generated_query_is_refused() -> None:
    with pytest.raises(ConfigError, match="answer = true with probe.query = 'generated'"):
        ProbeOptions(query="generated", answer=True)


def test_run_stores_the_answer_attention_of_every_trial(tmp_path, tiny_card) -> None:
    """``[probe] answer = true``: each trial's attention record holds the capture of exactly its answer (its
    completion tokens), laid out on the record's prompt segments, and equals the eager reference."""
    from probe.backends import make_backend
    from probe.loading import get_card
    from probe.runner import run_experiment
    from probe.runner.prompts import build_run_prompts
    from probe.backends.local import LocalBackend
    from probe.config import config_from_dict
    from probe.records import load_trials
    from probe.runfolder import RunFolder

    cfg = config_from_dict({
        "experiment": {"name": "answer", "seed": 3, "models": [str(tiny_card)], "output_dir": str(tmp_path)},
        "tasks": [{"source": "synthetic", "n": 1, "hops": 2}],
        "ice": {"conditions": ["Control", "Saturation"], "loads": [50], "replications": 1},
        "generation": {"max_new_tokens": 3, "batch_size": 2},
        "probe": {"enabled": True, "answer": True},
        "analysis": {"embedder": ""},
    })
    run = RunFolder(run_experiment(cfg, progress=False))
    backend = make_backend(get_card(str(tiny_card)))
    assert isinstance(backend, LocalBackend)
    prompts = {p.prompt_id: p for group in build_run_prompts(cfg, progress=False).values() for p in group}
    trials = load_trials(run.trials)
    assert len(trials) == 2
    for t in trials:
        record = SegmentAttention.load(run.attention_record(t.model, t.prompt_id))
        a = record.answer
        assert a is not None and len(a.tokens) == t.completion_tokens == 3
        assert a.segment_spans == record.segment_spans and a.mass.shape == (3, 2, 4, len(record.segment_spans) + 1)
        tp = backend.tokenize(prompts[t.prompt_id])
        _assert_equal_reference(backend.loaded.model, tp, a.tokens.tolist(), a)


def test_embedded_smollm2_capture_equals_eager_reference(smollm2) -> None:
    """The real default model (float32): a Saturation-like prompt and a shorter Control-like one, one left-padded
    batch."""
    model, tok = smollm2
    control = assemble(tok, [("sink", OPEN), ("instruction", INSTRUCTION), *[("germane", g) for g in GERMANE],
                             ("question", QUESTION), ("sink", CLOSE)])
    prompts = [saturation(tok), control]
    assert len(prompts[0].input_ids) > len(prompts[1].input_ids)
    answers, got, _ = _capture(model, prompts, n_new=8)
    for tp, a, g in zip(prompts, answers, got):
        _assert_equal_reference(model, tp, a, g)


@pytest.mark.parametrize("arch", ["llama-gqa3", "qwen2", "gemma3"])
def test_steps_folded_together_equal_each_step_folded_at_once(models, arch: str, monkeypatch) -> None:
    """A layer's decode steps wait and are folded several at a time (one product over the key cache); 23 new tokens
    cross several flushes of 4 and one of 16: the rows equal those folded one step at a time, and the reference. (The
    flushes of 4 run in inference mode, as the runner's generation does, and the last one after it.)"""
    import probe.attention.decode as decode

    prompts = _prompts()
    got = {}
    for steps in (1, 4, 16):
        monkeypatch.setattr(decode, "STEPS_PER_FLUSH", steps)
        answers, got[steps], _ = _capture(models[arch], prompts, n_new=23, inference=steps == 4)
    for steps in (4, 16):
        for a, b in zip(got[1], got[steps]):
            np.testing.assert_allclose(b.mass, a.mass, atol=ATOL, rtol=0)
            np.testing.assert_allclose(b.vmass, a.vmass, atol=ATOL, rtol=0)  # type: ignore[arg-type]
            assert (a.top_key == b.top_key).mean() > 0.99
    for tp, a, g in zip(prompts, answers, got[16]):
        assert len(a) > 16  # past the first flush of 16 (an end token may stop the batch before 23)
        _assert_equal_reference(models[arch], tp, a, g)


def test_sliding_window_reached_while_steps_wait(models) -> None:
    """A sliding-window layer folds its waiting steps before its cache starts dropping keys: Mistral with a window of
    44 keys, prompts of 30 and 36 tokens, 20 new tokens (the window is reached at the 8th): equal to the reference."""
    model = models["mistral"]
    prompts = [make_prompt(seed=21, n_tokens=30), make_prompt(seed=22, layout="residue", n_tokens=36)]
    model.config.sliding_window = 44
    try:
        answers, got, _ = _capture(model, prompts, n_new=20)
        for tp, a, g in zip(prompts, answers, got):
            _assert_equal_reference(model, tp, a, g)
            assert g.mass[-1, ..., :-1].sum(-1).max() < 1  # the last rows see fewer prompt keys than the first
    finally:
        model.config.sliding_window = 16


def test_layers_with_different_masks_at_the_same_steps_keep_their_own() -> None:
    """The combined mask of a flush is built once and shared by the layers that fold the same steps with the same
    mask tensors; two layers folding the same steps under different masks (a key hidden from one of them) must each
    get its own: every row equals a direct softmax over the keys that layer let it see."""
    from probe.attention.decode import AnswerRows
    from probe.attention.plan import build_plan

    tp = make_prompt(seed=31, n_tokens=20)
    plan = build_plan(tp, ProbeOptions())
    w, n_heads, dim, n_new = len(tp.input_ids), 2, 8, 5
    gen = torch.Generator().manual_seed(0)
    rows = AnswerRows([plan], [0], w, steps_per_flush=8)  # every step waits: one flush of all, at results()
    keys = torch.randn(1, n_heads, w + n_new, dim, generator=gen)
    queries = torch.randn(1, n_heads, w + n_new, dim, generator=gen)
    hidden = {0: None, 1: 3}  # layer 1 hides key 3 from every row
    expected = {layer: [] for layer in hidden}
    for step in range(n_new):
        n_k = w + step
        for layer, hide in hidden.items():
            n_q = w if step == 0 else 1
            allowed = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
            if hide is not None:
                allowed[:, hide] = False
            q = queries[:, :, n_k - n_q:n_k]
            rows.report(LayerCall(layer, q, keys[:, :, :n_k], keys[:, :, :n_k], allowed[None, None], 1.0))
            scores = torch.einsum("hd,hkd->hk", q[0, :, -1], keys[0, :, :n_k]).masked_fill(~allowed[-1], float("-inf"))
            expected[layer].append(torch.softmax(scores, -1))  # (H, K)
    got = rows.results([[0] * n_new], [tp.input_ids])[0]
    for layer in hidden:
        for t, row in enumerate(expected[layer]):
            want = torch.stack([row[:, a:b].sum(-1) for a, b in plan.segment_spans], dim=-1)  # (H, segments)
            np.testing.assert_allclose(got.mass[t, layer, :, :-1], want.numpy(), atol=1e-6)
            np.testing.assert_array_equal(got.top_key[t, layer], row.argmax(-1).numpy())


def _assert_forced_equals_generated(model: torch.nn.Module, prompts: list, answers: list[list[int]],
                                    generated: list[AnswerAttention], probes: list[SegmentAttention]) -> None:
    """Stage two of a two-stage run (prompt + recorded answer, one teacher-forced pass) against the capture taken
    while the same answers were generated: every answer row, and the prompt's own measures, to ATOL."""
    forced = probe_forced(model, prompts, answers, ProbeOptions(answer=True))
    for a, f, g, p in zip(answers, forced, generated, probes):
        assert f.answer is not None
        n = len(a)
        np.testing.assert_array_equal(f.answer.tokens, a)
        np.testing.assert_allclose(f.answer.mass, g.mass[:n], atol=ATOL, rtol=0)
        np.testing.assert_allclose(f.answer.vmass, g.vmass[:n], atol=ATOL, rtol=0)  # type: ignore[index]
        if n:
            assert (f.answer.top_key == g.top_key[:n]).mean() > 0.99  # a near-tie may fall either way
        assert max(f.max_differences(p).values()) <= ATOL


@pytest.mark.parametrize("arch", ARCHS)
def test_teacher_forced_pass_equals_the_capture_while_generating(models, arch: str) -> None:
    """Answers of different lengths in one batch (one cut short, as a row that met its end token early; one empty):
    the forced pass's rows are the generation's rows of the same tokens."""
    prompts = [*_prompts(), make_prompt(seed=13, n_tokens=33)]
    answers, got, probes = _capture(models[arch], prompts)
    answers = [answers[0], answers[1][:3], []]
    _assert_forced_equals_generated(models[arch], prompts, answers, got, probes)


def test_teacher_forced_pass_past_a_sliding_window(models) -> None:
    """Mistral with a window of 44 keys and 20 answer tokens: the forced rows past the window see only its keys."""
    model = models["mistral"]
    prompts = [make_prompt(seed=21, n_tokens=30), make_prompt(seed=22, layout="residue", n_tokens=36)]
    model.config.sliding_window = 44
    try:
        answers, got, probes = _capture(model, prompts, n_new=20)
        _assert_forced_equals_generated(model, prompts, answers, got, probes)
    finally:
        model.config.sliding_window = 16


def test_teacher_forced_pass_refuses_what_it_cannot_probe(models) -> None:
    prompts = _prompts()
    with pytest.raises(ConfigError, match="generated"):
        probe_forced(models["llama"], prompts, [[1], [2]], ProbeOptions(query="generated"))
    with pytest.raises(ConfigError, match="2 prompts but 1 answers"):
        probe_forced(models["llama"], prompts, [[1]], ProbeOptions(answer=True))
