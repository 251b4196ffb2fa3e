"""The analysis reads the run folder and nothing else: a FanOutQA run with answer capture is analysed with the
dataset package, every tokenizer and the sentence embedder made unavailable, and each record file is read once."""

from __future__ import annotations

import collections
import importlib.util
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.experiment import tiny_experiment


@pytest.mark.integration
def test_a_fanoutqa_run_is_analysed_from_its_folder_alone(tmp_path, tiny_card, monkeypatch):
    import transformers

    import probe.loading
    import probe.prompts.similarity
    import probe.records
    from probe.analysis import analyze_run
    from probe.attention.result import SegmentAttention
    from probe.config import load_config
    from probe.records import load_task_records, load_trials
    from probe.runfolder import RunFolder
    from probe.runner import run_experiment
    from tests.conftest import setup_package

    setup_package("fanoutqa")  # the run itself needs the dataset (a package of `make setup`)
    exp = tiny_experiment(tmp_path / "exp.toml", [tiny_card], tasks=[{"source": "fanoutqa", "n": 3}],
                          ice={"conditions": ["Control", "Saturation"], "loads": [50]},
                          generation={"max_new_tokens": 6}, probe={"enabled": True, "answer": True})
    run = RunFolder(run_experiment(load_config(exp), progress=False))
    tasks = load_task_records(run.tasks)
    assert len(tasks) == 3 and all(t.source == "fanoutqa" and t.hops for t in tasks)  # recorded when run
    trials = load_trials(run.trials)
    records = sorted(run.attention_root.rglob("*.npz"))
    assert len(records) == len(trials) == 6

    # what the analysis must not need: the task source, a tokenizer, the embedder
    real_find_spec = importlib.util.find_spec
    monkeypatch.setitem(sys.modules, "fanoutqa", None)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "fanoutqa" else real_find_spec(name, *a))

    def refuse(what: str):
        def call(*args, **kwargs):
            raise AssertionError(f"the analysis loaded {what}")
        return call

    monkeypatch.setattr(probe.loading, "load_tokenizer", refuse("a tokenizer"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse("a tokenizer"))
    monkeypatch.setattr(probe.prompts.similarity, "get_embedder", refuse("the embedder"))

    # every read of a record file, of a JSONL file and of a TOML text, counted by file
    reads: collections.Counter[str] = collections.Counter()
    real_load, real_iter, real_toml = SegmentAttention.load, probe.records.iter_jsonl, tomllib.loads

    def load(path):
        reads[Path(path).name] += 1
        return real_load(path)

    def iter_jsonl(path):
        reads[Path(path).name] += 1
        return real_iter(path)

    def loads(text, *args, **kwargs):
        reads["toml"] += 1
        return real_toml(text, *args, **kwargs)

    monkeypatch.setattr(SegmentAttention, "load", staticmethod(load))
    monkeypatch.setattr(probe.records, "iter_jsonl", iter_jsonl)
    monkeypatch.setattr(tomllib, "loads", loads)
    analysis = analyze_run(run)

    assert all(reads[p.name] == 1 for p in records), {p.name: reads[p.name] for p in records}
    assert reads["trials.jsonl"] == reads["prompts.jsonl"] == reads["tasks.jsonl"] == 1
    assert reads["toml"] == 1  # config.toml parsed once
    ice = analysis.families["ice"]
    hops = ice.hop_tracking
    scored = [t for t in trials if t.em is not None]
    assert hops is not None and hops.reason is None
    assert hops.n_trials == len(scored) and hops.n_skipped == 0  # every scored trial tracked, from its record
    assert {r.trial_id for r in hops.rows} == {t.trial_id for t in scored}
    assert ice.attention_cells and ice.retrieval  # the question rows and the answer capture, from the same reads


@pytest.mark.integration
def test_the_runner_records_each_answer_tokens_characters(tmp_path, tiny_card):
    """The characters of every answer token, recorded with the answer capture, lie in order inside the recorded
    output, and each token's characters are what it decodes to (a leading space aside)."""
    from probe.attention.result import SegmentAttention
    from probe.config import load_config
    from probe.loading import get_card, load_tokenizer
    from probe.records import load_trials
    from probe.runfolder import RunFolder
    from probe.runner import run_experiment

    exp = tiny_experiment(tmp_path / "exp.toml", [tiny_card], generation={"max_new_tokens": 12},
                          probe={"enabled": True, "answer": True})
    run = RunFolder(run_experiment(load_config(exp), progress=False))
    tok = load_tokenizer(get_card(str(tiny_card)))
    for t in load_trials(run.trials):
        a = SegmentAttention.load(run.attention_record(t.model, t.prompt_id)).answer
        assert a is not None and a.chars is not None and a.chars.shape == (len(a.tokens), 2)
        starts, ends = a.chars[:, 0], a.chars[:, 1]
        assert np.all(starts <= ends) and np.all(starts[1:] >= ends[:-1]) and ends[-1] <= len(t.output)
        for token, (s, e) in zip(a.tokens.tolist(), a.chars):
            assert t.output[s:e].strip() == tok.decode([token], skip_special_tokens=True).strip()
