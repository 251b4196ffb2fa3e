"""Reduce blocks of attention rows to per-segment aggregates as they are computed, then assemble the result.

A :class:`LayerReducer` receives, one block at a time, the post-softmax rows of some query positions of one layer
(``(head, block, key)``) and keeps only:

- the sum over the query set Q of the mass on each segment, ``(head, segment)``;
- for the residue, the running sums of the rows of each source and target segment (``(head, key)`` each, cosine
  mode) or the mass each target's queries place on each segment (``(head, segment)``, mass mode).

The rows themselves are dropped after each block, so a layer never holds more than ``block_size`` rows. The
chance level depends only on which keys Q can see, so it is computed from the mask rows of Q once per mask
(:meth:`PlanTensors.chance`), not per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from probe.attention.plan import ProbePlan
from probe.attention.result import KEY_KINDS, SegmentAttention


@dataclass
class LayerAggregates:
    """What one layer leaves behind (float64 numpy).

    Attributes:
        seg_mass_segment: (head, segment) mean mass of Q's rows on each segment.
        chance: chance level of P_ext for this layer (NaN where undefined).
        ar_k: (head, target) residue, or None.
    """

    seg_mass_segment: np.ndarray
    chance: float
    ar_k: np.ndarray | None


@dataclass
class RowBlock:
    """One block of query rows and, precomputed on the device, where each row's aggregates go.

    Attributes:
        positions: (B,) int64 query positions.
        query_index: indices within the block of the rows in Q, or None.
        target_index / target_owner: rows of AR targets and their target number (mass residue), or None.
        row_index / row_owner: rows of accumulated segments and their accumulator (cosine residue), or None.
    """

    positions: torch.Tensor
    query_index: torch.Tensor | None
    target_index: torch.Tensor | None
    target_owner: torch.Tensor | None
    row_index: torch.Tensor | None
    row_owner: torch.Tensor | None


class PlanTensors:
    """The plan's index tensors and row blocks on one device, built once per forward pass, shared by the layers.

    Everything that depends only on positions is laid out here from numpy, so the per-layer work is the attention
    arithmetic alone (no host round trips per block).

    Args:
        plan: the probe plan.
        device: the device of the attention rows.
    """

    # Segment sums by a one-hot matmul up to this many segments (fast on every device); by index_add_ beyond it
    # on the CPU, where the matmul's T x S x rows cost would dominate (CogniLoad prompts have hundreds).
    MATMUL_MAX_SEGMENTS = 64

    def __init__(self, plan: ProbePlan, device: torch.device) -> None:
        self.device = device
        T, S = plan.n_tokens, plan.n_segments
        self.n_segments = S
        self.seg = torch.as_tensor(plan.seg_of_token, device=device)  # (T,)
        self.use_matmul = device.type == "cuda" or S <= self.MATMUL_MAX_SEGMENTS
        if self.use_matmul:
            self.onehot = torch.zeros(T, S, dtype=torch.float32, device=device)  # (T, S)
            self.onehot[torch.arange(T, device=device), self.seg] = 1.0
        kinds = plan.segment_kinds
        sink_np = np.array([k == "sink" for k in kinds])[plan.seg_of_token]
        self.is_sink_key = torch.as_tensor(sink_np, device=device)  # (T,)
        self.is_ext_key = torch.as_tensor(np.array([k == "extraneous" for k in kinds])[plan.seg_of_token], device=device)
        self.query_positions = torch.as_tensor(plan.query_positions, device=device)
        self.target_counts = [plan.segment_spans[t][1] - plan.segment_spans[t][0] for t in plan.ar_targets]
        self.row_segments = plan.row_segments
        self.row_slot = {s: i for i, s in enumerate(self.row_segments)}

        in_query = np.zeros(T, dtype=bool)
        in_query[plan.query_positions] = True
        target_owner = np.full(T, -1, dtype=np.int64)
        if plan.compute_residue and plan.options.residue_mode == "mass":
            for i, t in enumerate(plan.ar_targets):
                a, b = plan.segment_spans[t]
                target_owner[a:b] = i
        row_owner = np.full(T, -1, dtype=np.int64)
        for s, i in self.row_slot.items():
            a, b = plan.segment_spans[s]
            row_owner[a:b] = i

        def on_device(sel: np.ndarray, owner: np.ndarray | None = None) -> tuple[torch.Tensor | None, ...]:
            idx = np.flatnonzero(sel)
            if len(idx) == 0:
                return (None, None)
            return (torch.as_tensor(idx, device=device),
                    None if owner is None else torch.as_tensor(owner[idx], device=device))

        self.blocks: list[RowBlock] = []
        rows = plan.row_positions
        for start in range(0, len(rows), plan.options.block_size):
            pos = rows[start : start + plan.options.block_size]
            q_index, _ = on_device(in_query[pos])
            t_index, t_owner = on_device(target_owner[pos] >= 0, target_owner[pos])
            r_index, r_owner = on_device(row_owner[pos] >= 0, row_owner[pos])
            self.blocks.append(RowBlock(torch.as_tensor(pos, device=device), q_index, t_index, t_owner, r_index,
                                        r_owner))

    def segment_sums(self, probs: torch.Tensor) -> torch.Tensor:
        """(H, B, S) sums of (H, B, T) rows over each segment's keys."""
        if self.use_matmul:
            return torch.matmul(probs, self.onehot)
        out = torch.zeros(*probs.shape[:2], self.n_segments, dtype=probs.dtype, device=probs.device)
        return out.index_add_(2, self.seg, probs)

    def chance(self, allowed: torch.Tensor, exclude_sink: bool) -> float:
        """Chance level of P_ext from the mask rows of Q (see :mod:`probe.attention.result`).

        Args:
            allowed: (n_queries, T) bool, the keys each query of Q may see in the layer.
            exclude_sink: whether P_ext's denominator leaves sink keys out.

        Returns:
            ``mean_q(n_ext/n_vis) / mean_q(n_den/n_vis)`` (NaN where the denominator is 0).
        """
        vis = allowed.to(torch.float64)
        n_vis = vis.sum(dim=1)
        n_ext = (vis * self.is_ext_key).sum(dim=1)
        n_den = (vis * ~self.is_sink_key).sum(dim=1) if exclude_sink else n_vis
        den = float((n_den / n_vis).sum())
        return float((n_ext / n_vis).sum()) / den if den > 0 else float("nan")


