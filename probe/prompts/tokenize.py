"""Tokenization with exact spans: a built Prompt + the target tokenizer -> TokenizedPrompt (SPEC §1).

The prompt is rendered through the model's chat template (a user turn with the generation prompt); template markup,
special tokens and the whitespace between segments become ``sink`` spans, every content token belongs to exactly
one segment. The loads of :mod:`probe.prompts.builder` are counted on these spans.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from probe.errors import ConfigError, SpanError
from probe.types import Prompt, Span, TokenizedPrompt

log = logging.getLogger(__name__)


def render_chat(text: str, tokenizer: Any, use_chat_template: bool) -> tuple[str, int, bool]:
    """The full model input as text, the offset of ``text`` inside it, and whether special tokens are added.

    With a chat template the user message is rendered with the generation prompt; template markup (system prompt,
    role markers, BOS) lies outside ``[offset, offset + len(text))`` and becomes ``sink``. Without one
    (``use_chat_template`` False: a base model) the text is the input and the tokenizer adds its special tokens.

    Raises:
        ConfigError: ``use_chat_template`` is set but the tokenizer has no chat template (never a silent switch to
            plain text: the model would see another input than the card says).
    """
    if use_chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"the tokenizer {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__!r} has no chat "
                "template but use_chat_template is set; set use_chat_template = false in the model card (the prompt "
                "then goes in as plain text), or use a tokenizer that has a template"
            )
        full = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        offset = full.find(text)
        if offset < 0:
            raise SpanError("the chat template changed the user text; its segments cannot be located in the input")
        return full, offset, False
    return text, 0, True


def tokenize_prompt(prompt: Prompt, tokenizer: Any, use_chat_template: bool = True) -> TokenizedPrompt:
    """Token ids of the full input and one span per segment (template and special tokens are ``sink``).

    A token belongs to the segment holding its visible (non-space) characters; a whitespace-only token between
    segments is layout and becomes a ``sink`` span labelled ``separator`` (so a segment's token count does not
    depend on where it stands). A token whose visible characters cross a segment boundary raises SpanError:
    spans are exact or the prompt is refused.
    """
    full, offset, add_special = render_chat(prompt.text, tokenizer, use_chat_template)
    enc = tokenizer(full, add_special_tokens=add_special, return_offsets_mapping=True)
    ids: list[int] = list(enc["input_ids"])
    offsets: list[tuple[int, int]] = [tuple(o) for o in enc["offset_mapping"]]
    # char -> segment index over the full text (-1: template / outside any segment)
    seg_of_char = np.full(len(full), -1, dtype=np.int64)
    for i, seg in enumerate(prompt.segments):
        seg_of_char[offset + seg.char_start : offset + seg.char_end] = i
    text_lo, text_hi = offset, offset + len(prompt.text)
    owner: list[int] = []  # segment index per token; -1 = template / special token, -2 = separator
    for t, (s, e) in enumerate(offsets):
        if e <= s or e <= text_lo or s >= text_hi:
            owner.append(-1)
            continue
        chars = full[s:e]
        visible = [s + j for j, ch in enumerate(chars) if not ch.isspace()]
        if not visible:  # whitespace: inside a segment it is the segment's; between segments it is layout
            inside = {int(seg_of_char[c]) for c in range(s, e)}
            owner.append(inside.pop() if len(inside) == 1 and -1 not in inside else -2)
            continue
        segs = {int(seg_of_char[c]) for c in visible}
        if len(segs) != 1:
            raise SpanError(
                f"prompt {prompt.prompt_id}: token {t} {chars!r} spans more than one segment/template part"
            )
        k = segs.pop()
        if k < 0:
            raise SpanError(f"prompt {prompt.prompt_id}: token {t} {chars!r} lies between segments")
        owner.append(k)
    spans: list[Span] = []
    start = 0
    for t in range(1, len(ids) + 1):
        if t == len(ids) or owner[t] != owner[start]:
            k = owner[start]
            if k >= 0:
                seg = prompt.segments[k]
                spans.append(Span(seg.kind, start, t, seg.label))
            else:
                spans.append(Span("sink", start, t, "template" if k == -1 else "separator"))
            start = t
    seen = [s.label for s in spans if s.kind != "sink"]
    if len(seen) != len(prompt.segments):
        raise SpanError(f"prompt {prompt.prompt_id}: {len(prompt.segments)} segments but {len(seen)} token spans "
                        "(a segment vanished or was split)")
    return TokenizedPrompt(input_ids=tuple(ids), spans=tuple(spans))


def measured_load(tp: TokenizedPrompt) -> float:
    """ℓ in percent: extraneous / (germane + extraneous) tokens; 0 when there is no germane or extraneous token."""
    ext, ger = tp.count("extraneous"), tp.count("germane")
    return 100.0 * ext / (ext + ger) if ext + ger else 0.0


def filler_share(tp: TokenizedPrompt) -> float:
    fil, ger = tp.count("filler"), tp.count("germane")
    return 100.0 * fil / (fil + ger) if fil + ger else 0.0
