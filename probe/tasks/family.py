"""Task families: a kind of benchmark, how its outputs are scored and which analysis its trials get.

The built-in families (``ice``, ``cogniload``) are registered by :mod:`probe.tasks`; a new one is a
:class:`Family` passed to :func:`register_family`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from probe.registry import Registry

if TYPE_CHECKING:
    from probe.scoring import Score
    from probe.types import Task

# Condition of a prompt laid out from a task's own segments when neither the family nor the task names one.
CUSTOM_CONDITION = "Custom"


@dataclass(frozen=True)
class Family:
    """A kind of benchmark: how its outputs are scored and which analysis its trials get.

    Attributes:
        name: the family's id, recorded on every prompt and trial (``ice``, ``cogniload``).
        score: ``(output, task, truncated) -> Score`` (:mod:`probe.scoring`).
        native_condition: the condition of a natively laid out prompt (CogniLoad: ``"CogniLoad"``); None lets the
            task name its condition (``meta["condition"]``), else :data:`CUSTOM_CONDITION`.
        has_s_sim: S_sim (docs/method.md#task-similarity-s_sim: the question against the extraneous segments) is
            defined for its prompts.
        description: one line for listings.
    """

    name: str
    score: Callable[[str | None, "Task", bool], "Score"]
    native_condition: str | None
    has_s_sim: bool
    description: str


FAMILIES: Registry[Family] = Registry("task family")


def register_family(family: Family) -> Family:
    """Register ``family`` under its name and return it.

    Raises:
        DuplicateEntryError: a family of that name is registered already.
    """
    return FAMILIES.register(family.name, family)


def get_family(name: str) -> Family:
    """The registered family ``name``.

    Raises:
        UnknownNameError: naming close matches and the registered families.
    """
    return FAMILIES.get(name)


__all__ = ["CUSTOM_CONDITION", "FAMILIES", "Family", "get_family", "register_family"]
