"""Segment masses from the attention kernel itself: the probe's fused path (docs/probes.md#the-fused-path)."""

from __future__ import annotations

from typing import Sequence

import torch

from probe.attention.masks import BlockMask
from probe.attention.measure import FusedLayer
from probe.attention.measures.value import module_gram, value_norms, output_projection
from probe.attention.segments import PlanTensors

def _kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q·kᵀ + mask)·v`` and each row's log-sum-exp, scale 1 (the queries come scaled).

    Args:
        query: (H, Lq, D) float32.
        key: (H, Lk, D) float32.
        value: (H, Lk, D) float32 (as wide as the queries: the kernels require it).
        mask: (Lq, Lk) additive float32 mask (0 / -inf, or a bias), or None (every key visible).

    Returns:
        (H, Lq, D) output and (H, Lq) log-sum-exp. A row that sees no key gets 0 for both on the CPU kernel; the
        callers never read such a row.
    """
    m = None if mask is None else mask[None, None]
    if query.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query[None], key[None], value[None], attn_mask=m, scale=1.0)
        return out[0], lse[0]
    bias = None
    if m is not None:  # the kernel wants the bias's rows 16-aligned in memory: a view into a wider buffer
        n_keys = m.shape[-1]
        wide = torch.zeros(*m.shape[:-1], -(-n_keys // 16) * 16, dtype=m.dtype, device=m.device)
        wide[..., :n_keys] = m
        bias = wide[..., :n_keys].expand(1, query.shape[0], -1, -1)
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
        query[None], key[None], value[None], bias, True, scale=1.0)[:2]
    return out[0], lse[0, :, : query.shape[1]]


def fused_layer(tensors: PlanTensors, masks: Sequence[BlockMask], query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor | None, scaling: float, module: torch.nn.Module | None,
                mask: torch.Tensor | None, segment_spans: Sequence[tuple[int, int]]) -> FusedLayer:
    """One prompt's :class:`FusedLayer` in one layer.

    Args:
        tensors: the plan's index tensors and row blocks on the layer's device.
        masks: the blocks' masks (:func:`probe.attention.masks.block_mask`), one per block of ``tensors``.
        query: (H, T, D) query states, key: (H_kv, T, D) key states, value: (H_kv, T, D) value states (read only
            with ``module``, for the value-weighted masses), the prompt's own (padding cut off).
        scaling: multiplier of q·kᵀ.
        module: the attention module whose output projection weights the values, or None (no value-weighted masses).
        mask: (T, T) mask of the prompt (bool: True = may attend; float: additive), or None (causal).
        segment_spans: the plan's segment spans (the rows of each accumulated segment).
    """
    n_heads, n_tokens, dim = query.shape
    device = query.device
    qs = query.to(torch.float32) * scaling
    kh = key.to(torch.float32).repeat_interleave(n_heads // key.shape[0], dim=0)  # (H, T, D): head h reads h // rep
    cols = tensors.onehot.expand(n_heads, -1, -1)  # (H, T, S)
    n_seg = cols.shape[-1]
    weighted = module is not None and value is not None
    if weighted:
        assert module is not None and value is not None
        norms = value_norms(value, output_projection(module), n_heads, gram=module_gram(module, n_heads, device))
        cols = torch.cat([cols, cols * norms[:, :, None]], dim=-1)  # (H, T, 2S)
    width = cols.shape[-1]
    n_calls = -(-width // dim)
    values = torch.zeros(n_heads, n_tokens, n_calls * dim, dtype=torch.float32, device=device)
    values[:, :, :width] = cols
    sums = torch.zeros(n_heads, width, dtype=torch.float64, device=device)
    lse = torch.zeros(n_heads, n_tokens, dtype=torch.float32, device=device)
    for block, bm in zip(tensors.blocks, masks):
        q = qs[:, block.first : block.last + 1] if block.contiguous else qs[:, block.positions]
        m = bm.dense(q.shape[1], device)
        k = kh[:, bm.lo : bm.hi]
        calls = range(n_calls) if block.query_index is not None else range(1)  # lse alone: one call
        outs = []
        for c in calls:
            out, row_lse = _kernel(q, k, values[:, bm.lo : bm.hi, c * dim : (c + 1) * dim], m)
            outs.append(out)
        lse[:, block.positions] = row_lse
        if block.query_index is not None:
            sums += torch.cat(outs, dim=-1)[:, block.query_index, :width].sum(dim=1, dtype=torch.float64)
    columns = [_column_sums(qs, kh, lse, mask, *segment_spans[s], n_keys)
               for s, n_keys in zip(tensors.acc_segments, tensors.acc_lengths)]
    return FusedLayer(q_mass=sums[:, :n_seg], q_value_mass=sums[:, n_seg:] if weighted else None,
                      column_sums=columns, n_queries=len(tensors.query_positions))


def _column_sums(qs: torch.Tensor, kh: torch.Tensor, lse: torch.Tensor, mask: torch.Tensor | None, a: int, b: int,
                 n_keys: int) -> torch.Tensor:
    """(H, n_keys) ``Σ_{i∈[a,b)} A_ij`` for keys j < ``n_keys``: the swapped call (docs/probes.md#the-fused-path)."""
    n_heads, _, dim = qs.shape
    device = qs.device
    wide = -(-(dim + 1) // 8) * 8  # D + 1 coordinates, padded with zeros to a multiple of 8 (CUDA kernels align)
    as_queries = torch.zeros(n_heads, n_keys, wide, dtype=torch.float32, device=device)
    as_queries[:, :, :dim] = kh[:, :n_keys]
    as_queries[:, :, dim] = 1.0
    as_keys = torch.zeros(n_heads, b - a, wide, dtype=torch.float32, device=device)
    as_keys[:, :, :dim] = qs[:, a:b]
    as_keys[:, :, dim] = -lse[:, a:b]
    seen = None
    additive = None
    if mask is None:  # causal: key j is read by the rows i >= j, keys before a by every row
        if n_keys > a:
            allowed = torch.arange(n_keys, device=device)[:, None] <= torch.arange(a, b, device=device)[None, :]
            additive = torch.zeros(allowed.shape, device=device).masked_fill_(~allowed, -torch.inf)
    else:
        rows = mask[a:b, :n_keys].T  # (L, |S|): may row i read key j
        if rows.dtype == torch.bool:
            allowed = rows
            additive = torch.zeros(rows.shape, device=device).masked_fill_(~rows, -torch.inf)
        else:
            allowed = rows > torch.finfo(rows.dtype).min / 2
            additive = rows.to(torch.float32).masked_fill(~allowed, -torch.inf)
        seen = allowed.any(dim=1)  # keys no row of the segment reads (a sliding window) sum to 0
    values = torch.zeros(n_heads, b - a, wide, dtype=torch.float32, device=device)
    _, col_lse = _kernel(as_queries, as_keys, values, additive)
    out = col_lse.exp()
    if seen is not None:
        out = out * seen
    return out


__all__ = ["fused_layer"]
