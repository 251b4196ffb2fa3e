"""Mask geometry of the probe's row blocks: which keys a block of query rows reads, and which of them are hidden.

A block of rows ending at position p reads only the keys a row can see (``[0, p]``, or the window), and only the
keys the mask hides inside that range are set to −inf (a triangle for a causal block). :func:`allowed_keys` gives
the keys each query may see, from which the chance level of P_ext is counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from probe.attention.segments import RowBlock
from probe.errors import HookError


@dataclass
class BlockMask:
    """Which keys one block of rows reads and which of them the mask hides.

    Attributes:
        lo / hi: the block reads keys ``[lo, hi)`` (every key a row of the block can see).
        head: (B, w) bool, True = hidden, for keys ``[lo, lo + w)``, or None.
        tail: (B, w) bool, True = hidden, for keys ``[tail_start, hi)``, or None.
        tail_start: first key of ``tail``.
        blocked: (B, hi - lo) bool, True = hidden, when the visible keys of a row are not one interval per row
            (then ``head`` and ``tail`` are None).
        additive: (B, hi - lo) float32 additive mask rows (a float mask with values other than 0 and -inf).
    """

    lo: int
    hi: int
    head: torch.Tensor | None = None
    tail: torch.Tensor | None = None
    tail_start: int = 0
    blocked: torch.Tensor | None = None
    additive: torch.Tensor | None = None

    def apply(self, scores: torch.Tensor) -> None:
        """Set the hidden keys of (H, B, hi - lo) ``scores`` to -inf (or add the additive mask), in place."""
        if self.additive is not None:
            scores += self.additive
            return
        if self.blocked is not None:
            scores.masked_fill_(self.blocked, float("-inf"))
            return
        if self.head is not None:
            scores[:, :, : self.head.shape[1]].masked_fill_(self.head, float("-inf"))
        if self.tail is not None:
            scores[:, :, self.tail_start - self.lo :].masked_fill_(self.tail, float("-inf"))


def causal_block_mask(block: RowBlock) -> BlockMask:
    """The block's keys and hidden keys under a plain causal mask."""
    return BlockMask(lo=0, hi=block.last + 1, tail=block.causal_tail, tail_start=block.first + 1)


def block_mask(mask: torch.Tensor, block: RowBlock) -> BlockMask:
    """The block's keys and hidden keys under a (T, T) mask (bool: True = may attend; float: additive).

    Raises:
        HookError: a row of the block may attend to no key.
    """
    rows = mask[block.first : block.last + 1] if block.contiguous else mask[block.positions]
    rows = rows[:, : block.last + 1]  # (B, last + 1): no row sees a key after itself
    if rows.dtype != torch.bool:
        allowed = rows > torch.finfo(rows.dtype).min / 2
        if not bool((rows[allowed] == 0).all()):  # a bias beyond hiding keys: add the rows as they are
            return BlockMask(lo=0, hi=block.last + 1, additive=rows.to(torch.float32))
        rows = allowed
    if not bool(rows.any(dim=1).all()):
        raise HookError(f"the attention mask lets a query row in [{block.first}, {block.last}] see no key")
    u = rows.to(torch.uint8)
    first_key = u.argmax(dim=1)  # first allowed key per row
    last_key = block.last - u.flip(1).argmax(dim=1)  # last allowed key per row
    lo, hi = int(first_key.min()), int(last_key.max()) + 1
    is_interval = bool((u.sum(dim=1) == last_key - first_key + 1).all())
    head_end, tail_start = int(first_key.max()), int(last_key.min()) + 1
    if not is_interval or head_end > tail_start:
        return BlockMask(lo=lo, hi=hi, blocked=~rows[:, lo:hi])
    return BlockMask(
        lo=lo,
        hi=hi,
        head=~rows[:, lo:head_end] if head_end > lo else None,
        tail=~rows[:, tail_start:hi] if hi > tail_start else None,
        tail_start=tail_start,
    )


def allowed_keys(mask: torch.Tensor | None, positions: torch.Tensor, n_keys: int) -> torch.Tensor:
    """(B, T) bool: the keys each query position may attend to under a (T, T) ``mask`` (None: plain causal).

    A boolean mask is True where attention is allowed; an additive float mask allows what it does not push to the
    dtype's minimum.
    """
    if mask is None:
        return torch.arange(n_keys, device=positions.device)[None, :] <= positions[:, None]
    rows = mask[positions, :]
    return rows if rows.dtype == torch.bool else rows > torch.finfo(rows.dtype).min / 2


def softmax_rows(scores: torch.Tensor, sinks: torch.Tensor | None, head_axis: int) -> torch.Tensor:
    """The softmax of ``scores`` over its last axis; with learned sinks (one logit per head, on ``head_axis``) the
    sink joins each row's softmax and is dropped from it afterwards, as the architectures with sinks compute it, so
    the row's weights sum to 1 minus the mass the softmax gave to no key (docs/probes.md#learned-sinks)."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    shape = [1] * scores.dim()
    shape[head_axis] = -1
    sink = sinks.to(device=scores.device, dtype=scores.dtype).view(shape).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
