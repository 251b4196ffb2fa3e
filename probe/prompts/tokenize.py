"""Tokenization with exact spans: a built Prompt + the target tokenizer -> TokenizedPrompt (docs/method.md#objects).

The prompt is rendered through the model's chat template (a user turn with the generation prompt); template markup,
special tokens and the whitespace between segments become ``sink`` spans, every content token belongs to exactly
one segment. The loads of :mod:`probe.prompts.builder` are counted on these spans.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Sequence

import numpy as np

from probe.errors import ConfigError, SpanError
from probe.types import Prompt, Span, TokenizedPrompt

log = logging.getLogger(__name__)

# The code points str.isspace() calls whitespace (all below U+3001).
_SPACE_CODES = np.array([c for c in range(0x3001) if chr(c).isspace()], dtype=np.uint32)


# Texts rendered once per tokenizer to find its chat template's frame: a template that inserts the user text
# verbatim renders each of them as prefix + text + suffix with the same prefix and suffix.
_FRAME_PROBES = ("x", " Leading and trailing space. ", "Two\n\nparagraphs\n", "Question: what? \\boxed{a}")
_frames: dict[int, tuple[object, tuple[str, str] | None]] = {}


def chat_frame(tokenizer: Any) -> tuple[str, str] | None:
    """The text a chat template puts before and after the user message, or None if it does not insert the message
    verbatim (then every prompt is rendered by the template itself).

    Rendering a prompt as ``prefix + text + suffix`` gives the template's own output for any text the template
    copies verbatim; the frame is checked once per tokenizer on texts with leading and trailing whitespace, blank
    lines and a backslash, so a template that trims or rewrites the message is not framed.
    """
    cached = _frames.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    frame: tuple[str, str] | None = None
    rendered = [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
        for t in _FRAME_PROBES
    ]
    i = rendered[0].rfind(_FRAME_PROBES[0])
    if i >= 0:
        prefix, suffix = rendered[0][:i], rendered[0][i + len(_FRAME_PROBES[0]) :]
        if all(r == prefix + t + suffix for r, t in zip(rendered, _FRAME_PROBES)):
            frame = (prefix, suffix)
    _frames[id(tokenizer)] = (tokenizer, frame)
    return frame


def render_chat(text: str, tokenizer: Any, use_chat_template: bool) -> tuple[str, int, bool]:
    """The full model input as text, the offset of ``text`` inside it, and whether special tokens are added.

    With a chat template the user message is rendered with the generation prompt; template markup (system prompt,
    role markers, BOS) lies outside ``[offset, offset + len(text))`` and becomes ``sink``. A template that copies the
    message verbatim is rendered once per tokenizer and reused (:func:`chat_frame`). Without one
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
        frame = chat_frame(tokenizer)
        if frame is not None:
            full = frame[0] + text + frame[1]
        else:
            full = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
        offset = full.find(text)
        if offset < 0:
            raise SpanError("the chat template changed the user text; its segments cannot be located in the input")
        return full, offset, False
    return text, 0, True


def _segment_of_char(prompt: Prompt, full: str, offset: int) -> np.ndarray:
    """(len(full),) int64: the segment index of every character of the full input (-1: template / outside)."""
    seg_of_char = np.full(len(full), -1, dtype=np.int64)
    for i, seg in enumerate(prompt.segments):
        seg_of_char[offset + seg.char_start : offset + seg.char_end] = i
    return seg_of_char


def _spans_from_owners(prompt: Prompt, owner: Sequence[int]) -> tuple[Span, ...]:
    """Runs of equal owners -> spans (-1: template sink, -2: separator sink, k: segment k)."""
    spans: list[Span] = []
    start = 0
    n = len(owner)
    for t in range(1, n + 1):
        if t == n or owner[t] != owner[start]:
            k = int(owner[start])
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
    return tuple(spans)


