"""Reference probe: every attention measure computed directly from eager ``output_attentions`` (full matrices).

Written independently of the engine (its own query sets, masks and loops over segments, float64 numpy) so that
the tests can hold the engine to it: this module lays out the prompt and runs the eager forward
(:class:`~probe.attention.measure.EagerAttention`), and each registered measure computes its own reference from it
(docs/probes.md). It materialises L × H × T² attention: use it on short prompts only.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np
import torch
from transformers import PreTrainedModel

from probe.attention.implementation import attention_implementation
from probe.attention.measure import EagerAttention
from probe.attention.measures import measures
from probe.attention.measures.value import output_projection
from probe.attention.result import KEY_KINDS, SegmentAttention
from probe.probe_options import ProbeOptions
from probe.errors import HookError
from probe.loading import input_device
from probe.types import TokenizedPrompt


def layer_window(config: object, layer: int) -> int | None:
    """The sliding window of ``layer`` from the config (None = full causal attention)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return window if layer_types[layer] == "sliding_attention" else None
    return window


def _visible(n: int, window: int | None) -> np.ndarray:
    """(n, n) bool: key k visible to query q (k <= q, and q - k < window when windowed)."""
    q = np.arange(n)[:, None]
    k = np.arange(n)[None, :]
    vis = k <= q
    if window is not None:
        vis &= (q - k) < window
    return vis


@contextmanager
def _value_states(model: PreTrainedModel, wanted: bool) -> Iterator[dict[int, tuple[np.ndarray, np.ndarray]]]:
    """Per layer, the value states (kv_head, T, head_dim) of the forward inside the block, read from the value
    projection's output by a forward hook (``v_proj``, or the last third of GPT-2's ``c_attn``), and the output
    projection, both float64 numpy; nothing is hooked unless ``wanted``."""
    seen: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    handles = []
    if wanted:
        config = model.config.get_text_config()
        n_heads = int(config.num_attention_heads)
        for module in model.modules():
            layer = getattr(module, "layer_idx", None)
            fused = getattr(module, "v_proj", None) is None
            proj = getattr(module, "c_attn" if fused else "v_proj", None)
            if layer is None or proj is None:
                continue
            head_dim = int(getattr(module, "head_dim", config.hidden_size // n_heads))

            def hook(_m: torch.nn.Module, _inp: object, out: torch.Tensor, layer: int = int(layer),
                     module: torch.nn.Module = module, head_dim: int = head_dim, fused: bool = fused) -> None:
                v = out[0].double()  # (T, H_kv * D), or GPT-2's (T, 3 * H * D) = [q | k | v]
                if fused:
                    v = v[:, 2 * v.shape[-1] // 3:]
                v = v.reshape(v.shape[0], -1, head_dim).transpose(0, 1)  # (H_kv, T, D)
                seen[layer] = (v.cpu().numpy(), output_projection(module).double().detach().cpu().numpy())

            handles.append(proj.register_forward_hook(hook))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


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
    needs_values = any(m.needs_values for m in measures())
    with torch.no_grad(), attention_implementation(model, "eager"), _value_states(model, needs_values) as seen:
        ids = torch.tensor([list(tokenized.input_ids) + gen], device=input_device(model))
        out = model(ids, output_attentions=True, use_cache=False)
    attentions = [a[0].double().cpu().numpy() for a in out.attentions]  # L x (H, T, T)
    values = out_proj = None
    if needs_values:
        if sorted(seen) != list(range(len(attentions))):
            raise HookError(f"reference: value states of layers {sorted(seen)} seen, expected 0..{len(attentions) - 1}")
        values = [seen[i][0] for i in range(len(attentions))]
        out_proj = [seen[i][1] for i in range(len(attentions))]
    config = model.config.get_text_config()

    n_layers = len(attentions)
    targets = [i for i, k in enumerate(seg_kinds) if k in ("germane", "question")]
    # Segment order among non-sink prompt segments, for the distance k - j.
    order: dict[int, int] = {}
    for i, kind in enumerate(seg_kinds):
        if kind not in ("sink", "generated"):
            order[i] = len(order)
    sink_key, ext_key = (_keys_of(kind, seg_bounds, seg_kinds, n) for kind in ("sink", "extraneous"))
    chance = np.array([_chance(_visible(n, layer_window(config, layer)), queries, ext_key, sink_key,
                               opts.exclude_sink) for layer in range(n_layers)])

    arrays: dict[str, np.ndarray] = {}
    eager = EagerAttention(attentions=attentions, values=values, out_proj=out_proj, queries=queries, seg_kinds=seg_kinds,
                           seg_labels=seg_labels, seg_bounds=seg_bounds, targets=targets, order=order,
                           sink_key=sink_key, ext_key=ext_key, options=opts, arrays=arrays)
    for m in measures():
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
