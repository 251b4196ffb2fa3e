"""Generation backends: a local transformers model (with probes) or a served OpenAI-compatible endpoint.

:func:`make_backend` turns a model card into the backend that runs it; the runner sees only the
:class:`~probe.backends.base.Backend` protocol.
"""

from __future__ import annotations

from probe.backends.base import Backend, Generation, build_messages
from probe.backends.local import LocalBackend
from probe.loading import ModelCard


def make_backend(card: ModelCard, device: str | None = None, seed: int = 0) -> Backend:
    """The backend of a card: a loaded local model, or a client of its served endpoint.

    ``seed`` is the experiment's: a local model samples from it (``temperature > 0``), a served one gets it as the
    request's ``seed``. (A served backend's retry jitter is drawn from the system: it spreads retry times and
    reaches no record.)
    """
    if card.backend == "openai":
        from probe.backends.openai import OpenAIBackend

        return OpenAIBackend(card, seed=seed)
    from probe.loading import load_model  # looked up when called (a test may stand in for it)

    return LocalBackend(load_model(card, device=device), seed=seed)


__all__ = ["Backend", "Generation", "LocalBackend", "build_messages", "make_backend"]
