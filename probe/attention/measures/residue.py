"""Attentional residue AR_k: how much the rows of a germane or question segment resemble (``cosine``) or reach
(``mass``) the extraneous segments before it (docs/probes.md#attentional-residue-ar_k)."""

from __future__ import annotations

import numpy as np
import torch

from probe.attention.measure import EagerAttention, LayerContext, Measure, register_measure
from probe.attention.segments import RowBlock



class Residue:
    """Running row sums of the accumulated segments of one layer, then AR_k per (head, target)."""

    def __init__(self, ctx: LayerContext) -> None:
        self.plan = ctx.plan
        self.n_heads = ctx.n_heads
        self.t = ctx.tensors
        self.mode = ctx.plan.options.residue_mode
        # One running row sum per accumulated segment, (H, keys kept) float32.
        self.acc = [torch.zeros(ctx.n_heads, n, dtype=torch.float32, device=self.t.device)
                    for n in self.t.acc_lengths]

    def add(self, block: RowBlock, probs: torch.Tensor, values: torch.Tensor | None, key_start: int) -> None:
        n_keys = probs.shape[-1]
        for slot, i0, i1 in block.segments:
            hi = min(key_start + n_keys, self.t.acc_lengths[slot])
            if hi > key_start:
                self.acc[slot][:, key_start:hi] += probs[:, i0:i1, : hi - key_start].sum(dim=1)

    def finish(self) -> np.ndarray:
        ar = np.zeros((self.n_heads, self.t.n_targets), dtype=np.float64)
        if self.t.target_slot:
            ar[:, list(self.t.target_slot)] = self._cosine() if self.mode == "cosine" else self._mass()
        self.acc = []
        return ar

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


def _reference(e: EagerAttention) -> np.ndarray:
    opts = e.options
    n_heads = e.attentions[0].shape[0]
    ar = np.zeros((len(e.attentions), n_heads, len(e.targets)))
    for layer, att in enumerate(e.attentions):
        for ti, t in enumerate(e.targets):
            ta, tb = e.seg_bounds[t]
            for j in range(t):
                if e.seg_kinds[j] != "extraneous":
                    continue
                weight = opts.gamma ** (e.order[t] - e.order[j])
                ja, jb = e.seg_bounds[j]
                for h in range(n_heads):
                    if opts.residue_mode == "mass":
                        value = np.mean([att[h, q, ja:jb].sum() for q in range(ta, tb)])
                    else:
                        keys = [k for k in range(jb) if not (opts.exclude_sink and e.sink_key[k])]
                        mean_e = att[h, ja:jb][:, keys].mean(axis=0)
                        mean_s = att[h, ta:tb][:, keys].mean(axis=0)
                        if mean_e.sum() == 0 or mean_s.sum() == 0:
                            value = 0.0
                        else:
                            mean_e = mean_e / mean_e.sum()
                            mean_s = mean_s / mean_s.sum()
                            value = float(mean_e @ mean_s / (np.linalg.norm(mean_e) * np.linalg.norm(mean_s)))
                    ar[layer, h, ti] += weight * value
    return ar


AR_K = register_measure(Measure(
    id="ar_k", axes=("layer", "head", "target"), value_range=(0.0, float("inf")),
    description="attentional residue of each germane and question segment", reference=_reference,
    reducer=Residue, needs_residue=True))
