"""Records are checked against what made them: a probe record rewritten one layer short, or two prompts' records
exchanged, is refused when the folder is analysed, naming the file and how to probe the prompt again."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from probe.cli import main
from tests.fixtures.experiment import tiny_experiment

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def probed(tmp_path_factory, tiny_card) -> Path:
    root = tmp_path_factory.mktemp("probed")
    exp = tiny_experiment(root / "exp.toml", [tiny_card], probe={"enabled": True})
    assert main(["run", str(exp)]) == 0
    return root / "outputs" / "tiny"


def _copy(probed: Path, tmp_path: Path) -> tuple[Path, list[Path]]:
    run = tmp_path / "run"
    shutil.copytree(probed, run)
    records = sorted((run / "attention").rglob("*.npz"))
    assert len(records) >= 2
    return run, records


def _analyse(run: Path, capsys) -> tuple[int, str]:
    rc = main(["analyze", str(run)])
    return rc, capsys.readouterr().err


def test_untouched_records_are_analysed(probed, tmp_path, capsys):
    run, _ = _copy(probed, tmp_path)
    assert _analyse(run, capsys)[0] == 0


def test_a_record_one_layer_short_is_refused(probed, tmp_path, capsys):
    from probe.attention.result import SegmentAttention

    run, records = _copy(probed, tmp_path)
    rec = SegmentAttention.load(records[0])
    short = replace(rec, measures={k: v[:-1] for k, v in rec.measures.items()}, chance=rec.chance[:-1])
    short.save(records[0])
    rc, err = _analyse(run, capsys)
    assert rc == 2 and f"{records[0]}: holds 1 layers x 4 heads, where model 'tiny-llama' has 2 x 4" in err, err


def test_two_prompts_records_exchanged_are_refused(probed, tmp_path, capsys):
    run, records = _copy(probed, tmp_path)
    a, b = records[0], records[-1]
    tmp = a.with_suffix(".swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    rc, err = _analyse(run, capsys)
    assert rc == 2 and f"{a}: its sha256 is not the one written" in err, err
    (run / "attention_index.jsonl").unlink()  # a run indexed before records were: the prompt digest still holds
    rc, err = _analyse(run, capsys)
    assert rc == 2 and "measured another prompt than" in err and "probes the prompt again" in err, err


def test_a_record_rewritten_with_its_own_shape_and_digest_is_refused_by_its_hash(probed, tmp_path, capsys):
    """The index written with each record (attention_index.jsonl) holds its sha256: a record whose values were
    changed, shape and prompt digest kept, is named."""
    from probe.attention.result import SegmentAttention

    run, records = _copy(probed, tmp_path)
    assert (run / "attention_index.jsonl").is_file()
    rec = SegmentAttention.load(records[0])
    rec.measures["p_ext"] = rec.measures["p_ext"] * 0 + 0.5
    rec.save(records[0])
    rc, err = _analyse(run, capsys)
    assert rc == 2 and f"{records[0]}: its sha256 is not the one written" in err, err


def test_show_refuses_a_changed_record(probed, tmp_path, capsys):
    """``probe show`` reads a record through the analysis' one reader: a record changed since it was written is
    named, not drawn."""
    from probe.attention.result import SegmentAttention
    from probe.records import load_trials
    from probe.runfolder import RunFolder

    run, _ = _copy(probed, tmp_path)
    trial = load_trials(run / "trials.jsonl")[0]
    record = RunFolder(run).attention_record(trial.model, trial.prompt_id)
    rec = SegmentAttention.load(record)
    rec.measures["p_ext"] = rec.measures["p_ext"] * 0 + 0.5
    rec.save(record)
    capsys.readouterr()
    assert main(["show", str(run), trial.prompt_id, "--device", "cpu"]) == 2
    assert f"{record}: its sha256 is not the one written" in capsys.readouterr().err
    assert not (run / "show").exists()
