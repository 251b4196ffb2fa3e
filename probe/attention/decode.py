"""Answer capture: the attention of every generation step, reduced at once to per-segment masses (an
:class:`~probe.attention.answer.AnswerAttention` per prompt; definitions:
docs/probes.md#attention-while-the-answer-is-written).

During ``generate`` the engine's attention function reports every layer call to the active capture. With answer
capture on, :class:`AnswerRows` takes, from each call, the one query row that produces the next token: in the prefill
the last prompt position (row ``t = 0``), in each decode step its single new query against the cache (row ``t``,
whose input is token ``t - 1``). For each batch row it computes that query's post-softmax row over the keys of the
call, exactly as the probe's rows are computed (float32 scores, soft-capping, the model's mask, an active
intervention's bias), and folds it at once into

- the mass on each prompt segment and on the answer tokens so far (one scatter over the keys),
- the same weighted by ``‖v_j W_O^h‖`` (value-weighted, renormalised over the row; the norms of the prompt's keys
  are computed once in the prefill, each decode step adds its new key's),
- the position of the top-attended key.

Nothing larger than one row of keys per layer and step exists, and no second forward pass runs. The answer measures
are per token, a shape the measure registry (whose arrays are per prompt, ``layer`` first, reduced over blocks of
prefill rows) does not hold, so they live here, with their reference :func:`reference_answer_attention`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from transformers import PreTrainedModel

from probe.attention.answer import AnswerAttention
from probe.attention.edits import BatchEdit
from probe.attention.implementation import attention_implementation
from probe.attention.measures.value import module_gram, value_norms
from probe.attention.plan import ProbePlan
from probe.attention.reference import _value_states, output_projection
from probe.errors import HookError
from probe.loading import input_device
from probe.types import TokenizedPrompt


class AnswerRows:
    """Collects, per layer and generation step, the answer-attention row of every prompt of a left-padded batch.

    Each layer's steps go into one preallocated tensor (grown by doubling), so a decode step allocates nothing but
    its row: the raw and the value-weighted masses come out of one scatter (the norms are kept beside a row of ones,
    so the raw mass is the same product, by 1), and the top key is written in place.

    Args:
        plans: one probe plan (of the prompt alone) per batch row.
        pads: left padding of each row.
        width: the batch's prompt width (``len(prompt) + pad`` of every row).
    """

    def __init__(self, plans: Sequence[ProbePlan], pads: Sequence[int], width: int) -> None:
        self.plans = list(plans)
        self.pads = list(pads)
        self.width = width
        self.n_segments = [p.n_segments for p in self.plans]
        smax = max(self.n_segments)
        self.answer_col = smax  # every row's answer column; padding goes to smax + 1 (dropped)
        self.n_cols = smax + 2
        colmap = np.full((len(self.plans), width), smax + 1, dtype=np.int64)
        for i, (plan, pad) in enumerate(zip(self.plans, self.pads)):
            colmap[i, pad:] = plan.seg_of_token[: plan.n_prompt_tokens]
        self._prompt_colmap = torch.from_numpy(colmap)
        self._colmap: dict[torch.device, torch.Tensor] = {}
        self.n_steps: dict[int, int] = {}  # layer -> steps reported
        # layer -> (step capacity, B, H, R, C) float32: R = 1 (raw mass) or 2 (raw, value-weighted)
        self.masses: dict[int, torch.Tensor] = {}
        self.tops: dict[int, torch.Tensor] = {}  # layer -> (step capacity, B, H) int64 padded key position
        # layer -> (B, H, 2, key capacity): ones, then ‖v W_O^h‖ by padded position
        self.norms: dict[int, torch.Tensor] = {}
        self.grams: dict[int, torch.Tensor] = {}
        self.out_rows: dict[int, torch.Tensor] = {}

    def _columns(self, device: torch.device, lo: int, hi: int) -> torch.Tensor:
        """(B, hi - lo) column of each key position ``[lo, hi)`` (padded coordinates)."""
        cm = self._colmap.get(device)
        if cm is None or cm.shape[1] < hi:
            cap = max(hi, 2 * (cm.shape[1] if cm is not None else self.width))
            cm = torch.full((len(self.plans), cap), self.answer_col, dtype=torch.long)
            cm[:, : self.width] = self._prompt_colmap
            cm = cm.to(device)
            self._colmap[device] = cm
        return cm[:, lo:hi]

    def _add_norms(self, layer: int, value: torch.Tensor, module: torch.nn.Module, n_heads: int, lo: int,
                   hi: int) -> torch.Tensor:
        """(B, H, 2, hi - lo): ones, then the norms of keys ``[lo, hi)`` (computed for the prompt in the prefill,
        for the new key in a decode step, kept by position)."""
        n_b, n_kv, n_k, dim = value.shape
        if layer not in self.grams:
            self.out_rows[layer] = output_projection(module).detach()
            self.grams[layer] = module_gram(module, n_heads, value.device)
        store = self.norms.get(layer)
        new_from = 0 if store is None else hi - 1  # prefill: every key; decode step: its new key (the last)
        if store is None or store.shape[3] < hi:
            cap = max(hi, 2 * (store.shape[3] if store is not None else self.width))
            grown = torch.ones(n_b, n_heads, 2, cap, dtype=torch.float32, device=value.device)
            if store is not None:
                grown[:, :, 1, : store.shape[3]] = store[:, :, 1]
            store = grown
            self.norms[layer] = store
        fresh = value[:, :, new_from - (hi - n_k):, :].to(torch.float32)  # (B, H_kv, n_new, D)
        n_new = fresh.shape[2]
        flat = fresh.permute(1, 0, 2, 3).reshape(n_kv, n_b * n_new, dim)
        norms = value_norms(flat, self.out_rows[layer], n_heads, gram=self.grams[layer])
        store[:, :, 1, new_from:hi] = norms.reshape(n_heads, n_b, n_new).permute(1, 0, 2)
        return store[:, :, :, lo:hi]

    def _step_slots(self, layer: int, step: int, n_b: int, n_heads: int, n_rows: int,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The zeroed (B, H, R, C) masses and (B, H) top keys of ``step`` in the layer's buffers (grown as needed)."""
        buf, top = self.masses.get(layer), self.tops.get(layer)
        if buf is None or top is None or buf.shape[0] <= step:
            cap = max(step + 1, 2 * buf.shape[0] if buf is not None else 64)
            grown = torch.zeros(cap, n_b, n_heads, n_rows, self.n_cols, dtype=torch.float32, device=device)
            grown_top = torch.zeros(cap, n_b, n_heads, dtype=torch.long, device=device)
            if buf is not None and top is not None:
                grown[: buf.shape[0]] = buf
                grown_top[: top.shape[0]] = top
            buf, top = self.masses[layer], self.tops[layer] = grown, grown_top
        return buf[step], top[step]

    def report(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
        softcap: float | None,
        edit: BatchEdit | None,
        module: torch.nn.Module | None,
    ) -> None:
        """Fold one layer call's generating row into the step's arrays.

        Args: as :meth:`probe.attention.capture.Capture.report`; ``query`` (B, H, n_q, D) with ``n_q`` the batch's
        width (the prefill) or 1 (a decode step), ``key`` / ``value`` (B, H_kv, K, D) the cache's last K positions.

        Raises:
            HookError: a call that is neither a prefill of the batch nor a one-query decode step, or a mask whose
                shape does not match the keys.
        """
        n_b, n_heads, n_q, dim = query.shape
        n_kv, n_k = key.shape[1], key.shape[2]
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
        last = self.width - 1 + step  # padded position of the generating query
        lo = last - n_k + 1  # the keys are the last n_k positions (a sliding-window cache keeps only the window)
        rep = n_heads // n_kv
        q = query[:, :, -1, :].to(torch.float32).mul(scaling).reshape(n_b, n_kv, rep, dim)
        scores = torch.matmul(q, key.to(torch.float32).transpose(-1, -2)).reshape(n_b, n_heads, n_k)
        if softcap is not None:
            scores = scores.div_(softcap).tanh_().mul_(softcap)
        if attention_mask is not None:
            if attention_mask.shape[-1] != n_k:
                raise HookError(f"layer {layer}: a mask over {attention_mask.shape[-1]} keys for {n_k} keys")
            m = attention_mask[:, 0, -1, :][:, None, :]  # (B or 1, 1, K)
            if m.dtype == torch.bool:
                scores.masked_fill_(~m, float("-inf"))
            else:
                scores += m.to(torch.float32)
        if edit is not None and edit.edits_layer(layer):
            pos = torch.tensor([last], device=edit.device)
            scores += edit.bias(layer, pos, lo, last + 1)[:, :, 0, :].to(scores.device)
        probs = torch.softmax(scores, dim=-1)  # (B, H, K); the generating query always sees itself: no empty row
        weights = None if module is None else self._add_norms(layer, value, module, n_heads, lo, last + 1)
        n_rows = 1 if weights is None else 2
        masses, top = self._step_slots(layer, step, n_b, n_heads, n_rows, probs.device)
        self.n_steps[layer] = step + 1
        torch.argmax(probs, dim=-1, out=top)
        if lo:
            top += lo
        cols = self._columns(probs.device, lo, last + 1)[:, None, None, :].expand(n_b, n_heads, n_rows, n_k)
        rows = probs[:, :, None, :] if weights is None else probs[:, :, None, :] * weights  # (B, H, R, K)
        masses.scatter_add_(3, cols, rows)

    def results(self, answers: Sequence[Sequence[int]], prompt_ids: Sequence[Sequence[int]]) -> list[AnswerAttention]:
        """One :class:`AnswerAttention` per batch row: rows ``0 .. len(answer) - 1`` of its steps.

        Args:
            answers: per row, the answer's token ids (the end token excluded).
            prompt_ids: per row, the prompt's token ids.

        Raises:
            HookError: layers that saw different numbers of steps, or fewer steps than an answer's tokens.
        """
        layers = sorted(self.n_steps)
        counts = {self.n_steps[layer] for layer in layers}
        if len(counts) != 1 or layers != list(range(len(layers))):
            raise HookError(f"answer capture: layers {layers} saw {sorted(counts)} generation steps (one count each)")
        n_steps = counts.pop()
        longest = max((len(a) for a in answers), default=0)
        if longest > n_steps:
            raise HookError(f"answer capture: {n_steps} generation steps seen for an answer of {longest} tokens")
        with_values = {self.masses[layer].shape[3] for layer in layers} == {2}
        # (T, B, L, H, R, C); a layer without value-weighted masses leaves them out of every layer
        both = torch.stack([self.masses[layer][:longest, ..., : 2 if with_values else 1, :] for layer in layers],
                           dim=2).cpu()
        mass = both[..., 0, :]
        top = torch.stack([self.tops[layer][:longest] for layer in layers], dim=2).cpu()  # (T, B, L, H)
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
                top_key=(top[:n, i] - pad).numpy().astype(np.int32), prompt_ids=np.asarray(ids, dtype=np.int64),
                segment_kinds=plan.segment_kinds[: self.n_segments[i]],
                segment_labels=plan.segment_labels[: self.n_segments[i]],
                segment_spans=plan.segment_spans[: self.n_segments[i]]))
        return out


