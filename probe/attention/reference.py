"""Reference probe: every attention measure computed directly from each layer's own eager attention (full matrices;
docs/probes.md#exactness-against-eager-attention)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from transformers import PreTrainedModel

from probe.attention.architecture import attention_layers, attention_modules, layer_of, n_layers_of, shared_layers
from probe.attention.implementation import attention_implementation
from probe.attention.measure import EagerAttention
from probe.attention.measures import measures
from probe.attention.result import KEY_KINDS, SegmentAttention
from probe.probe_options import ProbeOptions
from probe.errors import HookError
from probe.compat import input_device
from probe.types import TokenizedPrompt


def layer_window(config: object, layer: int) -> int | None:
    """The sliding window of ``layer`` from the config (None = full causal attention)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return window if layer_types[layer] == "sliding_attention" else None
    return window


@dataclass
class EagerLayer:
    """What one layer's own eager attention function computed in the reference forward (float64 numpy).

    Attributes:
        weights: (H, T, T) attention weights, as ``output_attentions`` gives them (with learned sinks a row sums to
            1 minus the mass on no key).
        values: (H_kv, T, Dv) value states the function was handed.
        visible: (T, T) bool: the keys each query may attend to under the mask the model built for the layer.
        out_proj: (H · Dv, hidden) the linear map the layer's attention output went into, found by its input (the
            output, reshaped, exactly), or None where the output was changed first (a gate, a norm).
    """

    weights: np.ndarray
    values: np.ndarray
    visible: np.ndarray
    out_proj: np.ndarray | None


