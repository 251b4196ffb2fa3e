"""The probe's measures from a TransformerLens ``TransformerBridge``, through its ``blocks.<l>.attn.hook_pattern``
hooks (docs/probes.md#transformerlens)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

from probe.attention.architecture import attention_layers, value_measures_apply
from probe.attention.masks import allowed_keys
from probe.attention.plan import build_plan
from probe.attention.reduce import LayerAggregates, LayerReducer, assemble_result, reduced_measures
from probe.attention.segments import PlanTensors
from probe.attention.reference import layer_window
from probe.attention.result import SegmentAttention
from probe.probe_options import ProbeOptions
from probe.errors import HookError
from probe.types import TokenizedPrompt

_PATTERN = "blocks.{layer}.attn.hook_pattern"
_VALUES = "blocks.{layer}.attn.hook_v"

_Hook = Callable[[torch.Tensor, object], None]


class _LensConfig(Protocol):
    @property
    def n_layers(self) -> int: ...

    @property
    def device(self) -> torch.device | str | None: ...


class LensModel(Protocol):
    """What :func:`probe_transformer_lens` uses of a TransformerLens model (``TransformerBridge`` or
    ``HookedTransformer``): its config, its hook points by name, and a forward pass with hooks."""

    @property
    def cfg(self) -> _LensConfig: ...

    @property
    def hook_dict(self) -> Mapping[str, object]: ...

    def run_with_hooks(self, input: torch.Tensor,
                       fwd_hooks: list[tuple[str | Callable[..., Any], Callable[..., Any]]] = ...,
                       *, return_type: str | None = ...) -> object: ...


def _attention_module(tl_model: LensModel, layer: int) -> torch.nn.Module | None:
    """The Hugging Face attention module a ``TransformerBridge`` wraps in block ``layer`` (its output projection
    is what a value-weighted measure reads), or None where the model offers none."""
    blocks = getattr(tl_model, "blocks", None)
    if blocks is None:
        return None
    attn = getattr(blocks[layer], "attn", None)
    module = getattr(attn, "original_component", None) or getattr(attn, "_original_component", None)
    return module if isinstance(module, torch.nn.Module) else None


def _visible(queries: torch.Tensor, n: int, window: int | None) -> torch.Tensor:
    """(n_queries, n) bool: the keys each query position sees (causal, and within a sliding window if any)."""
    allowed = allowed_keys(None, queries, n)
    if window is not None:
        allowed &= (queries[:, None] - torch.arange(n, device=queries.device)[None, :]) < window
    return allowed


def probe_transformer_lens(
    tl_model: LensModel,
    tokenized: TokenizedPrompt,
    options: ProbeOptions | None = None,
    generated_ids: Sequence[int] | None = None,
) -> SegmentAttention:
    """Probe one prompt with a TransformerLens ``TransformerBridge`` (same measures as ``probe_tokenized``).

    Args:
        tl_model: a ``TransformerBridge`` (anything with ``cfg.n_layers``, ``hook_dict`` and ``run_with_hooks``).
        tokenized: prompt ids and token spans.
        options: probe options (defaults: ``ProbeOptions()``; ``options.residue``: compute AR_k).
        generated_ids: answer ids appended to the prompt (query ``generated``).

    Returns:
        The prompt's :class:`SegmentAttention`.

    Raises:
        HookError: a layer has no pattern hook, or did not report exactly once.
    """
    options = options or ProbeOptions()
    generated = list(generated_ids or ())
    plan = build_plan(tokenized, options, n_generated=len(generated))
    n_layers = int(tl_model.cfg.n_layers)
    hf_model = getattr(tl_model, "original_model", None)
    hf_config = hf_model.config.get_text_config() if hf_model is not None else None
    # a hybrid model's state-space layers have no attention: NaN rows, as the engine reports them
    with_attention = attention_layers(hf_model) if hf_model is not None else tuple(range(n_layers))
    weighted = hf_model is None or value_measures_apply(hf_model)  # not where the output is gated first
    names = {i: _PATTERN.format(layer=i) for i in with_attention}
    missing = [n for n in names.values() if n not in tl_model.hook_dict]
    if missing:
        raise HookError(f"TransformerLens model has no hook {missing[0]} ({len(missing)} of the {len(names)} layers "
                        "with attention missing): its bridge does not expose this model's attention pattern; probe "
                        "the Hugging Face model with the engine (probe_tokenized)")

    calls: Counter[int] = Counter()
    values: dict[int, torch.Tensor] = {}
    with_values = any(m.needs_values for m in reduced_measures(plan))

    def value_hook(layer: int) -> _Hook:
        def hook(v: torch.Tensor, hook: object) -> None:
            values[layer] = v.detach()

        return hook

    layers: dict[int, LayerAggregates] = {}
    tensors: dict[torch.device, PlanTensors] = {}

    def make_hook(layer: int) -> _Hook:
        def hook(pattern: torch.Tensor, hook: object) -> None:
            calls[layer] += 1
            if calls[layer] > 1:
                return
            att = pattern[0]  # (H, T, T)
            if att.device not in tensors:
                tensors[att.device] = PlanTensors(plan, att.device)
            t = tensors[att.device]
            module = _attention_module(tl_model, layer) if weighted else None
            reducer = LayerReducer(plan, att.shape[0], t, layer, module)
            v = None
            if reducer.needs_values:
                if layer not in values:
                    raise HookError(f"TransformerLens hook {_VALUES.format(layer=layer)} did not fire before the "
                                    "pattern: a registered measure reads the value states")
                v = values.pop(layer)[0].transpose(0, 1).to(torch.float32)  # (1, T, H_kv, D) -> (H_kv, T, D)
            for block in t.blocks:
                reducer.add(block, att[:, block.positions, :].to(torch.float32), 0, v)
            window = layer_window(hf_config, layer) if hf_config is not None else None
            layers[layer] = reducer.finish(t.chance(_visible(t.query_positions, att.shape[-1], window),
                                                    options.exclude_sink))

        return hook

    ids = torch.tensor([list(tokenized.input_ids) + generated], dtype=torch.long, device=tl_model.cfg.device)
    with torch.no_grad():
        hooks: list[tuple[str | Callable[..., Any], Callable[..., Any]]] = []
        for i, name in names.items():
            if with_values:
                hooks.append((_VALUES.format(layer=i), value_hook(i)))
            hooks.append((name, make_hook(i)))
        tl_model.run_with_hooks(ids, fwd_hooks=hooks, return_type=None)
    bad = [i for i in names if calls[i] != 1]
    if bad:
        raise HookError(f"TransformerLens pattern hooks of layers {bad} fired {[calls[i] for i in bad]} times, not once")
    return assemble_result(plan, [layers.get(i) for i in range(n_layers)])
