"""Data-parallel runs: ``probe run`` under ``accelerate launch`` with two CPU processes.

The tiny random Llama of ``conftest.tiny_card`` runs a small experiment (2 tasks x 1 load x 2 replications = 16
prompts) once in this process (the single-process reference) and once as ``accelerate launch --multi_gpu
--num_processes 2 -m probe.cli run EXP.toml`` with no GPU visible. (accelerate's ``--cpu`` launcher starts several
processes only through ``mpirun``; ``--multi_gpu`` starts them through ``torch.distributed.run``, and ``probe run``
joins them over gloo when CUDA is absent.) Rank 0 builds the prompts, each rank records its share in
``trials.rank<r>.jsonl`` and rank 0 merges them into ``trials.jsonl``. The merged file must hold every prompt once,
with the reference's records (greedy decoding, one prompt per batch, so no padding can make outputs differ), and
no shard file may remain. A second launch over the state an interrupted run leaves (shard files, a half-written line,
a backend error) runs only the missing and failed trials and ends with the same records.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from probe.records import make_trial_id
from probe.runner import run_experiment
from probe.runner.folder import prepare_run_dir
from probe.config import load_config
from probe.records import append_jsonl, load_trials, read_jsonl
from tests.fixtures.experiment import tiny_experiment
from tests.serving import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N_PROMPTS = 2 * 2 * (1 + 3)  # tasks x replications x (Control + 3 conditions x 1 load)
PLAN = re.compile(r"rank (\d+) of (\d+): (\d+) trials to run, (\d+) already recorded")


def write_experiment(folder: Path, card: Path) -> Path:
    return tiny_experiment(folder / "exp.toml", [card], experiment={"name": "dp"},
                           ice={"conditions": None, "replications": 2},
                           generation={"max_new_tokens": 4, "batch_size": 1})


def launch(experiment: Path, n_processes: int = 2) -> subprocess.CompletedProcess[str]:
    """``accelerate launch --cpu`` of ``probe run`` (INFO logs on stderr); fails the test on a non-zero exit."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(n_processes),
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()),
        "-m", "probe.cli", "-v", "run", str(experiment), "-q",
    ]  # fmt: skip
    # No visible GPU: the processes run on the CPU and ``probe run`` joins them over gloo.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env, cwd=experiment.parent)
    assert done.returncode == 0, (
        f"accelerate launch exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )
    return done


def plans(stderr: str) -> dict[int, tuple[int, int]]:
    """rank -> (trials to run, trials already recorded), from the runner's log lines."""
    out: dict[int, tuple[int, int]] = {}
    for rank, world, todo, recorded in PLAN.findall(stderr):
        assert int(world) == 2
        out[int(rank)] = (int(todo), int(recorded))
    return out


def records(run_dir: Path) -> dict[str, dict]:
    return {t.trial_id: t.to_dict() for t in load_trials(run_dir / "trials.jsonl")}


@pytest.fixture(scope="module")
def reference(tiny_card: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same experiment run in one process (``run_experiment``, as a plain ``probe run`` does)."""
    exp = write_experiment(tmp_path_factory.mktemp("single"), tiny_card)
    return run_experiment(load_config(exp), progress=False, device="cpu")


@pytest.fixture(scope="module")
def dp_run(tiny_card: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(experiment file, run folder, stderr) of a two-process launch."""
    exp = write_experiment(tmp_path_factory.mktemp("dp"), tiny_card)
    done = launch(exp)
    return exp, load_config(exp).run_dir, done.stderr


def test_two_processes_record_every_prompt_once_as_one_process_does(dp_run, reference):
    _, run_dir, stderr = dp_run
    # both ranks ran, each its half, nothing recorded before
    assert plans(stderr) == {0: (N_PROMPTS // 2, 0), 1: (N_PROMPTS // 2, 0)}
    assert not list(run_dir.glob("trials.rank*.jsonl"))
    lines = list(read_jsonl(run_dir / "trials.jsonl"))
    prompts = list(read_jsonl(run_dir / "prompts.jsonl"))
    assert len(prompts) == len({p["prompt_id"] for p in prompts}) == N_PROMPTS  # written once, by rank 0
    assert prompts == list(read_jsonl(reference / "prompts.jsonl"))
    assert len(lines) == len({x["trial_id"] for x in lines}) == N_PROMPTS
    assert {x["prompt_id"] for x in lines} == {p["prompt_id"] for p in prompts}
    ref = records(reference)
    assert records(run_dir) == ref  # same outputs, answers, token counts, flags
    assert len({r["output"] for r in ref.values()}) > 1  # the outputs differ between prompts: the match means something
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "tiny-llama" in manifest["models"]


def test_relaunch_after_an_interruption_runs_only_what_is_missing(dp_run, reference):
    exp, run_dir, _ = dp_run
    ref = records(reference)
    prompts_before = (run_dir / "prompts.jsonl").read_bytes()
    ids = [make_trial_id("tiny-llama", p["prompt_id"]) for p in read_jsonl(run_dir / "prompts.jsonl")]
    rank_ids = {r: ids[r::2] for r in (0, 1)}  # probe.runner.trials.shard_of: every 2nd prompt, offset rank
    # What an interrupted two-process run leaves: each rank's shard holds part of its share, rank 1 died mid-line,
    # one of rank 0's trials failed in the backend; a few trials sit in the merged file from an earlier run.
    (run_dir / "trials.jsonl").unlink()
    failed = dict(ref[rank_ids[0][2]], output=None, answer=None, em=None, error="HTTP 503: overloaded")
    append_jsonl(run_dir / "trials.jsonl", [ref[rank_ids[1][5]]])
    append_jsonl(run_dir / "trials.rank0.jsonl", [ref[i] for i in rank_ids[0][:2]] + [failed])
    append_jsonl(run_dir / "trials.rank1.jsonl", [ref[i] for i in rank_ids[1][:3]])
    with (run_dir / "trials.rank1.jsonl").open("a") as fh:
        fh.write('{"trial_id": "tiny-llama::')
    recorded = {0: 2, 1: 3 + 1}

    done = launch(exp)
    share = N_PROMPTS // 2
    assert plans(done.stderr) == {r: (share - recorded[r], recorded[r]) for r in (0, 1)}
    assert not list(run_dir.glob("trials.rank*.jsonl"))
    lines = list(read_jsonl(run_dir / "trials.jsonl"))
    assert len(lines) == len({x["trial_id"] for x in lines}) == N_PROMPTS
    assert records(run_dir) == ref
    assert (run_dir / "prompts.jsonl").read_bytes() == prompts_before


def test_single_process_run_folds_in_shards_left_by_a_data_parallel_run(tiny_card, reference, tmp_path, caplog):
    """A data-parallel run interrupted and finished without ``accelerate launch`` ends with one merged file."""
    exp = write_experiment(tmp_path, tiny_card)
    cfg = load_config(exp)
    prepare_run_dir(cfg)
    (cfg.run_dir / "prompts.jsonl").write_bytes((reference / "prompts.jsonl").read_bytes())
    ref = records(reference)
    ids = sorted(ref)
    append_jsonl(cfg.run_dir / "trials.rank0.jsonl", [ref[i] for i in ids[:5]])
    append_jsonl(cfg.run_dir / "trials.rank1.jsonl", [ref[i] for i in ids[5:7]])
    with caplog.at_level(logging.INFO, logger="probe.runner"):
        run_experiment(cfg, progress=False, device="cpu")
    assert f"rank 0 of 1: {N_PROMPTS - 7} trials to run, 7 already recorded" in caplog.text
    assert not list(cfg.run_dir.glob("trials.rank*.jsonl"))
    lines = list(read_jsonl(cfg.run_dir / "trials.jsonl"))
    assert len(lines) == len({x["trial_id"] for x in lines}) == N_PROMPTS
    assert records(cfg.run_dir) == ref
