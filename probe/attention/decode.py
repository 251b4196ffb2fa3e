"""Answer capture: the attention of every generation step, reduced to per-segment masses (an
:class:`~probe.attention.answer.AnswerAttention` per prompt; docs/probes.md#attention-while-the-answer-is-written)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from transformers import PreTrainedModel

from probe.attention.answer import AnswerAttention
from probe.attention.call import LayerCall
from probe.attention.masks import softmax_rows
from probe.attention.implementation import attention_implementation
from probe.attention.measures.value import has_output_projection, module_gram, value_norms
from probe.attention.plan import ProbePlan
from probe.attention.measures.value import output_projection
from probe.attention.architecture import n_layers_of
from probe.attention.reference import eager_calls
from probe.errors import HookError
from probe.compat import input_device
from probe.types import TokenizedPrompt


# Steps a layer keeps before it folds them: the queries of several decode steps meet the layer's key cache in one
# product, so the cache is read once per flush rather than once per step (the cost of the capture was that reading).
STEPS_PER_FLUSH = 16
# At most this many score elements (steps × batch × heads × keys) per flush: long prompts and big batches flush sooner.
FLUSH_ELEMENTS = 1 << 22
# Flush masks kept for the layers that fold the same steps next (a few: full and sliding-window layers differ).
MASKS_KEPT = 4


def _window(module: torch.nn.Module | None) -> int | None | bool:
    """The sliding window of a layer's attention (None: the layer sees every earlier key; False: unknown, or a cache
    that drops keys in other ways, as a chunked layer's does: its steps are folded one at a time)."""
    if module is None:
        return False
    if hasattr(module, "sliding_window"):  # Qwen2/3, Gemma2/3: per layer (None on full-attention layers)
        return getattr(module, "sliding_window")
    config = getattr(module, "config", None)
    layer_types, layer = getattr(config, "layer_types", None), getattr(module, "layer_idx", None)
    if isinstance(layer_types, (list, tuple)) and isinstance(layer, int) and 0 <= layer < len(layer_types):
        kind = layer_types[layer]
        if kind == "full_attention":
            return None
        if kind == "sliding_attention":
            return getattr(config, "sliding_window", False)
        return False  # chunked (Llama 4) and kinds not known here
    return getattr(config, "sliding_window", None)  # Mistral: the model's; Llama, GPT-2: none


class _Pending:
    """A layer's generation steps waiting for its next flush: their queries (float32, in one buffer), positions and
    masks, and the layer call's latest key and value cache (which covers every waiting step's keys)."""

    def __init__(self, capacity: int, n_b: int, n_heads: int, dim: int, device: torch.device) -> None:
        self.queries = torch.empty(n_b, n_heads, capacity, dim, dtype=torch.float32, device=device)
        self.n_heads = n_heads
        self.clear()

    def clear(self) -> None:
        self.n = 0
        self.first = 0
        self.lo = 0
        self.lasts: list[int] = []
        self.masks: list[torch.Tensor | None] = []
        self.call: LayerCall | None = None  # the latest call: its key and value cache cover every waiting step

    def add(self, step: int, last: int, lo: int, call: LayerCall, row: int = -1) -> None:
        """Keep query row ``row`` of the call (a decode step's only row; a teacher-forced call's row ``last``)."""
        if not self.n:
            self.first, self.lo = step, lo
        self.queries[:, :, self.n].copy_(call.query[:, :, row, :])
        mask = None
        attention_mask = call.mask
        if attention_mask is not None:
            mask = attention_mask[:, 0, row, :]  # (B or 1, K): the generating query's row
            if attention_mask.shape[2] > 1:
                mask = mask.clone()  # the prefill's (W, W) mask is not kept for one row
        self.masks.append(mask)
        self.lasts.append(last)
        self.n += 1
        self.call = call

    def mask_key(self, n_k: int) -> tuple:
        """What :meth:`additive_mask` depends on: the steps' positions, the keys' range and each step's mask tensor
        (its storage, shape and strides: whoever keeps the key keeps the masks alive, so the storage is not reused).
        The layers of one decode step share its mask, so the layers of one flush share this key."""
        return (self.lo, n_k, tuple(self.lasts),
                tuple(None if m is None else (m.data_ptr(), m.dtype, tuple(m.shape), m.stride()) for m in self.masks))

    def additive_mask(self, n_k: int, device: torch.device) -> torch.Tensor:
        """(B or 1, 1, n, K) float32 additive mask of the waiting steps over the flush's keys ``lo .. lo + K - 1``:
        each step's own mask on the keys it saw, −inf on the later keys (its future)."""
        seen = torch.tensor([last - self.lo + 1 for last in self.lasts], device=device)  # keys each step saw
        out = torch.zeros(self.n, n_k, dtype=torch.float32, device=device)
        out.masked_fill_(torch.arange(n_k, device=device)[None, :] >= seen[:, None], float("-inf"))
        rows = [m for m in self.masks if m is not None]
        if not rows:
            return out[None, None]
        n_b = max(m.shape[0] for m in rows)
        full = out[None].repeat(n_b, 1, 1)  # (B, n, K)
        for i, m in enumerate(self.masks):
            if m is None:
                continue
            k = m.shape[-1]
            if m.dtype == torch.bool:
                full[:, i, :k].masked_fill_(~m.to(device), float("-inf"))
            else:
                full[:, i, :k] += m.to(device=device, dtype=torch.float32)
        return full[:, None]


