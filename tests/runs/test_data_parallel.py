"""Data-parallel runs: ``probe run`` under ``accelerate launch`` with two CPU processes.

The tiny random Llama of ``conftest.tiny_card`` runs a small experiment (2 tasks x 1 load x 2 replications = 16
prompts) once in this process (the single-process reference) and once as ``accelerate launch --multi_gpu
--num_processes 2 -m probe.cli run EXP.toml`` with no GPU visible. (accelerate's ``--cpu`` launcher starts several
processes only through ``mpirun``; ``--multi_gpu`` starts them through ``torch.distributed.run``, and ``probe run``
joins them over gloo when CUDA is absent.) Process ``r`` is shard ``r+1`` of 2 (``<run>/shards/<r+1>-of-2/``, as
``probe run --shard`` makes it) and rank 0 merges the two into the run folder. The merged file must hold every
prompt once, with the reference's records (greedy decoding, one prompt per batch, so no padding can make outputs
differ). A second launch over the state an interrupted run leaves (shards part done, a half-written line, a backend
error, nothing merged) runs only the missing and failed trials and ends with the same records; a plain ``probe run``
over unmerged shards is refused, naming them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from probe.config import load_config
from probe.errors import ConfigError
from probe.records import load_trials, make_trial_id, read_jsonl, write_jsonl
from probe.runner import run_experiment
from tests.fixtures.experiment import tiny_experiment
from tests.serving import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N_PROMPTS = 2 * 2 * (1 + 3)  # tasks x replications x (Control + 3 conditions x 1 load)
PLAN = re.compile(r"(\d+) trials to run, (\d+) already recorded in \S*/shards/(\d+)-of-(\d+)")


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
    """rank -> (trials to run, trials already recorded), from the runner's log lines (rank r runs shard r+1)."""
    out: dict[int, tuple[int, int]] = {}
    for todo, recorded, index, count in PLAN.findall(stderr):
        assert int(count) == 2
        out[int(index) - 1] = (int(todo), int(recorded))
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
    # both ranks ran, each its half, nothing recorded before, each in its shard folder
    assert plans(stderr) == {0: (N_PROMPTS // 2, 0), 1: (N_PROMPTS // 2, 0)}
    assert sorted(p.name for p in (run_dir / "shards").iterdir()) == ["1-of-2", "2-of-2"]
    lines = list(read_jsonl(run_dir / "trials.jsonl"))
    prompts = list(read_jsonl(run_dir / "prompts.jsonl"))
    assert len(prompts) == len({p["prompt_id"] for p in prompts}) == N_PROMPTS
    assert prompts == list(read_jsonl(reference / "prompts.jsonl"))
    assert len(lines) == len({x["trial_id"] for x in lines}) == N_PROMPTS
    assert [x["prompt_id"] for x in lines] == [p["prompt_id"] for p in prompts]  # merged in prompt order
    ref = records(reference)
    assert records(run_dir) == ref  # same outputs, answers, token counts, flags
    assert len({r["output"] for r in ref.values()}) > 1  # the outputs differ between prompts: the match means something
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "tiny-llama" in manifest["models"] and [s["shard"] for s in manifest["shards"]] == ["1/2", "2/2"]


def test_relaunch_after_an_interruption_runs_only_what_is_missing(dp_run, reference):
    exp, run_dir, _ = dp_run
    ref = records(reference)
    ids = [make_trial_id("tiny-llama", p["prompt_id"]) for p in read_jsonl(run_dir / "prompts.jsonl")]
    rank_ids = {r: ids[r::2] for r in (0, 1)}  # probe.runner.shards.Shard.select: every 2nd prompt from the r+1-th
    # What an interrupted two-process run leaves: nothing merged; each shard holds part of its share, rank 1 died
    # mid-line, one of rank 0's trials failed in the backend.
    for p in run_dir.iterdir():
        if p.name != "shards":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    one, two = (run_dir / "shards" / n / "trials.jsonl" for n in ("1-of-2", "2-of-2"))
    failed = dict(ref[rank_ids[0][2]], output=None, answer=None, em=None, error="HTTP 503: overloaded")
    write_jsonl(one, [ref[i] for i in rank_ids[0][:2]] + [failed])
    write_jsonl(two, [ref[i] for i in rank_ids[1][:3]])
    with two.open("a") as fh:
        fh.write('{"trial_id": "tiny-llama::')
    recorded = {0: 2, 1: 3}

    with pytest.raises(ConfigError, match=r"its shards \(1-of-2, 2-of-2\) are not merged"):
        run_experiment(load_config(exp), progress=False, device="cpu")
    done = launch(exp)
    share = N_PROMPTS // 2
    assert plans(done.stderr) == {r: (share - recorded[r], recorded[r]) for r in (0, 1)}
    lines = list(read_jsonl(run_dir / "trials.jsonl"))
    assert len(lines) == len({x["trial_id"] for x in lines}) == N_PROMPTS
    assert records(run_dir) == ref
    assert (run_dir / "prompts.jsonl").read_bytes() == (reference / "prompts.jsonl").read_bytes()
    # launched again over a finished run: nothing to run, and the same merge again
    again = launch(exp)
    assert plans(again.stderr) == {r: (0, share) for r in (0, 1)}
    assert records(run_dir) == ref