class LayerReducer:
    """Accumulates the aggregates of one layer from blocks of attention rows (see the module docstring).

    Args:
        plan: the probe plan.
        n_heads: attention heads of the layer.
        tensors: the plan's index tensors on the layer's device.
    """

    def __init__(self, plan: ProbePlan, n_heads: int, tensors: PlanTensors) -> None:
        self.plan = plan
        self.n_heads = n_heads
        self.t = tensors
        device = tensors.device
        T, S = plan.n_tokens, plan.n_segments
        self.q_mass = torch.zeros(n_heads, S, dtype=torch.float64, device=device)  # (H, S)
        self.residue = plan.compute_residue
        self.mode = plan.options.residue_mode
        if self.residue and self.mode == "mass":
            self.target_mass = torch.zeros(len(plan.ar_targets), n_heads, S, dtype=torch.float64, device=device)
        if tensors.row_segments:
            # (n_row_segments, H, T): running sums of the attention rows of each accumulated segment.
            self.row_sums = torch.zeros(len(tensors.row_segments), n_heads, T, dtype=torch.float32, device=device)

    def add(self, block: RowBlock, probs: torch.Tensor) -> None:
        """Fold one block of rows into the aggregates.

        Args:
            block: the block's positions and index tensors.
            probs: (H, B, T) float32 post-softmax attention rows of ``block.positions``.
        """
        seg_mass = self.t.segment_sums(probs)  # (H, B, S)
        if block.query_index is not None:
            self.q_mass += seg_mass[:, block.query_index].sum(dim=1, dtype=torch.float64)
        if block.target_index is not None:
            self.target_mass.index_add_(
                0, block.target_owner, seg_mass[:, block.target_index].transpose(0, 1).to(torch.float64)
            )
        if block.row_index is not None:
            self.row_sums.index_add_(0, block.row_owner, probs[:, block.row_index].transpose(0, 1))

    def finish(self, chance: float) -> LayerAggregates:
        """The layer's aggregates; the accumulators can be dropped afterwards.

        Args:
            chance: the layer's chance level (:meth:`PlanTensors.chance`).
        """
        plan = self.plan
        seg_mass = (self.q_mass / len(plan.query_positions)).cpu().numpy()
        ar = None
        if self.residue:
            ar = np.zeros((self.n_heads, len(plan.ar_targets)), dtype=np.float64)
            for ti, (t, pairs) in enumerate(zip(plan.ar_targets, plan.ar_sources)):
                for j, w in pairs:
                    if self.mode == "mass":
                        m = self.target_mass[ti, :, j] / self.t.target_counts[ti]
                        ar[:, ti] += w * m.cpu().numpy()
                    else:
                        ar[:, ti] += w * self._cosine(j, t).cpu().numpy()
        return LayerAggregates(seg_mass_segment=seg_mass, chance=chance, ar_k=ar)

    def _cosine(self, source: int, target: int) -> torch.Tensor:
        """(H,) cosine of the mean rows of ``source`` and ``target`` on keys [0, end of source), sinks removed.

        Each mean row is renormalised to sum 1 over the compared keys (which leaves the cosine unchanged); a row
        with no mass there (e.g. a target whose sliding window no longer reaches the source) gives cosine 0.
        """
        end = self.plan.segment_spans[source][1]
        a = self.row_sums[self.t.row_slot[source], :, :end].to(torch.float64)  # (H, end)
        b = self.row_sums[self.t.row_slot[target], :, :end].to(torch.float64)
        if self.plan.options.exclude_sink:
            keep = (~self.t.is_sink_key[:end]).to(torch.float64)
            a = a * keep
            b = b * keep
        a = a / a.sum(dim=1, keepdim=True).clamp_min(1e-300)
        b = b / b.sum(dim=1, keepdim=True).clamp_min(1e-300)
        na = a.norm(dim=1)
        nb = b.norm(dim=1)
        dot = (a * b).sum(dim=1)
        ok = (na > 0) & (nb > 0)
        return torch.where(ok, dot / torch.where(ok, na * nb, torch.ones_like(na)), torch.zeros_like(dot))


