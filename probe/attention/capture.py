"""The capture: collects, during one forward pass, every layer's measures for every prompt of a batch
(docs/probes.md#how-the-engine-computes-them)."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator, Protocol, Sequence

import torch

from probe.attention.answer import AnswerAttention
from probe.attention.call import LayerCall
from probe.attention.masks import BlockMask, allowed_keys, block_mask, causal_block_mask, softmax_rows
from probe.attention.plan import ProbePlan
from probe.attention.reduce import LayerAggregates, LayerReducer, assemble_result
from probe.attention.segments import PlanTensors
from probe.attention.result import SegmentAttention
from probe.errors import HookError


def _prefix(call: LayerCall, width: int) -> LayerCall:
    """The call restricted to its first ``width`` queries and keys."""
    mask = None if call.mask is None else call.mask[..., :width, :width]
    value = None if call.value is None else call.value[:, :, :width]
    return replace(call, query=call.query[:, :, :width], key=call.key[:, :, :width], value=value, mask=mask)


class AnswerSink(Protocol):
    """What takes every layer call of a ``generate`` besides the prefill probe (the answer capture,
    :class:`probe.attention.decode.AnswerRows`)."""

    def report(self, call: LayerCall) -> None:
        """One layer call (the prefill or a decode step)."""

    def report_forced(self, call: LayerCall) -> None:
        """One layer's teacher-forced call over prompt + answer (every generating row at once)."""

    def results(self, answers: Sequence[Sequence[int]], prompt_ids: Sequence[Sequence[int]]) -> list[AnswerAttention]:
        """Per batch row, the attention while its answer was written."""


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


# A prompt whose probe forms at least this share of its rows has all of them formed, and each layer's output for it
# is taken from them instead of the model's own kernel (docs/probes.md#one-attention-per-layer).
ONE_ATTENTION_SHARE = 0.5


class _Row:
    """One prompt of a batch: its plan, its left padding and what its layers reported."""

    def __init__(self, plan: ProbePlan, pad: int, max_block_elements: int | None, every_row: bool) -> None:
        self.plan = plan
        self.pad = pad
        self.max_block_elements = max_block_elements
        self.every_row = every_row
        self.tensors: dict[torch.device, PlanTensors] = {}  # per device (layers may be spread over GPUs)
        self.block_masks: dict[tuple, list[BlockMask]] = {}  # per mask (layers of one type share their mask)
        self.chance: dict[tuple, float] = {}
        self.layers: dict[int, LayerAggregates] = {}

    def tensors_on(self, device: torch.device) -> PlanTensors:
        if device not in self.tensors:
            self.tensors[device] = PlanTensors(self.plan, device, self.max_block_elements, self.every_row)
        return self.tensors[device]


