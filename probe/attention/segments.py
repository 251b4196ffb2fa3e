"""The segment map of one probe on one device: which segment each key belongs to, and the blocks of query rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from probe.attention.plan import ProbePlan


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
        every_row: lay out every position's row, not only the plan's (the engine then gives the layer its output
            from them, docs/probes.md#one-attention-per-layer); the rows outside the plan reach no measure.
    """

    # Segment sums by a one-hot matmul up to this many segments (fast on every device); by index_add_ beyond it
    # on the CPU, where the matmul's T x S x rows cost would dominate (CogniLoad prompts have hundreds).
    MATMUL_MAX_SEGMENTS = 64

    def __init__(self, plan: ProbePlan, device: torch.device, max_block_elements: int | None = None,
                 every_row: bool = False) -> None:
        self.device = device
        S = plan.n_segments
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

        self._lay_out_residue(plan)
        self.blocks = self._lay_out_blocks(plan, max_block_elements, every_row)

    def _lay_out_residue(self, plan: ProbePlan) -> None:
        """The accumulated segments of the residue (their slots and kept keys) and its weights."""
        S, spans = plan.n_segments, plan.segment_spans
        # Accumulated segments: slot -> (segment, keys kept). Sources (cosine) first, then targets with a source.
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
                                           dtype=torch.long, device=self.device)
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

    def _lay_out_blocks(self, plan: ProbePlan, max_block_elements: int | None, every_row: bool) -> list[RowBlock]:
        """The blocks of query rows (at most ``block_size`` rows and ``max_block_elements`` per head each)."""
        T, spans = plan.n_tokens, plan.segment_spans
        owner = np.full(T, -1, dtype=np.int64)
        for slot, s in enumerate(self.acc_segments):
            a, b = spans[s]
            owner[a:b] = slot
        in_query = np.zeros(T, dtype=bool)
        in_query[plan.query_positions] = True

        out: list[RowBlock] = []
        rows = np.arange(T) if every_row else plan.row_positions
        max_rows = plan.options.block_size
        start = 0
        while start < len(rows):
            end = start + 1
            while end < len(rows) and end + 1 - start <= max_rows and (
                max_block_elements is None or (end + 1 - start) * (int(rows[end]) + 1) <= max_block_elements
            ):
                end += 1
            out.append(self._block(rows[start:end], owner, in_query))
            start = end
        return out

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
