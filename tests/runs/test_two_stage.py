"""A two-stage run through the whole runner: a served card that names a local card in ``probe_with``.

Stage one's engine is a stand-in (:class:`EngineStandIn`): it answers with the local tiny model's own greedy
generation and reports what a served engine reports (the answer's token ids with its end token, or none; the
prompt's token count), and cannot probe. Stage two then probes the recorded answers on the local card, one
teacher-forced pass each. The run's records must equal those of a run that probed the same local model while it
generated (prompt measures and the answer capture, to 1e-5), trial for trial; a stage-two failure must leave stage
one's records whole, and the same command must finish the probes without running or recording a trial twice.

The real server (transformers serve) is in ``tests/runs/test_served_run.py``; vLLM in ``tests/runs/test_vllm.py``.
"""

from __future__ import annotations

import json

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import probe.runner
from probe.attention import SegmentAttention
from probe.backends import check_card
from probe.backends.base import SERVED as SERVED_ENGINE
from probe.backends.local import LocalBackend
from probe.config import load_config
from probe.errors import ConfigError
from probe.loading import get_card
from probe.records import load_prompts, load_trials, read_jsonl
from probe.runfolder import RunFolder
from probe.types import Span, TokenizedPrompt
from probe.runner import run_experiment
from probe.runner.forced import ENGINE_IDS, RETOKENIZED, _Item, batch_order
from tests.fixtures.experiment import tiny_experiment

pytestmark = pytest.mark.integration

ATOL = 1e-5  # float32 sums of the same products in another order (a batch of one pass against decode steps)
SERVED = "tiny-served"


class EngineStandIn:
    """What the runner sees of a served engine, answering with the local model's greedy generation.

    ``ids``: return the answer's token ids (vLLM's ``return_token_ids``), the end token included; ``tokens``: what
    ``/tokenize`` answers for a prompt (None: the server has no such route); ``count_off``: added to the prompt
    token count it reports (a server whose chat template differs).
    """

    capabilities = SERVED_ENGINE
    revision = None

    def __init__(self, name: str, local: LocalBackend, ids: bool = True, tokens: Any = "local",
                 count_off: int = 0) -> None:
        self.model_name = name
        self.local = local
        self.ids = ids
        self.tokens = tokens
        self.count_off = count_off
        self.generated = 0

    def server_tokens(self, prompt: Any) -> list[int] | None:
        if self.tokens == "local":
            return list(self.local.tokenize(prompt).input_ids)
        return self.tokens

    def generate(self, prompts: list, gen: Any, probe: Any = None, intervention: Any = None) -> Iterator[tuple]:
        assert probe is None
        eos = min(self.local.eos_ids())
        for p, g in self.local.generate(prompts, gen):
            self.generated += 1
            ids = (*g.output_ids, *(() if g.truncated else (eos,))) if self.ids else None
            yield p, replace(g, output_ids=ids, attention=None, prompt_tokens=g.prompt_tokens + self.count_off)


def write_cards(folder: Path, tiny_card: Path, probe_with: str | None = None) -> Path:
    served = folder / f"{SERVED}.toml"
    served.write_text(f'name = "{SERVED}"\nsource = "api"\nbackend = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
                      f'served_model = "tiny"\nprobe_with = "{probe_with or tiny_card}"\n')
    return served


