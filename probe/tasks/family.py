"""Task families: a kind of benchmark, which layout and analysis its trials get; its scorer is registered for it
by :mod:`probe.scoring` (docs/architecture.md#extending-the-toolkit)."""

from __future__ import annotations

from dataclasses import dataclass
from probe.registry import Registry

# Condition of a prompt laid out from a task's own segments when neither the family nor the task names one.
CUSTOM_CONDITION = "Custom"


@dataclass(frozen=True, kw_only=True)
class Family:
    """A kind of benchmark: how its natively laid out prompts are named and which analysis its trials get.

    Attributes:
        name: the family's id, recorded on every prompt and trial (``ice``, ``cogniload``).
        native_condition: the condition of a natively laid out prompt (CogniLoad: ``"CogniLoad"``); None lets the
            task name its condition (``meta["condition"]``), else :data:`CUSTOM_CONDITION`.
        has_s_sim: S_sim (docs/method.md#task-similarity-s_sim: the question against the extraneous segments) is
            defined for its prompts.
        description: one line for listings.
    """

    name: str
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