class Capture:
    """Collects the layers' aggregates of a batch of prompts during one forward pass; checks each layer reported once.

    Args:
        plans: one probe plan per batch row.
        n_layers: the model's depth (the layer axis of every result).
        layers: the layers expected to report (None: 0 .. n_layers-1); a hybrid model's other layers have no
            attention, and their rows of every array are NaN (:func:`~probe.attention.reduce.assemble_result`).
        pads: left padding of each row (None: no padding; every plan has the batch's length).
        max_block_elements: most ``rows x keys`` per head in one block of rows (None: ``block_size`` rows).
        prefill_only: take only the call whose queries and keys span the whole batch (generation's prefill) and let
            every other call (decode steps) through; without it any other shape is an error.
        answer: answer capture (:class:`~probe.attention.decode.AnswerRows`), handed every call of a ``generate``
            (the prefill's last row and each decode step's query), or None.
        value_weighted: compute the measures that read value states (False: leave them out, as where the weights
            are offloaded; ``probe bench attention`` times their cost so).
        forced: the batch runs teacher-forced, each prompt followed by its answer (:func:`probe.attention.probe_forced`):
            the one call is wider than the prompts (:meth:`report`).
        one_attention: where the pass's outputs are not decoded (not ``prefill_only``), the prompts whose plan forms
            at least ``ONE_ATTENTION_SHARE`` of their rows have every row formed and give each layer their output from
            them (:meth:`forms_output`; the others, :attr:`model_rows`, take the model's kernel); False: none.

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
        answer: AnswerSink | None = None,
        value_weighted: bool = True,
        forced: bool = False,
        layers: Sequence[int] | None = None,
        one_attention: bool = True,
    ) -> None:
        pads = list(pads) if pads is not None else [0] * len(plans)
        if len(pads) != len(plans) or not plans:
            raise HookError(f"capture: {len(plans)} plans and {len(pads)} paddings (one each, at least one)")
        widths = {p.n_tokens + pad for p, pad in zip(plans, pads)}
        if len(widths) != 1:
            raise HookError(f"capture: prompt length + padding differs between rows ({sorted(widths)})")
        self.width = widths.pop()
        own = [one_attention and not prefill_only and len(p.row_positions) >= ONE_ATTENTION_SHARE * p.n_tokens
               for p in plans]
        self.rows = [_Row(plan, pad, max_block_elements, o) for plan, pad, o in zip(plans, pads, own)]
        self.one_attention = any(own)
        self.model_rows = [i for i, o in enumerate(own) if not o]  # batch rows whose output the model's kernel gives
        self.n_layers = n_layers
        self.layers = tuple(range(n_layers)) if layers is None else tuple(layers)
        self.prefill_only = prefill_only
        self.answer = answer
        self.calls: Counter[int] = Counter()
        self.options = plans[0].options
        self.value_weighted = value_weighted
        self.forced = forced

    @property
    def plans(self) -> list[ProbePlan]:
        return [r.plan for r in self.rows]

    def forms_output(self, layer: int, n_queries: int, n_keys: int) -> bool:
        """Whether :meth:`report` gives this layer call's output from the probe's rows (the model's kernel is then not
        called): one attention is on, the layer has not reported yet, and the call is the pass over the prompts (or
        the teacher-forced pass, whose rows past the prompts the caller computes)."""
        return self.one_attention and self.calls[layer] == 0 and n_queries == n_keys and (
            n_queries == self.width or (self.forced and n_queries > self.width))

    def report(self, call: LayerCall, output: bool = False) -> torch.Tensor | None:
        """Compute the needed rows of one layer call for every prompt of the batch, in blocks, and keep their
        aggregates (:class:`~probe.attention.call.LayerCall`: under an intervention its bias is added to the rows'
        scores, so the probe measures the intervened attention; the value states and the module go to the measures
        that read them). A teacher-forced call (``forced``) is wider than the prompts: the answer capture takes
        it whole, and the prompts' rows are probed on its first ``width`` queries and keys (a prompt row sees no
        later key, so they are the prefill's).

        Returns:
            With ``output`` (where :meth:`forms_output`), the (B, H, width, Dv) attention output of the prompts'
            positions in the query's dtype, ``A·V`` from the probe's float32 rows (a padding position gets 0: no
            other position reads it; the rows of :attr:`model_rows` are left 0 for the caller); else None."""
        if self.forced and call.query.shape[2] > self.width:
            if self.answer is not None:
                self.answer.report_forced(call if self.value_weighted else replace(call, module=None))
            call = _prefix(call, self.width)
        elif self.answer is not None:
            if call.value is None:
                raise HookError(f"layer {call.layer}: answer capture needs the value states, and the layer reported "
                                "none")
            self.answer.report(call if self.value_weighted else replace(call, module=None))
        layer, query, key, attention_mask = call.layer, call.query, call.key, call.mask
        n_batch, n_heads, n_q, _ = query.shape
        n_kv, n_k = key.shape[1], key.shape[2]
        if n_q != self.width or n_k != self.width:
            if self.prefill_only:
                return None  # a decode step: one new query against the cache
            raise HookError(
                f"layer {layer}: attention over {n_q} queries x {n_k} keys, the probed sequence has "
                f"{self.width} tokens (a cache or packed input is not supported)"
            )
        self.calls[layer] += 1
        if self.calls[layer] > 1:
            return None  # the duplicate is reported by ``check``
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
        out = None
        if output:
            if call.value is None:
                raise HookError(f"layer {layer}: its output needs the value states, and the layer reported none")
            out = torch.zeros(n_batch, n_heads, self.width, call.value.shape[-1], dtype=query.dtype,
                              device=query.device)
        with _few_threads(query.device, max(r.plan.n_tokens for r in self.rows) ** 2 * n_heads // 2):
            for i, row in enumerate(self.rows):
                p = row.pad
                mask = None
                mask_key: tuple = (None,)
                if attention_mask is not None:
                    b = i if attention_mask.shape[0] > 1 else 0
                    mask = attention_mask[b, 0, p:, p:]  # (T, T): the prompt's own rows and keys
                    mask_key = (attention_mask.data_ptr(), tuple(attention_mask.shape), b, p)
                row.layers[layer] = self._reduce(row, i, call, mask, mask_key, out if row.every_row else None)
        return out

    def _reduce(self, row: _Row, i: int, call: LayerCall, mask: torch.Tensor | None,
                mask_key: tuple, out: torch.Tensor | None = None) -> LayerAggregates:
        """Batch row ``i``'s aggregates in one layer from its own (H, T, D) queries and (H_kv, T, D) keys (its padding
        cut off) and ``mask`` (T, T); the call's edit, where it edits this layer, adds its bias to the scores; the
        value states go to the measures that read them; with ``out`` (B, H, width, Dv), every row's ``A·V`` is
        written into its row ``i`` (the rows then cover every position)."""
        p, layer = row.pad, call.layer
        query, key = call.query[i, :, p:, :], call.key[i, :, p:, :]
        value = None if call.value is None else call.value[i, :, p:, :]
        edit = call.edit if call.edit is not None and call.edit.edits_layer(layer) else None
        scaling, softcap = call.scaling, call.softcap
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
        reducer = LayerReducer(row.plan, n_heads, tensors, layer, call.module if self.value_weighted else None)
        values = None
        if reducer.needs_values or out is not None:
            if value is None:
                raise HookError(f"layer {layer}: a measure reads the value states, but the layer reported none")
            values = value.to(torch.float32)
        key_t = key.to(torch.float32).transpose(-1, -2)  # (H_kv, D, T), a transposed view bmm reads as is
        for block, bm in zip(tensors.blocks, masks):
            q = query[:, block.first : block.last + 1] if block.contiguous else query[:, block.positions]
            n_rows = q.shape[1]
            q = (q.to(torch.float32) * scaling).reshape(n_kv, (n_heads // n_kv) * n_rows, dim)  # (H_kv, rep*B, D)
            scores = torch.bmm(q, key_t[:, :, bm.lo : bm.hi]).view(n_heads, n_rows, bm.hi - bm.lo)  # (H, B, K)
            if softcap is not None:
                scores = scores.div_(softcap).tanh_().mul_(softcap)
            bm.apply(scores)
            if edit is not None:
                rows = torch.tensor([i], device=edit.device)
                scores += edit.bias(layer, (block.positions + row.pad).to(edit.device), bm.lo + row.pad,
                                    bm.hi + row.pad, rows)[0].to(scores.device)
            probs = softmax_rows(scores, call.sinks, 0)
            del scores
            reducer.add(block, probs, bm.lo, values)
            if out is not None:  # the layer's output from the same rows: A·V, query head h reading value head h // rep
                assert values is not None and block.contiguous
                o = torch.bmm(probs.view(n_kv, (n_heads // n_kv) * n_rows, -1), values[:, bm.lo : bm.hi])
                out[i, :, p + block.first : p + block.last + 1] = o.view(n_heads, n_rows, -1)
            del probs
        return reducer.finish(self._chance(row, mask, mask_key, tensors))

    @staticmethod
    def _chance(row: _Row, mask: torch.Tensor | None, mask_key: tuple, tensors: PlanTensors) -> float:
        """The chance level of P_ext under one mask (counted once per mask)."""
        if mask_key not in row.chance:
            allowed = allowed_keys(mask, tensors.query_positions, row.plan.n_tokens)
            row.chance[mask_key] = tensors.chance(allowed, row.plan.options.exclude_sink)
        return row.chance[mask_key]

    def check(self) -> None:
        """Raise :class:`HookError` unless every expected layer reported exactly once."""
        missing = [i for i in self.layers if self.calls[i] == 0]
        repeated = sorted(i for i, n in self.calls.items() if n > 1)
        unexpected = sorted(i for i in self.calls if i not in self.layers)
        if missing or repeated or unexpected:
            parts = []
            if missing:
                parts.append(f"layers {missing} did not report (their attention bypasses the AttentionInterface)")
            if repeated:
                parts.append(f"layers {repeated} reported more than once")
            if unexpected:
                parts.append(f"layers {unexpected} are not among the attention layers {list(self.layers)}")
            raise HookError("attention probe: " + "; ".join(parts))

    def results(self) -> list[SegmentAttention]:
        """Check the layers, then one :class:`SegmentAttention` per batch row, in batch order."""
        self.check()
        return [assemble_result(r.plan, [r.layers.get(i) for i in range(self.n_layers)]) for r in self.rows]
