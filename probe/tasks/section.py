"""A ``[[tasks]]`` section and the registry of the task sources it names.

The section belongs to the tasks: it says which source to draw from and that source's options, and it is checked
against the registry of sources (:data:`SOURCES`) when it is made. The built-in sources are registered by
:mod:`probe.tasks`; a new one is a :class:`TaskSource` passed to :func:`register_source`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal

from probe.errors import ConfigError, FieldError
from probe.registry import Registry

if TYPE_CHECKING:
    from probe.types import Task

Layout = Literal["ice", "native", "task"]


@dataclass(frozen=True)
class TaskSection:
    """One ``[[tasks]]`` table: the source and its options. An experiment may list several.

    Attributes:
        source: a registered source's name.
        options: that source's options (an instance of its :attr:`TaskSource.options_type`; None: its defaults).
            ``TaskSection.of("synthetic", n=9, hops=3)`` makes both from keyword values.
    """

    source: str
    options: Any = None

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise FieldError("tasks", "source", f"{self.source!r} is not one of {', '.join(SOURCES.names())}")
        kind = SOURCES.get(self.source).options_type
        if self.options is None:
            object.__setattr__(self, "options", kind())
        elif not isinstance(self.options, kind):
            raise ConfigError(f"tasks: source {self.source!r} takes {kind.__name__}, got "
                              f"{type(self.options).__name__}")

    @classmethod
    def of(cls, source: str, **values: Any) -> "TaskSection":
        """The section of ``source`` with these option values (the keys of its ``[[tasks]]`` table).

        Raises:
            ConfigError: an unknown source, or a key the source does not read (naming the keys it reads).
        """
        if source not in SOURCES:
            raise FieldError("tasks", "source", f"{source!r} is not one of {', '.join(SOURCES.names())}")
        SOURCES.get(source).check_keys(values)
        return cls(source, SOURCES.get(source).options_type(**values))

    @property
    def n(self) -> int:
        """The source's ``n`` (every source reads it)."""
        return int(self.options.n)


@dataclass(frozen=True, kw_only=True)
class TaskSource:
    """One task source (see :mod:`probe.tasks`).

    Attributes:
        name: the ``source`` value of a ``[[tasks]]`` section.
        load: ``(options, seed) -> tasks`` in a fixed order.
        layout: ``ice``, ``native`` or ``task``.
        family: the name of its family (:func:`probe.tasks.get_family`).
        options_type: the frozen dataclass of its options (:mod:`probe.tasks.options`); its fields are the
            ``[[tasks]]`` keys the source reads besides ``source``, with their defaults.
        description: one line for listings.
    """

    name: str
    load: Callable[[Any, int], list["Task"]]
    layout: Layout
    family: str
    options_type: type
    description: str

    @property
    def options(self) -> frozenset[str]:
        """The ``[[tasks]]`` keys the source reads (besides ``source``)."""
        return frozenset(f.name for f in fields(self.options_type))

    def check_keys(self, keys: Iterable[str]) -> None:
        """Refuse a ``[[tasks]]`` key this source does not read: it would be silently ignored.

        Raises:
            FieldError: naming the first such key and the keys the source reads.
        """
        idle = sorted(set(keys) - self.options)
        if idle:
            raise FieldError("tasks", idle[0], f"has no effect for source {self.name!r} (it reads "
                             f"{', '.join(sorted(self.options))}); remove it")

    def is_native(self, task: "Task") -> bool:
        """Whether ``task`` is laid out from its own segments (else the ICE builder makes its conditions)."""
        if self.layout == "task":
            return bool(task.segments)
        return self.layout == "native"

    @property
    def uses_ice(self) -> bool:
        """Whether the ``[ice]`` section (conditions, loads, replications, distractors) can affect its prompts."""
        return self.layout != "native"


SOURCES: Registry[TaskSource] = Registry("task source")


def register_source(source: TaskSource) -> TaskSource:
    """Register ``source`` under its name and return it.

    Raises:
        DuplicateEntryError: a source of that name is registered already.
    """
    return SOURCES.register(source.name, source)


def get_source(name: str) -> TaskSource:
    """The registered source ``name``.

    Raises:
        UnknownNameError: naming close matches and the registered sources.
    """
    return SOURCES.get(name)


__all__ = ["Layout", "SOURCES", "TaskSection", "TaskSource", "get_source", "register_source"]