def experiment(folder: Path, model: Path | str, **probe_keys: Any) -> Any:
    return load_config(tiny_experiment(
        folder / "exp.toml", [model], experiment={"name": "two-stage", "seed": 7},
        ice={"replications": 2}, generation={"max_new_tokens": 6, "batch_size": 3},
        probe={"enabled": True, "answer": True, **probe_keys}))


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Replace the served backend the runner makes with an :class:`EngineStandIn` (settings in the returned dict)."""
    made: dict[str, Any] = {"settings": {}, "engines": []}
    real = probe.runner.make_backend

    def make(card: Any, device: Any = None, seed: int = 0) -> Any:
        if card.backend != "openai":
            return real(card, device=device, seed=seed)
        engine = EngineStandIn(card.name, real(get_card(card.probe_with), device="cpu", seed=seed),
                               **made["settings"])
        made["engines"].append(engine)
        return engine

    monkeypatch.setattr(probe.runner, "make_backend", make)
    return made


@pytest.fixture(scope="module")
def reference(tiny_card: Path, tmp_path_factory: pytest.TempPathFactory) -> RunFolder:
    """The local model probed while it generated (the in-generation path)."""
    return RunFolder(run_experiment(experiment(tmp_path_factory.mktemp("ref"), tiny_card), progress=False))


def trials_by_prompt(run: RunFolder, model: str) -> dict[str, Any]:
    return {t.prompt_id: t for t in load_trials(run.trials) if t.model == model}


def assert_probe_equal(got: SegmentAttention, want: SegmentAttention, answer: list[int]) -> None:
    assert max(got.max_differences(want).values()) <= ATOL
    assert got.answer is not None and want.answer is not None
    n = len(answer)
    np.testing.assert_array_equal(got.answer.tokens, answer)
    np.testing.assert_array_equal(want.answer.tokens[:n], answer)
    np.testing.assert_allclose(got.answer.mass, want.answer.mass[:n], atol=ATOL, rtol=0)
    np.testing.assert_allclose(got.answer.vmass, want.answer.vmass[:n], atol=ATOL, rtol=0)  # type: ignore[arg-type]
    np.testing.assert_array_equal(got.answer.chars, want.answer.chars[:n])  # type: ignore[index]
    if n:
        assert (got.answer.top_key == want.answer.top_key[:n]).mean() > 0.99  # a near-tie may fall either way


def assert_run_equals_reference(run: RunFolder, ref: RunFolder, origin: str) -> int:
    """Every trial recorded once with the reference's answer, and each probe equal to the reference's; returns the
    number of probe records compared."""
    counts = Counter(line["trial_id"] for line in read_jsonl(run.trials))
    assert counts and set(counts.values()) == {1}
    served, local = trials_by_prompt(run, SERVED), trials_by_prompt(ref, "tiny-llama")
    assert sorted(served) == sorted(local)
    for pid, t in served.items():
        assert (t.output, t.em, t.prompt_tokens) == (local[pid].output, local[pid].em, local[pid].prompt_tokens)
        got = SegmentAttention.load(run.attention_record(SERVED, pid))
        want = SegmentAttention.load(ref.attention_record("tiny-llama", pid))
        assert got.origin == origin and want.origin == "generation"
        ids = list(got.answer.tokens) if got.answer is not None else []
        assert_probe_equal(got, want, ids)
    return len(served)


def test_two_stage_records_equal_the_in_generation_probe(tmp_path, tiny_card, stand_in, reference):
    """Engine ids (end token included) -> stage two's records are the in-generation run's; replications of one
    greedy answer share one forward pass, and the answer's ids are recorded in the trial."""
    cfg = experiment(tmp_path, write_cards(tmp_path, tiny_card))
    calls: list[int] = []
    real = LocalBackend.probe_answers

    def counted(self, prompts, answers, texts, opts):
        calls.append(len(prompts))
        return real(self, prompts, answers, texts, opts)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LocalBackend, "probe_answers", counted)
        run = RunFolder(run_experiment(cfg, progress=False))
    n = assert_run_equals_reference(run, reference, ENGINE_IDS)
    distinct = {(p.text, t.output) for p in load_prompts(run.prompts)
                for t in [trials_by_prompt(run, SERVED)[p.prompt_id]]}
    assert sum(calls) == len(distinct) < n  # Control's two greedy replications: one pass
    t = next(iter(trials_by_prompt(run, SERVED).values()))
    assert t.output_ids is not None and len(t.output_ids) >= 1
    # the manifest says which local weights probed the served answers (the results page names them)
    entry = json.loads(run.manifest.read_text())["models"][SERVED]
    assert entry["backend"] == "openai" and entry["probe_with"]["source"] == "local"
    assert entry["probe_with"]["name"] == str(tiny_card)


