"""Attention interventions, their geometry: knock out or steer the attention edges from answering positions to chosen
prompt tokens. Specified in docs/interventions.md#how-it-is-applied-and-checked."""

from __future__ import annotations

import hashlib
import logging
from typing import Callable, Sequence

import numpy as np
import torch

from probe.attention.masks import softmax_rows
from probe.errors import ConfigError, SpanError
from probe.interventions import MATCHED_DRAWS, Intervention, RowEdit
from probe.types import TokenizedPrompt

log = logging.getLogger(__name__)

# Span kinds matched-random keys are drawn from: content that is neither extraneous, question nor markup.
RANDOM_KEY_KINDS: tuple[str, ...] = MATCHED_DRAWS["matched-random"][1]

# Most elements of one block's bias (batch x heads x rows x keys, float32): 4 Mi elements = 16 MiB.
BLOCK_ELEMENTS = 4 * 1024 * 1024


def head_bias(intervention: Intervention, n_layers: int, n_heads: int) -> torch.Tensor:
    """(n_layers, n_heads) float32: the bias of each layer's heads (0 where not edited).

    Raises:
        ConfigError: a layer or head outside the model.
    """
    out = torch.zeros(n_layers, n_heads, dtype=torch.float32)
    explicit_layers, heads = intervention.layers, intervention.heads
    layers = range(n_layers) if explicit_layers is None else explicit_layers
    for layer in layers:
        if layer >= n_layers:
            raise ConfigError(f"intervention {intervention.name!r}: layer {layer} is outside the model's "
                              f"{n_layers} layers (0..{n_layers - 1})")
    if heads is None:
        out[list(layers)] = intervention.score_bias
        return out
    for layer, head in heads:
        if layer >= n_layers or head >= n_heads:
            raise ConfigError(f"intervention {intervention.name!r}: head ({layer}, {head}) is outside the model's "
                              f"{n_layers} layers x {n_heads} heads")
        out[layer, head] = intervention.score_bias
    return out


