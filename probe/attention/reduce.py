"""Reduce blocks of attention rows to per-segment aggregates as they are computed, then assemble the result.

A :class:`LayerReducer` receives, one block at a time, the post-softmax rows of some query positions of one layer
(``(head, block, key)``) and which keys each query could see, and keeps only:

- the sum over the query set Q of the mass on each segment, ``(head, segment)``;
- the chance-level sums (extraneous, non-sink and visible key counts of each query of Q);
- for the residue, the running sums of the rows of each source and target segment (``(head, key)`` each, cosine
  mode) or the mass each target's queries place on each segment (``(head, segment)``, mass mode).

The rows themselves are dropped after each block, so a layer never holds more than ``block_size`` rows.
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


class LayerReducer:
    """Accumulates the aggregates of one layer from blocks of attention rows (see the module docstring).

    Args:
        plan: the probe plan.
        n_heads: attention heads of the layer.
        device: where the accumulators live (the layer's device).
    """

    def __init__(self, plan: ProbePlan, n_heads: int, device: torch.device) -> None:
        self.plan = plan
        self.n_heads = n_heads
        self.device = device
        T, S = plan.n_tokens, plan.n_segments
        seg = torch.as_tensor(plan.seg_of_token, device=device)
        self.onehot = torch.zeros(T, S, dtype=torch.float32, device=device)  # (T, S)
        self.onehot[torch.arange(T, device=device), seg] = 1.0
        kinds = plan.segment_kinds
        self.is_ext_seg = torch.tensor([k == "extraneous" for k in kinds], device=device)
        self.is_sink_seg = torch.tensor([k == "sink" for k in kinds], device=device)
        self.is_sink_key = self.is_sink_seg[seg]  # (T,)
        self.is_ext_key = self.is_ext_seg[seg]  # (T,)

        self.in_query = torch.zeros(T, dtype=torch.bool, device=device)
        self.in_query[torch.as_tensor(plan.query_positions, device=device)] = True
        self.q_mass = torch.zeros(n_heads, S, dtype=torch.float64, device=device)  # (H, S)
        self.n_q = 0
        self.chance_ext = 0.0  # Σ_q n_ext(q) / n_vis(q)
        self.chance_den = 0.0  # Σ_q n_nonsink(q) / n_vis(q)   (or Σ_q 1 when sinks are kept)

        opts = plan.options
        self.residue = plan.compute_residue
        self.mode = opts.residue_mode
        # Owner of each token's row among the target segments (mass mode) / accumulated segments (cosine mode).
        self.target_owner = torch.full((T,), -1, dtype=torch.long, device=device)
        self.target_counts = [plan.segment_spans[t][1] - plan.segment_spans[t][0] for t in plan.ar_targets]
        for i, t in enumerate(plan.ar_targets):
            a, b = plan.segment_spans[t]
            self.target_owner[a:b] = i
        if self.residue and self.mode == "mass":
            self.target_mass = torch.zeros(len(plan.ar_targets), n_heads, S, dtype=torch.float64, device=device)
        self.row_segments = plan.row_segments
        self.row_index = {s: i for i, s in enumerate(self.row_segments)}
        if self.row_segments:
            self.row_owner = torch.full((T,), -1, dtype=torch.long, device=device)
            for s, i in self.row_index.items():
                a, b = plan.segment_spans[s]
                self.row_owner[a:b] = i
            # (n_row_segments, H, T): running sums of the attention rows of each accumulated segment.
            self.row_sums = torch.zeros(len(self.row_segments), n_heads, T, dtype=torch.float32, device=device)

    def add(self, positions: torch.Tensor, probs: torch.Tensor, allowed: torch.Tensor) -> None:
        """Fold one block of rows into the aggregates.

        Args:
            positions: (B,) int64 query positions of the rows.
            probs: (H, B, T) float32 post-softmax attention rows.
            allowed: (B, T) bool, which keys each query may attend to (its mask row).
        """
        seg_mass = torch.matmul(probs, self.onehot)  # (H, B, S)
        inq = self.in_query[positions]  # (B,)
        if bool(inq.any()):
            self.q_mass += seg_mass[:, inq].sum(dim=1, dtype=torch.float64)
            self.n_q += int(inq.sum())
            vis = allowed[inq].to(torch.float64)  # (Bq, T)
            n_vis = vis.sum(dim=1)
            n_ext = vis[:, self.is_ext_key].sum(dim=1)
            if self.plan.options.exclude_sink:
                n_den = vis[:, ~self.is_sink_key].sum(dim=1)
            else:
                n_den = n_vis
            self.chance_ext += float((n_ext / n_vis).sum())
            self.chance_den += float((n_den / n_vis).sum())
        if not self.residue:
            return
        if self.mode == "mass":
            owner = self.target_owner[positions]
            sel = owner >= 0
            if bool(sel.any()):
                self.target_mass.index_add_(0, owner[sel], seg_mass[:, sel].transpose(0, 1).to(torch.float64))
        elif self.row_segments:
            owner = self.row_owner[positions]
            sel = owner >= 0
            if bool(sel.any()):
                self.row_sums.index_add_(0, owner[sel], probs[:, sel].transpose(0, 1))

    def finish(self) -> LayerAggregates:
        """The layer's aggregates; the accumulators can be dropped afterwards."""
        plan = self.plan
        if self.n_q != len(plan.query_positions):
            raise AssertionError(f"reduced {self.n_q} query rows, the plan has {len(plan.query_positions)}")
        seg_mass = (self.q_mass / self.n_q).cpu().numpy()
        chance = self.chance_ext / self.chance_den if self.chance_den > 0 else float("nan")
        ar = None
        if self.residue:
            ar = np.zeros((self.n_heads, len(plan.ar_targets)), dtype=np.float64)
            for ti, (t, pairs) in enumerate(zip(plan.ar_targets, plan.ar_sources)):
                for j, w in pairs:
                    if self.mode == "mass":
                        m = self.target_mass[ti, :, j] / self.target_counts[ti]
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
        a = self.row_sums[self.row_index[source], :, :end].to(torch.float64)  # (H, end)
        b = self.row_sums[self.row_index[target], :, :end].to(torch.float64)
        if self.plan.options.exclude_sink:
            keep = (~self.is_sink_key[:end]).to(torch.float64)
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
