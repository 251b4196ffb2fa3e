"""A served model behind an OpenAI-compatible chat-completions API: behaviour; its attention only through a local card
of the same weights named in ``probe_with`` (docs/performance.md#behavioural-sweeps-against-a-vllm-deployment)."""

from __future__ import annotations

import email.utils
import json
import logging
import os
import random
import re
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import httpx

from probe.backends.base import SERVED, Generation, build_messages
from probe.config import GenerationSection
from probe.probe_options import ProbeOptions
from probe.errors import ConfigError, ProbeError
from probe.loading import check_key_variable
from probe.types import Prompt

if TYPE_CHECKING:
    from probe.interventions import Intervention
    from probe.loading import ModelCard

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})  # and every other 5xx
FATAL_STATUS = frozenset({401, 403, 404})
# Phrases servers use for a prompt longer than the context window (OpenAI, vLLM, SGLang, llama-server, Gemini).
CONTEXT_PHRASES = (
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "exceeds the context",
    "context size",
    "exceed_context_size",
    "input token count",
    "too many tokens",
)


class EndpointError(ProbeError):
    """A served endpoint refuses every request (bad key, wrong URL, unknown model): fix the card or the key."""


def read_api_key(api_key_env: str | None, where: str) -> str | None:
    """The API key from the environment variable named ``api_key_env`` (None when no variable is named).

    Args:
        api_key_env: the variable's NAME (never the key itself); None for a local server without a key.
        where: the card, for the error message.

    Raises:
        ConfigError: the variable is named but unset or empty.
    """
    if not api_key_env:
        return None
    check_key_variable(api_key_env, where)
    key = os.environ.get(api_key_env, "").strip()
    if not key:
        raise ConfigError(
            f"{where}: api_key_env = {api_key_env!r}, but the environment variable {api_key_env} is not set; "
            f"export {api_key_env}=<your key> (or remove api_key_env from the card for a server that needs no key)"
        )
    bad = next(((i, c) for i, c in enumerate(key) if not " " <= c <= "~"), None)
    if bad is not None:  # the key is never quoted: only where it breaks and what is there
        what = ("a line break" if bad[1] in "\r\n" else "a control character" if ord(bad[1]) < 32 or bad[1] == "\x7f"
                else "a non-ASCII character")
        raise ConfigError(
            f"{where}: the value of {api_key_env} holds {what} at character {bad[0] + 1} of {len(key)}, which no HTTP "
            f"header can carry; set it to the key alone on one line (e.g. export {api_key_env}=\"$(head -n1 FILE)\" "
            "for a key file with more than one line)"
        )
    return key


_sleep = time.sleep  # where the backend waits between attempts (the tests record the waits here)

_BEARER = re.compile(r"(?i)\b(bearer)(\s+|\s*[:=]\s*)[^\s'\"\\]+")


