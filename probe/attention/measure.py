"""Attention measures as one registry: each measure is one entry, with its reducer and its eager reference (docs/probes.md#the-measure-registry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

import numpy as np
import torch

from probe.registry import Registry

if TYPE_CHECKING:
    from probe.attention.plan import ProbePlan
    from probe.attention.segments import PlanTensors, RowBlock
    from probe.probe_options import ProbeOptions


@dataclass(frozen=True)
class LayerContext:
    """What a measure's reducer knows of the layer it reduces.

    Attributes:
        plan: the probe plan (segments, query set, AR targets).
        n_heads: query heads of the layer.
        tensors: the plan's index tensors on the layer's device (the segment map: ``seg``, ``onehot``,
            ``segment_sums``, ``is_sink_key``, ``is_ext_key``, the row blocks).
        layer: the layer's index.
        module: the layer's attention module (its output projection, for value-weighted measures), or None.
    """

    plan: ProbePlan
    n_heads: int
    tensors: PlanTensors
    layer: int = 0
    module: torch.nn.Module | None = None


class BlockReducer(Protocol):
    """Folds the attention rows of one layer, a block at a time, into that layer's array of one measure."""

    def add(self, block: RowBlock, probs: torch.Tensor, values: torch.Tensor | None, key_start: int) -> None:
        """One block.

        Args:
            block: the block's query positions and index tensors.
            probs: (head, rows, keys) float32 post-softmax rows of ``block.positions`` on keys
                ``key_start .. key_start + keys - 1``.
            values: (kv_head, T, head_dim) float32 value states of the layer when the measure ``needs_values``,
                else None.
            key_start: the first key of ``probs``.
        """

    def finish(self) -> np.ndarray:
        """The layer's array (the measure's axes without ``layer``), float64."""


@dataclass(frozen=True)
class EagerAttention:
    """Everything a reference needs: eager attention of every layer and the prompt's layout, in plain numpy.

    Attributes:
        attentions: one (head, T, T) float64 array per layer (``output_attentions``).
        values: one (kv_head, T, head_dim) float64 array of value states per layer, read from the eager forward's
            value projection, when a measure needs them (else None).
        out_proj: one (heads · head_dim, hidden) float64 output projection per layer (rows: the attention output's
            dimensions, head after head), read from the model's weights, with ``values`` (else None).
        queries: the query set Q, sorted positions.
        seg_kinds / seg_labels / seg_bounds: one entry per segment (the answer tokens as a last ``generated`` one).
        targets: segment indices of the AR targets (germane and question segments).
        order: rank of each non-sink prompt segment (the distance k - j counts these).
        sink_key / ext_key: (T,) bool, keys of sink / extraneous segments.
        options: the probe options.
        arrays: the references of the measures registered before this one (for derived measures).
    """

    attentions: list[np.ndarray]
    values: list[np.ndarray] | None
    out_proj: list[np.ndarray] | None
    queries: list[int]
    seg_kinds: list[str]
    seg_labels: list[str]
    seg_bounds: list[tuple[int, int]]
    targets: list[int]
    order: dict[int, int]
    sink_key: np.ndarray
    ext_key: np.ndarray
    options: ProbeOptions
    arrays: dict[str, np.ndarray]


@dataclass(frozen=True)
class Measure:
    """One attention measure (docs/probes.md#the-measure-registry).

    Attributes:
        id: array name and ``measure`` column value (``<quantity>[_<normaliser>]``).
        axes: axes of the stored array, ``layer`` first.
        value_range: the range of its values.
        description: one line for tables and the report.
        reference: the measure from eager attention.
        reducer: a factory of the layer's :class:`BlockReducer` (None for a derived measure).
        derive: the (layer, …) array from the arrays of earlier measures and the plan (None for a reduced one).
        has_chance: a chance level applies (the record's ``chance`` per layer; enrichment = value / chance).
        needs_values: the reducer reads the layer's value states (the capture hands them only to such measures);
            a derived measure sets it when what it derives from reads them.
        needs_residue: computed only when the probe computes the residue (its rows are planned then).
        label: its name in sentences and figure titles (``P_ext``); the id when not given.
    """

    id: str
    axes: tuple[str, ...]
    value_range: tuple[float, float]
    description: str
    reference: Callable[[EagerAttention], np.ndarray]
    reducer: Callable[[LayerContext], BlockReducer] | None = None
    derive: Callable[[Mapping[str, np.ndarray], ProbePlan], np.ndarray] | None = None
    has_chance: bool = False
    needs_values: bool = False
    needs_residue: bool = False
    label: str = ""

    @property
    def name(self) -> str:
        """The label, else the id."""
        return self.label or self.id

    def __post_init__(self) -> None:
        if (self.reducer is None) == (self.derive is None):
            raise ValueError(f"attention measure {self.id!r}: give exactly one of reducer and derive")
        if not self.axes or self.axes[0] != "layer":
            raise ValueError(f"attention measure {self.id!r}: axes must start with 'layer', got {self.axes}")

    @property
    def is_head_share(self) -> bool:
        """One value per layer and head: the analysis links it to behaviour (per layer and per head)."""
        return self.axes == ("layer", "head")

    def applies(self, plan: ProbePlan) -> bool:
        """Whether a probe following ``plan`` computes this measure."""
        return plan.compute_residue or not self.needs_residue


MEASURES: Registry[Measure] = Registry("attention measure")



def register_measure(measure: Measure) -> Measure:
    """Add ``measure`` to the registry (a module of :mod:`probe.attention.measures` calls it on import)."""
    return MEASURES.register(measure.id, measure)


__all__ = ["BlockReducer", "EagerAttention", "LayerContext", "MEASURES", "Measure", "register_measure"]