def encode_prompt(prompt: Prompt, tokenizer: Any, use_chat_template: bool = True) -> TokenizedPrompt:
    """Token ids of the full input and one span per segment (template and special tokens are ``sink``).

    A token belongs to the segment holding its visible (non-space) characters; a whitespace-only token between
    segments is layout and becomes a ``sink`` span labelled ``separator`` (so a segment's token count does not
    depend on where it stands). A token whose visible characters cross a segment boundary raises SpanError:
    spans are exact or the prompt is refused.

    The owners of all tokens are found at once with numpy (a per-token loop over characters is the slow reference,
    :func:`encode_prompt_reference`, which the tests hold this to).
    """
    full, offset, add_special = render_chat(prompt.text, tokenizer, use_chat_template)
    enc = tokenizer(full, add_special_tokens=add_special, return_offsets_mapping=True)
    ids: list[int] = list(enc["input_ids"])
    n_tok = len(ids)
    if n_tok == 0:
        return TokenizedPrompt(input_ids=(), spans=_spans_from_owners(prompt, []))
    offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(n_tok, 2)
    starts, ends = offsets[:, 0], offsets[:, 1]
    seg_of_char = _segment_of_char(prompt, full, offset)
    codes = np.frombuffer(full.encode("utf-32-le"), dtype=np.uint32)
    is_space = np.append(np.isin(codes, _SPACE_CODES), False)
    # Per-token reductions over characters [s, e): reduceat over interleaved (s, e) indices, reading even entries.
    big = np.int64(1 << 40)
    vis_min = np.append(np.where(is_space[:-1], big, seg_of_char), big)
    vis_max = np.append(np.where(is_space[:-1], -big, seg_of_char), -big)
    all_seg = np.append(seg_of_char, 0)
    visible = np.append(~is_space[:-1], False).astype(np.int64)
    text_lo, text_hi = offset, offset + len(prompt.text)
    outside = (ends <= starts) | (ends <= text_lo) | (starts >= text_hi)
    s = np.where(outside, 0, starts)
    e = np.where(outside, 1, ends)
    idx = np.empty(2 * n_tok, dtype=np.int64)
    idx[0::2], idx[1::2] = s, e
    n_visible = np.add.reduceat(visible, idx)[0::2]
    seg_lo = np.minimum.reduceat(vis_min, idx)[0::2]
    seg_hi = np.maximum.reduceat(vis_max, idx)[0::2]
    any_lo = np.minimum.reduceat(all_seg, idx)[0::2]
    any_hi = np.maximum.reduceat(all_seg, idx)[0::2]
    # whitespace-only: inside one segment it is the segment's; between segments (or touching the template) layout
    owner = np.where((any_lo == any_hi) & (any_lo >= 0), any_lo, -2)
    has_visible = (n_visible > 0) & ~outside
    bad = has_visible & ((seg_lo != seg_hi) | (seg_lo < 0))
    if bad.any():
        t = int(np.flatnonzero(bad)[0])
        chars = full[starts[t] : ends[t]]
        if seg_lo[t] != seg_hi[t]:
            raise SpanError(
                f"prompt {prompt.prompt_id}: token {t} {chars!r} spans more than one segment/template part"
            )
        raise SpanError(f"prompt {prompt.prompt_id}: token {t} {chars!r} lies between segments")
    owner = np.where(has_visible, seg_lo, owner)
    owner = np.where(outside, -1, owner)
    return TokenizedPrompt(input_ids=tuple(ids), spans=_spans_from_owners(prompt, owner.tolist()))


def encode_prompt_reference(prompt: Prompt, tokenizer: Any, use_chat_template: bool = True) -> TokenizedPrompt:
    """:func:`encode_prompt` written plainly, token by token and character by character (the tests' reference)."""
    full, offset, add_special = render_chat(prompt.text, tokenizer, use_chat_template)
    enc = tokenizer(full, add_special_tokens=add_special, return_offsets_mapping=True)
    ids: list[int] = list(enc["input_ids"])
    offsets: list[tuple[int, int]] = [tuple(o) for o in enc["offset_mapping"]]
    seg_of_char = _segment_of_char(prompt, full, offset)
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
    return TokenizedPrompt(input_ids=tuple(ids), spans=_spans_from_owners(prompt, owner))


def measured_load(tp: TokenizedPrompt) -> float:
    """ℓ in percent: extraneous / (germane + extraneous) tokens; 0 when there is no germane or extraneous token."""
    ext, ger = tp.count("extraneous"), tp.count("germane")
    return 100.0 * ext / (ext + ger) if ext + ger else 0.0


def filler_share(tp: TokenizedPrompt) -> float:
    fil, ger = tp.count("filler"), tp.count("germane")
    return 100.0 * fil / (fil + ger) if fil + ger else 0.0


