"""Backends by name: what each can do, known from its card before anything loads, and how it is made
(docs/architecture.md#extending-the-toolkit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from probe.backends.base import LOCAL, SERVED, Backend, Capabilities
from probe.errors import ConfigError, UnknownNameError
from probe.registry import Registry


@dataclass(frozen=True)
class BackendEntry:
    """One backend as registered: its name (a card's ``backend``), its capabilities, how it is made from a card
    (``make(card, device, seed)``), and what a card of it must hold (``check(card)``: the problems, in words)."""

    name: str
    capabilities: Capabilities
    make: Callable[[Any, str | None, int], Backend]
    check: Callable[[Any], list[str]] = lambda card: []


BACKENDS: Registry[BackendEntry] = Registry("backend")


def register_backend(entry: BackendEntry) -> BackendEntry:
    """Register a backend (a card then names it in ``backend``). Returns it.

    Raises:
        DuplicateEntryError: another backend has the name.
    """
    return BACKENDS.register(entry.name, entry)


def _make_local(card: Any, device: str | None, seed: int) -> Backend:
    from probe.backends.local import LocalBackend
    from probe.loading import load_model  # looked up when called (a test may stand in for it)

    return LocalBackend(load_model(card, device=device), seed=seed)


def _make_openai(card: Any, device: str | None, seed: int) -> Backend:
    from probe.backends.openai import OpenAIBackend

    return OpenAIBackend(card, seed=seed)


def _check_openai(card: Any) -> list[str]:
    return [] if card.base_url and card.served_model else ["backend = 'openai' needs `base_url` and `served_model`"]


def _builtins() -> None:
    register_backend(BackendEntry("transformers", LOCAL, _make_local))
    register_backend(BackendEntry("openai", SERVED, _make_openai, _check_openai))


def backend_entry(name: str, where: str = "backend") -> BackendEntry:
    """The registered backend ``name`` (the toolkit's own are registered on first use).

    Raises:
        ConfigError: no backend of that name (``where`` names the card field; the close names are suggested).
    """
    if "transformers" not in BACKENDS:
        _builtins()
    try:
        return BACKENDS.get(name)
    except UnknownNameError as e:
        raise ConfigError(f"{where}: {e}") from None


def check_card(card: Any) -> BackendEntry:
    """A card held to its backend: the backend exists, the card holds what that backend needs, and ``probe_with``
    (the local card that probes a served model's answers) is named only by a card that runs no local weights.

    Raises:
        ConfigError: naming the card and the field.
    """
    where = card.card_path or card.name
    entry = backend_entry(card.backend, f"{where}: backend")
    for problem in entry.check(card):
        raise ConfigError(f"{where}: {problem}")
    if card.probe_with is not None and entry.capabilities.local:
        raise ConfigError(f"{where}: probe_with names the local card that probes a served model's answers; this card "
                          "has local weights and probes its own: remove probe_with")
    return entry


def capabilities(card: Any) -> Capabilities:
    """What the backend of ``card`` can do, known before anything loads (:func:`check_card` first).

    Raises:
        ConfigError: the card does not hold to its backend.
    """
    return check_card(card).capabilities


def check_probe_supported(card: Any) -> None:
    """Refuse attention probes on a card that runs no local weights and names no local card to probe its answers
    with (``probe_with``: a two-stage run), or names one that cannot.

    Raises:
        ConfigError: the card is served without ``probe_with``; ``probe_with`` names no card, or a served one.
    """
    if capabilities(card).local:
        return
    where = card.card_path or card.name
    if card.probe_with is None:
        raise ConfigError(
            f"{where}: model {card.name!r} is served (backend = {card.backend!r}, {card.base_url}); attention probes "
            "need local weights. Name the local card of the same weights in the card's `probe_with` (a two-stage run: "
            "the server writes the answers, the local weights probe them), set `[probe] enabled = false`, or use a "
            "card with local weights (source = package | gguf | local | hub)"
        )
    from probe.loading import get_card

    if not capabilities(get_card(card.probe_with)).local:
        raise ConfigError(f"{where}: probe_with: {card.probe_with!r} is a served card; name a card with local weights "
                          "(source = package | gguf | local | hub) of the model this server serves")


__all__ = ["BACKENDS", "BackendEntry", "Capabilities", "backend_entry", "capabilities", "check_card",
           "check_probe_supported", "register_backend"]
