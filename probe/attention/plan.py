"""What a probe must compute for one prompt: segments, the query set Q, the AR targets and their sources
(docs/probes.md#query-sets)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from probe.probe_options import ProbeOptions
from probe.errors import ConfigError, SpanError
from probe.types import TokenizedPrompt

AR_TARGET_KINDS: tuple[str, ...] = ("germane", "question")


@dataclass(frozen=True)
class ProbePlan:
    """The positions and segment bookkeeping of one probe.

    Attributes:
        n_tokens: length T of the probed sequence (prompt + answer tokens).
        n_prompt_tokens: length of the prompt.
        segment_kinds / segment_labels / segment_spans: one entry per segment, in order.
        seg_of_token: (T,) int64 segment index of every token.
        query_positions: (n_queries,) int64 sorted positions of the query set Q.
        ar_targets: segment indices of the AR targets.
        ar_sources: per target, ``(source segment, weight γ^(k−j))`` pairs of the extraneous segments before it.
        row_positions: (n_rows,) int64 sorted positions whose attention rows must be computed: Q, plus the tokens
            of the targets (residue) and of the sources that precede some target (cosine residue).
        options: the probe options (``options.residue``: whether AR_k is computed, :attr:`compute_residue`).
    """

    n_tokens: int
    n_prompt_tokens: int
    segment_kinds: tuple[str, ...]
    segment_labels: tuple[str, ...]
    segment_spans: tuple[tuple[int, int], ...]
    seg_of_token: np.ndarray
    query_positions: np.ndarray
    ar_targets: tuple[int, ...]
    ar_sources: tuple[tuple[tuple[int, float], ...], ...]
    row_positions: np.ndarray
    options: ProbeOptions

    @property
    def compute_residue(self) -> bool:
        """Whether AR_k is computed (``options.residue``)."""
        return self.options.residue

    @property
    def n_segments(self) -> int:
        return len(self.segment_kinds)


def _query_positions(q: str, spans: list[tuple[int, int]], kinds: list[str], n_prompt: int,
                     n_generated: int) -> np.ndarray:
    """The query positions of query set ``q`` (``question`` adds the last prompt token; ``segment:<i>`` counts
    the prompt's segments, the generated span left out)."""
    if q == "question":
        pos = [p for (a, b), k in zip(spans, kinds) if k == "question" for p in range(a, b)]
        if not pos:
            raise SpanError(
                "probe.query = 'question' but the prompt has no question segment; use query 'last' or 'segment:<i>'"
            )
        return np.unique(np.array([*pos, n_prompt - 1], dtype=np.int64))
    if q == "last":
        return np.array([n_prompt - 1], dtype=np.int64)
    if q == "generated":
        if n_generated == 0:
            raise ConfigError("probe.query = 'generated' needs the generated answer ids (generated_ids is empty)")
        return np.arange(n_prompt, n_prompt + n_generated, dtype=np.int64)
    if q.startswith("segment:"):
        i = int(q.split(":", 1)[1])
        n_segments = len(spans) - (1 if n_generated > 0 else 0)
        if not 0 <= i < n_segments:
            raise SpanError(f"probe.query = {q!r}: the prompt has {n_segments} segments (0-based)")
        return np.arange(spans[i][0], spans[i][1], dtype=np.int64)
    # ProbeOptions validates the name; this guards against a hand-built options object
    raise ConfigError(f"probe.query: {q!r}; use question, last, generated or segment:<i>")


def _ar_layout(kinds: list[str], gamma: float) -> tuple[tuple[int, ...], tuple[tuple[tuple[int, float], ...], ...]]:
    """(AR targets, each target's (extraneous source, γ^(k−j)) pairs) of the prompt's segment kinds."""
    # Rank among non-sink prompt segments: the distance k - j of docs/probes.md#attentional-residue-ar_k counts these.
    rank: dict[int, int] = {}
    for i, k in enumerate(kinds):
        if k != "sink":
            rank[i] = len(rank)
    targets = tuple(i for i in range(len(kinds)) if kinds[i] in AR_TARGET_KINDS)
    sources = tuple(tuple((j, float(gamma ** (rank[t] - rank[j]))) for j in range(t) if kinds[j] == "extraneous")
                    for t in targets)
    return targets, sources


def build_plan(
    tokenized: TokenizedPrompt,
    options: ProbeOptions,
    n_generated: int = 0,
) -> ProbePlan:
    """Lay out the segments, the query set and the AR targets of one probe.

    Args:
        tokenized: the prompt's ids and token spans (partitioning every token).
        options: query set, γ, whether to compute the residue (then the rows AR_k needs are planned) and its mode,
            sink exclusion, block size.
        n_generated: number of answer tokens appended after the prompt (0: prompt only).

    Returns:
        The plan.

    Raises:
        SpanError: the prompt has no question segment (query ``question``) or ``segment:<i>`` is out of range.
        ConfigError: query ``generated`` without answer tokens.
    """
    n_prompt = len(tokenized.input_ids)
    if n_prompt == 0:
        raise SpanError("the tokenized prompt is empty: nothing to probe")
    kinds = [s.kind for s in tokenized.spans]
    labels = [s.label or f"{s.kind}{i}" for i, s in enumerate(tokenized.spans)]
    spans = [(s.start, s.end) for s in tokenized.spans]
    if n_generated > 0:
        kinds.append("generated")
        labels.append("generated")
        spans.append((n_prompt, n_prompt + n_generated))
    n_tokens = n_prompt + n_generated
    seg_of_token = np.empty(n_tokens, dtype=np.int64)
    for i, (a, b) in enumerate(spans):
        seg_of_token[a:b] = i

    query = _query_positions(options.query, spans, kinds, n_prompt, n_generated)
    targets, sources = _ar_layout(kinds[: len(tokenized.spans)], options.gamma)
    rows = [query]
    if options.residue:
        for t in targets:
            rows.append(np.arange(spans[t][0], spans[t][1], dtype=np.int64))
        if options.residue_mode == "cosine":
            for j in sorted({j for pairs in sources for j, _ in pairs}):
                rows.append(np.arange(spans[j][0], spans[j][1], dtype=np.int64))
    row_positions = np.unique(np.concatenate(rows))

    return ProbePlan(
        n_tokens=n_tokens,
        n_prompt_tokens=n_prompt,
        segment_kinds=tuple(kinds),
        segment_labels=tuple(labels),
        segment_spans=tuple(spans),
        seg_of_token=seg_of_token,
        query_positions=query,
        ar_targets=targets,
        ar_sources=sources,
        row_positions=row_positions,
        options=options,
    )
