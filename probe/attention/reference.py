"""Reference probe: the probe's measures (docs/probes.md) computed directly from eager ``output_attentions`` (full
matrices).

Written independently of the engine (its own query sets, masks and loops over segments, float64 numpy) so that
the tests can hold the engine to it. It materialises L × H × T² attention: use it on short prompts only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from transformers import PreTrainedModel

from probe.attention.engine import attention_implementation
from probe.attention.result import KEY_KINDS, SegmentAttention
from probe.config import ProbeSection
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


def reference_segment_attention(
    model: PreTrainedModel,
    tokenized: TokenizedPrompt,
    options: ProbeSection | None = None,
    generated_ids: Sequence[int] | None = None,
) -> SegmentAttention:
    """The probe's measures from the eager attention matrices of every layer.

    The model is switched to eager attention for the call and switched back afterwards.

    Args:
        model: a Hugging Face causal LM (eval mode).
        tokenized: prompt ids and token spans.
        options: probe options (defaults: ``ProbeSection()``).
        generated_ids: answer ids appended to the prompt (query ``generated``).

    Returns:
        A :class:`SegmentAttention` laid out as the engine's (AR_k always computed).
    """
    opts = options or ProbeSection()
    gen = list(generated_ids or ())
    n_prompt = len(tokenized.input_ids)
    n = n_prompt + len(gen)

    seg_kinds = [s.kind for s in tokenized.spans]
    seg_labels = [s.label or f"{s.kind}{i}" for i, s in enumerate(tokenized.spans)]
    seg_bounds = [(s.start, s.end) for s in tokenized.spans]
    if gen:
        seg_kinds.append("generated")
        seg_labels.append("generated")
        seg_bounds.append((n_prompt, n))

    # Query set Q.
    if opts.query == "question":
        qs: set[int] = set()
        for (a, b), kind in zip(seg_bounds, seg_kinds):
            if kind == "question":
                qs.update(range(a, b))
        if not qs:
            raise HookError("reference: no question segment")
        qs.add(n_prompt - 1)
        queries = sorted(qs)
    elif opts.query == "last":
        queries = [n_prompt - 1]
    elif opts.query == "generated":
        queries = list(range(n_prompt, n))
    else:
        i = int(opts.query.split(":")[1])
        queries = list(range(*seg_bounds[i]))

    with torch.no_grad(), attention_implementation(model, "eager"):
        ids = torch.tensor([list(tokenized.input_ids) + gen], device=input_device(model))
        out = model(ids, output_attentions=True, use_cache=False)
    attentions = [a[0].double().cpu().numpy() for a in out.attentions]  # L x (H, T, T)
    config = model.config.get_text_config()

    n_layers = len(attentions)
    n_heads = attentions[0].shape[0]
    n_seg = len(seg_kinds)
    per_seg = np.zeros((n_layers, n_heads, n_seg))
    chance = np.zeros(n_layers)
    targets = [i for i, k in enumerate(seg_kinds) if k in ("germane", "question")]
    ar = np.zeros((n_layers, n_heads, len(targets)))
    # Segment order among non-sink prompt segments, for the distance k - j.
    order: dict[int, int] = {}
    for i, kind in enumerate(seg_kinds):
        if kind not in ("sink", "generated"):
            order[i] = len(order)
    sink_key = np.zeros(n, dtype=bool)
    ext_key = np.zeros(n, dtype=bool)
    for (a, b), kind in zip(seg_bounds, seg_kinds):
        if kind == "sink":
            sink_key[a:b] = True
        if kind == "extraneous":
            ext_key[a:b] = True

    for layer, att in enumerate(attentions):
        for s, (a, b) in enumerate(seg_bounds):
            for h in range(n_heads):
                per_seg[layer, h, s] = np.mean([att[h, q, a:b].sum() for q in queries])
        vis = _visible(n, layer_window(config, layer))
        ratio_ext = []
        ratio_den = []
        for q in queries:
            n_vis = vis[q].sum()
            ratio_ext.append(vis[q][ext_key].sum() / n_vis)
            ratio_den.append((vis[q][~sink_key].sum() if opts.exclude_sink else n_vis) / n_vis)
        chance[layer] = np.mean(ratio_ext) / np.mean(ratio_den) if np.mean(ratio_den) > 0 else np.nan

        for ti, t in enumerate(targets):
            ta, tb = seg_bounds[t]
            for j in range(t):
                if seg_kinds[j] != "extraneous":
                    continue
                weight = opts.gamma ** (order[t] - order[j])
                ja, jb = seg_bounds[j]
                for h in range(n_heads):
                    if opts.residue_mode == "mass":
                        value = np.mean([att[h, q, ja:jb].sum() for q in range(ta, tb)])
                    else:
                        keys = [k for k in range(jb) if not (opts.exclude_sink and sink_key[k])]
                        mean_e = att[h, ja:jb][:, keys].mean(axis=0)
                        mean_s = att[h, ta:tb][:, keys].mean(axis=0)
                        if mean_e.sum() == 0 or mean_s.sum() == 0:
                            value = 0.0
                        else:
                            mean_e = mean_e / mean_e.sum()
                            mean_s = mean_s / mean_s.sum()
                            value = float(mean_e @ mean_s / (np.linalg.norm(mean_e) * np.linalg.norm(mean_s)))
                    ar[layer, h, ti] += weight * value

    by_kind = np.zeros((n_layers, n_heads, len(KEY_KINDS)))
    for s, kind in enumerate(seg_kinds):
        by_kind[..., KEY_KINDS.index(kind)] += per_seg[..., s]
    ext = by_kind[..., KEY_KINDS.index("extraneous")]
    den = by_kind.sum(-1) - (by_kind[..., KEY_KINDS.index("sink")] if opts.exclude_sink else 0.0)
    p_ext = np.full_like(ext, np.nan)
    np.divide(ext, den, out=p_ext, where=den > 0)
    return SegmentAttention(
        seg_mass=by_kind.astype(np.float32),
        seg_mass_segment=per_seg.astype(np.float32),
        p_ext=p_ext.astype(np.float32),
        chance=chance.astype(np.float32),
        ar_k=ar.astype(np.float32),
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
