"""Run-folder integrity: ``--force`` starts a run over, one writer at a time, no duplicate trial read silently, a
failed build leaves nothing behind, a copied folder resumes, a damaged probe record is named and probed again, a
failed write says what to do and leaves no temporary file, and every file of a run has one mode."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from probe.config import read_run_config
from probe.runner.folder import prepare_run_dir
from probe.cli import main
from probe.config import load_config
from probe.records import DuplicateTrialError, load_trials
from probe.runfolder import RunFolder
from tests.fixtures.experiment import tiny_experiment

pytestmark = pytest.mark.integration

def write_exp(path: Path, card: Path, out: Path, seed: int = 7, probe: bool = False) -> Path:
    return tiny_experiment(path, [card], out, experiment={"name": "integrity", "seed": seed},
                           ice={"replications": 2}, generation={"max_new_tokens": 3, "batch_size": 4},
                           probe={"enabled": probe})


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_force_with_another_seed_starts_the_run_over(tmp_path, tiny_card, caplog):
    out = tmp_path / "outputs"
    assert main(["run", str(write_exp(tmp_path / "a.toml", tiny_card, out, seed=7)), "-q"]) == 0
    run = RunFolder(out / "integrity")
    seed7 = files(run.root)
    caplog.clear()
    assert main(["run", str(write_exp(tmp_path / "b.toml", tiny_card, out, seed=8)), "-q", "--force"]) == 0
    # the reference: the seed-8 experiment run into a fresh folder
    fresh_out = tmp_path / "fresh"
    assert main(["run", str(write_exp(tmp_path / "c.toml", tiny_card, fresh_out, seed=8)), "-q"]) == 0
    fresh = RunFolder(fresh_out / "integrity")
    assert run.prompts.read_bytes() == fresh.prompts.read_bytes()
    assert run.trials.read_bytes() == fresh.trials.read_bytes()
    assert json.loads(run.manifest.read_text())["seed"] == 8
    # the seed-7 records are where the message said, as they were
    moved = [p for p in run.root.iterdir() if p.name.startswith("superseded-")]
    assert len(moved) == 1
    assert str(moved[0]) in caplog.text and "experiment.seed: 7 -> 8" in caplog.text
    assert {k: v for k, v in files(moved[0]).items()} == {k: v for k, v in seed7.items() if k != "run.lock"}


def test_a_second_run_into_a_locked_folder_stops_naming_the_holder(tmp_path, tiny_card, capsys):
    exp = write_exp(tmp_path / "a.toml", tiny_card, tmp_path / "outputs")
    run = RunFolder(tmp_path / "outputs" / "integrity")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from probe.runfolder import RunLock; lock = RunLock(sys.argv[1]); "
         "lock.acquire(); print('locked', flush=True); time.sleep(60)", str(run.root)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        capsys.readouterr()
        assert main(["run", str(exp), "-q"]) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid}" in err and str(run.root) in err
        assert not run.trials.exists() and not run.prompts.exists()
    finally:
        holder.kill()
        holder.wait()
    assert main(["run", str(exp), "-q"]) == 0  # the kernel released the lock with its holder


def test_two_runs_started_at_once_record_each_trial_once(tmp_path, tiny_card):
    exp = write_exp(tmp_path / "a.toml", tiny_card, tmp_path / "outputs")
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "probe.cli", "run", str(exp), "-q"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read() if p.stderr else "") for p in procs]
    assert all(rc in (0, 2) for rc, _ in results), results
    for rc, err in results:
        if rc == 2:
            assert "another `probe run`" in err and "pid" in err
    cfg = load_config(exp)
    ids = [json.loads(x)["trial_id"] for x in RunFolder(cfg.run_dir).trials.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 2 * 2 * 2  # tasks x replications x (Control, Saturation@50)


def test_a_trial_recorded_twice_is_refused_by_the_readers(tmp_path, tiny_card, capsys):
    exp = write_exp(tmp_path / "a.toml", tiny_card, tmp_path / "outputs")
    assert main(["run", str(exp), "-q"]) == 0
    run = RunFolder(tmp_path / "outputs" / "integrity")
    lines = run.trials.read_text().splitlines(keepends=True)
    run.trials.write_text("".join(lines + lines[:3]))  # what two writers at once leave
    with pytest.raises(DuplicateTrialError, match=rf"{run.trials}:{len(lines) + 1}: .*3 trial\(s\) are recorded twice"):
        load_trials(run.trials)
    capsys.readouterr()
    assert main(["analyze", str(run.root)]) == 2
    assert "recorded twice" in capsys.readouterr().err
    assert not run.analysis.exists()
    # a backend error retried later is not a duplicate: the retry replaces it
    err = dict(json.loads(lines[0]), error="HTTP 500", output=None, em=None)
    run.trials.write_text(json.dumps(err) + "\n" + "".join(lines))
    assert len(load_trials(run.trials)) == len(lines)


def test_a_failed_build_writes_nothing_and_the_fix_runs_without_force(tmp_path, tiny_card, capsys):
    from probe.tasks.synthetic import generate_synthetic

    good = [{k: v for k, v in t.to_dict().items() if k != "source"}
            for t in generate_synthetic(2, 2, np.random.default_rng(0))]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(dict(d, question="") if i == 1 else d) + "\n" for i, d in enumerate(good)))
    exp = tmp_path / "a.toml"
    exp.write_text(f'[experiment]\nname = "bad"\nmodels = ["{tiny_card}"]\noutput_dir = "{tmp_path / "outputs"}"\n'
                   f'[[tasks]]\nsource = "jsonl"\npath = "{tasks}"\n[ice]\nconditions = ["Control"]\nloads = [20]\n'
                   'replications = 1\n'
                   '[generation]\nmax_new_tokens = 2\n[analysis]\nembedder = ""\n')
    for command in ("build", "run"):
        assert main([command, str(exp), "-q"]) == 2
        assert "question" in capsys.readouterr().err
        assert not (tmp_path / "outputs").exists()
    tasks.write_text("".join(json.dumps(d) + "\n" for d in good))
    assert main(["run", str(exp), "-q"]) == 0
    # a folder with a config but no record (a build that failed later, say in the tokenizer) takes a new config
    run = RunFolder(tmp_path / "outputs" / "bad")
    run.prompts.unlink()
    run.trials.unlink()
    exp.write_text(exp.read_text().replace("max_new_tokens = 2", "max_new_tokens = 3"))
    assert main(["build", str(exp), "-q"]) == 0


def test_a_copied_run_folder_resumes_and_batch_size_is_no_difference(tmp_path, tiny_card, capsys):
    exp = write_exp(tmp_path / "a.toml", tiny_card, tmp_path / "outputs")
    assert main(["run", str(exp), "-q"]) == 0
    run = RunFolder(tmp_path / "outputs" / "integrity")
    copy = RunFolder(tmp_path / "elsewhere" / "integrity")
    shutil.copytree(run.root, copy.root)
    trials = copy.trials.read_bytes()
    assert main(["run", str(exp), "-q", "--output-dir", str(copy.root.parent), "--batch-size", "1"]) == 0
    assert copy.trials.read_bytes() == trials  # resumed: nothing to redo
    assert load_config(exp, {"experiment": {"output_dir": str(copy.root.parent)}, "generation": {"batch_size": 1}}) \
        == read_run_config(copy)
    capsys.readouterr()
    assert main(["run", str(exp), "-q", "--output-dir", str(copy.root.parent), "--max-new-tokens", "5"]) == 2
    assert "generation.max_new_tokens: 3 -> 5" in capsys.readouterr().err


def _probe_records(run: RunFolder) -> list[Path]:
    return sorted(run.attention_root.rglob("*.npz"))


def test_a_truncated_probe_record_is_named_and_probed_again(tmp_path, tiny_card, capsys):
    exp = write_exp(tmp_path / "a.toml", tiny_card, tmp_path / "outputs", probe=True)
    assert main(["run", str(exp), "-q"]) == 0
    run = RunFolder(tmp_path / "outputs" / "integrity")
    records = _probe_records(run)
    assert records
    victim = records[0]
    good = victim.read_bytes()
    victim.write_bytes(good[: len(good) // 2])
    capsys.readouterr()
    assert main(["analyze", str(run.root)]) == 2
    err = capsys.readouterr().err
    assert str(victim) in err and "not a readable probe record" in err and "probe run" in err
    assert "Traceback" not in err
    from probe.attention.result import SegmentAttention

    trials = run.trials.read_bytes()
    assert main(["run", str(exp), "-q"]) == 0
    assert run.trials.read_bytes() == trials  # the trial is kept; only its probe is made again
    again, before = SegmentAttention.load(victim), SegmentAttention.load(records[1])
    assert again.p_ext.shape == before.p_ext.shape
    victim.write_bytes(good)
    ref = SegmentAttention.load(victim)
    np.testing.assert_allclose(again.p_ext, ref.p_ext, rtol=0, atol=1e-6)


def test_show_names_a_truncated_probe_record(tmp_path, tiny_card, capsys):
    exp = write_exp(tmp_path / "a.toml", tiny_card, tmp_path / "outputs", probe=True)
    assert main(["run", str(exp), "-q"]) == 0
    run = RunFolder(tmp_path / "outputs" / "integrity")
    victim = _probe_records(run)[0]
    victim.write_bytes(victim.read_bytes()[:100])
    prompt_id = next(json.loads(x)["prompt_id"] for x in run.prompts.read_text().splitlines()
                     if run.attention_record("tiny-llama", json.loads(x)["prompt_id"]) == victim)
    capsys.readouterr()
    assert main(["show", str(run.root), prompt_id, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert str(victim) in err and "not a readable probe record" in err


@pytest.mark.parametrize("failing, code", [("prompts.jsonl.tmp", errno.ENOSPC), ("manifest.json.tmp", errno.ENOSPC),
                                           ("trials.jsonl", errno.ENOSPC), ("trials.jsonl", errno.EROFS)],
                         ids=["prompts-full", "manifest-full", "trials-full", "trials-read-only"])
def test_a_full_disk_says_what_to_do_leaves_no_temporary_file_and_a_rerun_finishes(tmp_path, tiny_card, capsys,
                                                                                    monkeypatch, failing, code):
    # the writer fails as the kernel would (tests run as root, where chmod does not stop a write)
    exp = write_exp(tmp_path / "a.toml", tiny_card, tmp_path / "outputs", probe=True)
    real_fsync = os.fsync

    def full(fd: int) -> None:  # the disk fills up (or the folder turns read-only) while this file is written
        if os.readlink(f"/proc/self/fd/{fd}").endswith(failing):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    capsys.readouterr()
    assert main(["run", str(exp), "-q"]) == 1
    err = capsys.readouterr().err
    assert os.strerror(code) in err and "Nothing already recorded is lost" in err
    assert "run the same command again" in err and "Traceback" not in err
    run = RunFolder(tmp_path / "outputs" / "integrity")
    assert not [p for p in run.root.rglob("*") if p.name.endswith(".tmp")]
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert main(["run", str(exp), "-q"]) == 0
    fresh = tmp_path / "fresh.toml"
    write_exp(fresh, tiny_card, tmp_path / "fresh", probe=True)
    assert main(["run", str(fresh), "-q"]) == 0
    ref = RunFolder(tmp_path / "fresh" / "integrity")
    got = sorted(load_trials(run.trials), key=lambda t: t.trial_id)
    want = sorted(load_trials(ref.trials), key=lambda t: t.trial_id)
    assert got == want
    assert [p.relative_to(run.root) for p in _probe_records(run)] == \
        [p.relative_to(ref.root) for p in _probe_records(ref)]


def test_every_file_of_a_run_has_one_mode(tmp_path, tiny_card):
    exp = write_exp(tmp_path / "a.toml", tiny_card, tmp_path / "outputs", probe=True)
    assert main(["run", str(exp), "-q", "--analyze"]) == 0
    run = RunFolder(tmp_path / "outputs" / "integrity")
    modes = {str(p.relative_to(run.root)): stat.S_IMODE(p.stat().st_mode) for p in run.root.rglob("*")
             if p.is_file()}
    assert _probe_records(run) and set(modes.values()) == {stat.S_IMODE(run.trials.stat().st_mode)}, modes


def test_force_starts_over_past_a_damaged_record_file_only_for_another_configuration(tmp_path):
    from dataclasses import replace

    from probe.config import config_from_dict
    from probe.records import RecordError

    cfg = config_from_dict({"experiment": {"name": "x", "output_dir": str(tmp_path)},
                            "tasks": [{"source": "synthetic"}]})
    prepare_run_dir(cfg)
    run = cfg.run_folder
    run.trials.write_text("not a record\n{}\n")
    for force in (False, True):  # the same configuration: the damage is named, --force or not
        with pytest.raises(RecordError, match=rf"{run.trials}:1: not valid JSON"):
            prepare_run_dir(cfg, force=force)
    other = replace(cfg, experiment=replace(cfg.experiment, seed=8))
    prepare_run_dir(other, force=True)
    assert not run.trials.exists() and read_run_config(run) == other
    (moved,) = [p for p in run.root.iterdir() if p.name.startswith("superseded-")]
    assert (moved / "trials.jsonl").read_text() == "not a record\n{}\n"


def test_report_names_a_truncated_attention_summary_and_analyze_rewrites_it(tmp_path, tiny_card, capsys):
    exp = write_exp(tmp_path / "a.toml", tiny_card, tmp_path / "outputs", probe=True)
    assert main(["run", str(exp), "-q", "--analyze"]) == 0
    run = RunFolder(tmp_path / "outputs" / "integrity")
    good = run.attention_summary.read_bytes()
    run.attention_summary.write_bytes(good[: len(good) // 2])
    capsys.readouterr()
    assert main(["report", str(run.root)]) == 2
    err = capsys.readouterr().err
    assert str(run.attention_summary) in err and "probe analyze" in err and "Traceback" not in err
    assert main(["analyze", str(run.root)]) == 0
    assert run.attention_summary.read_bytes() == good
    assert main(["report", str(run.root)]) == 0
    assert not list(run.root.glob("*.tmp"))
