"""The probe engine: per-segment attention aggregates of a Hugging Face model at the speed of its fast attention.

The engine registers an attention function with transformers' ``AttentionInterface`` (name
:data:`IMPLEMENTATION`) and switches the model to it for one forward pass (or one ``generate`` call). Each layer's
call receives the query and key states after rotary embedding, the mask, ``scaling``, ``softcap`` and
``sliding_window``; it

1. computes the layer's output as the model would: through SDPA (transformers' own ``sdpa_attention_forward``,
   so the hidden states are those of the model's ``sdpa`` implementation), or, for soft-capped logits (Gemma 2),
   through an exact blocked attention, since SDPA cannot soft-cap;
2. for every prompt of the batch, computes post-softmax rows only for the query positions its probe needs, a block
   of rows at a time, exactly as the architecture's eager attention does (scores ``q·kᵀ·scaling``, then
   ``tanh(x/cap)·cap`` when soft-capped, then the mask, which carries the causal and sliding-window pattern, then a
   float32 softmax; each query head ``h`` reads key head ``h // (heads / kv_heads)`` as ``repeat_kv`` does). A
   block of rows ending at position p reads only the keys a row can see (``[0, p]``, or the window), and only the
   keys the mask hides inside that range are set to −inf (a triangle for a causal block);
3. reduces each block at once to per-segment aggregates (:class:`~probe.attention.reduce.LayerReducer`) and
   reports them to the active :class:`Capture`.

Batches (several prompts per forward pass) are left-padded: row ``i`` of a batch of width W holds its prompt at
positions ``[pads[i], W)``, its position ids run from 0 (as ``generate`` makes them), and the mask hides the padding.
The probe reads row i's queries, keys and mask at ``[pads[i], W)``, which are those of the prompt alone, so each
row's aggregates equal a one-prompt probe (up to the float rounding of a batched matmul).

Generation (:func:`probe_generation`): the capture is told the batch's width and takes only the call whose queries
and keys both span it — ``generate``'s prefill, which sees the whole prompt — and lets every decode step (one
query, a longer cache) through untouched. The generated tokens are those of the ``sdpa`` implementation.

Interventions (:mod:`probe.attention.intervention`, :func:`attach_edit`): the same registered function applies an
active :class:`~probe.attention.intervention.BatchEdit` to the layers it names (knockout or steer of the edges from
chosen queries to chosen keys), during a forward pass or every step of ``generate``; a probe active at the same
time adds the same edit to its rows, so it measures the intervened attention.

No L × H × T² tensor ever exists: the largest probe tensor is one block, ``(heads, rows, keys)``, with the rows
chosen so that it stays within a few per cent of the forward's own activations
(:func:`~probe.attention.capacity.block_elements`). After the forward pass the capture checks that every layer
reported exactly once (else :class:`~probe.errors.HookError`), and the model gets its previous attention
implementation back whatever happened.

Scores are computed in float32 whatever the model's dtype (a bfloat16 model's eager attention would round the
scores to bfloat16 first; the engine's rows are the more precise ones).
"""

from __future__ import annotations

import contextvars
import logging
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from transformers import AttentionInterface, PreTrainedConfig, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from probe.attention.capacity import ModelShape, block_elements
from probe.attention.intervention import BatchEdit, edited_attention
from probe.attention.plan import ProbePlan, build_plan
from probe.attention.reduce import SCRATCH_COPIES, LayerAggregates, LayerReducer, PlanTensors, RowBlock, assemble_result
from probe.attention.result import SegmentAttention
from probe.config import ProbeSection
from probe.errors import ConfigError, HookError
from probe.loading import LoadedModel, input_device
from probe.types import TokenizedPrompt

log = logging.getLogger(__name__)

IMPLEMENTATION = "ice_probe"

# Architectures (``config.model_type``) whose attention goes through the AttentionInterface with the standard
# eager semantics reproduced above; each has an exactness test against its eager ``output_attentions``.
SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gpt2")

# Query sets whose rows lie inside the prompt: they can be probed during generation's prefill.
PROMPT_QUERY_SETS = ("question", "last")

_ACTIVE: contextvars.ContextVar["Capture | None"] = contextvars.ContextVar("ice_probe_capture", default=None)
_ACTIVE_EDIT: contextvars.ContextVar["BatchEdit | None"] = contextvars.ContextVar("ice_probe_edit", default=None)
_registered = False


