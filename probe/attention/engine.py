"""The probe engine: per-segment attention aggregates of a Hugging Face model at the speed of its fast attention.

The engine registers an attention function with transformers' ``AttentionInterface`` (name
:data:`IMPLEMENTATION`) and switches the model to it for one forward pass. Each layer's call receives the query and
key states after rotary embedding, the mask, ``scaling``, ``softcap`` and ``sliding_window``; it

1. computes the layer's output as the model would: through SDPA (transformers' own ``sdpa_attention_forward``),
   or, for soft-capped logits (Gemma 2), through an exact blocked attention, since SDPA cannot soft-cap;
2. computes post-softmax rows only for the query positions the probe needs, ``block_size`` rows at a time,
   exactly as the architecture's eager attention does (scores ``q·kᵀ·scaling``, then ``tanh(x/cap)·cap`` when
   soft-capped, then the mask, which carries the causal and sliding-window pattern, then a float32 softmax; each
   query head ``h`` reads key head ``h // (heads / kv_heads)`` as ``repeat_kv`` does);
3. reduces each block at once to per-segment aggregates (:class:`~probe.attention.reduce.LayerReducer`) and
   reports them to the active :class:`Capture`.

No L × H × T² tensor ever exists: the largest probe tensor is ``(heads, block_size, T)``. After the forward pass
the capture checks that every layer reported exactly once (else :class:`~probe.errors.HookError`), and the model
gets its previous attention implementation back whatever happened.

Scores are computed in float32 whatever the model's dtype (a bfloat16 model's eager attention would round the
scores to bfloat16 first; the engine's rows are the more precise ones).
"""

from __future__ import annotations

import contextvars
import logging
from collections import Counter
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from probe.attention.plan import ProbePlan, build_plan
from probe.attention.reduce import LayerAggregates, LayerReducer, PlanTensors, assemble_result
from probe.attention.result import SegmentAttention
from probe.config import ProbeSection
from probe.errors import HookError
from probe.loading import input_device
from probe.types import TokenizedPrompt

log = logging.getLogger(__name__)

IMPLEMENTATION = "ice_probe"

# Architectures (``config.model_type``) whose attention goes through the AttentionInterface with the standard
# eager semantics reproduced above; each has an exactness test against its eager ``output_attentions``.
SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gpt2")

_ACTIVE: contextvars.ContextVar["Capture | None"] = contextvars.ContextVar("ice_probe_capture", default=None)
_registered = False


def _register() -> None:
    """Register the probe's attention and mask functions with transformers (once per process)."""
    global _registered
    if not _registered:
        AttentionInterface.register(IMPLEMENTATION, _probe_attention)
        # The probe's forward runs SDPA, so it takes SDPA's masks (None when a plain causal mask suffices).
        AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
        _registered = True


def text_config_of(model: PreTrainedModel) -> object:
    """The model's text (decoder) config."""
    return model.config.get_text_config()


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