def test_retokenised_answers_are_probed_when_they_round_trip(tmp_path, tiny_card, stand_in, reference, caplog):
    """No engine ids: the text is re-tokenised. A random tiny model writes token strings that need not decode back
    to themselves; those trials are named and left unprobed, the rest equal the reference."""
    stand_in["settings"].update(ids=False, tokens=None)
    run = RunFolder(run_experiment(experiment(tmp_path, write_cards(tmp_path, tiny_card)), progress=False))
    tok = stand_in["engines"][0].local.tokenizer
    served, local = trials_by_prompt(run, SERVED), trials_by_prompt(reference, "tiny-llama")
    probed = compared = 0
    for pid, t in served.items():
        assert t.output_ids is None
        path = run.attention_record(SERVED, pid)
        ids = tok.encode(t.output, add_special_tokens=False)
        if tok.decode(ids, skip_special_tokens=True) != t.output:
            assert not path.exists() and f"{SERVED}::{pid}: not probed" in caplog.text
            continue
        got, want = SegmentAttention.load(path), SegmentAttention.load(reference.attention_record("tiny-llama", pid))
        assert got.origin == RETOKENIZED and t.output == local[pid].output
        if list(want.answer.tokens[: len(ids)]) == ids:  # type: ignore[union-attr]
            assert_probe_equal(got, want, ids)
            compared += 1
        probed += 1
    print(f"{probed} of {len(served)} probed, {compared} compared")
    assert compared >= 1


def test_a_stage_two_failure_keeps_stage_one_and_the_same_command_finishes(tmp_path, tiny_card, stand_in,
                                                                           reference):
    cfg = experiment(tmp_path, write_cards(tmp_path, tiny_card))
    real = LocalBackend.probe_answers
    batches: list[int] = []

    def failing(self, prompts, answers, texts, opts):
        if batches:
            raise RuntimeError("out of memory (simulated)")
        batches.append(len(prompts))
        return real(self, prompts, answers, texts, opts)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LocalBackend, "probe_answers", failing)
        with pytest.raises(RuntimeError, match="simulated"):
            run_experiment(cfg, progress=False)
    run = cfg.run_folder
    first = trials_by_prompt(run, SERVED)
    assert len(first) == len(trials_by_prompt(reference, "tiny-llama"))  # stage one whole
    kept = {pid for pid in first if run.attention_record(SERVED, pid).exists()}
    assert 0 < len(kept) < len(first)
    cut = sorted(kept)[0]  # a record cut short (a crash in a copy): removed with a warning and probed again
    path = run.attention_record(SERVED, cut)
    path.write_bytes(path.read_bytes()[:200])
    kept.discard(cut)
    stamps = {pid: run.attention_record(SERVED, pid).stat().st_mtime_ns for pid in kept}

    run_experiment(cfg, progress=False)  # the same command
    assert stand_in["engines"][1].generated == 0  # stage one had nothing left to run
    assert {pid: run.attention_record(SERVED, pid).stat().st_mtime_ns for pid in kept} == stamps  # not redone
    assert_run_equals_reference(RunFolder(cfg.run_dir), reference, ENGINE_IDS)


def test_answer_ids_come_from_the_engine_or_a_round_trip(tiny_card):
    """Engine ids lose their end tokens and must decode to the recorded text; re-tokenised text must decode back to
    itself (a special token's string in the text does not: decoding drops it)."""
    from probe.loading import load_tokenizer
    from types import SimpleNamespace

    from probe.runner.forced import answer_ids

    tok = load_tokenizer(get_card(str(tiny_card)))
    eos = {tok.eos_token_id}
    text = "Paris is the capital."
    ids = tok.encode(text, add_special_tokens=False)

    def rec(output: str, output_ids: list[int] | None) -> Any:  # what answer_ids reads of a trial record
        return SimpleNamespace(output=output, output_ids=output_ids)

    assert answer_ids(rec(text, [*ids, tok.eos_token_id]), tok, eos) == (ids, ENGINE_IDS)
    assert answer_ids(rec(text, None), tok, eos) == (ids, RETOKENIZED)
    assert "do not decode to the recorded output" in answer_ids(rec(text, ids[:-1]), tok, eos)  # type: ignore[operator]
    assert "does not re-tokenise to itself" in answer_ids(rec(text + "<|im_end|>", None), tok, eos)  # type: ignore[operator]


