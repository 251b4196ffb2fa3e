"""Shards without a rendezvous (probe.runner.shards): ``probe run EXP --shard i/N`` then ``probe merge``.

The tiny random Llama of ``conftest.tiny_card`` runs a small experiment with probing on (2 tasks x 2 replications x
(Control + 3 conditions at one load) = 16 prompts) once in one process (the reference) and as two shards, each in
its own folder; ``probe merge`` must give the reference's trials, record for record, in prompt order, and its probe
records, and must refuse what cannot be merged, naming the shard and what to do.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from probe.cli import main
from probe.config import load_config
from probe.records import load_prompts, load_trials, read_jsonl, write_jsonl
from probe.runner import run_experiment
from probe.runner.shards import Shard, ShardError, find_shards, merge_shards_into
from tests.fixtures.experiment import tiny_experiment

pytestmark = [pytest.mark.integration]


def write_experiment(folder: Path, card: Path) -> Path:
    return tiny_experiment(folder / "exp.toml", [card], experiment={"name": "sh"},
                           ice={"conditions": None, "replications": 2},
                           generation={"max_new_tokens": 4, "batch_size": 1}, probe={"enabled": True})


@pytest.fixture(scope="module")
def reference(tiny_card: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    exp = write_experiment(tmp_path_factory.mktemp("one"), tiny_card)
    return run_experiment(load_config(exp), progress=False, device="cpu")


@pytest.fixture(scope="module")
def shards(tiny_card: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(experiment file, run folder) after running shards 2/2 and 1/2 through the CLI; not merged."""
    exp = write_experiment(tmp_path_factory.mktemp("sharded"), tiny_card)
    for spec in ("2/2", "1/2"):
        assert main(["run", str(exp), "--shard", spec, "-q", "--device", "cpu"]) == 0
    return exp, load_config(exp).run_dir


def _copy(run_dir: Path, dest: Path) -> Path:
    shutil.copytree(run_dir, dest)
    return dest


def _arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def test_two_shards_merged_equal_one_process_trial_for_trial_and_record_for_record(shards, reference, tmp_path):
    _, run_dir = shards
    run = _copy(run_dir, tmp_path / "sh")
    folders = find_shards(run)
    assert [f.name for f in folders] == ["1-of-2", "2-of-2"]
    ids = [p.prompt_id for p in load_prompts(reference / "prompts.jsonl")]
    for i, f in enumerate(folders):  # each shard ran every 2nd prompt, from its own offset, and nothing else
        recorded = [t.prompt_id for t in load_trials(f / "trials.jsonl")]
        assert sorted(recorded) == sorted(ids[i::2]) and len(set(recorded)) == len(recorded)
    summary = merge_shards_into(run)
    assert summary.n_trials == len(ids) == 16 and summary.n_errors == 0
    merged = load_trials(run / "trials.jsonl")
    assert [t.prompt_id for t in merged] == ids  # prompt order
    ref = {t.trial_id: t for t in load_trials(reference / "trials.jsonl")}
    assert {t.trial_id: t for t in merged} == ref
    assert len({t.output for t in ref.values()}) > 1  # the outputs differ: the match means something
    assert (run / "prompts.jsonl").read_bytes() == (reference / "prompts.jsonl").read_bytes()
    assert (run / "tasks.jsonl").read_bytes() == (reference / "tasks.jsonl").read_bytes()
    ref_records = sorted(p.relative_to(reference) for p in (reference / "attention").rglob("*.npz"))
    assert sorted(p.relative_to(run) for p in (run / "attention").rglob("*.npz")) == ref_records
    assert summary.n_probe_records == len(ref_records) == 16
    for rel in ref_records:
        a, b = _arrays(reference / rel), _arrays(run / rel)
        assert a.keys() == b.keys()
        for k in a:  # the same forward over the same tokens, one prompt per batch: equal to float32 rounding
            if a[k].dtype.kind in "fc":
                np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6, err_msg=f"{rel}: {k}")
            else:
                np.testing.assert_array_equal(b[k], a[k], err_msg=f"{rel}: {k}")
    cfg = load_config(run / "config.toml")
    assert cfg.experiment.name == "sh" and cfg.run_dir == run_dir  # the experiment's own folder, not a shard's
    manifest = json.loads((run / "manifest.json").read_text())
    assert [s["shard"] for s in manifest["shards"]] == ["1/2", "2/2"]


def test_merge_again_rewrites_what_it_wrote_and_never_drops_a_trial_the_shards_lack(shards, tmp_path, capsys):
    """A second merge of the same shards (a data-parallel launch resumed over a finished run) writes the same
    trials; a folder that holds a trial the shards do not (a retry run in the merged folder) is refused without
    --force, and with it its records are moved aside, not lost."""
    _, run_dir = shards
    run = _copy(run_dir, tmp_path / "sh")
    assert main(["merge", str(run)]) == 0
    assert "merged 2 shards" in capsys.readouterr().out
    first = (run / "trials.jsonl").read_bytes()
    assert merge_shards_into(run).n_trials == 16
    assert (run / "trials.jsonl").read_bytes() == first
    trials = list(read_jsonl(run / "trials.jsonl"))
    trials[3] = dict(trials[3], output="a retried answer")
    write_jsonl(run / "trials.jsonl", trials)
    with pytest.raises(ShardError, match=rf"holds 1 trials the shards do not \(the first: '{trials[3]['trial_id']}'"):
        merge_shards_into(run)
    assert list(read_jsonl(run / "trials.jsonl")) == trials  # refused: nothing written
    merge_shards_into(run, force=True)
    assert (run / "trials.jsonl").read_bytes() == first
    aside = [p for p in run.iterdir() if p.name.startswith("superseded-")]
    assert len(aside) == 1 and list(read_jsonl(aside[0] / "trials.jsonl")) == trials
    assert not (aside[0] / "shards").exists() and len(find_shards(run)) == 2  # the shards stay where they were


