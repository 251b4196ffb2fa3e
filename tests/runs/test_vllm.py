"""A two-stage run against a real vLLM server: vLLM writes the answers, the local weights probe them.

vLLM's OpenAI-compatible server (from the environment ``make setup-vllm`` builds; it pins its own transformers)
serves the embedded default model, de-quantised to a float32 Hugging Face folder, on 127.0.0.1. A served card names
the local card of the same weights in ``probe_with``; the experiment probes with ``[probe] answer = true``. Checked:

- the server tokenizes a prompt's chat messages (``/tokenize``) into the local tokenizer's tokens;
- every trial is recorded once, with vLLM's own token ids (``return_token_ids``), and in float32 its greedy answers
  are the local model's; each probe record equals the one a local run took while generating, to 1e-5;
- a server killed mid-run (SIGKILL, by its pid) and started again loses and doubles nothing: the failed trials are
  errors, not wrong answers, and are neither probed nor lost; the same command completes them and their probes.

Without the vLLM environment the module is skipped, saying so; with ``PROBE_REQUIRE_VLLM=1`` (CI, which builds the
environment) a missing environment fails instead. Start-up takes minutes (compilation and warm-up), bounded by the
server's ``startup_timeout``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from probe.attention import SegmentAttention
from probe.backends.openai import OpenAIBackend
from probe.config import load_config
from probe.loading import ModelCard, get_card
from probe.records import load_trials, read_jsonl
from probe.runfolder import RunFolder
from probe.runner import run_experiment
from probe.runner.forced import ENGINE_IDS
from tests.fixtures.experiment import tiny_experiment
from tests.serving import VllmServer, served_copy, vllm_python

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.served]

LOCAL = "smollm2-135m-instruct"
SERVED = "smollm2-vllm"
ATOL = 1e-5  # float32 sums of the same products in another order (one forced pass against decode steps)
STOP_AFTER = 3  # trials answered before the server is killed in the fault test


@pytest.fixture(scope="module")
def vllm(hf_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    if vllm_python() is None:
        why = ("no vLLM environment (.venv-vllm, or PROBE_VLLM_PYTHON): `make setup-vllm` builds it; this test needs "
               "it to start a real vLLM server")
        if os.environ.get("PROBE_REQUIRE_VLLM") == "1":
            pytest.fail(why + " (PROBE_REQUIRE_VLLM=1: this machine should have it)")
        pytest.skip(why)
    folder = served_copy(hf_folder, tmp_path_factory.mktemp("vllm") / "smollm2")
    server = VllmServer(folder, served_model=SERVED)
    started = time.perf_counter()
    server.start()
    print(f"\nvLLM ready in {time.perf_counter() - started:.0f} s")
    try:
        yield server
    finally:
        server.stop()


def write_experiment(folder: Path, server: VllmServer, models: list[Any] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    card = folder / f"{SERVED}.toml"
    card.write_text(
        f'name = "{SERVED}"\nsource = "api"\nbackend = "openai"\nbase_url = "{server.base_url}"\n'
        f'served_model = "{server.served_model}"\nmax_concurrency = 2\nmax_retries = 1\nrequest_timeout = 120.0\n'
        f'probe_with = "{LOCAL}"\n')
    return tiny_experiment(folder / "exp.toml", models or [card], experiment={"name": "vllm", "seed": 11},
                           ice={"conditions": None}, generation={"max_new_tokens": 24, "batch_size": 1},
                           probe={"enabled": True, "answer": True})


@pytest.fixture(scope="module")
def runs(vllm: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[RunFolder, RunFolder]:
    """The two-stage run through vLLM, and the local model probed while it generated, on the same prompts."""
    folder = tmp_path_factory.mktemp("two-stage")
    started = time.perf_counter()
    two = RunFolder(run_experiment(load_config(write_experiment(folder, vllm)), progress=False, device="cpu"))
    two_s = time.perf_counter() - started
    started = time.perf_counter()
    ref = RunFolder(run_experiment(load_config(write_experiment(folder / "ref", vllm, [LOCAL])), progress=False,
                                   device="cpu"))
    n = len(load_trials(ref.trials))
    print(f"\n{n} trials: two-stage through vLLM {two_s:.0f} s, local probed generation "
          f"{time.perf_counter() - started:.0f} s (one shared 2-core machine)")
    return two, ref


def by_prompt(run: RunFolder, model: str) -> dict[str, Any]:
    return {t.prompt_id: t for t in load_trials(run.trials) if t.model == model}


def assert_probes_equal(run: RunFolder, ref: RunFolder, pids: list[str]) -> None:
    for pid in pids:
        got = SegmentAttention.load(run.attention_record(SERVED, pid))
        want = SegmentAttention.load(ref.attention_record(LOCAL, pid))
        assert got.origin == ENGINE_IDS, pid
        assert max(got.max_differences(want).values()) <= ATOL, pid
        assert got.answer is not None and want.answer is not None
        np.testing.assert_array_equal(got.answer.tokens, want.answer.tokens)
        np.testing.assert_allclose(got.answer.mass, want.answer.mass, atol=ATOL, rtol=0)
        np.testing.assert_allclose(got.answer.vmass, want.answer.vmass, atol=ATOL, rtol=0)  # type: ignore[arg-type]
        np.testing.assert_array_equal(got.answer.chars, want.answer.chars)  # type: ignore[arg-type]


def test_the_server_tokenizes_prompts_as_the_local_card(vllm, runs):
    from probe.backends.local import LocalBackend
    from probe.loading import load_model
    from probe.records import load_prompts

    two, _ = runs
    prompt = load_prompts(two.prompts)[0]
    served = OpenAIBackend(ModelCard(name=SERVED, source="api", backend="openai", base_url=vllm.base_url,
                                     served_model=vllm.served_model))
    local = LocalBackend(load_model(get_card(LOCAL), device="cpu"))
    assert served.server_tokens(prompt) == list(local.tokenize(prompt).input_ids)


def test_two_stage_through_vllm_equals_local_probed_generation(runs):
    two, ref = runs
    counts = Counter(line["trial_id"] for line in read_jsonl(two.trials))
    assert counts and set(counts.values()) == {1}
    served, local = by_prompt(two, SERVED), by_prompt(ref, LOCAL)
    assert sorted(served) == sorted(local) and len(served) == 8
    for pid, t in served.items():
        assert t.error is None and t.output_ids is not None, pid  # vLLM returned the answer's ids
        assert (t.output, t.prompt_tokens, t.em) == (local[pid].output, local[pid].prompt_tokens, local[pid].em), pid
    assert len({t.output for t in served.values()}) > 1
    assert_probes_equal(two, ref, sorted(served))


def test_a_server_killed_mid_run_loses_and_doubles_nothing(vllm, runs, tmp_path, monkeypatch):
    """Runs last: it kills the module's server and starts it again."""
    two, ref = runs
    cfg = load_config(write_experiment(tmp_path, vllm))
    real = OpenAIBackend.generate

    def killing(self, prompts, gen, probe=None, intervention=None):
        for i, item in enumerate(real(self, prompts, gen, probe, intervention), 1):
            yield item
            if i == STOP_AFTER:
                os.killpg(vllm.pid, 9)  # type: ignore[arg-type]  # a crash of the server and its workers

    monkeypatch.setattr(OpenAIBackend, "generate", killing)
    run_experiment(cfg, progress=False, device="cpu")  # finishes: failures are records, not exceptions
    monkeypatch.setattr(OpenAIBackend, "generate", real)
    run = cfg.run_folder
    first = by_prompt(run, SERVED)
    failed = {pid for pid, t in first.items() if t.error is not None}
    assert len(first) == 8 and STOP_AFTER <= 8 - len(failed)
    assert failed and all(first[pid].output is None and first[pid].em is None for pid in failed)
    assert not any(run.attention_record(SERVED, pid).exists() for pid in failed)  # nothing to probe yet
    assert_probes_equal(run, ref, sorted(set(first) - failed))

    vllm.stop(grace=0.0)  # reap the killed process
    vllm.start()
    run_experiment(cfg, progress=False, device="cpu")  # the same command
    counts = Counter(line["trial_id"] for line in read_jsonl(run.trials))
    for pid in first:  # a failed trial: its error line, then its answer; the rest: once
        assert counts[f"{SERVED}::{pid}"] == (2 if pid in failed else 1), pid
    final = by_prompt(run, SERVED)
    assert all(t.error is None for t in final.values())
    assert {pid: t.output for pid, t in final.items()} == {pid: t.output for pid, t in by_prompt(two, SERVED).items()}
    assert_probes_equal(run, ref, sorted(final))
    shutil.rmtree(tmp_path, ignore_errors=True)