class Capture:
    """Collects the layers' aggregates during one forward pass and checks that each layer reported once.

    Args:
        plan: what to compute.
        n_layers: the layers expected to report (0 .. n_layers-1).
    """

    def __init__(self, plan: ProbePlan, n_layers: int) -> None:
        self.plan = plan
        self.n_layers = n_layers
        self.calls: Counter[int] = Counter()
        self.layers: dict[int, LayerAggregates] = {}
        self.tensors: dict[torch.device, PlanTensors] = {}  # per device (layers may be spread over GPUs)
        self.chance_by_mask: dict[tuple[int, tuple[int, ...]] | None, float] = {}

    def report(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
        softcap: float | None,
    ) -> None:
        """Compute the needed rows of one layer in blocks and keep their aggregates.

        Args:
            layer: the reporting layer's index.
            query: (1, H, T, D) query states after rotary embedding.
            key: (1, H_kv, T, D) key states.
            attention_mask: (1, 1, T, T) bool (True = may attend) or additive float mask, or None (plain causal).
            scaling: multiplier of ``q·kᵀ``.
            softcap: logit soft-capping value, or None.
        """
        self.calls[layer] += 1
        if self.calls[layer] > 1:
            return  # the duplicate is reported by ``check``
        plan = self.plan
        if query.shape[0] != 1:
            raise HookError(f"layer {layer}: the probe runs one prompt at a time, got batch {query.shape[0]}")
        n_heads, n_q, _ = query.shape[1:]
        n_kv, n_k = key.shape[1], key.shape[2]
        if n_q != plan.n_tokens or n_k != plan.n_tokens:
            raise HookError(
                f"layer {layer}: attention over {n_q} queries x {n_k} keys, the probed sequence has "
                f"{plan.n_tokens} tokens (a cache or packed input is not supported)"
            )
        if n_heads % n_kv:
            raise HookError(f"layer {layer}: {n_heads} query heads do not group over {n_kv} key/value heads")
        device = query.device
        if device not in self.tensors:
            self.tensors[device] = PlanTensors(plan, device)
        tensors = self.tensors[device]
        reducer = LayerReducer(plan, n_heads, tensors)
        k = key[0].to(torch.float32).transpose(-1, -2)  # (H_kv, D, T), a transposed view bmm reads as is
        for block in tensors.blocks:
            probs = attention_rows(query, k, block.positions, attention_mask, scaling, softcap)
            reducer.add(block, probs)
            del probs
        self.layers[layer] = reducer.finish(self._chance(tensors, attention_mask))

    def _chance(self, tensors: PlanTensors, attention_mask: torch.Tensor | None) -> float:
        """The chance level under this mask, computed once per mask (layers of one type share their mask)."""
        key = None if attention_mask is None else (attention_mask.data_ptr(), tuple(attention_mask.shape))
        if key not in self.chance_by_mask:
            allowed = allowed_keys(attention_mask, tensors.query_positions, self.plan.n_tokens)
            self.chance_by_mask[key] = tensors.chance(allowed, self.plan.options.exclude_sink)
        return self.chance_by_mask[key]

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

    def aggregates(self) -> list[LayerAggregates]:
        return [self.layers[i] for i in range(self.n_layers)]