def random_key_seed(seed: int, prompt_id: str) -> int:
    """The seed of one prompt's matched keys (and re-injected neutral sentences): a function of the experiment seed
    and the prompt id alone."""
    digest = hashlib.sha256(f"{seed}\n{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _positions(tokenized: TokenizedPrompt, kinds: Sequence[str]) -> np.ndarray:
    return np.array([p for s in tokenized.spans if s.kind in kinds for p in range(s.start, s.end)], dtype=np.int64)


def row_edit(tokenized: TokenizedPrompt, intervention: Intervention, seed: int = 0, prompt_id: str = "") -> RowEdit:
    """The key mask and first query of one prompt under ``intervention`` (docs/interventions.md#how-it-is-applied-and-checked).

    Args:
        tokenized: the prompt's ids and token spans.
        intervention: the intervention (its ``keys`` and ``queries``).
        seed / prompt_id: seed the ``matched-random`` draw.

    Returns:
        The prompt's :class:`RowEdit`; a ``matched-random`` draw short of tokens is logged (``short`` says by how
        many).

    Raises:
        SpanError: queries ``answer`` on a prompt without a question segment.
    """
    n = len(tokenized.input_ids)
    question = _positions(tokenized, ("question",))
    q_first = int(question.min()) if question.size else n
    keys = np.zeros(n, dtype=bool)
    wanted = -1
    if intervention.keys in MATCHED_DRAWS:
        target, kinds = MATCHED_DRAWS[intervention.keys]
        matched = _positions(tokenized, (target,))
        wanted = int(matched.size)
        pool = _positions(tokenized, kinds)
        pool = pool[pool < q_first]
        rng = np.random.default_rng(random_key_seed(seed, prompt_id))
        take = min(wanted, pool.size)
        keys[rng.choice(pool, size=take, replace=False)] = True
        if take < wanted:
            log.warning("intervention %r, prompt %r: %s keys: %d tokens wanted (its %s tokens), only %d tokens to draw "
                        "from", intervention.name, prompt_id, intervention.keys, wanted, target, take)
        anchor = matched
    else:
        anchor = _positions(tokenized, (intervention.keys,))
        keys[anchor] = True
    if intervention.queries == "answer":
        if not question.size:
            raise SpanError(f"intervention {intervention.name!r}: queries \"answer\" need a question segment; "
                            f"prompt {prompt_id or '(unnamed)'} has none (use queries \"after\" or a RowEdit)")
        start = q_first
    else:
        start = int(anchor.min()) + 1 if anchor.size else n
    return RowEdit(keys=keys, query_start=start, wanted=wanted)


class BatchEdit:
    """The edit of a left-padded batch: per-row key masks and first queries in padded coordinates, per-head biases.

    Args:
        rows: one :class:`RowEdit` per batch row.
        pads: left padding of each row (row ``i`` holds its prompt at ``[pads[i], width)``).
        intervention: the intervention (kind, α, layers, heads).
        n_layers / n_heads: the model's depth and query heads.
        device: where the model's attention runs.

    Raises:
        ConfigError: rows and pads disagree, a key mask of the wrong length, a layer or head outside the model.
    """

    def __init__(self, rows: Sequence[RowEdit], pads: Sequence[int], intervention: Intervention, n_layers: int,
                 n_heads: int, device: torch.device | str = "cpu", lengths: Sequence[int] | None = None) -> None:
        if len(rows) != len(pads) or not rows:
            raise ConfigError(f"BatchEdit: {len(rows)} row edits and {len(pads)} paddings (one each, at least one)")
        widths = {len(r.keys) + p for r, p in zip(rows, pads)}
        if len(widths) != 1:
            raise ConfigError(f"BatchEdit: key mask length + padding differs between rows ({sorted(widths)})")
        if lengths is not None and [len(r.keys) for r in rows] != list(lengths):
            raise ConfigError("BatchEdit: a key mask's length differs from its prompt's token count")
        self.intervention = intervention
        self.width = widths.pop()
        self.device = torch.device(device)
        keys = np.zeros((len(rows), self.width), dtype=bool)
        for i, (r, p) in enumerate(zip(rows, pads)):
            keys[i, p:] = r.keys
        self.keys = torch.from_numpy(keys).to(self.device)  # (B, W)
        self.query_start = torch.tensor([p + r.query_start for r, p in zip(rows, pads)], dtype=torch.long,
                                        device=self.device)  # (B,)
        self.has_keys = self.keys.any(dim=1)  # (B,)
        self.empty = not bool(self.has_keys.any())
        self.every_row_keyed = bool(self.has_keys.all())
        bias = head_bias(intervention, n_layers, n_heads)
        self.layer_bias: dict[int, torch.Tensor] = {
            layer: bias[layer].to(self.device) for layer in range(n_layers) if bool((bias[layer] != 0).any())
        }
        self._bias_key = {layer: tuple(float(x) for x in b.tolist()) for layer, b in self.layer_bias.items()}
        self._seen: dict[int, int] = {}  # per layer: positions processed so far (prefill + decode steps)
        # The additive masks of the current step, shared by the layers that have the same mask and head biases
        # (every layer of a decode step, for an edit of all heads): built once per step, not once per layer.
        self._step = -1
        self._additive: dict[tuple, torch.Tensor] = {}

    def step_additive(self, layer: int, mask: torch.Tensor | None, rows: slice, query_positions: torch.Tensor,
                      key_positions: torch.Tensor, build: "Callable[[], torch.Tensor]") -> torch.Tensor:
        """The (B, H, n, K) additive mask of a block, built by ``build`` or reused from a layer of the same step with
        the same model mask and head biases (only single-block calls are kept: a decode step or a short tail)."""
        step = int(query_positions[-1])
        if step != self._step:
            self._step = step
            self._additive.clear()
        mask_key = None if mask is None else (mask.data_ptr(), tuple(mask.shape))
        key = (mask_key, rows.start, rows.stop, int(key_positions[0]), int(key_positions.shape[0]),
               self._bias_key[layer])
        hit = self._additive.get(key)
        if hit is None:
            hit = build()
            if hit.numel() <= BLOCK_ELEMENTS:
                self._additive[key] = hit
        return hit

    def last_position(self, layer: int, n_queries: int, n_keys: int) -> int:
        """The absolute (padded) position of a layer call's last query, counted over the calls of a forward pass
        or a ``generate``: a call whose queries span all its keys starts at position 0 (a prefill, or a forward
        without cache); any other call continues after the previous one (a decode step against the cache, which
        under a sliding window holds only the last keys).
        """
        if n_queries == n_keys:  # a new forward pass: nothing of an earlier one is reused
            self._seen[layer] = n_queries
            if layer == min(self.layer_bias):
                self._step = -1
                self._additive.clear()
        else:
            self._seen[layer] = self._seen.get(layer, 0) + n_queries
        return self._seen[layer] - 1

    def edits_layer(self, layer: int) -> bool:
        return not self.empty and layer in self.layer_bias

    def edited_queries(self, query_positions: torch.Tensor) -> torch.Tensor:
        """(B, n) bool: the (row, query) pairs the edit reaches (a query of a row that has keys)."""
        return (query_positions[None, :] >= self.query_start[:, None]) & self.has_keys[:, None]

    def edges(self, query_positions: torch.Tensor, lo: int, hi: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """(B, n, hi - lo) bool: edited edges from the queries at ``query_positions`` (padded coordinates) to keys
        ``[lo, hi)``; keys past the prompt (generated tokens) are never keys, a query's edge to itself never edited.

        Args:
            query_positions: (n,) int64 absolute query positions.
            lo / hi: the key range.
            rows: batch rows to take (None: all).
        """
        keys = self.keys if rows is None else self.keys[rows]
        start = self.query_start if rows is None else self.query_start[rows]
        n_b = keys.shape[0]
        k = torch.zeros(n_b, hi - lo, dtype=torch.bool, device=keys.device)
        top = min(hi, self.width)
        if top > lo:
            k[:, : top - lo] = keys[:, lo:top]
        key_pos = torch.arange(lo, hi, device=keys.device)
        is_query = query_positions[None, :] >= start[:, None]  # (B, n)
        not_self = key_pos[None, :] != query_positions[:, None]  # (n, K)
        return is_query[:, :, None] & k[:, None, :] & not_self[None, :, :]

    def bias(self, layer: int, query_positions: torch.Tensor, lo: int, hi: int,
             rows: torch.Tensor | None = None) -> torch.Tensor:
        """(B, H, n, hi - lo) float32: what the edit adds to layer ``layer``'s scores (0, ``log α`` or −inf)."""
        edges = self.edges(query_positions, lo, hi, rows)
        head = self.layer_bias[layer].to(edges.device)
        zero = torch.zeros((), dtype=torch.float32, device=edges.device)
        return torch.where(edges[:, None], head[None, :, None, None], zero)


def _base_additive(mask: torch.Tensor | None, rows: slice, query_positions: torch.Tensor,
                   key_positions: torch.Tensor) -> torch.Tensor:
    """(B or 1, 1, n, K) float32 additive form of the model's mask for query rows ``rows`` (None: causal over the
    absolute ``query_positions`` and ``key_positions``)."""
    n_keys = key_positions.shape[0]
    if mask is None:
        allowed = key_positions[None, :] <= query_positions[:, None]
        return torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device).masked_fill_(
            ~allowed, float("-inf"))[None, None]
    m = mask[:, :, rows, :n_keys]
    if m.dtype == torch.bool:
        return torch.zeros(m.shape, dtype=torch.float32, device=m.device).masked_fill_(~m, float("-inf"))
    return m.to(torch.float32)


def _rows_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive: torch.Tensor,
                    scaling: float, softcap: float | None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of a block of query rows under a (B, H, n, K) additive mask.

    Without soft-capping or learned sinks through torch's SDPA in the model's dtype; with either (SDPA has neither)
    computed explicitly in float32 as the engine's exact path does: ``tanh(s / cap) · cap``, then the mask, then the
    softmax (with the sink logit in it).

    Returns:
        (B, n, H, Dv) output in the query's dtype.
    """
    n_heads, n_kv = query.shape[1], key.shape[1]
    if softcap is None and sinks is None:
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=additive, scale=scaling, enable_gqa=n_heads != n_kv)
        return out.transpose(1, 2)
    rep = n_heads // n_kv
    dtype = torch.promote_types(query.dtype, torch.float32)
    k = key.to(dtype).repeat_interleave(rep, dim=1)
    v = value.to(dtype).repeat_interleave(rep, dim=1)
    scores = torch.matmul(query.to(dtype), k.transpose(-1, -2)).mul_(scaling)
    if softcap is not None:
        scores = scores.div_(softcap).tanh_().mul_(softcap)
    scores = scores + additive.to(dtype)
    probs = torch.nan_to_num(softmax_rows(scores, sinks, 1))  # a padding row that sees no key
    return torch.matmul(probs, v).to(query.dtype).transpose(1, 2)


def edited_attention(
    edit: BatchEdit,
    layer: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    softcap: float | None,
    base: torch.Tensor | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer's attention output under the edit.

    Args:
        edit: the batch's edit (``edit.edits_layer(layer)`` must hold).
        layer: the layer's index.
        query: (B, H, n_q, D) query states; the queries are the last ``n_q`` positions of the ``n_k`` keys.
        key / value: (B, H_kv, n_k, D) key and value states (the cache included during decoding).
        mask: the model's (B or 1, 1, n_q, n_k) bool / additive mask, or None (plain causal).
        scaling / softcap / sinks: as the layer's attention.
        base: the layer's unedited (B, n_q, H, Dv) output, or None when every (row, query) pair is edited (then it
            is not needed).

    Returns:
        (B, n_q, H, Dv) output: the edited rows recomputed a block at a time, the others those of ``base``.
    """
    n_batch, n_heads, n_q = query.shape[:3]
    n_k = key.shape[2]
    last = edit.last_position(layer, n_q, n_k)
    positions = torch.arange(last - n_q + 1, last + 1, device=query.device)
    lo = last - n_k + 1  # the keys are the last n_k positions (a sliding-window cache keeps only the window)
    key_positions = torch.arange(lo, last + 1, device=query.device)
    edited = edit.edited_queries(positions.to(edit.device)).to(query.device)  # (B, n_q)
    touched = edited.any(dim=0).nonzero()
    if touched.numel() == 0:
        assert base is not None
        return base
    first = int(touched[0])
    out = base if base is not None else torch.empty(n_batch, n_q, n_heads, value.shape[-1], dtype=query.dtype,
                                                    device=query.device)
    block = max(1, BLOCK_ELEMENTS // max(1, n_batch * n_heads * n_k))
    for a in range(first, n_q, block):
        b = min(n_q, a + block)
        pos = positions[a:b]
        def build(a: int = a, b: int = b, pos: torch.Tensor = pos) -> torch.Tensor:
            return (_base_additive(mask, slice(a, b), pos, key_positions)
                    + edit.bias(layer, pos.to(edit.device), lo, last + 1).to(query.device)).to(query.dtype)

        additive = edit.step_additive(layer, mask, slice(a, b), pos, key_positions, build)
        new = _rows_attention(query[:, :, a:b], key, value, additive, scaling, softcap, sinks)
        if base is None:
            out[:, a:b] = new
        else:
            out[:, a:b] = torch.where(edited[:, a:b, None, None], new, out[:, a:b])
    return out


__all__ = ["RANDOM_KEY_KINDS", "BatchEdit", "edited_attention", "head_bias", "random_key_seed", "row_edit"]
