"""The reduction of blocks of attention rows to the measures' arrays, layer by layer, and the assembled result
(docs/probes.md#how-the-engine-computes-them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from probe.attention.measure import BlockReducer, LayerContext, Measure
from probe.attention.measures import measures
from probe.attention.measures.value import has_output_projection
from probe.attention.plan import ProbePlan
from probe.attention.result import KEY_KINDS, SegmentAttention
from probe.attention.segments import PlanTensors, RowBlock
from probe.errors import HookError

# Bytes of float32 scratch one block of rows holds per (head, row, key): the scores and their softmax.
SCRATCH_COPIES = 2


@dataclass
class LayerAggregates:
    """What one layer leaves behind (float64 numpy).

    Attributes:
        arrays: measure id -> the layer's array of that measure (its axes without ``layer``).
        chance: chance level of P_ext for this layer (NaN where undefined).
        with_values: whether the measures that read value states were computed (the layer had its attention
            module and value states).
    """

    arrays: dict[str, np.ndarray]
    chance: float
    with_values: bool = False


class LayerReducer:
    """Accumulates the arrays of every measure of one layer from blocks of attention rows.

    One :class:`~probe.attention.measure.BlockReducer` per registered measure that is reduced from rows (not
    derived) and applies to the plan; each block goes to all of them, with the layer's value states to those that
    ask for them.

    Args:
        plan: the probe plan.
        n_heads: attention heads of the layer.
        tensors: the plan's index tensors on the layer's device.
        layer: the layer's index.
        module: its attention module, whose output projection the value-weighted measures read; without it (rows
            made by hand), or with its weights offloaded (a dispatched model), the measures that read value states
            are left out (of every layer: :func:`assemble_result` keeps a measure only where all layers have it).
    """

    def __init__(self, plan: ProbePlan, n_heads: int, tensors: PlanTensors, layer: int = 0,
                 module: torch.nn.Module | None = None) -> None:
        ctx = LayerContext(plan=plan, n_heads=n_heads, tensors=tensors, layer=layer, module=module)
        # Value-weighted measures read the module's weights: not where they are offloaded (on the meta device until
        # a hook loads them), nor without a module (rows made by hand).
        self.with_values = module is not None and all(p.device.type != "meta" for p in module.parameters()) \
            and has_output_projection(module)
        self.ctx = ctx
        self.measures = [m for m in reduced_measures(plan, self.with_values) if m.reducer is not None]
        self.needs_values = any(m.needs_values for m in self.measures)
        self._reducers: dict[str, tuple[bool, BlockReducer]] | None = None  # built when rows are first reduced

    @property
    def reducers(self) -> dict[str, tuple[bool, BlockReducer]]:
        """Measure id -> (whether it reads value states, its block reducer); made on first use."""
        if self._reducers is None:
            self._reducers = {m.id: (m.needs_values, m.reducer(self.ctx)) for m in self.measures
                              if m.reducer is not None}
        return self._reducers

    def add(self, block: RowBlock, probs: torch.Tensor, key_start: int = 0,
            values: torch.Tensor | None = None) -> None:
        """Fold one block of rows into every measure.

        Args:
            block: the block's positions and index tensors.
            probs: (H, B, K) float32 post-softmax attention rows of ``block.positions`` on keys
                ``key_start .. key_start + K - 1`` (every key a row can see must lie in that range).
            key_start: the first key of ``probs``.
            values: (H_kv, T, D) value states of the layer (given when ``needs_values``).
        """
        for needs_values, reducer in self.reducers.values():
            reducer.add(block, probs, values if needs_values else None, key_start)

    def finish(self, chance: float) -> LayerAggregates:
        """The layer's arrays; the accumulators can be dropped afterwards.

        Args:
            chance: the layer's chance level (:meth:`PlanTensors.chance`).
        """
        arrays = {mid: reducer.finish() for mid, (_, reducer) in self.reducers.items()}
        self._reducers = {}
        return LayerAggregates(arrays=arrays, chance=chance, with_values=self.with_values)


def reduced_measures(plan: ProbePlan, with_values: bool = True) -> list[Measure]:
    """The registered measures a probe following ``plan`` computes, in registration order (without those that read
    value states unless ``with_values``)."""
    return [m for m in measures() if m.applies(plan) and (with_values or not m.needs_values)]


def assemble_result(plan: ProbePlan, layers: list[LayerAggregates | None]) -> SegmentAttention:
    """Stack the layers' arrays into a :class:`SegmentAttention`, then derive the measures that derive.

    Args:
        plan: the probe plan.
        layers: one :class:`LayerAggregates` per layer, in layer order; None for a layer without attention (a
            hybrid model's state-space layer), whose rows of every array are NaN.

    Returns:
        The result (float32 arrays).

    Raises:
        HookError: a layer reported no array of a measure the plan computes.
    """
    arrays: dict[str, np.ndarray] = {}
    present = [a for a in layers if a is not None]
    if not present:
        raise HookError("no layer of the model reported its attention")
    for m in reduced_measures(plan, all(a.with_values for a in present)):
        if m.derive is not None:
            arrays[m.id] = np.asarray(m.derive(arrays, plan), dtype=np.float64)
            continue
        found = [a.arrays[m.id] for a in present if m.id in a.arrays]
        if len(found) != len(present):
            raise HookError(f"{len(present) - len(found)} of {len(present)} layers reported no {m.description} "
                            f"({m.id}) although the probe plan computes it")
        blank = np.full_like(found[0], np.nan, dtype=np.float64)
        it = iter(found)
        arrays[m.id] = np.stack([blank if a is None else next(it) for a in layers])  # (L, ...)
    chance = np.array([np.nan if a is None else a.chance for a in layers], dtype=np.float64)
    o = plan.options
    return SegmentAttention(
        measures={k: v.astype(np.float32) for k, v in arrays.items()},
        chance=chance.astype(np.float32),
        kinds=KEY_KINDS,
        segment_labels=plan.segment_labels,
        segment_kinds=plan.segment_kinds,
        segment_spans=plan.segment_spans,
        ar_targets=plan.ar_targets,
        options={
            "query": o.query,
            "gamma": o.gamma,
            "residue_mode": o.residue_mode,
            "exclude_sink": o.exclude_sink,
            "block_size": o.block_size,
            "residue": o.residue,
        },
        n_tokens=plan.n_tokens,
        n_prompt_tokens=plan.n_prompt_tokens,
        n_queries=int(len(plan.query_positions)),
    )


__all__ = ["SCRATCH_COPIES", "LayerAggregates", "LayerReducer", "assemble_result", "reduced_measures"]