@contextmanager
def eager_calls(model: PreTrainedModel) -> Iterator[dict[int, EagerLayer]]:
    """Inside the block, each call of an attention module's own eager function (its modeling module's
    ``eager_attention_forward``, wrapped) is recorded by the module's ``layer_idx`` once the block ends: the weights
    it returned, the value states and the mask it was handed, and the output projection its output went into
    (every ``Linear`` / ``Conv1D`` of the module is hooked; the one whose input equals the output is it). The
    model's forward must run with ``attn_implementation="eager"``.

    Raises:
        HookError: an attention module's modeling module has no ``eager_attention_forward``.
    """
    seen: dict[int, EagerLayer] = {}
    raw: dict[int, tuple] = {}
    inputs: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    patched: dict[Any, Any] = {}
    handles = []
    for layer, module in attention_modules(model).items():
        namespace = sys.modules[type(module).__module__]
        original = getattr(namespace, "eager_attention_forward", None)
        if original is None:
            raise HookError(f"reference: {type(module).__module__} has no eager_attention_forward to record")
        if namespace not in patched:
            patched[namespace] = original

            def recording(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, *args: object, _original: Any = original,
                          **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
                out, weights = _original(module, query, key, value, attention_mask, *args, **kwargs)
                raw[int(layer_of(module))] = (weights, value, attention_mask, out)  # type: ignore[arg-type]
                return out, weights

            setattr(namespace, "eager_attention_forward", recording)
        for sub in module.modules():
            if isinstance(sub, torch.nn.Linear) or type(sub).__name__ == "Conv1D":
                def pre(m: torch.nn.Module, args: tuple, layer: int = layer) -> None:
                    weight = m.weight
                    assert isinstance(weight, torch.Tensor)
                    weight = weight.T if isinstance(m, torch.nn.Linear) else weight
                    inputs.setdefault(layer, []).append((args[0].detach(), weight.detach()))
                handles.append(sub.register_forward_pre_hook(pre))
    try:
        with shared_layers(model):
            yield seen
    finally:
        for h in handles:
            h.remove()
        for space, function in patched.items():
            setattr(space, "eager_attention_forward", function)
    for layer, (weights, value, mask, out) in raw.items():
        n = weights.shape[-1]
        flat = out[0].reshape(out.shape[1], -1).double()  # (T, H * Dv)
        proj = None
        for x, w in inputs.get(layer, []):
            x = x[0].double() if x.dim() == 3 else x.double()
            if x.shape == flat.shape and torch.allclose(x, flat, rtol=1e-6, atol=1e-7):
                proj = w.double().cpu().numpy()
                break
        if mask is None:
            visible = np.tril(np.ones((n, n), dtype=bool))
        else:
            m = mask[0, 0, -n:, -n:]
            visible = (m if m.dtype == torch.bool else m == 0).cpu().numpy()
        seen[layer] = EagerLayer(weights=weights[0].double().cpu().numpy(), values=value[0].double().cpu().numpy(),
                                 visible=visible, out_proj=proj)


def _segments(tokenized: TokenizedPrompt, n: int) -> tuple[list[str], list[str], list[tuple[int, int]]]:
    """Kinds, labels and token bounds of the prompt's spans, then the answer (``generated``) when ``n`` runs past
    the prompt."""
    n_prompt = len(tokenized.input_ids)
    kinds = [s.kind for s in tokenized.spans]
    labels = [s.label or f"{s.kind}{i}" for i, s in enumerate(tokenized.spans)]
    bounds = [(s.start, s.end) for s in tokenized.spans]
    if n > n_prompt:
        kinds.append("generated")
        labels.append("generated")
        bounds.append((n_prompt, n))
    return kinds, labels, bounds


def _keys_of(kind: str, bounds: list[tuple[int, int]], kinds: list[str], n: int) -> np.ndarray:
    """(n,) bool: the key positions in segments of ``kind``."""
    out = np.zeros(n, dtype=bool)
    for (a, b), k in zip(bounds, kinds):
        if k == kind:
            out[a:b] = True
    return out


def _query_set(query: str, bounds: list[tuple[int, int]], kinds: list[str], n_prompt: int, n: int) -> list[int]:
    """The query positions Q of option ``query`` (docs/probes.md#query-sets), in order."""
    if query == "question":
        qs = {t for (a, b), kind in zip(bounds, kinds) if kind == "question" for t in range(a, b)}
        if not qs:
            raise HookError("reference: no question segment")
        return sorted(qs | {n_prompt - 1})
    if query == "last":
        return [n_prompt - 1]
    if query == "generated":
        return list(range(n_prompt, n))
    return list(range(*bounds[int(query.split(":")[1])]))


def _chance(vis: np.ndarray, queries: list[int], ext_key: np.ndarray, sink_key: np.ndarray,
            exclude_sink: bool) -> float:
    """P_ext's chance level at one layer: the mean over Q of the extraneous share of the visible keys, over the
    mean non-sink share (1 when the sink is not excluded); NaN when no query sees a non-sink key."""
    ratio_ext, ratio_den = [], []
    for q in queries:
        n_vis = vis[q].sum()
        ratio_ext.append(vis[q][ext_key].sum() / n_vis)
        ratio_den.append((vis[q][~sink_key].sum() if exclude_sink else n_vis) / n_vis)
    return float(np.mean(ratio_ext) / np.mean(ratio_den)) if np.mean(ratio_den) > 0 else np.nan


def reference_segment_attention(
    model: PreTrainedModel,
    tokenized: TokenizedPrompt,
    options: ProbeOptions | None = None,
    generated_ids: Sequence[int] | None = None,
) -> SegmentAttention:
    """The probe's measures from the eager attention matrices of every layer.

    The model is switched to eager attention for the call and switched back afterwards.

    Args:
        model: a Hugging Face causal LM (eval mode).
        tokenized: prompt ids and token spans.
        options: probe options (defaults: ``ProbeOptions()``).
        generated_ids: answer ids appended to the prompt (query ``generated``).

    Returns:
        A :class:`SegmentAttention` laid out as the engine's, with every registered measure (AR_k always computed).
    """
    opts = options or ProbeOptions()
    gen = list(generated_ids or ())
    n_prompt = len(tokenized.input_ids)
    n = n_prompt + len(gen)

    seg_kinds, seg_labels, seg_bounds = _segments(tokenized, n)
    queries = _query_set(opts.query, seg_bounds, seg_kinds, n_prompt, n)
    with torch.no_grad(), attention_implementation(model, "eager"), eager_calls(model) as seen:
        ids = torch.tensor([list(tokenized.input_ids) + gen], device=input_device(model))
        model(ids, use_cache=False)
    n_layers = n_layers_of(model)
    expected = list(attention_layers(model))
    if sorted(seen) != expected:
        raise HookError(f"reference: eager attention of layers {sorted(seen)} seen, expected {expected}")
    first = seen[expected[0]]
    blank = EagerLayer(np.full_like(first.weights, np.nan), np.full_like(first.values, np.nan),
                       np.ones_like(first.visible), None)
    layers = [seen.get(i, blank) for i in range(n_layers)]
    attentions = [e.weights for e in layers]  # L x (H, T, T)
    values = [e.values for e in layers]
    # a layer without attention has NaN everywhere; one whose output is gated before its projection has no reference
    # for the value-weighted measures (their references raise)
    out_proj = None if any(e.out_proj is None for e in seen.values()) else [
        np.full((first.out_proj.shape), np.nan) if e.out_proj is None else e.out_proj  # type: ignore[union-attr]
        for e in layers]
    targets = [i for i, k in enumerate(seg_kinds) if k in ("germane", "question")]
    # Segment order among non-sink prompt segments, for the distance k - j.
    order: dict[int, int] = {}
    for i, kind in enumerate(seg_kinds):
        if kind not in ("sink", "generated"):
            order[i] = len(order)
    sink_key, ext_key = (_keys_of(kind, seg_bounds, seg_kinds, n) for kind in ("sink", "extraneous"))
    chance = np.array([_chance(e.visible, queries, ext_key, sink_key, opts.exclude_sink) if i in seen else np.nan
                       for i, e in enumerate(layers)])

    arrays: dict[str, np.ndarray] = {}
    eager = EagerAttention(attentions=attentions, values=values, out_proj=out_proj, queries=queries, seg_kinds=seg_kinds,
                           seg_labels=seg_labels, seg_bounds=seg_bounds, targets=targets, order=order,
                           sink_key=sink_key, ext_key=ext_key, options=opts, arrays=arrays)
    for m in measures():
        if m.needs_values and out_proj is None:
            continue  # the layer's output is gated or normalised before its projection: no ‖v W_O‖ per key
        arrays[m.id] = np.asarray(m.reference(eager), dtype=np.float64)
    return SegmentAttention(
        measures={k: v.astype(np.float32) for k, v in arrays.items()},
        chance=chance.astype(np.float32),
        kinds=KEY_KINDS,
        segment_labels=tuple(seg_labels),
        segment_kinds=tuple(seg_kinds),
        segment_spans=tuple(seg_bounds),
        ar_targets=tuple(targets),
        options={"query": opts.query, "gamma": opts.gamma, "residue_mode": opts.residue_mode,
                 "exclude_sink": opts.exclude_sink, "block_size": opts.block_size, "residue": True},
        n_tokens=n,
        n_prompt_tokens=n_prompt,
        n_queries=len(queries),
    )
