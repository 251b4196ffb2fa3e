"""The served path end to end: a real ``transformers serve`` on 127.0.0.1 serving the embedded default model.

The GGUF default is exported once as a Hugging Face folder; one server (one CPU thread) serves it for the whole
module. The backend's answers are compared with ``model.generate`` run here on the same folder (same weights,
same chat template, greedy), truncation is read from ``finish_reason``, and a server stopped mid-run leaves
errors in the trial records that a rerun against the restarted server completes.

Needs the serving extra (``pip install "transformers[serving]"``); skipped with that reason where it is missing.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from probe.backends.base import Generation, build_messages
from probe.backends.openai import OpenAIBackend, RetryPolicy
from probe.config import GenerationSection
from probe.loading import ModelCard
from probe.records import TrialRecord, append_jsonl, load_trials, make_trial_id
from probe.runner.folder import done_ids
from tests.serving import LocalServer
from probe.types import Prompt, Segment

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.served]

MAX_NEW = 40
TEXTS = (
    "Answer in one word: what colour is the sky on a clear day?",
    "Lena was born in Oslo. Oslo is the capital of Norway. In which country was Lena born? "
    "Put the final answer in \\boxed{}.",
    "Write a long story about a dragon who learns to bake bread, with many details.",
    "What is 12 plus 30? Reply with the number only.",
)


def make_prompt(i: int, text: str) -> Prompt:
    return Prompt(prompt_id=f"served{i}", task_id=f"t{i}", source="synthetic", condition="Control", load=0,
                  achieved_load=0.0, replication=0, text=text, segments=(Segment("question", 0, len(text)),))


PROMPTS = [make_prompt(i, t) for i, t in enumerate(TEXTS)]


def card_for(server: LocalServer, **kw: object) -> ModelCard:
    values: dict = dict(name="smollm2-served", source="api", backend="openai", base_url=server.base_url,
                        served_model=server.served_model, max_concurrency=2, request_timeout=120.0)
    values.update(kw)
    return ModelCard(**values)


@pytest.fixture(scope="module")
def reference(hf_folder: Path) -> dict[tuple[str, int], tuple[str, int, list[int], bool]]:
    """Local greedy ``model.generate`` on the same folder and chat template, one prompt at a time.

    Returns:
        (prompt_id, max_new_tokens) -> (text, n_prompt_tokens, generated ids up to and with the end token,
        truncated).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_folder)
    model = AutoModelForCausalLM.from_pretrained(hf_folder, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    eos_ids = {eos} if isinstance(eos, int) else set(eos)
    out = {}
    for p in PROMPTS:
        ids = tok.apply_chat_template(build_messages(p), add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]
        with torch.inference_mode():
            seq = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=MAX_NEW, temperature=None, top_p=None, top_k=None)
        generated = seq[0, ids.shape[1] :].tolist()
        # Greedy decoding is prefix-consistent: the answer under a limit of 4 tokens is the first 4 of this one.
        for max_new in (MAX_NEW, 4):
            new = generated[:max_new]
            cut = next((j for j, t in enumerate(new) if t in eos_ids), None)
            kept = new if cut is None else new[: cut + 1]
            truncated = cut is None and len(new) >= max_new
            out[(p.prompt_id, max_new)] = (tok.decode(kept, skip_special_tokens=True), ids.shape[1], kept, truncated)
    return out


def run(backend: OpenAIBackend, prompts: list[Prompt], max_new: int) -> dict[str, Generation]:
    return {p.prompt_id: g for p, g in backend.generate(prompts, GenerationSection(max_new_tokens=max_new))}


def test_served_answers_equal_local_greedy_generate(server, reference):
    with OpenAIBackend(card_for(server), seed=0) as backend:
        out = run(backend, PROMPTS, MAX_NEW)
    assert sorted(out) == sorted(p.prompt_id for p in PROMPTS)
    # The prompts exercise both endings: at least one answer stops by itself, at least one hits the limit.
    assert {reference[(p.prompt_id, MAX_NEW)][3] for p in PROMPTS} == {True, False}
    for p in PROMPTS:
        text, n_prompt, kept, truncated = reference[(p.prompt_id, MAX_NEW)]
        g = out[p.prompt_id]
        assert g.error is None, g.error
        assert g.text == text, p.prompt_id
        assert g.truncated == truncated, p.prompt_id
        assert g.prompt_tokens == n_prompt  # the server applied the same chat template
        assert g.completion_tokens == len(kept)  # the server counts the end token it generated


def test_served_answers_are_deterministic_across_requests(server, reference):
    with OpenAIBackend(card_for(server, max_concurrency=1), seed=0) as backend:
        first = run(backend, PROMPTS[:2], MAX_NEW)
        second = run(backend, PROMPTS[:2], MAX_NEW)
    assert {k: g.text for k, g in first.items()} == {k: g.text for k, g in second.items()}


