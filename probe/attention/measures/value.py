"""Value-weighted segment mass and P_ext: attention weighted by what each key contributes to the output
(docs/probes.md#value-weighted-share)."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from torch.utils.weak import WeakIdKeyDictionary

from probe.attention.measure import EagerAttention, LayerContext, Measure, register_measure
from probe.attention.measures.mass import by_kind, share_of_extraneous
from probe.attention.plan import ProbePlan
from probe.attention.segments import RowBlock
from probe.errors import HookError



# Names architectures give the linear map that takes an attention module's output (heads x value width) back to the
# hidden size; the conformance suite checks the one found against the map the attention output really goes into.
OUTPUT_PROJECTIONS = ("o_proj", "out_proj", "dense", "c_proj", "wo", "Wo", "o", "proj", "attn_out", "out")


def output_projection(module: torch.nn.Module) -> torch.Tensor:
    """(heads · value width, hidden) output projection of an attention module, rows = the attention output's
    dimensions: the first of :data:`OUTPUT_PROJECTIONS` it has that is a ``Linear`` (transposed) or a GPT-2
    ``Conv1D`` (as it is).

    Raises:
        HookError: the module has none.
    """
    for name in OUTPUT_PROJECTIONS:
        proj = getattr(module, name, None)
        proj = getattr(proj, "original_component", proj)  # TransformerLens wraps the Linear in a bridge
        if isinstance(proj, torch.nn.Linear):
            return proj.weight.T
        if isinstance(proj, torch.nn.Module) and type(proj).__name__ == "Conv1D":
            weight = proj.weight
            assert isinstance(weight, torch.Tensor)
            return weight
    raise HookError(f"{type(module).__name__} has none of {', '.join(OUTPUT_PROJECTIONS)}: its output projection "
                    "cannot be read")


def has_output_projection(module: torch.nn.Module) -> bool:
    """Whether :func:`output_projection` finds one."""
    try:
        output_projection(module)
    except HookError:
        return False
    return True


def head_gram(out_rows: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(head, head_dim, head_dim) float32 Gram matrix W_O^h W_O^hᵀ of each query head's rows of the output projection
    (``out_rows``: (heads · head_dim, hidden)), so that ‖v W_O^h‖² = v (W_O^h W_O^hᵀ) vᵀ."""
    w = out_rows.to(torch.float32).reshape(n_heads, out_rows.shape[0] // n_heads, -1)  # (H, D, hidden)
    return torch.matmul(w, w.transpose(1, 2))


# weight tensor -> ((its version, data pointer, heads, device), Gram): the Gram of a layer is computed once, not per
# prompt, layer call and batch (it cost a matrix product over the hidden size each time)
_GRAMS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def module_gram(module: torch.nn.Module, n_heads: int, device: torch.device) -> torch.Tensor:
    """:func:`head_gram` of the module's output projection on ``device``, kept while the weight is unchanged (an
    in-place edit of the weight bumps its version and the Gram is computed again)."""
    out_rows = output_projection(module)
    weight = out_rows._base if out_rows._base is not None else out_rows  # o_proj.weight.T is a view of the weight
    try:
        version = weight._version
    except RuntimeError:  # an inference tensor keeps no version (and cannot be edited in place outside inference)
        version = -1
    stamp = (version, weight.data_ptr(), n_heads, device)
    kept = _GRAMS.get(weight)
    if kept is None or kept[0] != stamp:
        kept = (stamp, head_gram(out_rows.detach().to(device), n_heads))
        _GRAMS[weight] = kept
    return kept[1]


def value_norms(values: torch.Tensor, out_rows: torch.Tensor, n_heads: int,
                gram: torch.Tensor | None = None) -> torch.Tensor:
    """(head, T) float32 ‖v_j W_O^h‖ of every key j and query head h.

    Args:
        values: (kv_head, T, head_dim) value states.
        out_rows: (heads · head_dim, hidden) output projection, rows = the attention output's dimensions.
        n_heads: query heads.
        gram: :func:`head_gram` of ``out_rows`` when already computed (a caller that asks once per decode step).
    """
    n_kv = values.shape[0]
    if gram is None:
        gram = head_gram(out_rows, n_heads)  # (H, D, D)
    v = values.to(torch.float32).repeat_interleave(n_heads // n_kv, dim=0)  # (H, T, D): head h reads KV head h//rep
    sq = (torch.matmul(v, gram) * v).sum(-1)  # (H, T)
    return sq.clamp_min_(0).sqrt_()


class ValueMass:
    """Sums Q's rows, each weight times its key's ‖v W_O^h‖, over each segment's keys; each segment's share of the
    total at the end."""

    def __init__(self, ctx: LayerContext) -> None:
        if ctx.module is None:
            raise HookError(f"layer {ctx.layer}: the value-weighted share needs the attention module's output "
                            "projection, and the layer reported none")
        self.t = ctx.tensors
        self.n_heads = ctx.n_heads
        self.module = ctx.module
        self.out_rows = output_projection(ctx.module)
        self.q_mass = torch.zeros(ctx.n_heads, ctx.plan.n_segments, dtype=torch.float64, device=ctx.tensors.device)
        self.norms: torch.Tensor | None = None

    def add(self, block: RowBlock, probs: torch.Tensor, values: torch.Tensor | None, key_start: int) -> None:
        if block.query_index is None:
            return
        if values is None:
            raise HookError("the value-weighted share was given no value states")
        if self.norms is None:
            gram = module_gram(self.module, self.n_heads, values.device)
            self.norms = value_norms(values, self.out_rows, self.n_heads, gram=gram)  # (H, T)
        n_keys = probs.shape[-1]
        weighted = probs[:, block.query_index] * self.norms[:, None, key_start:key_start + n_keys]  # (H, nq, K)
        self.q_mass += self.t.segment_sums(weighted, key_start).sum(dim=1, dtype=torch.float64)

    def finish(self) -> np.ndarray:
        return _shares(self.q_mass)


def _shares(q_mass: torch.Tensor) -> np.ndarray:
    """(H, S) each segment's share of a (H, S) value-weighted mass (NaN where a head's total is 0)."""
    total = q_mass.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, q_mass / total.clamp_min(1e-300), torch.nan).cpu().numpy()


def _reference_segment(e: EagerAttention) -> np.ndarray:
    if e.values is None or e.out_proj is None:
        raise HookError("reference: the value-weighted share needs the value states and output projection")
    n_layers, n_heads = len(e.attentions), e.attentions[0].shape[0]
    out = np.zeros((n_layers, n_heads, len(e.seg_bounds)))
    for layer, att in enumerate(e.attentions):
        values, w = e.values[layer], e.out_proj[layer]  # (H_kv, T, D), (H*D, hidden)
        dim = values.shape[-1]
        rep = n_heads // values.shape[0]
        for h in range(n_heads):
            norms = np.linalg.norm(values[h // rep] @ w[h * dim:(h + 1) * dim], axis=-1)  # (T,)
            for s, (a, b) in enumerate(e.seg_bounds):
                out[layer, h, s] = sum(att[h, q, a:b] @ norms[a:b] for q in e.queries)
    with np.errstate(invalid="ignore", divide="ignore"):
        return out / out.sum(axis=-1, keepdims=True)


def _reference_p_ext(e: EagerAttention) -> np.ndarray:
    per_seg = e.arrays["value_share_segment"]
    ext = sum(per_seg[..., s] for s, k in enumerate(e.seg_kinds) if k == "extraneous")
    den = sum(per_seg[..., s] for s, k in enumerate(e.seg_kinds) if k != "sink" or not e.options.exclude_sink)
    ext = np.zeros(per_seg.shape[:2]) + ext
    out = np.full(per_seg.shape[:2], np.nan)
    np.divide(ext, den, out=out, where=np.asarray(den) > 0)
    return out


def _derive_p_ext(arrays: Mapping[str, np.ndarray], plan: ProbePlan) -> np.ndarray:
    return share_of_extraneous(by_kind(arrays["value_share_segment"], plan.segment_kinds), plan.options.exclude_sink)


VALUE_MASS_SEGMENT = register_measure(Measure(
    id="value_share_segment", axes=("layer", "head", "segment"), value_range=(0.0, 1.0),
    description="share of each segment in the value-weighted attention (α ‖v W_O‖) of the query set",
    reference=_reference_segment, reducer=ValueMass, needs_values=True))
VALUE_P_EXT = register_measure(Measure(
    id="value_p_ext", axes=("layer", "head"), value_range=(0.0, 1.0),
    description="value-weighted P_ext: share of the non-sink value-weighted attention on extraneous segments",
    reference=_reference_p_ext, derive=_derive_p_ext, has_chance=True, needs_values=True,
    label="value-weighted P_ext"))