def _mask_rows(attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B, T) rows of a (1, 1, T, T) mask."""
    if attention_mask.dim() != 4 or attention_mask.shape[0] != 1 or attention_mask.shape[1] != 1:
        raise HookError(f"unexpected attention mask of shape {tuple(attention_mask.shape)}; expected (1, 1, T, T)")
    return attention_mask[0, 0, positions, :]


def allowed_keys(attention_mask: torch.Tensor | None, positions: torch.Tensor, n_keys: int) -> torch.Tensor:
    """(B, T) bool: the keys each query position may attend to under ``attention_mask`` (None: plain causal).

    A boolean mask is True where attention is allowed; an additive float mask allows what it does not push to the
    dtype's minimum.
    """
    if attention_mask is None:
        return torch.arange(n_keys, device=positions.device)[None, :] <= positions[:, None]
    rows = _mask_rows(attention_mask, positions)
    return rows if rows.dtype == torch.bool else rows > torch.finfo(rows.dtype).min / 2


def attention_rows(
    query: torch.Tensor,
    key_t: torch.Tensor,
    positions: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    softcap: float | None,
) -> torch.Tensor:
    """Post-softmax attention rows of some query positions, as the architecture's eager attention computes them.

    Args:
        query: (1, H, T, D) query states.
        key_t: (H_kv, D, T) float32 transposed key states.
        positions: (B,) int64 query positions.
        attention_mask: (1, 1, T, T) bool or additive float mask, or None for a plain causal mask.
        scaling: multiplier of ``q·kᵀ``.
        softcap: soft-capping value or None.

    Returns:
        (H, B, T) float32 rows, each summing to 1.
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
    if attention_mask is not None and not attention_mask.dtype == torch.bool:
        scores += _mask_rows(attention_mask, positions).to(torch.float32)
    else:
        scores.masked_fill_(~allowed_keys(attention_mask, positions, n_keys), float("-inf"))
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
    """Exact attention output computed ``block_size`` queries at a time (for soft-capped logits).

    Returns:
        (1, T, H, D) output in the query's dtype, the layout ``eager_attention_forward`` returns.
    """
    n_heads, n_q = query.shape[1], query.shape[2]
    n_kv = key.shape[1]
    key_t = key[0].to(torch.float32).transpose(-1, -2)  # (H_kv, D, T)
    v = value[0].to(torch.float32)  # (H_kv, T, Dv)
    out = torch.empty(n_heads, n_q, value.shape[-1], dtype=query.dtype, device=query.device)
    for start in range(0, n_q, block_size):
        pos = torch.arange(start, min(start + block_size, n_q), device=query.device)
        probs = attention_rows(query, key_t, pos, attention_mask, scaling, softcap)  # (H, B, T)
        o = torch.bmm(probs.reshape(n_kv, (n_heads // n_kv) * len(pos), -1), v)  # (H_kv, rep*B, Dv)
        out[:, start : start + len(pos)] = o.reshape(n_heads, len(pos), -1).to(query.dtype)
    return out.unsqueeze(0).transpose(1, 2).contiguous()


def _probe_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """The registered attention function: the model's output through SDPA, the probe's aggregates on the side."""
    capture = _ACTIVE.get()
    if capture is None:
        raise HookError(
            f"attention implementation {IMPLEMENTATION!r} was called outside probe_prompt; "
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
    if softcap is None:
        out, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=0.0, scaling=scaling, **kwargs)
    else:
        out = _blocked_attention(query, key, value, mask, scaling, softcap, capture.plan.options.block_size)
    capture.report(int(layer), query, key, mask, float(scaling), softcap)
    return out, None


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
    check_architecture(model)
    _register()
    previous = model.config._attn_implementation
    token = _ACTIVE.set(capture)
    try:
        model.set_attn_implementation(IMPLEMENTATION)
        if text_config_of(model)._attn_implementation != IMPLEMENTATION:
            raise HookError(
                f"{type(model).__name__} did not accept attention implementation {IMPLEMENTATION!r} "
                "(it does not dispatch through transformers' AttentionInterface)"
            )
        yield capture
    finally:
        _ACTIVE.reset(token)
        if previous is not None and model.config._attn_implementation != previous:
            model.set_attn_implementation(previous)


def probe_prompt(
    model: PreTrainedModel,
    tokenized: TokenizedPrompt,
    options: ProbeSection | None = None,
    generated_ids: Sequence[int] | None = None,
    *,
    compute_residue: bool = True,
) -> SegmentAttention:
    """Probe one prompt: segment masses, P_ext with chance and enrichment, sink mass and AR_k (SPEC §4).

    Runs one forward pass of the model's base (no LM head, no cache) over the prompt, or over prompt + answer when
    ``generated_ids`` are given.

    Args:
        model: a loaded Hugging Face causal LM of a supported architecture, in eval mode.
        tokenized: the prompt's ids and token spans (``probe.prompts.tokenize.tokenize_prompt`` makes them; any spans that
            partition the tokens will do).
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
    options = options or ProbeSection()
    generated = list(generated_ids or ())
    plan = build_plan(tokenized, options, n_generated=len(generated), compute_residue=compute_residue)
    n_layers = int(text_config_of(model).num_hidden_layers)
    capture = Capture(plan, n_layers)
    device = input_device(model)  # not the first parameter's: a dispatched model may keep it on `meta`
    ids = torch.tensor([list(tokenized.input_ids) + generated], dtype=torch.long, device=device)
    base = model.base_model
    log.debug("probing %d tokens (%d query rows, %d rows in all)", plan.n_tokens, len(plan.query_positions),
              len(plan.row_positions))
    with torch.no_grad(), attach_probe(model, capture):
        base(input_ids=ids, use_cache=False)
    capture.check()
    return assemble_result(plan, capture.aggregates())
