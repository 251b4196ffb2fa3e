"""The runner: records, resumption after an interruption, skipped prompts, run-folder safety."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from probe.loading import get_card
from probe.runner import run_experiment
from probe.runner.folder import prepare_run_dir
from probe.runner.prompts import build_run_prompts
from probe.runner.trials import make_record
from probe.backends.local import LocalBackend
from probe.config import config_from_dict
from probe.errors import ConfigError
from probe.records import load_trials, read_jsonl
from tests.fixtures.experiment import tiny_experiment
from tests.fixtures.interrupt import interrupt_run

pytestmark = pytest.mark.integration


def make_cfg(tmp_path: Path, card: Path, **gen):
    return config_from_dict({
        "experiment": {"name": "t", "seed": 3, "models": [str(card)], "output_dir": str(tmp_path)},
        "tasks": [{"source": "synthetic", "n": 2, "hops": 2}],
        "ice": {"loads": [50], "replications": 2},
        "generation": {"max_new_tokens": 4, "batch_size": 3, **gen},
        "analysis": {"embedder": ""},
    })


def expected_trials(cfg) -> int:
    # per task and replication: Control + (LongControl, Saturation, Residue) x loads
    return 2 * cfg.ice.replications * (1 + 3 * len(cfg.ice.loads))


def test_run_writes_one_record_per_prompt(tmp_path, tiny_card):
    cfg = make_cfg(tmp_path, tiny_card)
    run_dir = run_experiment(cfg, progress=False)
    trials = load_trials(run_dir / "trials.jsonl")
    prompts = list(read_jsonl(run_dir / "prompts.jsonl"))
    assert len(trials) == len(prompts) == expected_trials(cfg)
    assert {t.prompt_id for t in trials} == {p["prompt_id"] for p in prompts}
    t = trials[0]
    assert t.model == "tiny-llama" and t.trial_id == f"tiny-llama::{t.prompt_id}"
    # a random model never emits its end token in 4 steps: every scored trial is truncated
    assert all(t.truncated for t in trials)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["seed"] == 3 and "tiny-llama" in manifest["models"]
    assert manifest["packages"]["torch"]
    # Control replications share one text: they are generated once and carry the same output
    ctrl = sorted((t for t in trials if t.condition == "Control"), key=lambda t: t.prompt_id)
    assert ctrl[0].output == ctrl[1].output


def test_interrupted_run_resumes_without_duplicates_or_losses(tmp_path, tiny_card, monkeypatch):
    cfg = make_cfg(tmp_path, tiny_card)
    first = interrupt_run(cfg, monkeypatch, stop_at=4)
    path = cfg.run_dir / "trials.jsonl"
    assert 0 < len(first) < expected_trials(cfg)
    # a crash mid-write leaves half a line behind
    with path.open("a") as fh:
        fh.write('{"trial_id": "tiny-llama::half')
    run_experiment(cfg, progress=False)
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip().endswith("}")]
    ids = [x["trial_id"] for x in lines]
    assert len(ids) == len(set(ids)) == expected_trials(cfg)
    assert path.read_text().splitlines()[: len(first)] == first  # nothing recorded was rewritten
    # a finished run is not redone
    before = path.read_text()
    run_experiment(cfg, progress=False)
    assert path.read_text() == before


def test_prompt_longer_than_the_context_window_is_skipped_with_reason(tmp_path, tiny_card):
    card = tmp_path / "short.toml"
    card.write_text(tiny_card.read_text().replace("context_window = 4096", "context_window = 150")
                    .replace('name = "tiny-llama"', 'name = "tiny-short"'))
    cfg = make_cfg(tmp_path, card)
    run_dir = run_experiment(cfg, progress=False)
    trials = load_trials(run_dir / "trials.jsonl")
    skipped = [t for t in trials if t.skipped]
    assert skipped and all("context window of 150" in t.skip_reason and t.em is None for t in skipped)
    assert all(t.prompt_tokens + 4 > 150 for t in skipped)
    assert all(t.prompt_tokens + 4 <= 150 for t in trials if not t.skipped)


def test_a_run_folder_of_another_config_is_refused(tmp_path, tiny_card):
    cfg = make_cfg(tmp_path, tiny_card)
    prepare_run_dir(cfg)
    build_run_prompts(cfg, progress=False)
    other = replace(cfg, generation=replace(cfg.generation, max_new_tokens=9))
    with pytest.raises(ConfigError, match="different configuration") as err:
        prepare_run_dir(other)
    assert "generation.max_new_tokens: 4 -> 9" in str(err.value)  # the refusal names what differs
    prepare_run_dir(other, force=True)


def test_cogniload_trials_are_scored_by_progressive_exact_match():
    import numpy as np

    from probe.backends.base import Generation
    from probe.tasks.cogniload import generate_puzzle
    from probe.types import Prompt

    task = generate_puzzle(3, 20, 50, np.random.default_rng(0))
    prompt = Prompt("p", task.task_id, "cogniload", "CogniLoad", 50, 50.0, 0, "x", (), family="cogniload")
    # the generic scorer would take the last line; progressive matching finds the PoI's sentence
    poi, cat = task.meta["poi"], task.meta["category"]
    right = Generation(f"Working it out.\nIn the end the {cat} of {poi} is {task.gold}.\nThat was fun.", False, 10, 5)
    rec = make_record("m", prompt, task, right)
    assert rec.em == 1.0 and rec.hop_recall is None
    wrong = Generation("I do not know.", False, 10, 5)
    assert make_record("m", prompt, task, wrong).em == 0.0


AWKWARD_TASK_IDS = ["a/b c:d", "Zürich|東京 100%", "t" * 200]


def test_attention_records_of_any_task_id_land_where_the_run_folder_names_them(tmp_path, tiny_card):
    """Task ids with a slash, a colon, the id separator, '%', non-Latin text and 200 characters: each probed prompt's
    record lies exactly at ``RunFolder.attention_record(model, prompt_id)``, and nothing else is written there."""
    from probe.attention import SegmentAttention
    from probe.runfolder import RunFolder, parse_prompt_id

    path = tmp_path / "tasks.jsonl"
    lines = [{"task_id": tid, "question": f"Where does Brannoc {i} live?", "gold": "Velt",
              "hops": [{"fact": f"Brannoc {i} lives in Velt.", "answer": "Velt"}]}
             for i, tid in enumerate(AWKWARD_TASK_IDS)]
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in lines), encoding="utf-8")
    cfg = config_from_dict({
        "experiment": {"name": "awkward", "seed": 5, "models": [str(tiny_card)], "output_dir": str(tmp_path)},
        "tasks": [{"source": "jsonl", "path": str(path)}],
        "ice": {"conditions": ["Control", "Saturation"], "loads": [50], "replications": 1},
        "generation": {"max_new_tokens": 2},
        "probe": {"enabled": True},
        "analysis": {"embedder": ""},
    })
    run = RunFolder(run_experiment(cfg, progress=False))
    trials = load_trials(run.trials)
    assert sorted({t.task_id for t in trials}) == sorted(AWKWARD_TASK_IDS) and len(trials) == 2 * len(AWKWARD_TASK_IDS)
    expected = {run.attention_record(t.model, t.prompt_id) for t in trials}
    assert set(run.attention_root.rglob("*.npz")) == expected
    for t in trials:
        assert parse_prompt_id(t.prompt_id).task_id == t.task_id
        record = SegmentAttention.load(run.attention_record(t.model, t.prompt_id))
        assert record.n_layers == 2 and record.p_ext.shape == (2, 4)
    # a resumed run finds every record where it wrote it and probes nothing again
    before = {p: p.stat().st_mtime_ns for p in expected}
    run_experiment(replace(cfg, generation=replace(cfg.generation)), progress=False)
    assert {p: p.stat().st_mtime_ns for p in expected} == before


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("damaged", ["trials", "prompts"])
def test_a_damaged_record_line_stops_a_run_before_it_writes_anything(tmp_path, tiny_card, damaged):
    from probe.records import RecordError

    cfg = make_cfg(tmp_path, tiny_card)
    run = cfg.run_folder
    run_experiment(cfg, progress=False)
    trials = run.trials.read_text(encoding="utf-8").splitlines(keepends=True)
    run.trials.write_text("".join(trials[:-3]), encoding="utf-8")  # three trials still to run
    path = getattr(run, damaged)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[2] = lines[2][: len(lines[2]) // 2] + "\n"  # a line cut in the middle of the file
    path.write_text("".join(lines), encoding="utf-8")
    before = _snapshot(run.root)
    with pytest.raises(RecordError, match=rf"{path.name}:3: not valid JSON"):
        run_experiment(cfg, progress=False)
    assert _snapshot(run.root) == before


def test_a_sampled_generation_depends_on_the_experiment_seed_alone(tiny_card):
    import torch

    from probe.config import GenerationSection
    from probe.loading import load_model
    from probe.types import Prompt, Segment

    loaded = load_model(get_card(str(tiny_card)), device="cpu")
    text = "Brannoc lives in Velt.\n\nQuestion: Where does Brannoc live?"
    prompts = [Prompt(f"t{i}|Control|L0|r0", f"t{i}", "jsonl", "Control", 0, 0.0, 0, text,
                      (Segment("germane", 0, 22), Segment("question", 24, len(text)))) for i in range(3)]
    gen = GenerationSection(max_new_tokens=6, batch_size=3, temperature=1.0)

    def sample(seed: int, global_seed: int) -> dict[str, tuple[int, ...]]:
        torch.manual_seed(global_seed)  # whatever ran before in the process
        state = torch.random.get_rng_state()
        out = {p.prompt_id: g.output_ids for p, g in LocalBackend(loaded, seed=seed).generate(prompts, gen)}
        assert torch.equal(torch.random.get_rng_state(), state)  # the process's own generator is left alone
        return out

    first = sample(7, 0)
    assert sample(7, 123) == first
    assert sample(8, 0) != first


def test_two_tokenizers_name_themselves_in_prompt_ids_and_records(tmp_path, tiny_card):
    """Two local models build prompts each in its own tokenizer: every prompt id ends in ``|@<card>``, and each model's
    attention records (a card name with a slash included) lie at the run folder's paths for its own prompts."""
    from probe.runfolder import RunFolder, parse_prompt_id

    other = tmp_path / "other.toml"
    other.write_text(tiny_card.read_text().replace('name = "tiny-llama"', 'name = "org/tiny"'))
    cfg = config_from_dict({
        "experiment": {"name": "two", "seed": 3, "models": [str(tiny_card), str(other)], "output_dir": str(tmp_path)},
        "tasks": [{"source": "synthetic", "n": 1, "hops": 2}],
        "ice": {"conditions": ["Control", "Residue"], "loads": [50], "replications": 1},
        "generation": {"max_new_tokens": 2},
        "probe": {"enabled": True},
        "analysis": {"embedder": ""},
    })
    run = RunFolder(run_experiment(cfg, progress=False))
    trials = load_trials(run.trials)
    assert {t.model for t in trials} == {"tiny-llama", "org/tiny"} and len(trials) == 4
    for t in trials:
        assert parse_prompt_id(t.prompt_id).tokenizer == t.model
    assert set(run.attention_root.rglob("*.npz")) == {run.attention_record(t.model, t.prompt_id) for t in trials}
    assert sorted(p.name for p in run.attention_root.iterdir()) == ["org%2Ftiny", "tiny-llama"]


