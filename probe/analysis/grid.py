"""An array that a result holds: :class:`Grid`.

A result keeps each of its arrays (a (layer, head) map of estimates, a (layer,) chance curve, a (layer, target)
AR_k table) in a :class:`Grid` field, beside its other fields. The analysis file codec
(:mod:`probe.analysis.results`) writes every Grid to ``attention_summary.npz`` under the field's place in the
analysis (``families.ice.attention_cells[3].enrichment``), writes that name into ``analysis.json`` and reads the
array back into the same field: no member name is made by hand, and the report reads the arrays from the results.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Grid:
    """A float32 array held by a result (see the module docstring).

    Attributes:
        values: the array, stored as float32 (what ``attention_summary.npz`` holds).

    Two grids are equal when their shapes and values are (NaN equal to NaN).
    """

    values: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", np.asarray(self.values, dtype=np.float32))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Grid):
            return NotImplemented
        return self.values.shape == other.values.shape and bool(
            np.array_equal(self.values, other.values, equal_nan=True))

    __hash__ = None  # type: ignore[assignment]  # equal by value, and the values are mutable

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)


__all__ = ["Grid"]
