"""One generic registry: named entries, duplicates refused, "did you mean" on a typo, optional lazy import.

Task sources, task families, report sections and attention measures are each a :class:`Registry`. An entry is
registered once under its name; a second registration under the same name is an error (two modules claiming one
name is a bug, not an override). A look-up of an unknown name raises :class:`~probe.errors.UnknownNameError`,
which lists close matches and every registered name.

A registry may name a module per entry that registers it on import (``lazy``), or a module pattern such as
``"probe.report.{name}"``: the first look-up of such a name imports that module, so ``import probe`` stays cheap.

    >>> colours: Registry[int] = Registry("colour")
    >>> colours.register("red", 1)
    1
    >>> colours.get("red")
    1
    >>> colours.get("rde")
    Traceback (most recent call last):
    ...
    probe.errors.UnknownNameError: unknown colour 'rde'; did you mean 'red'? (valid: red)
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from probe.errors import ProbeError, UnknownNameError

T = TypeVar("T")


class DuplicateEntryError(ProbeError):
    """A name is registered twice in one registry."""


class Registry(Generic[T]):
    """Named entries of one kind.

    Args:
        kind: what an entry is, for messages ("task source", "attention measure").
        lazy: name -> the module whose import registers that entry.
        module_pattern: for a name neither registered nor in ``lazy``, the module to try, with ``{name}`` filled in
            (``"probe.report.{name}"``); a missing module is an unknown name.
    """

    def __init__(self, kind: str, *, lazy: Mapping[str, str] | None = None,
                 module_pattern: str | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._lazy = dict(lazy or {})
        self._pattern = module_pattern

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

    def _import_for(self, name: str) -> None:
        module = self._lazy.get(name) or (self._pattern.format(name=name) if self._pattern else None)
        if module is None:
            return
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            return
        if name not in self._entries:
            raise ProbeError(f"{module} registers no {self.kind} {name!r}; register it there")

    def get(self, name: str) -> T:
        """The entry registered as ``name``, importing its module first where one is named.

        Raises:
            UnknownNameError: no such entry (the message suggests close matches).
        """
        if name not in self._entries:
            self._import_for(name)
        if name not in self._entries:
            raise UnknownNameError(self.kind, name, self.names())
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        """Registered names (lazily importable ones included), in registration order."""
        return tuple(dict.fromkeys([*self._entries, *self._lazy]))

    def load_all(self) -> None:
        """Import every lazily named entry, so iteration sees them all."""
        for name in list(self._lazy):
            if name not in self._entries:
                self._import_for(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._lazy

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

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"


__all__ = ["DuplicateEntryError", "Registry"]