def test_a_server_that_tokenizes_otherwise_is_refused_before_anything_is_recorded(tmp_path, tiny_card, stand_in):
    stand_in["settings"].update(tokens=[7, 7, 7])
    cfg = experiment(tmp_path, write_cards(tmp_path, tiny_card))
    with pytest.raises(ConfigError, match=r"probe_with: the server tokenizes prompt .*first difference at token 0"):
        run_experiment(cfg, progress=False)
    assert not cfg.run_folder.trials.exists() or not list(read_jsonl(cfg.run_folder.trials))


def test_a_prompt_counted_otherwise_is_not_probed_and_says_why(tmp_path, tiny_card, stand_in, caplog):
    """No ``/tokenize``: each trial's prompt token count is compared; a mismatch leaves its trial unprobed."""
    stand_in["settings"].update(tokens=None, count_off=1)
    run = RunFolder(run_experiment(experiment(tmp_path, write_cards(tmp_path, tiny_card)), progress=False))
    trials = trials_by_prompt(run, SERVED)
    assert trials and not any(run.attention_record(SERVED, pid).exists() for pid in trials)
    assert "the server counted" in caplog.text and "not probed" in caplog.text


def test_probe_with_is_refused_where_it_cannot_work(tmp_path, tiny_card):
    """On a card with local weights; naming a served card; with interventions (they edit attention in the model
    that generates): each refused before anything is written, saying what to do."""
    local = tmp_path / "local.toml"
    local.write_text(tiny_card.read_text().replace('name = "tiny-llama"', 'name = "local-with"')
                     + f'probe_with = "{tiny_card}"\n')
    with pytest.raises(ConfigError, match="this card has local weights and probes its own"):
        check_card(get_card(str(local)))
    served = write_cards(tmp_path, tiny_card)
    chained = tmp_path / "chained.toml"
    chained.write_text(served.read_text().replace(f'name = "{SERVED}"', 'name = "chained"')
                       .replace(str(tiny_card), str(served)))
    (tmp_path / "one").mkdir()
    cfg = experiment(tmp_path / "one", chained)
    with pytest.raises(ConfigError, match="is a served card; name a card with local weights"):
        run_experiment(cfg, progress=False)
    (tmp_path / "two").mkdir()
    cfg = load_config(tiny_experiment(
        tmp_path / "two" / "exp.toml", [served], probe={"enabled": True},
        interventions=[{"name": "ko", "kind": "knockout", "keys": "extraneous"}]))
    with pytest.raises(ConfigError, match=r"served; \[\[interventions\]\] run with local"):
        run_experiment(cfg, progress=False)
    assert not cfg.run_dir.exists()


def test_stage_two_batches_answers_of_like_length() -> None:
    """generate's layout fills every answer of a batch to the longest: ordering by answer band, then prompt length,
    leaves fewer filler tokens than ordering by prompt + answer, on 420 answers spread like the confirmatory
    study's (prompts of 120-500 tokens, answers of 16-256): 1.11x the tokens against 1.31x here."""
    rng = np.random.default_rng(0)
    items = [_Item(TokenizedPrompt(tuple(range(int(p))), (Span("question", 0, int(p)),)), [1] * int(a), ENGINE_IDS,
                   "", (), "") for p, a in zip(rng.integers(120, 500, 420), rng.integers(16, 256, 420))]

    def padded(order: list) -> int:  # each batch of 8: its size x (longest prompt + longest answer)
        return sum(len(g) * (max(len(i.tokenized.input_ids) for i in g) + max(len(i.answer) for i in g))
                   for g in (order[b : b + 8] for b in range(0, len(order), 8)))

    tokens = sum(len(i.tokenized.input_ids) + len(i.answer) for i in items)
    by_total = padded(sorted(items, key=lambda i: len(i.tokenized.input_ids) + len(i.answer)))
    ours = padded(sorted(items, key=batch_order))
    print(f"padded tokens / tokens: by prompt + answer {by_total / tokens:.3f}, stage two's order {ours / tokens:.3f}")
    assert ours < 0.9 * by_total and ours < 1.2 * tokens