def reference_answer_attention(model: PreTrainedModel, tokenized: TokenizedPrompt,
                               answer_ids: Sequence[int]) -> AnswerAttention:
    """The answer attention of one prompt from a post-hoc eager forward over prompt + answer (full matrices).

    Row ``t`` is the eager ``output_attentions`` row of position ``len(prompt) - 1 + t``; its mass is summed per
    segment and over the answer positions; the value-weighted row weights each key by ``‖v_j W_O^h‖`` with ``v_j``
    read from the value projection and ``W_O^h`` from the output projection of the model (float64 numpy).
    Materialises L × H × T²: short prompts only.
    """
    answer = list(answer_ids)
    n_prompt = len(tokenized.input_ids)
    spans = [(s.start, s.end) for s in tokenized.spans]
    with torch.no_grad(), attention_implementation(model, "eager"), _value_states(model, True) as seen:
        ids = torch.tensor([list(tokenized.input_ids) + answer], device=input_device(model))
        out = model(ids, output_attentions=True, use_cache=False)
    n_layers = len(out.attentions)
    n_heads = out.attentions[0].shape[1]
    n_t = len(answer)
    mass = np.zeros((n_t, n_layers, n_heads, len(spans) + 1))
    vmass = np.zeros_like(mass)
    top = np.zeros((n_t, n_layers, n_heads), dtype=np.int64)
    for layer in range(n_layers):
        att = out.attentions[layer][0].double().cpu().numpy()  # (H, T, T)
        values, w = seen[layer]  # (H_kv, T, D), (H*D, hidden)
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
    vmass /= vmass.sum(axis=-1, keepdims=True)
    return AnswerAttention(
        tokens=np.asarray(answer, dtype=np.int64), mass=mass.astype(np.float32), vmass=vmass.astype(np.float32),
        top_key=top.astype(np.int32), prompt_ids=np.asarray(tokenized.input_ids, dtype=np.int64),
        segment_kinds=tuple(s.kind for s in tokenized.spans),
        segment_labels=tuple(s.label or f"{s.kind}{i}" for i, s in enumerate(tokenized.spans)),
        segment_spans=tuple(spans))


__all__ = ["AnswerRows", "reference_answer_attention"]
