"""Attention per key token: how much attention the query set gives each single token of a prompt, for display
(docs/probes.md#seeing-one-prompt)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from probe.attention.engine import probe_tokenized
from probe.attention.result import SegmentAttention
from probe.probe_options import ProbeOptions
from probe.errors import ConfigError
from probe.types import Span, TokenizedPrompt

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Query sets that keep their meaning when every token is its own span (``segment:<i>`` counts spans).
TOKEN_QUERY_SETS: tuple[str, ...] = ("question", "last")


def split_into_tokens(tokenized: TokenizedPrompt) -> TokenizedPrompt:
    """The same input with one span per token; each keeps its segment's kind, labelled ``<label>#<token>``."""
    spans = tuple(
        Span(s.kind, t, t + 1, f"{s.label or s.kind}#{t}") for s in tokenized.spans for t in range(s.start, s.end)
    )
    return TokenizedPrompt(input_ids=tokenized.input_ids, spans=spans)


def token_attention(model: PreTrainedModel, tokenized: TokenizedPrompt,
                    options: ProbeOptions | None = None) -> SegmentAttention:
    """Probe a prompt with every token as its own segment (see docs/probes.md#seeing-one-prompt).

    Args:
        model: a loaded Hugging Face causal LM of a supported architecture, in eval mode.
        tokenized: the prompt's ids and segment spans.
        options: the probe options; only the query set matters (``question`` or ``last``; AR_k is not computed).

    Returns:
        A :class:`SegmentAttention` whose segments are the tokens: ``seg_mass_segment`` (layer, head, T) is the
        mass the query set gives each token (a row sums to 1 over tokens); ``seg_mass``, ``p_ext``, ``chance`` and
        ``enrichment`` equal the ordinary probe's.

    Raises:
        ConfigError: a query set other than ``question`` or ``last``. HookError: an unsupported architecture.
    """
    opts = options or ProbeOptions()
    if opts.query not in TOKEN_QUERY_SETS:
        raise ConfigError(f"probe.query = {opts.query!r}: attention per token is shown for the query sets "
                          f"{', '.join(TOKEN_QUERY_SETS)}; choose one of them")
    return probe_tokenized(model, split_into_tokens(tokenized), dataclasses.replace(opts, residue=False))


__all__ = ["TOKEN_QUERY_SETS", "split_into_tokens", "token_attention"]