class PieceCounter:
    """Token counts of prompt pieces taken one by one, where the tokenizer provably tokenizes each piece of a
    prompt as it tokenizes the piece alone.

    That holds for byte-level BPE tokenizers with GPT-2's pre-tokenizing regex and no normalizer (SmolLM2, GPT-2,
    StarCoder...): in that regex a pre-token that holds a newline holds nothing but whitespace, BPE never merges
    across pre-tokens, and no match looks behind it. So when pieces are joined by newlines (the builder's
    ``\\n`` / ``\\n\\n`` separators), and a piece neither starts nor ends with whitespace nor contains a special
    token's text, the tokens of the whole prompt are the template's, the separators' and each piece's own: a
    piece's count in any prompt is its count alone. The builder then counts a candidate prompt by adding up cached
    piece counts instead of tokenizing it whole; :meth:`countable` says which texts qualify, and every built
    prompt is still tokenized whole, its counts checked against the sum.

    Args:
        tokenizer: a Hugging Face tokenizer.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._counts: dict[str, int] = {}
        self.is_separable = self._is_separable(tokenizer)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._specials: tuple[str, ...] = ()
        if backend is not None:
            self._specials = tuple(t.content for t in backend.get_added_tokens_decoder().values() if t.content)

    @staticmethod
    def _is_separable(tokenizer: Any) -> bool:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or backend.normalizer is not None:
            return False
        try:
            state = json.loads(backend.pre_tokenizer.__getstate__())
        except (AttributeError, TypeError, ValueError):
            return False
        return (state.get("type") == "ByteLevel" and state.get("use_regex") is True
                and state.get("add_prefix_space") is False)

    def countable(self, text: str) -> bool:
        """Whether ``text`` is a piece whose count in any newline-joined prompt is its count alone."""
        return (self.is_separable and bool(text) and not text[0].isspace() and not text[-1].isspace()
                and not any(s in text for s in self._specials))

    def count(self, text: str) -> int:
        """Tokens of ``text`` alone (no special tokens); cached."""
        n = self._counts.get(text)
        if n is None:
            n = self._counts[text] = len(self.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)
        return n


def token_char_spans(tokens: Sequence[int], text: str, tokenizer: Any) -> np.ndarray:
    """``(T, 2)`` character span of each generated token in the recorded output ``text``.

    First the tokenizer's offsets of ``text`` (``return_offsets_mapping``), when re-tokenising the text gives the
    very ids the model generated; else token ``t`` spans what it adds to the decoding of the few tokens before it,
    when those pieces rebuild ``text`` exactly; else the ids are decoded prefix by prefix and token ``t`` spans the
    characters its prefix adds (a token that completes no character, e.g. the first byte of a multi-byte letter,
    spans none).

    The runner records these spans with the answer attention (``AnswerAttention.chars``), where the tokenizer is
    at hand; the analysis reads them from the record.

    Raises:
        SpanError: the generated ids do not decode to ``text``.
    """
    ids = [int(t) for t in tokens]
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) == ids:
            return np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(len(ids), 2)
    except (TypeError, NotImplementedError, KeyError):  # a slow tokenizer offers no offsets: decode instead
        pass
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    if whole != text:
        raise SpanError(f"the {len(ids)} answer tokens decode to {whole[:60]!r}…, not to the output "
                               f"{text[:60]!r}…")
    quick = _incremental_spans(ids, text, tokenizer)
    if quick is not None:
        return quick
    out = np.zeros((len(ids), 2), dtype=np.int64)
    end = 0
    for t in range(len(ids)):  # every prefix decoded whole: a token that completes no character spans none
        prefix = tokenizer.decode(ids[: t + 1], skip_special_tokens=True)
        n = 0
        for x, y in zip(prefix, text):
            if x != y:
                break
            n += 1
        out[t] = (end, max(end, n))
        end = max(end, n)
    return out


_CONTEXT = 6  # tokens decoded before each token, so a tokenizer that drops a word's leading space sees the word


def _incremental_spans(ids: list[int], text: str, tokenizer: Any) -> np.ndarray | None:
    """Token spans from what each token adds to the decoding of the few tokens before it (linear in the answer's
    length), or None when that does not rebuild ``text`` exactly (a character split over tokens, say)."""
    out = np.zeros((len(ids), 2), dtype=np.int64)
    pos = 0
    for t in range(len(ids)):
        w = max(0, t - _CONTEXT)
        before = tokenizer.decode(ids[w:t], skip_special_tokens=True) if t > w else ""
        after = tokenizer.decode(ids[w : t + 1], skip_special_tokens=True)
        if not after.startswith(before) or "\ufffd" in after[len(before):]:
            return None
        piece = after[len(before):]
        if text[pos : pos + len(piece)] != piece:
            return None
        out[t] = (pos, pos + len(piece))
        pos += len(piece)
    return out if pos == len(text) else None