@pytest.mark.parametrize("query, residue", [("question", True), ("generated", True), ("question", False)])
def test_probed_run_records_equal_a_separate_probe_per_prompt(tmp_path, tiny_card, query, residue):
    """The probe computed during generation (or after it, in batches, for query 'generated') is the one-prompt probe;
    with ``[probe] residue = false`` the records hold no AR_k and say so."""
    import numpy as np

    from probe.attention import SegmentAttention, probe_tokenized
    from probe.loading import load_model
    from probe.records import load_prompts
    from probe.runfolder import RunFolder

    cfg = make_cfg(tmp_path, tiny_card)
    cfg = replace(cfg, probe=replace(cfg.probe, enabled=True, query=query, residue=residue))
    run = RunFolder(run_experiment(cfg, progress=False))
    trials = load_trials(run.trials)
    assert len(trials) == expected_trials(cfg)
    backend = LocalBackend(load_model(str(tiny_card)))
    prompts = load_prompts(run.prompts)
    answers = {p.prompt_id: g.output_ids for p, g in backend.generate(prompts, cfg.generation)}
    assert {t.prompt_id: t.output for t in trials} == {p.prompt_id: backend.loaded.tokenizer.decode(
        answers[p.prompt_id], skip_special_tokens=True) for p in prompts}  # generation unchanged by the probe
    for p in prompts:
        stored = SegmentAttention.load(run.attention_record("tiny-llama", p.prompt_id))
        tp = backend.tokenize(p)
        want = probe_tokenized(backend.loaded.model, tp, cfg.probe,
                            generated_ids=answers[p.prompt_id] if query == "generated" else None)
        assert stored.n_tokens == want.n_tokens
        assert stored.options["residue"] is residue and (stored.ar_k is None) is (not residue)
        for field in ("seg_mass", "seg_mass_segment", "p_ext", "chance", *(("ar_k",) if residue else ())):
            np.testing.assert_allclose(getattr(stored, field), getattr(want, field), atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("n_batches", [1, 2, 3, 6])
def test_run_bench_rotates_the_arms_over_every_batch(n_batches: int) -> None:
    from benchmarks.run import arm_order

    names = ["unprobed", "probed", "answer"]
    for b in range(n_batches):
        orders = [arm_order(names, r, b) for r in range(3)]
        assert all(sorted(o) == sorted(names) for o in orders)
        assert {o[0] for o in orders} == set(names)  # each arm leads this batch once over three rounds
    if n_batches > 1:
        assert arm_order(names, 0, 0) != arm_order(names, 0, 1)


def test_run_bench_times_probed_and_unprobed_arms(tmp_path, tiny_card, monkeypatch):
    import benchmarks.run as bench_run
    from benchmarks.run import format_run_bench, run_probe_cost_bench

    exp = tiny_experiment(tmp_path / "exp.toml", [tiny_card], experiment={"name": "b"},
                          tasks=[{"source": "synthetic", "n": 1, "hops": 2}], ice={"conditions": None},
                          generation={"max_new_tokens": 3, "batch_size": 2})
    calls: list[tuple[str, tuple[str, ...]]] = []
    real = bench_run.run_model

    def recording(cfg, backend, prompts, *args, **kwargs):
        calls.append((cfg.experiment.name, tuple(p.prompt_id for p in prompts)))
        return real(cfg, backend, prompts, *args, **kwargs)

    monkeypatch.setattr(bench_run, "run_model", recording)
    b = run_probe_cost_bench(str(exp), rounds=2, output_dir=str(tmp_path / "out"))
    assert b.n_trials == 4 and b.same_outputs and b.n_attention_files == 4 and b.n_batches == 2
    assert b.unprobed_s > 0 and b.ratio == pytest.approx(b.probed_s / b.unprobed_s)
    assert "probed / unprobed" in format_run_bench(b)
    # the third arm: probed with the answer capture, side by side in the same rounds
    assert b.answer_s is not None and b.answer_s > 0 and b.answer_ratio == pytest.approx(b.answer_s / b.unprobed_s)
    assert len(b.round_answer_ratios) == 2 and "answer capture / unprobed run" in format_run_bench(b)
    assert len(b.batch_ratios) == len(b.batch_answer_ratios) == 4  # 2 rounds x 2 batches
    assert "per batch, 4 paired: median" in format_run_bench(b)
    # interleaved batch by batch: each batch runs in all three arms before the next, the arms' order rotating
    assert len(calls) == 2 * 2 * 3
    batches = [calls[i][1] for i in range(0, len(calls), 3)]
    assert all(len(set(calls[i + j][1] for j in range(3))) == 1 for i in range(0, len(calls), 3))
    assert batches[0] != batches[1] and batches[:2] == batches[2:] and sum(len(x) for x in batches[:2]) == 4
    firsts = [calls[i][0] for i in range(0, len(calls), 3)]  # (round 0: batch 0, batch 1; round 1: batch 0, 1)
    assert firsts[0] != firsts[2] and firsts[1] != firsts[3]  # each batch's order changes from round to round
    assert firsts[0] != firsts[1]  # and from batch to batch
