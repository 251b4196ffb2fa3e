"""Reduce blocks of attention rows to per-segment aggregates as they are computed, then assemble the result.

A :class:`LayerReducer` receives, one block at a time, the post-softmax rows of some query positions of one layer
(``(head, block, key)``, the keys starting at any offset) and keeps only:

- the sum over the query set Q of the mass on each segment, ``(head, segment)``;
- for the residue, the running sum of the rows of each *accumulated* segment, ``(head, key)`` each, cut to the keys
  the residue reads: for the cosine residue every extraneous source in use (up to its own end) and every target
  that has a source (up to the end of its last source); for the mass residue the targets alone.

The rows themselves are dropped after each block. A segment's rows are contiguous within a block (positions are
sorted and a segment's tokens are consecutive), so a block adds a slice sum per segment it touches; Q's rows are
the only ones reduced to segment sums, so a residue row costs one pass of adds over its keys, no matmul.

At the end of the layer the residue is computed for all (source, target) pairs at once: the dot products of the source
and target row sums by one batched matmul, the targets' norms on keys ``[0, end of source)`` from a cumulative sum (the
comparison window, docs/probes.md#attentional-residue-ar_k), and γ^{k−j} weights as a (target, source) matrix — no
Python loop over pairs. The chance level depends only on which keys Q can see, so it is computed from the mask rows of Q
once per mask (:meth:`PlanTensors.chance`), not per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from probe.attention.plan import ProbePlan
from probe.attention.result import KEY_KINDS, SegmentAttention
from probe.errors import HookError

# Bytes of float32 scratch one block of rows holds per (head, row, key): the scores and their softmax.
SCRATCH_COPIES = 2


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
    """One block of query rows and where each row's aggregates go.

    Attributes:
        positions: (B,) int64 query positions (sorted).
        first / last: ``positions[0]`` and ``positions[-1]``.
        contiguous: the positions are ``first .. last`` without gaps (a slice reads them).
        query_index: indices within the block of the rows in Q, or None.
        segments: ``(accumulator slot, i0, i1)``: block rows ``i0:i1`` belong to that accumulated segment.
        causal_tail: (B, last - first) bool, True where key ``first + 1 + c`` lies after the row's position (the
            only keys in ``[0, last]`` a causal mask hides from this block), or None for a one-row block.
    """

    positions: torch.Tensor
    first: int
    last: int
    contiguous: bool
    query_index: torch.Tensor | None
    segments: tuple[tuple[int, int, int], ...]
    causal_tail: torch.Tensor | None


class PlanTensors:
    """The plan's index tensors and row blocks on one device, built once per forward pass, shared by the layers.

    Everything that depends only on positions is laid out here from numpy, so the per-layer work is the attention
    arithmetic alone (no host round trips per block).

    Args:
        plan: the probe plan.
        device: the device of the attention rows.
        max_block_elements: most ``rows x keys`` elements per head in one block (a block of rows ending at position
            p reads ``p + 1`` keys); None: blocks of ``plan.options.block_size`` rows. Rows per block never exceed
            ``plan.options.block_size``.
    """

    # Segment sums by a one-hot matmul up to this many segments (fast on every device); by index_add_ beyond it
    # on the CPU, where the matmul's T x S x rows cost would dominate (CogniLoad prompts have hundreds).
    MATMUL_MAX_SEGMENTS = 64

    def __init__(self, plan: ProbePlan, device: torch.device, max_block_elements: int | None = None) -> None:
        self.device = device
        T, S = plan.n_tokens, plan.n_segments
        self.n_segments = S
        self.seg = torch.as_tensor(plan.seg_of_token, device=device)  # (T,)
        self.use_matmul = device.type == "cuda" or S <= self.MATMUL_MAX_SEGMENTS
        self._onehot: torch.Tensor | None = None
        kinds = plan.segment_kinds
        sink_np = np.array([k == "sink" for k in kinds])[plan.seg_of_token]
        self.is_sink_key = torch.as_tensor(sink_np, device=device)  # (T,)
        ext_np = np.array([k == "extraneous" for k in kinds])[plan.seg_of_token]
        self.is_ext_key = torch.as_tensor(ext_np, device=device)  # (T,)
        self.query_positions = torch.as_tensor(plan.query_positions, device=device)
        self.exclude_sink = plan.options.exclude_sink

        # Accumulated segments: slot -> (segment, keys kept). Sources (cosine) first, then targets with a source.
        spans = plan.segment_spans
        self.target_slot: dict[int, int] = {}  # target number -> accumulator slot
        acc: list[tuple[int, int]] = []
        if plan.compute_residue:
            if plan.options.residue_mode == "cosine":
                for j in sorted({j for pairs in plan.ar_sources for j, _ in pairs}):
                    acc.append((j, spans[j][1]))
            self.n_sources = len(acc)
            for ti, (t, pairs) in enumerate(zip(plan.ar_targets, plan.ar_sources)):
                if pairs:
                    self.target_slot[ti] = len(acc)
                    acc.append((t, max(spans[j][1] for j, _ in pairs)))
        else:
            self.n_sources = 0
        self.acc_segments = tuple(s for s, _ in acc)
        self.acc_lengths = tuple(n for _, n in acc)
        self.source_slot = {s: i for i, s in enumerate(self.acc_segments[: self.n_sources])}
        self.source_ends = torch.as_tensor([spans[s][1] for s in self.acc_segments[: self.n_sources]],
                                           dtype=torch.long, device=device)
        # (target, source) weights γ^(k-j) of the residue sum.
        weights = np.zeros((len(plan.ar_targets), max(self.n_sources, 1)))
        if plan.compute_residue and plan.options.residue_mode == "cosine":
            for ti, pairs in enumerate(plan.ar_sources):
                for j, w in pairs:
                    weights[ti, self.source_slot[j]] = w
        self.cosine_weights = weights
        # (target, segment) weights γ^(k-j) / |S_k| of the mass residue.
        mass_weights = np.zeros((len(plan.ar_targets), S))
        for ti, (t, pairs) in enumerate(zip(plan.ar_targets, plan.ar_sources)):
            for j, w in pairs:
                mass_weights[ti, j] = w / (spans[t][1] - spans[t][0])
        self.mass_weights = mass_weights
        self.n_targets = len(plan.ar_targets)

        owner = np.full(T, -1, dtype=np.int64)
        for slot, s in enumerate(self.acc_segments):
            a, b = spans[s]
            owner[a:b] = slot
        in_query = np.zeros(T, dtype=bool)
        in_query[plan.query_positions] = True

        self.blocks: list[RowBlock] = []
        rows = plan.row_positions
        max_rows = plan.options.block_size
        start = 0
        while start < len(rows):
            end = start + 1
            while end < len(rows) and end + 1 - start <= max_rows and (
                max_block_elements is None or (end + 1 - start) * (int(rows[end]) + 1) <= max_block_elements
            ):
                end += 1
            self.blocks.append(self._block(rows[start:end], owner, in_query))
            start = end

    def _block(self, pos: np.ndarray, owner: np.ndarray, in_query: np.ndarray) -> RowBlock:
        device = self.device
        q_index = np.flatnonzero(in_query[pos])
        own = owner[pos]
        segments = []
        i = 0
        while i < len(pos):  # runs of one accumulated segment
            j = i + 1
            while j < len(pos) and own[j] == own[i]:
                j += 1
            if own[i] >= 0:
                segments.append((int(own[i]), i, j))
            i = j
        first, last = int(pos[0]), int(pos[-1])
        tail = None
        if last > first:
            keys = np.arange(first + 1, last + 1)
            tail = torch.as_tensor(keys[None, :] > pos[:, None], device=device)  # (B, last - first)
        return RowBlock(
            positions=torch.as_tensor(pos, device=device),
            first=first,
            last=last,
            contiguous=last - first + 1 == len(pos),
            query_index=torch.as_tensor(q_index, device=device) if len(q_index) else None,
            segments=tuple(segments),
            causal_tail=tail,
        )

    @property
    def onehot(self) -> torch.Tensor:
        """(T, S) float32 one-hot of each key's segment (built on first use)."""
        if self._onehot is None:
            T = self.seg.shape[0]
            self._onehot = torch.zeros(T, self.n_segments, dtype=torch.float32, device=self.device)
            self._onehot[torch.arange(T, device=self.device), self.seg] = 1.0
        return self._onehot

    def segment_sums(self, probs: torch.Tensor, key_start: int = 0) -> torch.Tensor:
        """(H, B, S) sums of (H, B, K) rows over each segment's keys; the rows cover keys ``key_start + [0, K)``."""
        n_keys = probs.shape[-1]
        if self.use_matmul:
            return torch.matmul(probs, self.onehot[key_start : key_start + n_keys])
        out = torch.zeros(*probs.shape[:2], self.n_segments, dtype=probs.dtype, device=probs.device)
        return out.index_add_(2, self.seg[key_start : key_start + n_keys], probs)

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
        self.q_mass = torch.zeros(n_heads, plan.n_segments, dtype=torch.float64, device=device)  # (H, S)
        self.residue = plan.compute_residue
        self.mode = plan.options.residue_mode
        # One running row sum per accumulated segment, (H, keys kept) float32.
        self.acc = [torch.zeros(n_heads, n, dtype=torch.float32, device=device) for n in tensors.acc_lengths]

    def add(self, block: RowBlock, probs: torch.Tensor, key_start: int = 0) -> None:
        """Fold one block of rows into the aggregates.

        Args:
            block: the block's positions and index tensors.
            probs: (H, B, K) float32 post-softmax attention rows of ``block.positions`` on keys
                ``key_start .. key_start + K - 1`` (every key a row can see must lie in that range).
        """
        n_keys = probs.shape[-1]
        if block.query_index is not None:
            sums = self.t.segment_sums(probs[:, block.query_index], key_start)  # (H, nq, S)
            self.q_mass += sums.sum(dim=1, dtype=torch.float64)
        for slot, i0, i1 in block.segments:
            hi = min(key_start + n_keys, self.t.acc_lengths[slot])
            if hi > key_start:
                self.acc[slot][:, key_start:hi] += probs[:, i0:i1, : hi - key_start].sum(dim=1)

    def finish(self, chance: float) -> LayerAggregates:
        """The layer's aggregates; the accumulators can be dropped afterwards.

        Args:
            chance: the layer's chance level (:meth:`PlanTensors.chance`).
        """
        plan = self.plan
        seg_mass = (self.q_mass / len(plan.query_positions)).cpu().numpy()
        ar = None
        if self.residue:
            ar = np.zeros((self.n_heads, self.t.n_targets), dtype=np.float64)
            if self.t.target_slot:
                ar[:, list(self.t.target_slot)] = (self._cosine() if self.mode == "cosine" else self._mass())
        self.acc = []
        return LayerAggregates(seg_mass_segment=seg_mass, chance=chance, ar_k=ar)

    def _targets(self) -> tuple[list[int], torch.Tensor]:
        """Target numbers with a source and their row sums stacked, (n, H, L) zero-padded."""
        numbers = list(self.t.target_slot)
        slots = [self.t.target_slot[ti] for ti in numbers]
        length = max(self.t.acc_lengths[s] for s in slots)
        rows = torch.zeros(len(slots), self.n_heads, length, dtype=torch.float32, device=self.t.device)
        for i, s in enumerate(slots):
            rows[i, :, : self.t.acc_lengths[s]] = self.acc[s]
        return numbers, rows

    def _cosine(self) -> np.ndarray:
        """(H, n targets with a source): Σ_j γ^(k-j) cos(mean row of E_j, mean row of S_k) on keys [0, end of E_j).

        The sink keys are left out of both vectors; the cosine does not depend on the rows' scale, so the row sums
        stand for the mean rows (renormalised or not). A row with no mass on the compared keys (e.g. a target
        whose sliding window no longer reaches the source) gives cosine 0.
        """
        t = self.t
        n_src = t.n_sources
        numbers, tgt = self._targets()  # (n_t, H, Lt)
        src_len = max(t.acc_lengths[:n_src])
        src = torch.zeros(n_src, self.n_heads, src_len, dtype=torch.float32, device=t.device)  # (n_s, H, Ls)
        for j in range(n_src):
            src[j, :, : t.acc_lengths[j]] = self.acc[j]  # zero beyond the source's end
        if t.exclude_sink:
            src *= ~t.is_sink_key[:src_len]
            tgt *= ~t.is_sink_key[: tgt.shape[-1]]
        n = min(src_len, tgt.shape[-1])
        dot = torch.matmul(src[..., :n].transpose(0, 1), tgt[..., :n].permute(1, 2, 0))  # (H, n_s, n_t)
        src_sq = src.square().sum(-1).T  # (H, n_s)
        # |target row on keys [0, end_j)|^2 for every source j, from a running sum of squares.
        cum = tgt.square().cumsum(-1)  # (n_t, H, Lt)
        ends = (t.source_ends - 1).clamp(max=tgt.shape[-1] - 1)
        tgt_sq = cum[:, :, ends].permute(1, 2, 0)  # (H, n_s, n_t)
        dot, src_sq, tgt_sq = dot.double(), src_sq.double(), tgt_sq.double()
        den = (src_sq[:, :, None] * tgt_sq).sqrt()
        ok = den > 0
        cos = torch.where(ok, dot / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(den))
        weights = torch.as_tensor(t.cosine_weights[numbers, :n_src].T, dtype=torch.float64, device=t.device)
        return (cos * weights).sum(dim=1).cpu().numpy()  # (H, n_t)

    def _mass(self) -> np.ndarray:
        """(H, n targets with a source): Σ_j γ^(k-j) × mean mass of S_k's rows on E_j."""
        numbers, tgt = self._targets()  # (n_t, H, L)
        mass = self.t.segment_sums(tgt).double().cpu().numpy()  # (n_t, H, S)
        return np.einsum("ths,ts->ht", mass, self.t.mass_weights[numbers])


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
        residues = [a.ar_k for a in layers if a.ar_k is not None]
        if len(residues) != len(layers):
            raise HookError(f"{len(layers) - len(residues)} of {len(layers)} layers reported no attention residue "
                            "although the probe plan computes it")
        ar = np.stack(residues).astype(np.float32)  # (L, H, n_targets)
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