def _register() -> None:
    """Register the probe's attention and mask functions with transformers (once per process)."""
    global _registered
    if not _registered:
        AttentionInterface.register(IMPLEMENTATION, _probe_attention)
        # The probe's forward runs SDPA, so it takes SDPA's masks (None when a plain causal mask suffices).
        AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
        _registered = True


def text_config_of(model: PreTrainedModel) -> PreTrainedConfig:
    """The model's text (decoder) config."""
    return model.config.get_text_config()


def layers_and_heads(model: PreTrainedModel) -> tuple[int, int]:
    """The model's number of layers and of query heads per layer."""
    cfg = model.config.get_text_config()
    return int(cfg.num_hidden_layers), int(cfg.num_attention_heads)


def check_architecture(model: PreTrainedModel) -> None:
    """Raise :class:`HookError` unless the model's architecture is one the engine supports.

    Raises:
        HookError: naming the unsupported ``model_type`` and the supported ones.
    """
    model_type = getattr(model.config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise HookError(
            f"the attention probe does not support architecture {model_type!r} "
            f"({type(model).__name__}); supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


def is_prompt_query(options: ProbeSection) -> bool:
    """Whether the query set lies inside the prompt (``question``, ``last``, ``segment:<i>``), so that the probe
    can ride on generation's prefill; ``generated`` needs a forward pass over prompt + answer."""
    return options.query in PROMPT_QUERY_SETS or options.query.startswith("segment:")


# ---------------------------------------------------------------------------------------------------------------
# Masks


@dataclass
class BlockMask:
    """Which keys one block of rows reads and which of them the mask hides.

    Attributes:
        lo / hi: the block reads keys ``[lo, hi)`` (every key a row of the block can see).
        head: (B, w) bool, True = hidden, for keys ``[lo, lo + w)``, or None.
        tail: (B, w) bool, True = hidden, for keys ``[tail_start, hi)``, or None.
        tail_start: first key of ``tail``.
        blocked: (B, hi - lo) bool, True = hidden, when the visible keys of a row are not one interval per row
            (then ``head`` and ``tail`` are None).
        additive: (B, hi - lo) float32 additive mask rows (a float mask with values other than 0 and -inf).
    """

    lo: int
    hi: int
    head: torch.Tensor | None = None
    tail: torch.Tensor | None = None
    tail_start: int = 0
    blocked: torch.Tensor | None = None
    additive: torch.Tensor | None = None

    def apply(self, scores: torch.Tensor) -> None:
        """Set the hidden keys of (H, B, hi - lo) ``scores`` to -inf (or add the additive mask), in place."""
        if self.additive is not None:
            scores += self.additive
            return
        if self.blocked is not None:
            scores.masked_fill_(self.blocked, float("-inf"))
            return
        if self.head is not None:
            scores[:, :, : self.head.shape[1]].masked_fill_(self.head, float("-inf"))
        if self.tail is not None:
            scores[:, :, self.tail_start - self.lo :].masked_fill_(self.tail, float("-inf"))


def causal_block_mask(block: RowBlock) -> BlockMask:
    """The block's keys and hidden keys under a plain causal mask."""
    return BlockMask(lo=0, hi=block.last + 1, tail=block.causal_tail, tail_start=block.first + 1)


def block_mask(mask: torch.Tensor, block: RowBlock) -> BlockMask:
    """The block's keys and hidden keys under a (T, T) mask (bool: True = may attend; float: additive).

    Raises:
        HookError: a row of the block may attend to no key.
    """
    rows = mask[block.first : block.last + 1] if block.contiguous else mask[block.positions]
    rows = rows[:, : block.last + 1]  # (B, last + 1): no row sees a key after itself
    if rows.dtype != torch.bool:
        allowed = rows > torch.finfo(rows.dtype).min / 2
        if not bool((rows[allowed] == 0).all()):  # a bias beyond hiding keys: add the rows as they are
            return BlockMask(lo=0, hi=block.last + 1, additive=rows.to(torch.float32))
        rows = allowed
    if not bool(rows.any(dim=1).all()):
        raise HookError(f"the attention mask lets a query row in [{block.first}, {block.last}] see no key")
    u = rows.to(torch.uint8)
    first_key = u.argmax(dim=1)  # first allowed key per row
    last_key = block.last - u.flip(1).argmax(dim=1)  # last allowed key per row
    lo, hi = int(first_key.min()), int(last_key.max()) + 1
    is_interval = bool((u.sum(dim=1) == last_key - first_key + 1).all())
    head_end, tail_start = int(first_key.max()), int(last_key.min()) + 1
    if not is_interval or head_end > tail_start:
        return BlockMask(lo=lo, hi=hi, blocked=~rows[:, lo:hi])
    return BlockMask(
        lo=lo,
        hi=hi,
        head=~rows[:, lo:head_end] if head_end > lo else None,
        tail=~rows[:, tail_start:hi] if hi > tail_start else None,
        tail_start=tail_start,
    )


def allowed_keys(mask: torch.Tensor | None, positions: torch.Tensor, n_keys: int) -> torch.Tensor:
    """(B, T) bool: the keys each query position may attend to under a (T, T) ``mask`` (None: plain causal).

    A boolean mask is True where attention is allowed; an additive float mask allows what it does not push to the
    dtype's minimum.
    """
    if mask is None:
        return torch.arange(n_keys, device=positions.device)[None, :] <= positions[:, None]
    rows = mask[positions, :]
    return rows if rows.dtype == torch.bool else rows > torch.finfo(rows.dtype).min / 2


# ---------------------------------------------------------------------------------------------------------------
# The capture


# A prompt whose probe rows hold fewer score elements than this (heads x T^2 / 2, about T = 1300 for 9 heads) is
# reduced on one CPU thread: its operations are small, and splitting each of them over threads costs more in
# synchronisation than it saves (much more on a machine shared with other work).
SMALL_PROBE_ELEMENTS = 8 * 1024 * 1024


@contextmanager
def _few_threads(device: torch.device, n_elements: int) -> Iterator[None]:
    """One intra-op thread for the block when the probe's work is small and on the CPU; restored afterwards."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1 or n_elements >= SMALL_PROBE_ELEMENTS:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class _Row:
    """One prompt of a batch: its plan, its left padding and what its layers reported."""

    def __init__(self, plan: ProbePlan, pad: int, max_block_elements: int | None) -> None:
        self.plan = plan
        self.pad = pad
        self.max_block_elements = max_block_elements
        self.tensors: dict[torch.device, PlanTensors] = {}  # per device (layers may be spread over GPUs)
        self.block_masks: dict[tuple, list[BlockMask]] = {}  # per mask (layers of one type share their mask)
        self.chance: dict[tuple, float] = {}
        self.layers: dict[int, LayerAggregates] = {}

    def tensors_on(self, device: torch.device) -> PlanTensors:
        if device not in self.tensors:
            self.tensors[device] = PlanTensors(self.plan, device, self.max_block_elements)
        return self.tensors[device]


class Capture:
    """Collects the layers' aggregates of a batch of prompts during one forward pass; checks each layer reported once.

    Args:
        plans: one probe plan per batch row.
        n_layers: the layers expected to report (0 .. n_layers-1).
        pads: left padding of each row (None: no padding; every plan has the batch's length).
        max_block_elements: most ``rows x keys`` per head in one block of rows (None: ``block_size`` rows).
        prefill_only: take only the call whose queries and keys span the whole batch (generation's prefill) and let
            every other call (decode steps) through; without it any other shape is an error.

    Raises:
        HookError: plans and pads disagree on the batch's width.
    """

    def __init__(
        self,
        plans: Sequence[ProbePlan],
        n_layers: int,
        pads: Sequence[int] | None = None,
        max_block_elements: int | None = None,
        prefill_only: bool = False,
    ) -> None:
        pads = list(pads) if pads is not None else [0] * len(plans)
        if len(pads) != len(plans) or not plans:
            raise HookError(f"capture: {len(plans)} plans and {len(pads)} paddings (one each, at least one)")
        widths = {p.n_tokens + pad for p, pad in zip(plans, pads)}
        if len(widths) != 1:
            raise HookError(f"capture: prompt length + padding differs between rows ({sorted(widths)})")
        self.width = widths.pop()
        self.rows = [_Row(plan, pad, max_block_elements) for plan, pad in zip(plans, pads)]
        self.n_layers = n_layers
        self.prefill_only = prefill_only
        self.calls: Counter[int] = Counter()
        self.options = plans[0].options

    @property
    def plans(self) -> list[ProbePlan]:
        return [r.plan for r in self.rows]

    def report(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
        softcap: float | None,
        edit: BatchEdit | None = None,
    ) -> None:
        """Compute the needed rows of one layer for every prompt of the batch, in blocks, and keep their aggregates.

        Args:
            layer: the reporting layer's index.
            query: (B, H, W, D) query states after rotary embedding.
            key: (B, H_kv, W, D) key states.
            attention_mask: (B or 1, 1, W, W) bool (True = may attend) or additive float mask, or None (causal).
            scaling: multiplier of ``q·kᵀ``.
            softcap: logit soft-capping value, or None.
            edit: an intervention acting on this layer (its bias is added to the rows' scores, so the probe
                measures the intervened attention), or None.
        """
        n_batch, n_heads, n_q, _ = query.shape
        n_kv, n_k = key.shape[1], key.shape[2]
        if n_q != self.width or n_k != self.width:
            if self.prefill_only:
                return  # a decode step: one new query against the cache
            raise HookError(
                f"layer {layer}: attention over {n_q} queries x {n_k} keys, the probed sequence has "
                f"{self.width} tokens (a cache or packed input is not supported)"
            )
        self.calls[layer] += 1
        if self.calls[layer] > 1:
            return  # the duplicate is reported by ``check``
        if n_batch != len(self.rows):
            raise HookError(f"layer {layer}: a batch of {n_batch} rows, the probe expects {len(self.rows)}")
        if n_heads % n_kv:
            raise HookError(f"layer {layer}: {n_heads} query heads do not group over {n_kv} key/value heads")
        if attention_mask is not None and (
            attention_mask.dim() != 4 or attention_mask.shape[1] != 1 or attention_mask.shape[0] not in (1, n_batch)
            or tuple(attention_mask.shape[2:]) != (self.width, self.width)
        ):
            raise HookError(f"layer {layer}: unexpected attention mask of shape {tuple(attention_mask.shape)}; "
                            f"expected ({n_batch} or 1, 1, {self.width}, {self.width})")
        with _few_threads(query.device, max(r.plan.n_tokens for r in self.rows) ** 2 * n_heads // 2):
            for i, row in enumerate(self.rows):
                p = row.pad
                mask = None
                mask_key: tuple = (None,)
                if attention_mask is not None:
                    b = i if attention_mask.shape[0] > 1 else 0
                    mask = attention_mask[b, 0, p:, p:]  # (T, T): the prompt's own rows and keys
                    mask_key = (attention_mask.data_ptr(), tuple(attention_mask.shape), b, p)
                row_edit = (edit, layer, i) if edit is not None and edit.edits_layer(layer) else None
                row.layers[layer] = self._reduce(row, query[i, :, p:, :], key[i, :, p:, :], mask, mask_key, scaling,
                                                 softcap, row_edit)

    def _reduce(
        self,
        row: _Row,
        query: torch.Tensor,
        key: torch.Tensor,
        mask: torch.Tensor | None,
        mask_key: tuple,
        scaling: float,
        softcap: float | None,
        row_edit: tuple[BatchEdit, int, int] | None = None,
    ) -> LayerAggregates:
        """One prompt's aggregates in one layer from its (H, T, D) queries and (H_kv, T, D) keys; ``row_edit`` =
        (the batch's edit, layer, batch row) adds the intervention's bias to the scores."""
        n_heads, dim = query.shape[0], query.shape[2]
        n_kv = key.shape[0]
        tensors = row.tensors_on(query.device)
        masks = row.block_masks.get(mask_key)
        if masks is None:
            if mask is None:
                masks = [causal_block_mask(b) for b in tensors.blocks]
            else:
                masks = [block_mask(mask, b) for b in tensors.blocks]
            if all(m.additive is None for m in masks):  # the rows of a bias mask are not kept across layers
                row.block_masks[mask_key] = masks
        reducer = LayerReducer(row.plan, n_heads, tensors)
        key_t = key.to(torch.float32).transpose(-1, -2)  # (H_kv, D, T), a transposed view bmm reads as is
        for block, bm in zip(tensors.blocks, masks):
            q = query[:, block.first : block.last + 1] if block.contiguous else query[:, block.positions]
            n_rows = q.shape[1]
            q = (q.to(torch.float32) * scaling).reshape(n_kv, (n_heads // n_kv) * n_rows, dim)  # (H_kv, rep*B, D)
            scores = torch.bmm(q, key_t[:, :, bm.lo : bm.hi]).view(n_heads, n_rows, bm.hi - bm.lo)  # (H, B, K)
            if softcap is not None:
                scores = scores.div_(softcap).tanh_().mul_(softcap)
            bm.apply(scores)
            if row_edit is not None:
                edit, layer, i = row_edit
                rows = torch.tensor([i], device=edit.device)
                scores += edit.bias(layer, (block.positions + row.pad).to(edit.device), bm.lo + row.pad,
                                    bm.hi + row.pad, rows)[0].to(scores.device)
            probs = torch.softmax(scores, dim=-1)
            del scores
            reducer.add(block, probs, bm.lo)
            del probs
        if mask_key not in row.chance:
            allowed = allowed_keys(mask, tensors.query_positions, row.plan.n_tokens)
            row.chance[mask_key] = tensors.chance(allowed, row.plan.options.exclude_sink)
        return reducer.finish(row.chance[mask_key])

    def check(self) -> None:
        """Raise :class:`HookError` unless every expected layer reported exactly once."""
        missing = [i for i in range(self.n_layers) if self.calls[i] == 0]
        repeated = sorted(i for i, n in self.calls.items() if n > 1)
        unexpected = sorted(i for i in self.calls if not 0 <= i < self.n_layers)
        if missing or repeated or unexpected:
            parts = []
            if missing:
                parts.append(f"layers {missing} did not report (their attention bypasses the AttentionInterface)")
            if repeated:
                parts.append(f"layers {repeated} reported more than once")
            if unexpected:
                parts.append(f"layers {unexpected} are outside 0..{self.n_layers - 1}")
            raise HookError("attention probe: " + "; ".join(parts))

    def results(self) -> list[SegmentAttention]:
        """Check the layers, then one :class:`SegmentAttention` per batch row, in batch order."""
        self.check()
        return [assemble_result(r.plan, [r.layers[i] for i in range(self.n_layers)]) for r in self.rows]


# ---------------------------------------------------------------------------------------------------------------
# Attention functions


def attention_rows(
    query: torch.Tensor,
    key_t: torch.Tensor,
    positions: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    softcap: float | None,
    key_offset: int = 0,
) -> torch.Tensor:
    """Post-softmax attention rows of some query positions over all keys, as eager attention computes them.

    Args:
        query: (1, H, Q, D) query states.
        key_t: (H_kv, D, K) float32 transposed key states.
        positions: (B,) int64 query indices (into the Q axis).
        attention_mask: (1, 1, Q, K) bool or additive float mask, or None for a plain causal mask.
        scaling: multiplier of ``q·kᵀ``.
        softcap: soft-capping value or None.
        key_offset: key position of query 0 under the causal mask when ``attention_mask`` is None (``K - Q``:
            the queries are the last Q positions, as in a decode step against a cache).

    Returns:
        (H, B, K) float32 rows, each summing to 1.
    """
    n_heads, dim = query.shape[1], query.shape[3]
    n_kv = key_t.shape[0]
    n_keys = key_t.shape[-1]
    b = positions.shape[0]
    # Query head h reads key head h // rep (repeat_kv): group the query heads by key head.
    q = query[0, :, positions, :].to(torch.float32).reshape(n_kv, (n_heads // n_kv) * b, dim)  # (H_kv, rep*B, D)
    scores = torch.bmm(q, key_t).mul_(scaling).view(n_heads, b, n_keys)  # (H, B, T)
    if softcap is not None:
        scores = scores.div_(softcap).tanh_().mul_(softcap)
    mask = None if attention_mask is None else attention_mask[0, 0]
    if mask is not None and mask.dtype != torch.bool:
        scores += mask[positions, :].to(torch.float32)
    else:
        scores.masked_fill_(~allowed_keys(mask, positions + (key_offset if mask is None else 0), n_keys),
                            float("-inf"))
    return torch.softmax(scores, dim=-1)


def _blocked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    softcap: float | None,
    block_size: int,
) -> torch.Tensor:
    """Exact attention output computed ``block_size`` queries at a time (for soft-capped logits), row by row.

    Returns:
        (B, T, H, D) output in the query's dtype, the layout ``eager_attention_forward`` returns.
    """
    n_batch, n_heads, n_q = query.shape[:3]
    n_kv = key.shape[1]
    offset = key.shape[2] - n_q  # a decode step: the queries are the last positions of the cache
    out = torch.empty(n_batch, n_heads, n_q, value.shape[-1], dtype=query.dtype, device=query.device)
    for i in range(n_batch):
        key_t = key[i].to(torch.float32).transpose(-1, -2)  # (H_kv, D, T)
        v = value[i].to(torch.float32)  # (H_kv, T, Dv)
        mask = None
        if attention_mask is not None:
            mask = attention_mask[i : i + 1] if attention_mask.shape[0] > 1 else attention_mask
        for start in range(0, n_q, block_size):
            pos = torch.arange(start, min(start + block_size, n_q), device=query.device)
            probs = attention_rows(query[i : i + 1], key_t, pos, mask, scaling, softcap, offset)  # (H, B, T)
            probs = torch.nan_to_num(probs)  # a padding row that sees no key
            o = torch.bmm(probs.reshape(n_kv, (n_heads // n_kv) * len(pos), -1), v)  # (H_kv, rep*B, Dv)
            out[i, :, start : start + len(pos)] = o.reshape(n_heads, len(pos), -1).to(query.dtype)
    return out.transpose(1, 2).contiguous()


def _probe_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The registered attention function: the model's output through SDPA (edited where an intervention is active,
    :mod:`probe.attention.intervention`), the probe's aggregates of that attention on the side."""
    capture = _ACTIVE.get()
    edit = _ACTIVE_EDIT.get()
    if capture is None and edit is None:
        raise HookError(
            f"attention implementation {IMPLEMENTATION!r} was called outside a probe or an intervention; "
            "set the model's attention implementation back (model.set_attn_implementation('sdpa'))"
        )
    layer = getattr(module, "layer_idx", None)
    if layer is None:
        raise HookError(f"{type(module).__name__} has no layer_idx: cannot tell which layer reports")
    if dropout:
        raise HookError(f"layer {layer}: attention dropout {dropout} is active; call model.eval() before probing")
    if scaling is None:  # eager's default in every supported architecture
        scaling = query.shape[-1] ** -0.5
    if isinstance(attention_mask, torch.Tensor) or attention_mask is None:
        mask = attention_mask
    else:
        raise HookError(f"layer {layer}: unsupported attention mask type {type(attention_mask).__name__}")
    editing = edit is not None and edit.edits_layer(int(layer))
    if editing and query.shape[0] != edit.keys.shape[0]:  # type: ignore[union-attr]
        raise HookError(f"layer {layer}: a batch of {query.shape[0]} rows, the intervention was built for "
                        f"{edit.keys.shape[0]}")  # type: ignore[union-attr]
    # A decode step in which every row is edited needs no unedited output.
    skip_base = editing and query.shape[2] == 1 and edit.every_row_keyed  # type: ignore[union-attr]
    out: torch.Tensor | None = None
    if not skip_base:
        if softcap is None:
            out, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=0.0, scaling=scaling, **kwargs)
        else:
            block = capture.options.block_size if capture is not None else ProbeSection().block_size
            out = _blocked_attention(query, key, value, mask, scaling, softcap, block)
    if editing:
        out = edited_attention(edit, int(layer), query, key, value, mask, float(scaling), softcap,  # type: ignore[arg-type]
                               out)
    if capture is not None:
        capture.report(int(layer), query, key, mask, float(scaling), softcap, edit)
    assert out is not None
    return out, None


@contextmanager
def attention_implementation(model: PreTrainedModel, name: str) -> Iterator[PreTrainedModel]:
    """Switch ``model`` to attention implementation ``name`` for the block, then restore the previous one.

    Nested blocks that ask for the implementation already in force change nothing.

    Raises:
        HookError: the model did not accept ``name`` (it does not dispatch through transformers'
            ``AttentionInterface``).
    """
    previous = model.config._attn_implementation
    try:
        if previous != name:
            model.set_attn_implementation(name)
        if text_config_of(model)._attn_implementation != name:
            raise HookError(
                f"{type(model).__name__} did not accept attention implementation {name!r} "
                "(it does not dispatch through transformers' AttentionInterface)"
            )
        yield model
    finally:
        if previous is not None and model.config._attn_implementation != previous:
            model.set_attn_implementation(previous)


@contextmanager
def attach_probe(model: PreTrainedModel, capture: Capture) -> Iterator[Capture]:
    """Switch ``model`` to the probe's attention for the duration of the block, then restore it.

    Args:
        model: a supported Hugging Face model.
        capture: receives the layers' reports.

    Yields:
        ``capture``.

    Raises:
        HookError: unsupported architecture, or the model refused the attention implementation.
    """
    with _engine_attention(model, _ACTIVE, capture):
        yield capture


@contextmanager
def attach_edit(model: PreTrainedModel, edit: BatchEdit) -> Iterator[BatchEdit]:
    """Switch ``model`` to the engine's attention with an intervention's edit for the block, then restore it.

    Composes with :func:`attach_probe` (either may be outside): a probe inside the block measures the edited
    attention.

    Raises:
        HookError: unsupported architecture, or the model refused the attention implementation.
    """
    with _engine_attention(model, _ACTIVE_EDIT, edit):
        yield edit


@contextmanager
def _engine_attention(model: PreTrainedModel, slot: contextvars.ContextVar[Any], value: Any) -> Iterator[None]:
    """The engine's attention on ``model`` with ``value`` in ``slot`` (the probe's or the edit's) for the block."""
    check_architecture(model)
    _register()
    token = slot.set(value)
    try:
        with attention_implementation(model, IMPLEMENTATION):
            yield
    finally:
        slot.reset(token)


# ---------------------------------------------------------------------------------------------------------------
# Entry points


def block_budget(model: PreTrainedModel, n_tokens: int) -> int:
    """Rows x keys per head in one block of probe rows when the forward pass holds ``n_tokens`` tokens (all rows of
    a batch: the rows are probed one at a time, so a batch's forward leaves each of them more room); see
    ``block_elements``."""
    itemsize = torch.empty((), dtype=model.dtype).element_size()
    return block_elements(ModelShape.from_config(text_config_of(model), itemsize), n_tokens, SCRATCH_COPIES)


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Left-pad token sequences into one batch.

    Args:
        sequences: token ids of each row.
        pad_id: the id written into padding positions (masked, so any valid id).

    Returns:
        ``(input_ids, attention_mask, pads)``: (B, W) int64 ids, (B, W) int64 mask (1 = token), padding per row.
    """
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    pads = []
    for i, s in enumerate(sequences):
        ids[i, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
        mask[i, width - len(s) :] = 1
        pads.append(width - len(s))
    return ids, mask, pads


def transformers_model(model: Any) -> Any:
    """The transformers model of a ``probe.load_model`` model (:class:`probe.loading.LoadedModel`), else ``model``."""
    return model.model if isinstance(model, LoadedModel) else model


def probe_batch(
    model: PreTrainedModel,
    prompts: Sequence[TokenizedPrompt],
    options: ProbeSection | None = None,
    generated_ids: Sequence[Sequence[int]] | None = None,
    *,
    compute_residue: bool = True,
) -> list[SegmentAttention]:
    """Probe several prompts in one forward pass (left-padded); each result equals :func:`probe_tokenized`'s.

    Args:
        model: a loaded Hugging Face causal LM of a supported architecture, in eval mode (or a ``probe.load_model``
            model, whose transformers model is used).
        prompts: the prompts' ids and token spans.
        options: query set, γ, residue mode, sink exclusion, block size (defaults: ``ProbeSection()``).
        generated_ids: per prompt, answer token ids appended after it; required by query ``generated``.
        compute_residue: compute AR_k.

    Returns:
        One :class:`SegmentAttention` per prompt, in order.

    Raises:
        HookError: unsupported architecture, a layer that did not report exactly once, or an unusable input.
        SpanError / ConfigError: a query set cannot be formed from the spans / options.
    """
    model = transformers_model(model)
    options = options or ProbeSection()
    if not prompts:
        return []
    answers = [list(g) for g in generated_ids] if generated_ids is not None else [[] for _ in prompts]
    if len(answers) != len(prompts):
        raise ConfigError(f"probe_batch: {len(prompts)} prompts but {len(answers)} generated answers")
    plans = [build_plan(tp, options, n_generated=len(g), compute_residue=compute_residue)
             for tp, g in zip(prompts, answers)]
    ids, mask, pads = left_pad([list(tp.input_ids) + g for tp, g in zip(prompts, answers)])
    width = ids.shape[1]
    capture = Capture(plans, int(text_config_of(model).num_hidden_layers), pads,
                      block_budget(model, width * len(prompts)))
    device = input_device(model)  # not the first parameter's: a dispatched model may keep it on `meta`
    kwargs: dict[str, torch.Tensor] = {}
    if any(pads):  # position ids from 0 in every row, as generate makes them
        kwargs = {"attention_mask": mask.to(device),
                  "position_ids": (mask.cumsum(-1) - 1).clamp_min(0).to(device)}
    log.debug("probing %d prompts of up to %d tokens", len(prompts), width)
    with torch.no_grad(), attach_probe(model, capture):
        model.base_model(input_ids=ids.to(device), use_cache=False, **kwargs)
    return capture.results()


def probe_tokenized(
    model: PreTrainedModel,
    tokenized: TokenizedPrompt,
    options: ProbeSection | None = None,
    generated_ids: Sequence[int] | None = None,
    *,
    compute_residue: bool = True,
) -> SegmentAttention:
    """Probe one prompt: segment masses, P_ext with chance and enrichment, sink mass and AR_k (docs/probes.md).

    Runs one forward pass of the model's base (no LM head, no cache) over the prompt, or over prompt + answer when
    ``generated_ids`` are given.

    Args:
        model: a loaded Hugging Face causal LM of a supported architecture, in eval mode (or a ``probe.load_model``
            model, whose transformers model is used).
        tokenized: the prompt's ids and token spans (``probe.prompts.tokenize.encode_prompt`` makes them; any spans
            that partition the tokens will do).
        options: query set, γ, residue mode, sink exclusion, block size (defaults: ``ProbeSection()``).
        generated_ids: answer token ids appended after the prompt; required by query ``generated``.
        compute_residue: compute AR_k (needs the rows of every token of the germane, question and earlier
            extraneous segments); False computes only the query set's rows.

    Returns:
        The prompt's :class:`SegmentAttention`.

    Raises:
        HookError: unsupported architecture, a layer that did not report exactly once, or an unusable input.
        SpanError / ConfigError: the query set cannot be formed from the spans / options.
    """
    generated = [list(generated_ids)] if generated_ids is not None else None
    return probe_batch(model, [tokenized], options, generated, compute_residue=compute_residue)[0]


@contextmanager
def probe_generation(
    model: PreTrainedModel,
    prompts: Sequence[TokenizedPrompt],
    pads: Sequence[int],
    options: ProbeSection | None = None,
    *,
    compute_residue: bool = True,
) -> Iterator[Capture]:
    """Probe a left-padded batch during ``model.generate``'s own prefill (the probe rides on generation).

    Inside the block, run ``model.generate`` on the batch laid out as :func:`left_pad` does (row i = ``pads[i]``
    padding tokens, then ``prompts[i]``); afterwards ``capture.results()`` gives one :class:`SegmentAttention` per
    prompt, equal to :func:`probe_tokenized`'s. Only the prefill (queries and keys both spanning the batch) is probed;
    decode steps pass through, and the outputs are those of the model's ``sdpa`` attention.

    Args:
        model: a loaded Hugging Face causal LM of a supported architecture, in eval mode.
        prompts: the batch's prompts (ids and token spans), in batch order.
        pads: left padding of each row.
        options: probe options; the query set must lie inside the prompt (not ``generated``).
        compute_residue: compute AR_k.

    Yields:
        The :class:`Capture`.

    Raises:
        ConfigError: query ``generated`` (it needs the answer: probe after generation with :func:`probe_batch`).
        HookError: see :func:`attach_probe`; ``results()`` raises it when a layer did not report exactly once.
    """
    options = options or ProbeSection()
    if not is_prompt_query(options):
        raise ConfigError(f"probe.query = {options.query!r} reads the answer; it cannot ride on generation's prefill")
    plans = [build_plan(tp, options, compute_residue=compute_residue) for tp in prompts]
    width = max(p.n_tokens + pad for p, pad in zip(plans, pads))
    capture = Capture(plans, int(text_config_of(model).num_hidden_layers), pads,
                      block_budget(model, width * len(prompts)), prefill_only=True)
    with attach_probe(model, capture):
        yield capture