def assemble_result(plan: ProbePlan, layers: list[LayerAggregates]) -> SegmentAttention:
    """Stack the layers' aggregates into a :class:`SegmentAttention` and derive the per-kind measures.

    Args:
        plan: the probe plan.
        layers: one :class:`LayerAggregates` per layer, in layer order.

    Returns:
        The result (float32 arrays).
    """
    per_seg = np.stack([a.seg_mass_segment for a in layers])  # (L, H, S)
    by_kind = np.zeros((*per_seg.shape[:2], len(KEY_KINDS)), dtype=np.float64)  # (L, H, K)
    for s, kind in enumerate(plan.segment_kinds):
        by_kind[..., KEY_KINDS.index(kind)] += per_seg[..., s]
    ext = by_kind[..., KEY_KINDS.index("extraneous")]
    if plan.options.exclude_sink:
        den = by_kind.sum(axis=-1) - by_kind[..., KEY_KINDS.index("sink")]
    else:
        den = by_kind.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_ext = np.where(den > 0, ext / np.where(den > 0, den, 1.0), np.nan)
    chance = np.array([a.chance for a in layers], dtype=np.float64)
    ar = None
    if plan.compute_residue:
        ar = np.stack([a.ar_k for a in layers]).astype(np.float32)  # (L, H, n_targets)
    o = plan.options
    return SegmentAttention(
        seg_mass=by_kind.astype(np.float32),
        seg_mass_segment=per_seg.astype(np.float32),
        p_ext=p_ext.astype(np.float32),
        chance=chance.astype(np.float32),
        ar_k=ar,
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
            "residue": plan.compute_residue,
        },
        n_tokens=plan.n_tokens,
        n_prompt_tokens=plan.n_prompt_tokens,
        n_queries=int(len(plan.query_positions)),
    )
