"""Generation backends, by name: a local transformers model (with probes) or a served OpenAI-compatible endpoint, and
any backend registered beside them (:mod:`probe.backends.registry`; the runner sees only the
:class:`~probe.backends.base.Backend` protocol)."""

from __future__ import annotations

from probe.backends.base import Backend, Capabilities, Generation, ProbingBackend, build_messages, probing
from probe.backends.local import LocalBackend
from probe.backends.registry import BackendEntry, capabilities, check_card, check_probe_supported, register_backend
from probe.loading import ModelCard


def make_backend(card: ModelCard, device: str | None = None, seed: int = 0) -> Backend:
    """The backend of a card, made by its registered entry: a loaded local model, or a client of its served
    endpoint.

    ``seed`` is the experiment's: a local model samples from it (``temperature > 0``), a served one gets it as the
    request's ``seed``. (A served backend's retry jitter is drawn from the system: it spreads retry times and
    reaches no record.)

    Raises:
        ConfigError: the card names no registered backend, or does not hold what its backend needs.
    """
    return check_card(card).make(card, device, seed)


__all__ = ["Backend", "BackendEntry", "Capabilities", "Generation", "LocalBackend", "ProbingBackend", "build_messages", "capabilities",
           "check_card", "check_probe_supported", "make_backend", "probing", "register_backend"]
