"""The engine's attention function, registered with transformers' ``AttentionInterface``, and switching a model to it
(docs/probes.md#how-the-engine-computes-them)."""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from transformers import AttentionInterface, PreTrainedConfig, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from probe.attention.architecture import attention_layers, check_architecture, layer_of, n_layers_of, shared_layers
from probe.attention.call import LayerCall
from probe.attention.capture import Capture
from probe.attention.edits import BatchEdit, edited_attention
from probe.attention.masks import allowed_keys, softmax_rows
from probe.probe_options import ProbeOptions
from probe.errors import HookError

IMPLEMENTATION = "ice_probe"

_ACTIVE: contextvars.ContextVar["Capture | None"] = contextvars.ContextVar("ice_probe_capture", default=None)
_ACTIVE_EDIT: contextvars.ContextVar["BatchEdit | None"] = contextvars.ContextVar("ice_probe_edit", default=None)
_registered = False
DEFAULT_BLOCK = ProbeOptions().block_size  # the rows of a blocked attention computed without a probe


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
    return n_layers_of(model), int(model.config.get_text_config().num_attention_heads)


def probed_layers(model: PreTrainedModel) -> tuple[int, tuple[int, ...]]:
    """The model's depth and the layers whose attention reports to the probe (all of them but a hybrid model's
    state-space and linear-attention layers)."""
    return n_layers_of(model), attention_layers(model)


def attention_rows(
    query: torch.Tensor,
    key_t: torch.Tensor,
    positions: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    softcap: float | None,
    key_offset: int = 0,
    sinks: torch.Tensor | None = None,
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
        sinks: (H,) learned sink logits, or None.

    Returns:
        (H, B, K) float32 rows, each summing to 1 (to 1 minus the mass on no key, with sinks).
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
    return softmax_rows(scores, sinks, 0)


def _blocked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    softcap: float | None,
    block_size: int,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact attention output computed ``block_size`` queries at a time (for soft-capped logits and learned sinks),
    row by row.

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
            probs = attention_rows(query[i : i + 1], key_t, pos, mask, scaling, softcap, offset, sinks)  # (H, B, T)
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
    layer = layer_of(module)
    if layer is None:
        raise HookError(f"{type(module).__name__} has no layer_idx: cannot tell which layer reports")
    if dropout:
        raise HookError(f"layer {layer}: attention dropout {dropout} is active; call model.eval() before probing")
    if scaling is None:  # eager's default in every supported architecture
        scaling = query.shape[-1] ** -0.5
    sinks = kwargs.pop("s_aux", None)  # learned sinks (gpt-oss): one logit per head that no key carries
    if sinks is not None:
        sinks = sinks.detach()
    if isinstance(attention_mask, torch.Tensor) or attention_mask is None:
        mask = attention_mask
    else:
        raise HookError(f"layer {layer}: unsupported attention mask type {type(attention_mask).__name__}")
    editing = edit is not None and edit.edits_layer(int(layer))
    if editing and query.shape[0] != edit.keys.shape[0]:  # type: ignore[union-attr]
        raise HookError(f"layer {layer}: a batch of {query.shape[0]} rows, the intervention was built for "
                        f"{edit.keys.shape[0]}")  # type: ignore[union-attr]
    def layer_call() -> LayerCall:  # what the capture is handed (made only where there is one)
        return LayerCall(int(layer), query, key, value, mask, float(scaling), softcap, edit, module, sinks)

    block = capture.options.block_size if capture is not None else DEFAULT_BLOCK
    if capture is not None and not editing and capture.forms_output(int(layer), query.shape[2], key.shape[2]):
        # One attention: the probe's rows give the output; positions past the prompts (a teacher-forced answer)
        # and the batch rows the probe does not form take the model's kernel on their own rows.
        prompts = capture.report(layer_call(), output=True)
        assert prompts is not None
        formed = prompts.transpose(1, 2)
        n_prompt = formed.shape[1]
        if query.shape[2] > n_prompt:
            tail_mask = mask[:, :, n_prompt:] if mask is not None else allowed_keys(
                None, torch.arange(n_prompt, query.shape[2], device=query.device), key.shape[2])[None, None]
            tail = _model_attention(module, query[:, :, n_prompt:], key, value, tail_mask, scaling, softcap, sinks,
                                    block, kwargs)
            formed = torch.cat([formed, tail], dim=1)
        formed = formed.contiguous()
        if capture.model_rows:
            rows = torch.tensor(capture.model_rows, device=query.device)
            rows_mask = mask if mask is None or mask.shape[0] == 1 else mask[rows]
            formed[rows] = _model_attention(module, query[rows], key[rows], value[rows], rows_mask, scaling, softcap,
                                            sinks, block, kwargs)
        return formed, None
    # A decode step in which every row is edited needs no unedited output.
    skip_base = editing and query.shape[2] == 1 and edit.every_row_keyed  # type: ignore[union-attr]
    out: torch.Tensor | None = None
    if not skip_base:
        out = _model_attention(module, query, key, value, mask, scaling, softcap, sinks, block, kwargs)
    if editing:
        out = edited_attention(edit, int(layer), query, key, value, mask, float(scaling), softcap,  # type: ignore[arg-type]
                               out, sinks)
    if capture is not None:
        capture.report(layer_call())
    assert out is not None
    return out, None


def _model_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     mask: torch.Tensor | None, scaling: float, softcap: float | None, sinks: torch.Tensor | None,
                     block: int, kwargs: dict[str, Any]) -> torch.Tensor:
    """The layer's output as the model computes it: SDPA, or the exact blocked attention where SDPA cannot
    (soft-capped logits, learned sinks); (B, W, H, Dv)."""
    if softcap is None and sinks is None:
        out, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=0.0, scaling=scaling, **kwargs)
        return out
    return _blocked_attention(query, key, value, mask, scaling, softcap, block, sinks)


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
        with attention_implementation(model, IMPLEMENTATION), shared_layers(model):
            yield
    finally:
        slot.reset(token)
