"""Attention while the answer is written: per generated token, per layer and head, the mass on each prompt segment.

An :class:`AnswerAttention` holds, for one trial, what the decode steps of generation saw (definitions:
docs/probes.md):

- ``tokens[t]``: the answer's token ids (the answer the trial records; the end token excluded).
- ``mass[t, l, h, s]``: the post-softmax attention of the query row that produced token ``t`` on segment ``s`` of
  the prompt (segments in order, sink segments included), and in the last column ``s = S`` on the answer tokens
  written so far. A row sums to 1 over the ``S + 1`` columns.
- ``vmass[t, l, h, s]``: the same, value-weighted (each key's weight times ``‖v_j W_O^h‖``, renormalised over the
  row), or None where the model's weights could not be read.
- ``top_key[t, l, h]``: the position (prompt + answer coordinates, no padding) of the key holding the largest
  weight in that row.
- ``chars[t]``: the characters ``[start, end)`` of the recorded output text that token ``t`` wrote (what hop
  tracking maps a mention onto), found by the runner with the model's tokenizer
  (:func:`probe.prompts.tokenize.token_char_spans`); None in a record written before the runner recorded it.

Alignment: row ``t`` is the query whose output produced token ``t``. For ``t = 0`` that is the last prompt position;
for ``t ≥ 1`` it is the decode step whose input is token ``t - 1``. "The attention while writing token t" is row
``t``, and token ``t`` is *copied* from key ``k`` when ``top_key[t, l, h] = k`` holds the same token id as token
``t`` (the retrieval rule of Wu et al. 2024).

Only aggregates are kept: ``(T_gen, L, H, S + 1)`` numbers per trial, never a row over every key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AnswerAttention:
    """Per-token answer attention of one trial (module docstring).

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