def test_a_missing_shard_is_named_with_the_command_that_makes_it(shards, tmp_path):
    _, run_dir = shards
    run = _copy(run_dir, tmp_path / "sh")
    shutil.rmtree(run / "shards" / "2-of-2")
    with pytest.raises(ShardError, match=r"shard 2/2 of 2 is missing: run `probe run EXP --shard 2/2`"):
        merge_shards_into(run)
    assert not (run / "trials.jsonl").exists()


def test_an_unfinished_shard_is_refused_and_nothing_is_written(shards, tmp_path):
    _, run_dir = shards
    run = _copy(run_dir, tmp_path / "sh")
    trials = list(read_jsonl(run / "shards" / "1-of-2" / "trials.jsonl"))
    write_jsonl(run / "shards" / "1-of-2" / "trials.jsonl", trials[:-2])
    with pytest.raises(ShardError, match=r"1-of-2: shard 1/2 has not finished .*tiny-llama: 2"):
        merge_shards_into(run)
    assert not (run / "trials.jsonl").exists() and not (run / "config.toml").exists()


def test_overlapping_and_foreign_trials_are_refused(shards, tmp_path):
    _, run_dir = shards
    run = _copy(run_dir, tmp_path / "sh")
    one, two = (run / "shards" / n / "trials.jsonl" for n in ("1-of-2", "2-of-2"))
    write_jsonl(two, list(read_jsonl(two)) + list(read_jsonl(one))[:1])
    with pytest.raises(ShardError, match="belongs to another shard's share"):
        merge_shards_into(run)
    # the same shard given twice (a copy of its folder)
    run2 = _copy(run_dir, tmp_path / "sh2")
    shutil.copytree(run2 / "shards" / "1-of-2", tmp_path / "copy-of-1")
    with pytest.raises(ShardError, match="shard 1/2 is given twice"):
        merge_shards_into(run2, find_shards(run2) + [tmp_path / "copy-of-1"])


def test_shards_made_with_other_settings_are_refused(shards, tmp_path):
    _, run_dir = shards
    run = _copy(run_dir, tmp_path / "sh")
    config = run / "shards" / "2-of-2" / "config.toml"
    config.write_text(config.read_text().replace("max_new_tokens = 4", "max_new_tokens = 5"))
    with pytest.raises(ShardError, match=r"2-of-2: made with other settings .*generation.max_new_tokens: 4 -> 5"):
        merge_shards_into(run)


def test_shard_specs_are_checked(tmp_path):
    assert Shard.parse(" 2 / 4 ") == Shard(2, 4) and Shard(2, 4).name == "2-of-4"
    for bad in ("0/4", "5/4", "2", "a/b", "2/0"):
        with pytest.raises(ShardError, match="give i/N with 1 <= i <= N"):
            Shard.parse(bad)
    with pytest.raises(ShardError, match="no shard to merge"):
        merge_shards_into(tmp_path)


@pytest.mark.parametrize("link", ["prompts.jsonl", "manifest.json", "attention"])
def test_merge_never_writes_through_a_planted_link(shards, tmp_path, capsys, link):
    """A shard folder received from elsewhere with a link where the merge writes: refused, naming the link, and the
    file or folder it points to is unchanged."""
    from tests.security.tree import tree_digest

    _, run_dir = shards
    run = _copy(run_dir, tmp_path / "sh")
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "precious.txt").write_text("keep\n")
    (run / link).symlink_to(outside / ("dir" if link == "attention" else "precious.txt"))
    before = tree_digest(outside)
    assert main(["merge", str(run)]) == 2
    assert "is a link" in capsys.readouterr().err
    assert tree_digest(outside) == before


def test_show_never_writes_through_a_planted_link(shards, tmp_path, capsys):
    from probe.records import load_prompts
    from tests.security.tree import tree_digest

    _, run_dir = shards
    run = _copy(run_dir, tmp_path / "sh")
    assert main(["merge", str(run)]) == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    (run / "show").symlink_to(outside)
    pid = load_prompts(run / "prompts.jsonl")[0].prompt_id
    before = tree_digest(outside)
    capsys.readouterr()
    assert main(["show", str(run), pid, "--device", "cpu"]) == 2
    assert "is a link" in capsys.readouterr().err
    assert tree_digest(outside) == before


def test_a_changed_or_foreign_shard_record_is_refused_and_nothing_is_merged(shards, tmp_path, capsys):
    """A merge re-indexes what it copies, so it must hold each shard's records to the sha256 they were written with
    (and to a trial of that shard) first: otherwise a record changed in transit would come out of the merge looking
    as written."""
    from probe.attention.result import SegmentAttention

    _, run_dir = shards
    run = _copy(run_dir, tmp_path / "sh")
    record = sorted((run / "shards").rglob("*.npz"))[0]
    rec = SegmentAttention.load(record)
    rec.measures["p_ext"] = rec.measures["p_ext"] * 0 + 0.5
    rec.save(record)
    assert main(["merge", str(run)]) == 2
    assert f"{record}: its sha256 is not the one written" in capsys.readouterr().err
    assert not (run / "trials.jsonl").exists()

    run = _copy(run_dir, tmp_path / "sh2")
    record = sorted((run / "shards").rglob("*.npz"))[0]
    stray = record.with_name("planted.npz")
    shutil.copy(record, stray)
    assert main(["merge", str(run)]) == 2
    assert f"{stray}: no trial of the shard made this probe record" in capsys.readouterr().err
    assert not (run / "trials.jsonl").exists()
