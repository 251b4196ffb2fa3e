"""Attention while the answer is written: per generated token, per layer and head, the mass on each prompt segment.
Specified in docs/probes.md#attention-while-the-answer-is-written."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AnswerAttention:
    """Per-token answer attention of one trial (docs/probes.md#attention-while-the-answer-is-written).

    Attributes:
        tokens: (T_gen,) int64 answer token ids.
        mass: (T_gen, L, H, S + 1) float32.
        vmass: (T_gen, L, H, S + 1) float32, or None.
        top_key: (T_gen, L, H) int32.
        prompt_ids: (T_prompt,) int64 prompt token ids (the token under a top key ``k < T_prompt``).
        segment_kinds / segment_labels / segment_spans: the prompt's segments (token spans), in order.
        chars: (T_gen, 2) int64 character span of each answer token in the output text, or None.
    """

    tokens: np.ndarray
    mass: np.ndarray
    vmass: np.ndarray | None
    top_key: np.ndarray
    prompt_ids: np.ndarray
    segment_kinds: tuple[str, ...]
    segment_labels: tuple[str, ...]
    segment_spans: tuple[tuple[int, int], ...]
    chars: np.ndarray | None = None

    def __post_init__(self) -> None:
        t = len(self.tokens)
        s = len(self.segment_kinds) + 1
        if self.mass.ndim != 4 or self.mass.shape[0] != t or self.mass.shape[3] != s:
            raise ValueError(f"mass has shape {self.mass.shape}; expected ({t}, layers, heads, {s})")
        if self.vmass is not None and self.vmass.shape != self.mass.shape:
            raise ValueError(f"vmass has shape {self.vmass.shape}; expected {self.mass.shape}")
        if self.top_key.shape != self.mass.shape[:3]:
            raise ValueError(f"top_key has shape {self.top_key.shape}; expected {self.mass.shape[:3]}")
        if not (len(self.segment_labels) == len(self.segment_spans) == len(self.segment_kinds)):
            raise ValueError("segment_kinds, segment_labels and segment_spans differ in length")
        if self.chars is not None and self.chars.shape != (t, 2):
            raise ValueError(f"chars has shape {self.chars.shape}; expected ({t}, 2)")

    @property
    def n_prompt(self) -> int:
        """Tokens of the prompt."""
        return len(self.prompt_ids)

    @property
    def n_layers(self) -> int:
        return int(self.mass.shape[1])

    @property
    def n_heads(self) -> int:
        return int(self.mass.shape[2])

    def token_at(self, position: np.ndarray) -> np.ndarray:
        """Token ids at positions of prompt + answer (``top_key`` values), same shape as ``position``."""
        seq = np.concatenate([self.prompt_ids.astype(np.int64), self.tokens.astype(np.int64)])
        return seq[np.asarray(position, dtype=np.int64)]

    def segment_of(self, position: np.ndarray) -> np.ndarray:
        """Segment index of each position (``S`` for an answer token, -1 for a position in no segment)."""
        pos = np.asarray(position, dtype=np.int64)
        out = np.full(pos.shape, -1, dtype=np.int64)
        for i, (a, b) in enumerate(self.segment_spans):
            out[(pos >= a) & (pos < b)] = i
        out[pos >= self.n_prompt] = len(self.segment_spans)
        return out


__all__ = ["AnswerAttention"]
