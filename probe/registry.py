"""One generic registry: named entries, duplicates refused, "did you mean" on a typo."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from probe.errors import ProbeError, UnknownNameError

T = TypeVar("T")


class DuplicateEntryError(ProbeError):
    """A name is registered twice in one registry."""


class Registry(Generic[T]):
    """Named entries of one kind.

    Args:
        kind: what an entry is, for messages ("task source", "attention measure").
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        """Add ``entry`` under ``name`` and return it.

        Raises:
            DuplicateEntryError: ``name`` is registered already.
        """
        if name in self._entries:
            raise DuplicateEntryError(f"{self.kind} {name!r} is registered already; choose another name")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests that register a toy entry take it out again)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        """The entry registered as ``name``.

        Raises:
            UnknownNameError: no such entry (the message suggests close matches).
        """
        if name not in self._entries:
            raise UnknownNameError(self.kind, name, self.names())
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """The registered (name, entry) pairs, in registration order."""
        return list(self._entries.items())

    def values(self) -> list[T]:
        """The registered entries, in registration order."""
        return list(self._entries.values())
