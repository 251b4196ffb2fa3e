"""Segment masses and P_ext: where the query set's attention goes (docs/probes.md#attention-proportion)."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from probe.attention.measure import EagerAttention, LayerContext, Measure, register_measure
from probe.attention.plan import ProbePlan
from probe.attention.segments import RowBlock
from probe.attention.result import KEY_KINDS



class SegmentMass:
    """Sums Q's rows over each segment's keys, ``(head, segment)``; the mean over Q at the end."""

    def __init__(self, ctx: LayerContext) -> None:
        self.t = ctx.tensors
        self.n_queries = len(ctx.plan.query_positions)
        self.q_mass = torch.zeros(ctx.n_heads, ctx.plan.n_segments, dtype=torch.float64, device=ctx.tensors.device)

    def add(self, block: RowBlock, probs: torch.Tensor, values: torch.Tensor | None, key_start: int) -> None:
        if block.query_index is not None:
            sums = self.t.segment_sums(probs[:, block.query_index], key_start)  # (H, nq, S)
            self.q_mass += sums.sum(dim=1, dtype=torch.float64)

    def finish(self) -> np.ndarray:
        return (self.q_mass / self.n_queries).cpu().numpy()


def by_kind(per_segment: np.ndarray, segment_kinds: tuple[str, ...] | list[str]) -> np.ndarray:
    """(…, kind) sums of a (…, segment) array over the segments of each key kind."""
    out = np.zeros((*per_segment.shape[:-1], len(KEY_KINDS)), dtype=np.float64)
    for s, kind in enumerate(segment_kinds):
        out[..., KEY_KINDS.index(kind)] += per_segment[..., s]
    return out


def share_of_extraneous(kinds_mass: np.ndarray, exclude_sink: bool) -> np.ndarray:
    """(…) extraneous share of a (…, kind) mass: over every non-sink kind, or over all kinds; NaN where 0."""
    ext = kinds_mass[..., KEY_KINDS.index("extraneous")]
    den = kinds_mass.sum(axis=-1)
    if exclude_sink:
        den = den - kinds_mass[..., KEY_KINDS.index("sink")]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, ext / np.where(den > 0, den, 1.0), np.nan)


def _reference_segment(e: EagerAttention) -> np.ndarray:
    n_layers, n_heads = len(e.attentions), e.attentions[0].shape[0]
    out = np.zeros((n_layers, n_heads, len(e.seg_bounds)))
    for layer, att in enumerate(e.attentions):
        for s, (a, b) in enumerate(e.seg_bounds):
            for h in range(n_heads):
                out[layer, h, s] = np.mean([att[h, q, a:b].sum() for q in e.queries])
    return out


def _reference_kind(e: EagerAttention) -> np.ndarray:
    per_seg = e.arrays["seg_mass_segment"]
    out = np.zeros((*per_seg.shape[:2], len(KEY_KINDS)))
    for s, kind in enumerate(e.seg_kinds):
        out[..., KEY_KINDS.index(kind)] += per_seg[..., s]
    return out


def _reference_p_ext(e: EagerAttention) -> np.ndarray:
    kinds = e.arrays["seg_mass"]
    ext = kinds[..., KEY_KINDS.index("extraneous")]
    den = kinds.sum(-1) - (kinds[..., KEY_KINDS.index("sink")] if e.options.exclude_sink else 0.0)
    out = np.full_like(ext, np.nan)
    np.divide(ext, den, out=out, where=den > 0)
    return out


def _derive_kind(arrays: Mapping[str, np.ndarray], plan: ProbePlan) -> np.ndarray:
    return by_kind(arrays["seg_mass_segment"], plan.segment_kinds)


def _derive_p_ext(arrays: Mapping[str, np.ndarray], plan: ProbePlan) -> np.ndarray:
    return share_of_extraneous(arrays["seg_mass"], plan.options.exclude_sink)


SEG_MASS_SEGMENT = register_measure(Measure(
    id="seg_mass_segment", axes=("layer", "head", "segment"), value_range=(0.0, 1.0),
    description="mean attention mass of the query set on each segment", reference=_reference_segment,
    reducer=SegmentMass))
SEG_MASS = register_measure(Measure(
    id="seg_mass", axes=("layer", "head", "kind"), value_range=(0.0, 1.0),
    description="mean attention mass of the query set on each key kind", reference=_reference_kind,
    derive=_derive_kind))
P_EXT = register_measure(Measure(
    id="p_ext", axes=("layer", "head"), value_range=(0.0, 1.0),
    description="P_ext: share of the non-sink attention on extraneous segments", reference=_reference_p_ext,
    derive=_derive_p_ext, has_chance=True, label="P_ext"))
