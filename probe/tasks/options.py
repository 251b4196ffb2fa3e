"""The options of each built-in task source: the keys of its ``[[tasks]]`` table besides ``source``.

One frozen dataclass per source (:attr:`probe.tasks.TaskSource.options_type`); a key that another source reads is
no field here, so it is refused by name where the table is read (:func:`probe.config.config_from_dict`). Every
source reads ``n``.
"""

from __future__ import annotations

from dataclasses import dataclass

from probe.errors import FieldError


def _at_least_one(n: int) -> None:
    if n < 1:
        raise FieldError("tasks", "n", f"{n} must be >= 1")


@dataclass(frozen=True)
class SyntheticOptions:
    """``n`` fictional chains of ``hops`` (2 or 3) facts."""

    n: int = 20
    hops: int = 2

    def __post_init__(self) -> None:
        _at_least_one(self.n)
        if self.hops not in (2, 3):
            raise FieldError("tasks", "hops", f"{self.hops}; the synthetic source makes 2- or 3-hop questions")


@dataclass(frozen=True)
class FanoutqaOptions:
    """``n`` dev-set questions with at most ``max_hops`` decomposition steps; ``path``: another copy of the set."""

    n: int = 20
    max_hops: int = 6
    path: str | None = None

    def __post_init__(self) -> None:
        _at_least_one(self.n)


@dataclass(frozen=True)
class JsonlOptions:
    """The first ``n`` tasks of the file ``path`` (its format: docs/method.md#sources)."""

    path: str | None = None  # required: None is refused below with what to write
    n: int = 20

    def __post_init__(self) -> None:
        _at_least_one(self.n)
        if not self.path:
            raise FieldError("tasks", "path", "a jsonl task source needs `path = \"file.jsonl\"`")


@dataclass(frozen=True)
class CogniloadOptions:
    """``n`` puzzles for every cell of ``difficulty`` x ``length`` x ``needle_ratio`` (percent, 5 to 95)."""

    n: int = 20
    difficulty: tuple[int, ...] = (1, 3, 5, 7, 10)
    length: tuple[int, ...] = (20, 50, 100, 250)
    needle_ratio: tuple[int, ...] = (5, 25, 50, 75, 95)

    def __post_init__(self) -> None:
        _at_least_one(self.n)
        for rho in self.needle_ratio:
            if not 5 <= rho <= 95:
                raise FieldError("tasks", "needle_ratio", f"{rho} is outside [5, 95] percent")


__all__ = ["CogniloadOptions", "FanoutqaOptions", "JsonlOptions", "SyntheticOptions"]
