"""A ``[[tasks]]`` section and the registry of the task sources it names.

The section belongs to the tasks: it says which source to draw from and that source's options, and it is checked
against the registry of sources (:data:`SOURCES`) when it is made. The built-in sources are registered by
:mod:`probe.tasks`; a new one is a :class:`TaskSource` passed to :func:`register_source`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal

from probe.errors import ConfigError
from probe.registry import Registry

if TYPE_CHECKING:
    from probe.types import Task

Layout = Literal["ice", "native", "task"]


@dataclass(frozen=True)
class TaskSection:
    """One task source. An experiment may list several (``[[tasks]]``)."""

    source: str
    n: int = 20
    hops: int = 2  # synthetic: 2 or 3
    path: str | None = None  # jsonl: the file; fanoutqa: optional override of the packaged dev set
    max_hops: int = 6  # fanoutqa: skip questions with more decomposition steps (the dev set has 5 or more)
    # cogniload grid
    difficulty: tuple[int, ...] = (1, 3, 5, 7, 10)
    length: tuple[int, ...] = (20, 50, 100, 250)
    needle_ratio: tuple[int, ...] = (5, 25, 50, 75, 95)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ConfigError(f"tasks.source: {self.source!r} is not one of {', '.join(SOURCES.names())}")
        if self.n < 1:
            raise ConfigError(f"tasks.n: {self.n} must be >= 1")
        if self.source == "synthetic" and self.hops not in (2, 3):
            raise ConfigError(f"tasks.hops: {self.hops}; the synthetic source makes 2- or 3-hop questions")
        if self.source == "jsonl" and not self.path:
            raise ConfigError("tasks.path: a jsonl task source needs `path = \"file.jsonl\"`")
        for rho in self.needle_ratio:
            if not 5 <= rho <= 95:
                raise ConfigError(f"tasks.needle_ratio: {rho} is outside [5, 95] percent")


@dataclass(frozen=True)
class TaskSource:
    """One task source (see :mod:`probe.tasks`).

    Attributes:
        name: the ``source`` value of a ``[[tasks]]`` section.
        load: ``(section, seed) -> tasks`` in a fixed order.
        layout: ``ice``, ``native`` or ``task``.
        family: the name of its family (:func:`probe.tasks.get_family`).
        options: ``[[tasks]]`` keys the source reads (besides ``source``).
        description: one line for listings.
    """

    name: str
    load: Callable[[TaskSection, int], list["Task"]]
    layout: Layout
    family: str
    options: frozenset[str]
    description: str

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