def test_truncation_comes_from_finish_reason(server, reference):
    with OpenAIBackend(card_for(server)) as backend:
        out = run(backend, PROMPTS, 4)
    for p in PROMPTS:
        text, _, kept, truncated = reference[(p.prompt_id, 4)]
        assert out[p.prompt_id].truncated == truncated
        assert out[p.prompt_id].text == text
    assert out["served2"].truncated and out["served2"].completion_tokens == 4  # the story cannot end in 4 tokens


def _record(model: str, p: Prompt, g: Generation) -> dict:
    return TrialRecord(
        trial_id=make_trial_id(model, p.prompt_id), model=model, prompt_id=p.prompt_id, task_id=p.task_id,
        source=p.source, condition=p.condition, load=p.load, achieved_load=p.achieved_load,
        replication=p.replication, prompt_tokens=g.prompt_tokens or 0, output=g.text, answer=None, gold="",
        em=None, hop_recall=None, truncated=g.truncated, uninterpretable=False, error=g.error,
        completion_tokens=g.completion_tokens,
    ).to_dict()


def test_server_stopped_mid_run_leaves_errors_that_a_rerun_completes(server, reference, tmp_path):
    """Runs last in this module: it stops the shared server and starts it again."""
    path = tmp_path / "trials.jsonl"
    card = card_for(server, max_concurrency=1)
    retry = RetryPolicy(max_retries=1, base_backoff=0.05, max_backoff=0.1)
    with OpenAIBackend(card, retry=retry) as backend:
        for i, (p, g) in enumerate(backend.generate(PROMPTS, GenerationSection(max_new_tokens=MAX_NEW))):
            append_jsonl(path, [_record(card.name, p, g)])
            if i == 0:
                server.stop(grace=0.0)  # a crash: in-flight and later requests meet a dead port
    first = {t.prompt_id: t for t in load_trials(path)}
    assert len(first) == len(PROMPTS)
    failed = [pid for pid, t in first.items() if t.error is not None]
    assert len(failed) >= len(PROMPTS) - 2, "requests after the stop must fail"
    for pid in failed:
        assert first[pid].output is None and "connection failed" in (first[pid].error or "")

    server.start()
    done = done_ids(tmp_path)
    todo = [p for p in PROMPTS if make_trial_id(card.name, p.prompt_id) not in done]
    assert sorted(p.prompt_id for p in todo) == sorted(failed)
    with OpenAIBackend(card, retry=retry) as backend:
        append_jsonl(path, [_record(card.name, p, g) for p, g in backend.generate(todo, GenerationSection(
            max_new_tokens=MAX_NEW))])
    final = {t.prompt_id: t for t in load_trials(path)}
    assert done_ids(tmp_path) == {make_trial_id(card.name, p.prompt_id) for p in PROMPTS}
    for p in PROMPTS:
        assert final[p.prompt_id].output == reference[(p.prompt_id, MAX_NEW)][0]


class _ServerWithAWorker(LocalServer):
    """A stand-in server that starts a worker of its own, as vLLM's API server does: ``python -m http.server`` on a
    folder holding ``health``, after a shell has started ``sleep`` in the background and written its pid."""

    def __init__(self, folder: Path) -> None:
        (folder / "health").write_text("ok")
        super().__init__(folder, startup_timeout=30.0)
        self.worker_pid_file = folder / "worker.pid"

    def _check_prerequisites(self) -> None:
        pass

    def start(self) -> str:
        (self.model_dir / "config.json").write_text("{}")
        return super().start()

    def _command(self) -> list[str]:
        script = (f"sleep 300 & echo $! > {self.worker_pid_file}; "
                  f"exec {sys.executable} -m http.server {self.port} --bind 127.0.0.1 --directory {self.model_dir}")
        return ["sh", "-c", script]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


@pytest.mark.parametrize("crash", [False, True], ids=["stopped", "killed, then stopped"])
def test_stopping_a_server_ends_the_workers_it_started(tmp_path, crash):
    """A killed API server left vLLM's engine core and worker running, each busy on a core, after the test had
    ended; stop() ends the server's whole process group, even after the server itself was killed."""
    server = _ServerWithAWorker(tmp_path)
    server.start()
    worker = int(server.worker_pid_file.read_text())
    assert _alive(worker)
    if crash:
        os.kill(server.pid, 9)  # type: ignore[arg-type]  # the server alone dies; its worker is orphaned
        time.sleep(0.5)
        assert _alive(worker)
    server.stop(grace=5.0)
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)