def scrub_secret(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` taken out in every form an error message may quote it: as it is, escaped as Python's
    ``repr`` of the str or of its UTF-8 bytes writes it (as h11 and httpx quote a header), and each run of four or more
    of its letters, digits and ``-_+/=.`` (so a key cut short by a truncated message is gone too); any remaining
    ``Bearer <token>`` is blanked as well. Each removal reads ``<key>``."""
    if secret:
        forms = {secret, repr(secret)[1:-1], secret.encode("unicode_escape").decode("ascii"),
                 repr(secret.encode("utf-8", "backslashreplace"))[2:-1],
                 *re.findall(r"[A-Za-z0-9_\-+/=.]{4,}", secret)}
        for form in sorted(forms, key=len, reverse=True):
            text = text.replace(form, "<key>")
    return _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}<key>", text)


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait between attempts of one request.

    The wait before retry ``i`` (0-based) is ``min(max_backoff, base_backoff * 2**i)`` scaled by a uniform
    jitter factor in ``[0.5, 1.0]``, and at least the server's ``Retry-After`` (itself capped at
    ``max_retry_after``). All times in seconds.
    """

    max_retries: int = 6
    base_backoff: float = 1.0
    max_backoff: float = 60.0
    max_retry_after: float = 300.0

    def delay(self, retry: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry number ``retry`` (0 = the first retry)."""
        backoff = min(self.max_backoff, self.base_backoff * 2.0**retry) * rng.uniform(0.5, 1.0)
        if retry_after is not None:
            return max(backoff, min(retry_after, self.max_retry_after))
        return backoff


def parse_retry_after(headers: httpx.Headers) -> float | None:
    """Seconds a server asks to wait: ``retry-after-ms``, or ``Retry-After`` as seconds or an HTTP date."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class OpenAIBackend:
    """Generations from an OpenAI-compatible ``/chat/completions`` endpoint, several requests in flight.

    Thread-safe for one ``generate`` call at a time; ``close`` (or ``with``) releases the connection pool.
    """

    def __init__(
        self,
        card: "ModelCard",
        *,
        seed: int | None = 0,
        retry: RetryPolicy | None = None,
        rng_seed: int | None = None,
    ) -> None:
        """Set up a client for a card with ``backend = "openai"``; nothing is sent until ``generate``.

        Args:
            card: the model card (``base_url``, ``served_model``, ``api_key_env``, ``max_concurrency``,
                ``request_timeout``, ``max_retries``); its name is recorded as the trial's model.
            seed: the ``seed`` request field, e.g. the experiment's seed (None: not sent). Dropped for the rest of
                the run if the server rejects it.
            retry: the retry policy; None uses ``RetryPolicy(max_retries=card.max_retries)``.
            rng_seed: seed of the backoff jitter (None: from the system), for reproducible tests.

        Raises:
            ConfigError: the card is not a served card, a value is out of range, or the key variable is unset.
        """
        where = card.card_path or card.name
        if card.backend != "openai" or not card.base_url or not card.served_model:
            raise ConfigError(f"{where}: the OpenAI-compatible backend needs backend = 'openai', base_url and "
                              "served_model")
        if not card.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}: base_url: {card.base_url!r} must start with http:// or https://")
        if card.max_concurrency < 1:
            raise ConfigError(f"{where}: max_concurrency: {card.max_concurrency} must be >= 1")
        if card.request_timeout <= 0:
            raise ConfigError(f"{where}: request_timeout: {card.request_timeout} must be > 0 seconds")
        if card.max_retries < 0:
            raise ConfigError(f"{where}: max_retries: {card.max_retries} must be >= 0")
        api_key = read_api_key(card.api_key_env, where)
        self.model_name = card.name
        self.base_url = card.base_url.rstrip("/")
        self.served_model = card.served_model
        self.max_concurrency = card.max_concurrency
        self.retry = retry or RetryPolicy(max_retries=card.max_retries)
        self.seed = seed
        # a two-stage card (probe_with) asks the engine for the answer's token ids (vLLM's return_token_ids),
        # which the teacher-forced probe reads in place of re-tokenising the text; dropped if the server refuses it
        self.token_ids = card.probe_with is not None
        self._use_max_completion_tokens = False
        self._rng = random.Random(rng_seed)
        self._lock = threading.Lock()
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        timeout = httpx.Timeout(card.request_timeout, connect=min(10.0, card.request_timeout))
        limits = httpx.Limits(max_connections=card.max_concurrency, max_keepalive_connections=card.max_concurrency)
        self._client = httpx.Client(headers=headers, timeout=timeout, limits=limits)
        self._secret = api_key  # only ever used to take the key out of what is recorded or logged

    def _scrub(self, text: str) -> str:
        return scrub_secret(text, self._secret)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "OpenAIBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    capabilities = SERVED  # a served model gives text only: no attention, no edit inside the model
    revision = None

    def layers_and_heads(self) -> tuple[int, int]:
        raise ConfigError(f"model {self.model_name!r} is served: its layers and heads are not known here")

    def generate(self, prompts: list[Prompt], gen: GenerationSection, probe: ProbeOptions | None = None,
                 intervention: Intervention | None = None) -> Iterator[tuple[Prompt, Generation]]:
        """Send every prompt, at most ``max_concurrency`` at a time; yield each as its answer arrives.

        Args:
            prompts: the prompts, each yielded exactly once (in completion order, not input order).
            gen: ``max_new_tokens``, ``temperature``, ``top_p``.
            probe, intervention: must be None (a served model gives text only).

        Raises:
            EndpointError: the server answered 401, 403 or 404 (checked before anything more is sent).
            ConfigError: a probe or an intervention was asked for.
        """
        if probe is not None or intervention is not None:
            raise ConfigError(f"model {self.model_name!r} is served: probes and interventions need local weights "
                              "(a served model gives text only)")
        if not prompts:
            return
        pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix=f"{self.model_name}-http")
        try:
            pending: dict[Future[Generation], Prompt] = {}
            queue = iter(prompts)
            for p in queue:  # keep at most max_concurrency submitted, so a fatal error stops further requests
                pending[pool.submit(self._complete, p, gen)] = p
                if len(pending) >= self.max_concurrency:
                    break
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    prompt = pending.pop(fut)
                    result = fut.result()  # EndpointError propagates
                    nxt = next(queue, None)
                    if nxt is not None:
                        pending[pool.submit(self._complete, nxt, gen)] = nxt
                    yield prompt, result
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def server_tokens(self, prompt: Prompt) -> list[int] | None:
        """The server's token ids of a prompt's chat messages with the generation prompt (vLLM's ``/tokenize``,
        beside ``/v1``), or None where the server has no such endpoint or does not answer it."""
        root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        body = {"model": self.served_model, "messages": build_messages(prompt), "add_generation_prompt": True}
        try:
            resp = self._client.post(f"{root}/tokenize", json=body)
            tokens = resp.json().get("tokens") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return [int(t) for t in tokens] if isinstance(tokens, list) else None

    # ----- one request -----

    def _body(self, prompt: Prompt, gen: GenerationSection) -> dict[str, object]:
        body: dict[str, object] = {
            "model": self.served_model,
            "messages": build_messages(prompt),
            "temperature": gen.temperature,
            "top_p": gen.top_p,
            "stream": False,
        }
        with self._lock:
            body["max_completion_tokens" if self._use_max_completion_tokens else "max_tokens"] = gen.max_new_tokens
            if self.seed is not None:
                body["seed"] = self.seed
            if self.token_ids:
                body["return_token_ids"] = True
        return body

    def _complete(self, prompt: Prompt, gen: GenerationSection) -> Generation:
        """One prompt, with retries. Never raises except ``EndpointError``."""
        url = f"{self.base_url}/chat/completions"
        n_attempts = 0
        n_adapted = 0
        last = ""
        while True:
            n_attempts += 1
            retry_after: float | None = None
            body = self._body(prompt, gen)
            try:
                resp = self._client.post(url, json=body)
            except httpx.TimeoutException as e:
                last = f"timed out ({type(e).__name__})"
            except httpx.TransportError as e:  # refused, reset, dropped mid-response; may quote the request's headers
                last = f"connection failed ({type(e).__name__}: {self._scrub(str(e))})"
            else:
                status = resp.status_code
                if status == 200:
                    try:
                        return _parse_completion(resp.json())
                    except (ValueError, KeyError, IndexError, TypeError) as e:
                        last = self._scrub(f"malformed response ({type(e).__name__}: {e}): {resp.text[:200]!r}")
                        # a garbled body is treated like a server error: retried
                else:
                    message = self._scrub(_error_message(resp))
                    if status in FATAL_STATUS:
                        raise EndpointError(
                            f"{self.model_name}: {url} answered HTTP {status} ({message}); check base_url, "
                            f"served_model ({self.served_model!r}) and the API key in the model card"
                        )
                    if status in (400, 422):
                        if n_adapted < 2 and self._adapt(body, message):
                            n_adapted += 1
                            n_attempts -= 1  # a changed request is not a retry
                            continue
                        if _is_context_overflow(message):
                            return Generation(text=None, truncated=False, skip_reason=f"longer than the model's "
                                              f"context window (HTTP {status}: {message})")
                        return Generation(text=None, truncated=False, error=f"HTTP {status}: {message}")
                    last = f"HTTP {status}: {message}"
                    if status not in RETRYABLE_STATUS and status < 500:
                        return Generation(text=None, truncated=False, error=last)
                    retry_after = parse_retry_after(resp.headers)
            if n_attempts > self.retry.max_retries:
                log.warning("%s: prompt %s failed after %d attempts: %s", self.model_name, prompt.prompt_id,
                            n_attempts, last)
                return Generation(text=None, truncated=False, error=f"{last} (after {n_attempts} attempts)")
            with self._lock:
                delay = self.retry.delay(n_attempts - 1, retry_after, self._rng)
            log.info("%s: prompt %s attempt %d: %s; retrying in %.2f s", self.model_name, prompt.prompt_id,
                     n_attempts, last, delay)
            _sleep(delay)

    def _adapt(self, body: dict[str, object], message: str) -> bool:
        """Change the request for a server that rejects one of its parameters; True if something changed."""
        low = message.lower()
        with self._lock:
            if "seed" in body and "seed" in low:
                log.warning("%s: the server rejects `seed` (%s); sending requests without it", self.model_name, message)
                self.seed = None
                return True
            if "return_token_ids" in body and "return_token_ids" in low:
                log.warning("%s: the server rejects `return_token_ids` (%s); the probe re-tokenises the answers",
                            self.model_name, message)
                self.token_ids = False
                return True
            if "max_tokens" in body and "max_completion_tokens" in low:
                log.warning("%s: the server wants `max_completion_tokens` in place of `max_tokens`", self.model_name)
                self._use_max_completion_tokens = True
                return True
        return False


def _parse_completion(data: dict) -> Generation:
    """A ``chat.completion`` JSON object -> Generation (text, truncated, usage, and the answer's token ids where the
    server returned them: vLLM's ``choices[0].token_ids``)."""
    choice = data["choices"][0]
    text = choice["message"].get("content") or ""
    usage = data.get("usage") or {}
    ids = choice.get("token_ids")
    n_tokens = usage.get("completion_tokens")
    if isinstance(ids, list) and ids and choice.get("finish_reason") == "stop" and choice.get("stop_reason") is None:
        # vLLM stopped at the model's end token (a stop string or stop id would be its stop_reason): its ids and its
        # count include that token, which a local run does not count as written
        n_tokens = len(ids) - 1
    return Generation(
        text=text,
        truncated=choice.get("finish_reason") == "length",
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=n_tokens,
        output_ids=tuple(int(i) for i in ids) if isinstance(ids, list) else None,
    )


def _error_message(resp: httpx.Response) -> str:
    """The server's error text: ``error.message`` (and ``error.code``) of an OpenAI error body, else the body."""
    try:
        data = resp.json()
    except (ValueError, json.JSONDecodeError):
        return resp.text[:300].strip() or resp.reason_phrase
    if isinstance(data, list) and data:  # Gemini wraps its error in a list
        data = data[0]
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data))
        if isinstance(err, dict):
            msg = str(err.get("message") or err)
            code = err.get("code")
            return f"{msg} [{code}]" if code and str(code) not in msg else msg
        return str(err)[:300]
    return str(data)[:300]


def _is_context_overflow(message: str) -> bool:
    low = message.lower()
    return any(p in low for p in CONTEXT_PHRASES)