class AnswerRows:
    """Collects, per layer and generation step, the answer-attention row of every prompt of a left-padded batch.

    A layer's generating queries wait, up to :data:`STEPS_PER_FLUSH` steps, in a small buffer (one copy per step);
    a flush computes all their rows against the layer's key cache at once: one product over the cache, the mask of
    each step (kept from its call: a step's row covers the keys up to its own position, later keys are masked; the
    layers of one flush share the steps and their masks, so the combined mask is built once for all of them), the
    active edit's bias at each step's position, then the softmax rows times a one-hot of the key columns: each row's
    mass per column; the same with each key weighted by its norm gives the value-weighted masses. Steps wait
    only while the cache keeps every key: a layer with a sliding window flushes before the window is reached and then
    folds each step at once, as its cache starts dropping keys. :meth:`results` flushes what is left.

    Args:
        plans: one probe plan (of the prompt alone) per batch row.
        pads: left padding of each row.
        width: the batch's prompt width (``len(prompt) + pad`` of every row).
        steps_per_flush: the most steps a layer keeps before folding them (1: fold each step at once; None:
            :data:`STEPS_PER_FLUSH`).
    """

    def __init__(self, plans: Sequence[ProbePlan], pads: Sequence[int], width: int,
                 steps_per_flush: int | None = None, n_layers: int | None = None) -> None:
        steps_per_flush = STEPS_PER_FLUSH if steps_per_flush is None else steps_per_flush
        if steps_per_flush < 1:
            raise ValueError(f"steps_per_flush must be at least 1, got {steps_per_flush}")
        self.plans = list(plans)
        self.n_layers = n_layers
        self.pads = list(pads)
        self.width = width
        self.steps_per_flush = steps_per_flush
        self.n_segments = [p.n_segments for p in self.plans]
        smax = max(self.n_segments)
        self.answer_col = smax  # every row's answer column; padding goes to smax + 1 (dropped)
        self.n_cols = smax + 2
        colmap = np.full((len(self.plans), width), smax + 1, dtype=np.int64)
        for i, (plan, pad) in enumerate(zip(self.plans, self.pads)):
            colmap[i, pad:] = plan.seg_of_token[: plan.n_prompt_tokens]
        self._prompt_colmap = torch.from_numpy(colmap)
        self._onehots: dict[torch.device, torch.Tensor] = {}
        self.n_steps: dict[int, int] = {}  # layer -> steps reported
        # layer -> (step capacity, B, H, R, C) float32: R = 1 (raw mass) or 2 (raw, value-weighted)
        self.masses: dict[int, torch.Tensor] = {}
        self.tops: dict[int, torch.Tensor] = {}  # layer -> (step capacity, B, H) int64 padded key position
        # layer -> (B, H, key capacity): ‖v W_O^h‖ by padded position (the first n_normed filled)
        self.norms: dict[int, torch.Tensor] = {}
        self.n_normed: dict[int, int] = {}
        self.grams: dict[int, torch.Tensor] = {}
        self.out_rows: dict[int, torch.Tensor] = {}
        self._pending: dict[int, _Pending] = {}
        self._windows: dict[int, int | None | bool] = {}  # layer -> its sliding window (_window)
        # the latest flushes' additive masks by _Pending.mask_key, shared by the layers of the same steps (a model with
        # sliding-window layers has two masks per step); each entry keeps alive the step masks its key names, so that
        # their storage is not reused while it is kept
        self._masks: dict[tuple, tuple[list[torch.Tensor | None], torch.Tensor]] = {}

    def _onehot(self, device: torch.device, lo: int, hi: int) -> torch.Tensor:
        """(B, hi - lo, C) float32: 1 in the column (segment, answer or padding) of each key position ``[lo, hi)``
        (padded coordinates), so that a row of weights times it is the row's mass per column."""
        oh = self._onehots.get(device)
        if oh is None or oh.shape[1] < hi:
            cap = max(hi, 2 * (oh.shape[1] if oh is not None else self.width))
            cols = torch.full((len(self.plans), cap), self.answer_col, dtype=torch.long)
            cols[:, : self.width] = self._prompt_colmap
            oh = torch.zeros(len(self.plans), cap, self.n_cols, dtype=torch.float32)
            oh.scatter_(2, cols[:, :, None], 1.0)
            oh = oh.to(device)
            self._onehots[device] = oh
        return oh[:, lo:hi]

    def _norms(self, layer: int, value: torch.Tensor, module: torch.nn.Module, n_heads: int, lo: int,
               hi: int) -> torch.Tensor:
        """(B, H, hi - lo): the norms ``‖v_j W_O^h‖`` of keys ``[lo, hi)`` (``value`` holds those keys); the norms of
        keys not seen before are computed now, each key's once, and kept by position."""
        n_b, n_kv, n_k, dim = value.shape
        if layer not in self.grams:
            self.out_rows[layer] = output_projection(module).detach()
            self.grams[layer] = module_gram(module, n_heads, value.device)
        store = self.norms.get(layer)
        new_from = self.n_normed.get(layer, 0)
        if store is None or store.shape[2] < hi:
            cap = max(hi, 2 * (store.shape[2] if store is not None else self.width))
            grown = torch.zeros(n_b, n_heads, cap, dtype=torch.float32, device=value.device)
            if store is not None:
                grown[:, :, : store.shape[2]] = store
            store = grown
            self.norms[layer] = store
        if new_from < hi:
            fresh = value[:, :, new_from - lo:, :].to(torch.float32)  # (B, H_kv, n_new, D)
            n_new = fresh.shape[2]
            flat = fresh.permute(1, 0, 2, 3).reshape(n_kv, n_b * n_new, dim)
            norms = value_norms(flat, self.out_rows[layer], n_heads, gram=self.grams[layer])
            store[:, :, new_from:hi] = norms.reshape(n_heads, n_b, n_new).permute(1, 0, 2)
            self.n_normed[layer] = hi
        return store[:, :, lo:hi]

    def _step_slots(self, layer: int, first: int, n: int, n_b: int, n_heads: int, n_rows: int,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The (n, B, H, R, C) masses and (n, B, H) top keys of steps ``first .. first + n - 1`` in the layer's
        buffers (zeroed when allocated, each step written once; grown as needed)."""
        buf, top = self.masses.get(layer), self.tops.get(layer)
        end = first + n
        if buf is None or top is None or buf.shape[0] < end:
            cap = max(end, 2 * buf.shape[0] if buf is not None else 64)
            grown = torch.zeros(cap, n_b, n_heads, n_rows, self.n_cols, dtype=torch.float32, device=device)
            grown_top = torch.zeros(cap, n_b, n_heads, dtype=torch.long, device=device)
            if buf is not None and top is not None:
                grown[: buf.shape[0]] = buf
                grown_top[: top.shape[0]] = top
            buf, top = self.masses[layer], self.tops[layer] = grown, grown_top
        return buf[first:end], top[first:end]

    def report(self, call: LayerCall) -> None:
        """Keep one layer call's generating row for the layer's next flush (or fold it now: class docstring).

        Args:
            call: the layer call (:class:`~probe.attention.call.LayerCall`); its ``query`` (B, H, n_q, D) has ``n_q``
                the batch's width (the prefill) or 1 (a decode step), its ``key`` / ``value`` (B, H_kv, K, D) the
                cache's last K positions.

        Raises:
            HookError: a call that is neither a prefill of the batch nor a one-query decode step, a mask whose
                shape does not match the keys, or a cache that dropped keys some waiting step still needs.
        """
        layer, query, key, attention_mask, module = call.layer, call.query, call.key, call.mask, call.module
        n_b, n_heads, n_q, dim = query.shape
        n_k = key.shape[2]
        step = self.n_steps.get(layer, 0)
        if not step:
            if n_q != self.width or n_k != self.width:
                raise HookError(f"layer {layer}: answer capture expected the prefill of {self.width} tokens first, "
                                f"got {n_q} queries x {n_k} keys")
            if n_b != len(self.plans):
                raise HookError(f"layer {layer}: a batch of {n_b} rows, the answer capture expects {len(self.plans)}")
        elif n_q != 1:
            raise HookError(f"layer {layer}: a decode step of {n_q} queries; answer capture reads one new query per "
                            "step (assisted or chunked decoding is not supported)")
        elif n_b != len(self.plans):
            raise HookError(f"layer {layer}: a batch of {n_b} rows, the answer capture expects {len(self.plans)}")
        if attention_mask is not None and attention_mask.shape[-1] != n_k:
            raise HookError(f"layer {layer}: a mask over {attention_mask.shape[-1]} keys for {n_k} keys")
        last = self.width - 1 + step  # padded position of the generating query
        lo = last - n_k + 1  # the keys are the last n_k positions (a sliding-window cache keeps only the window)
        pending = self._pending.get(layer)
        if pending is None:
            pending = self._pending[layer] = _Pending(self.steps_per_flush, n_b, n_heads, dim, query.device)
        elif pending.n and lo != pending.lo:
            raise HookError(f"layer {layer}: the cache dropped keys that {pending.n} waiting generation steps still "
                            f"need (keys from position {lo}, the steps read from {pending.lo}); fold each step at "
                            "once (steps_per_flush = 1)")
        pending.add(step, last, lo, call)
        self.n_steps[layer] = step + 1
        if layer not in self._windows:
            self._windows[layer] = _window(module)
        window = self._windows[layer]
        waits = window is None or (window is not False and last + 2 < window)  # the next step still sees key 0
        if (not waits or lo or pending.n >= self.steps_per_flush
                or (pending.n + 1) * n_b * n_heads * (n_k + 1) > FLUSH_ELEMENTS):
            self._flush(layer)

    def report_forced(self, call: LayerCall) -> None:
        """Take every generating row of one teacher-forced call over the batch's prompts and answers, laid out as
        ``generate`` lays them out (row i: ``pads[i]`` padding, the prompt, the answer, filler to the longest
        answer): row ``t`` of every answer is the query at padded position ``width - 1 + t``, folded in flushes
        exactly as the decode steps are (the call holds every key, and each row's mask stops at its own position).

        Raises:
            HookError: a call not wider than the prompts, of another batch, or a layer reported twice.
        """
        layer, query = call.layer, call.query
        n_b, n_heads, n_q, dim = query.shape
        if self.n_steps.get(layer):
            raise HookError(f"layer {layer}: reported twice in a teacher-forced pass")
        if n_q < self.width or call.key.shape[2] != n_q or n_b != len(self.plans):
            raise HookError(f"layer {layer}: a teacher-forced pass over {n_b} rows x {n_q} queries x "
                            f"{call.key.shape[2]} keys; expected {len(self.plans)} rows of at least {self.width}")
        if call.value is None:
            raise HookError(f"layer {layer}: answer capture needs the value states, and the layer reported none")
        pending = self._pending[layer] = _Pending(self.steps_per_flush, n_b, n_heads, dim, query.device)
        n_steps = n_q - self.width + 1  # the last prompt position, then each answer position
        for step in range(n_steps):
            last = self.width - 1 + step
            pending.add(step, last, 0, call, row=last)
            if pending.n >= self.steps_per_flush or (pending.n + 1) * n_b * n_heads * (n_q + 1) > FLUSH_ELEMENTS:
                self._flush(layer)
        self._flush(layer)
        self.n_steps[layer] = n_steps

    def _flush(self, layer: int) -> None:
        """Fold the layer's waiting steps into its buffers (class docstring) and release the cache they held."""
        p = self._pending.get(layer)
        if p is None or not p.n:
            return
        call = p.call
        assert call is not None and call.value is not None
        key, value, module, edit = call.key, call.value, call.module, call.edit
        n_b, n_kv, n_k, dim = key.shape
        n_heads, n = p.n_heads, p.n
        lo, hi = p.lo, p.lo + n_k
        rep = n_heads // n_kv
        q = p.queries[:, :, :n].mul(call.scaling).reshape(n_b, n_kv, rep * n, dim)  # (B, H_kv, rep·n, D)
        scores = torch.matmul(q, key.to(torch.float32).transpose(-1, -2)).view(n_b, n_heads, n, n_k)
        if call.softcap is not None:
            scores = scores.div_(call.softcap).tanh_().mul_(call.softcap)
        mask_key = p.mask_key(n_k)
        kept = self._masks.get(mask_key)
        if kept is None:
            if len(self._masks) >= MASKS_KEPT:
                del self._masks[next(iter(self._masks))]  # the oldest
            kept = self._masks[mask_key] = (list(p.masks), p.additive_mask(n_k, scores.device))
        scores += kept[1]
        if edit is not None and edit.edits_layer(layer):
            pos = torch.tensor(p.lasts, device=edit.device)
            scores += edit.bias(layer, pos, lo, hi).to(scores.device)
        top_key = scores.max(dim=-1).indices  # (B, H, n): the top key (max's indices cost less than argmax's)
        weights = softmax_rows(scores, call.sinks, 1)  # (B, H, n, K); each generating query sees itself
        del scores
        norms = None if module is None or not has_output_projection(module) \
            else self._norms(layer, value, module, n_heads, lo, hi)  # (B, H, K)
        masses, top = self._step_slots(layer, p.first, n, n_b, n_heads, 1 if norms is None else 2, weights.device)
        top.copy_(top_key.permute(2, 0, 1))
        if lo:
            top += lo
        onehot = self._onehot(weights.device, lo, hi)  # (B, K, C): 1 in each key's column
        # the rows times the one-hot columns: each row's mass per column
        mass = torch.bmm(weights.view(n_b, n_heads * n, n_k), onehot).view(n_b, n_heads, n, self.n_cols)
        masses[:, :, :, 0].copy_(mass.permute(2, 0, 1, 3))
        if norms is not None:
            weights.mul_(norms[:, :, None, :])  # α_qj ‖v_j W_O^h‖
            vmass = torch.bmm(weights.view(n_b, n_heads * n, n_k), onehot).view(n_b, n_heads, n, self.n_cols)
            masses[:, :, :, 1].copy_(vmass.permute(2, 0, 1, 3))
        p.clear()

    def results(self, answers: Sequence[Sequence[int]], prompt_ids: Sequence[Sequence[int]]) -> list[AnswerAttention]:
        """One :class:`AnswerAttention` per batch row: rows ``0 .. len(answer) - 1`` of its steps.

        Args:
            answers: per row, the answer's token ids (the end token excluded).
            prompt_ids: per row, the prompt's token ids.

        Raises:
            HookError: layers that saw different numbers of steps, or fewer steps than an answer's tokens.
        """
        with torch.inference_mode():  # generate may have run in inference mode, and its buffers are then inference's
            for layer in list(self._pending):
                self._flush(layer)
        layers = sorted(self.n_steps)
        counts = {self.n_steps[layer] for layer in layers}
        if len(counts) != 1 or (self.n_layers is None and layers != list(range(len(layers)))):
            raise HookError(f"answer capture: layers {layers} saw {sorted(counts)} generation steps (one count each)")
        n_steps = counts.pop()
        longest = max((len(a) for a in answers), default=0)
        if longest > n_steps:
            raise HookError(f"answer capture: {n_steps} generation steps seen for an answer of {longest} tokens")
        with_values = {self.masses[layer].shape[3] for layer in layers} == {2}
        # (T, B, L, H, R, C); a layer without value-weighted masses leaves them out of every layer
        kept = [self.masses[layer][:longest, ..., : 2 if with_values else 1, :] for layer in layers]
        tops = [self.tops[layer][:longest] for layer in layers]
        if self.n_layers is not None:  # a hybrid model: NaN (top key -1) in the layers without attention
            by_layer = dict(zip(layers, zip(kept, tops)))
            blank = (torch.full_like(kept[0], torch.nan), torch.full_like(tops[0], -1))
            kept, tops = (list(x) for x in zip(*(by_layer.get(i, blank) for i in range(self.n_layers))))
        both = torch.stack(kept, dim=2).cpu()
        mass = both[..., 0, :]
        top = torch.stack(tops, dim=2).cpu()  # (T, B, L, H)
        vmass = both[..., 1, :] if with_values else None
        out = []
        for i, (plan, pad, answer, ids) in enumerate(zip(self.plans, self.pads, answers, prompt_ids)):
            n = len(answer)
            cols = [*range(self.n_segments[i]), self.answer_col]
            m = mass[:n, i][..., cols].numpy()
            v = None
            if vmass is not None:
                raw = vmass[:n, i][..., cols].to(torch.float64)
                total = raw.sum(dim=-1, keepdim=True)
                v = torch.where(total > 0, raw / total.clamp_min(1e-300), torch.nan).to(torch.float32).numpy()
            out.append(AnswerAttention(
                tokens=np.asarray(answer, dtype=np.int64), mass=m.astype(np.float32), vmass=v,
                top_key=(top[:n, i] - pad).clamp_min(-1).numpy().astype(np.int32),
                prompt_ids=np.asarray(ids, dtype=np.int64),
                segment_kinds=plan.segment_kinds[: self.n_segments[i]],
                segment_labels=plan.segment_labels[: self.n_segments[i]],
                segment_spans=plan.segment_spans[: self.n_segments[i]]))
        return out


def reference_answer_attention(model: PreTrainedModel, tokenized: TokenizedPrompt,
                               answer_ids: Sequence[int]) -> AnswerAttention:
    """The answer attention of one prompt from a post-hoc eager forward over prompt + answer (full matrices).

    Row ``t`` is the eager ``output_attentions`` row of position ``len(prompt) - 1 + t``; its mass is summed per
    segment and over the answer positions; the value-weighted row weights each key by ``‖v_j W_O^h‖`` with ``v_j``
    as the layer's own eager function was handed it and ``W_O^h`` the map its output went into (float64 numpy;
    :func:`~probe.attention.reference.eager_calls`). A layer without attention is NaN (top key -1).
    Materialises L × H × T²: short prompts only.
    """
    answer = list(answer_ids)
    n_prompt = len(tokenized.input_ids)
    spans = [(s.start, s.end) for s in tokenized.spans]
    with torch.no_grad(), attention_implementation(model, "eager"), eager_calls(model) as seen:
        ids = torch.tensor([list(tokenized.input_ids) + answer], device=input_device(model))
        model(ids, use_cache=False)
    n_layers = n_layers_of(model)
    n_heads = next(iter(seen.values())).weights.shape[0]
    n_t = len(answer)
    mass = np.full((n_t, n_layers, n_heads, len(spans) + 1), np.nan)
    vmass = np.full_like(mass, np.nan)
    top = np.full((n_t, n_layers, n_heads), -1, dtype=np.int64)
    for layer, eager in seen.items():
        att = eager.weights  # (H, T, T)
        values, w = eager.values, eager.out_proj  # (H_kv, T, Dv), (H*Dv, hidden)
        if w is None:
            w = np.full((n_heads * values.shape[-1], 1), np.nan)  # gated output: no value-weighted reference
        dim = values.shape[-1]
        rep = n_heads // values.shape[0]
        for h in range(n_heads):
            norms = np.linalg.norm(values[h // rep] @ w[h * dim:(h + 1) * dim], axis=-1)  # (T,)
            for t in range(n_t):
                q = n_prompt - 1 + t
                row = att[h, q, : q + 1]
                weighted = row * norms[: q + 1]
                for s, (a, b) in enumerate(spans):
                    mass[t, layer, h, s] = row[a:b].sum()
                    vmass[t, layer, h, s] = weighted[a:b].sum()
                mass[t, layer, h, -1] = row[n_prompt:].sum()
                vmass[t, layer, h, -1] = weighted[n_prompt:].sum()
                top[t, layer, h] = int(np.argmax(row))
    with np.errstate(invalid="ignore"):
        vmass /= vmass.sum(axis=-1, keepdims=True)
    return AnswerAttention(
        tokens=np.asarray(answer, dtype=np.int64), mass=mass.astype(np.float32), vmass=vmass.astype(np.float32),
        top_key=top.astype(np.int32), prompt_ids=np.asarray(tokenized.input_ids, dtype=np.int64),
        segment_kinds=tuple(s.kind for s in tokenized.spans),
        segment_labels=tuple(s.label or f"{s.kind}{i}" for i, s in enumerate(tokenized.spans)),
        segment_spans=tuple(spans))


__all__ = ["AnswerRows", "reference_answer_attention"]
