"""One prompt of a run, seen token by token: its tokens, segments and the attention the query set gives each token
(docs/probes.md#seeing-one-prompt)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from probe.errors import ProbeError
from probe.loaded_run import Run, load_run

if TYPE_CHECKING:
    from probe.attention.result import SegmentAttention
    from probe.probe_options import ProbeOptions
    from probe.loading import LoadedModel
    from probe.records import TrialRecord
    from probe.types import Prompt, TokenizedPrompt

log = logging.getLogger(__name__)

# The recomputed segment masses must match the run's record to this (float32 sums, same engine and weights);
# a larger gap means the record was made with other weights or options, and the page says so.
RECORD_TOLERANCE = 1e-4


@dataclass(frozen=True)
class PromptView:
    """One prompt's tokens and per-token attention (see docs/probes.md#seeing-one-prompt).

    Attributes:
        run_path: the run folder.
        model: the model card the attention is of.
        prompt: the prompt as built for the run.
        tokenized: its model input: ids (T,) and one span per segment.
        token_text: (T,) the characters of each token in the model input, including any whitespace before it
            (special tokens without characters: their token string).
        per_token: the engine's probe with every token as its own segment: ``seg_mass_segment`` (layer, head, T).
        query_positions: the tokens of the query set Q.
        options: the probe options used (the run's ``[probe]`` section, query possibly changed).
        record: the run's attention record of the prompt, or None (probing was off, or it does not match).
        record_note: why no record is used, or how well it agrees with the recomputation.
        trials: the prompt's trial records for this model.
    """

    run_path: Path
    model: str
    prompt: Prompt
    tokenized: TokenizedPrompt
    token_text: tuple[str, ...]
    per_token: SegmentAttention
    query_positions: tuple[int, ...]
    options: ProbeOptions
    record: SegmentAttention | None
    record_note: str
    trials: tuple[TrialRecord, ...]

    @property
    def n_layers(self) -> int:
        return self.per_token.n_layers

    @property
    def n_heads(self) -> int:
        return self.per_token.n_heads

    def check_selection(self, layer: int | None, head: int | None) -> None:
        """Raise ProbeError unless ``layer`` / ``head`` are None or in range (0-based)."""
        if layer is not None and not 0 <= layer < self.n_layers:
            raise ProbeError(f"layer {layer}: {self.model} has layers 0..{self.n_layers - 1}")
        if head is not None and not 0 <= head < self.n_heads:
            raise ProbeError(f"head {head}: {self.model} has heads 0..{self.n_heads - 1}")

    def token_mass(self, layer: int | None = None, head: int | None = None) -> np.ndarray:
        """(T,) attention of the query set on each token; mean over layers / heads where None."""
        return select(self.per_token.seg_mass_segment, layer, head)

    def segment_mass(self, layer: int | None = None, head: int | None = None) -> np.ndarray:
        """(S,) attention on each segment: the run's record when used, else the per-token masses summed."""
        if self.record is not None:
            return select(self.record.seg_mass_segment, layer, head)
        return self.recomputed_segment_mass(layer, head)

    def recomputed_segment_mass(self, layer: int | None = None, head: int | None = None) -> np.ndarray:
        """(S,) the per-token masses summed over each segment's tokens."""
        return select(segment_sums(self.per_token.seg_mass_segment, self.tokenized), layer, head)

    def p_ext_by_layer(self, head: int | None = None) -> np.ndarray:
        """(layer,) P_ext of the head (mean over heads where None)."""
        p = self.per_token.p_ext.astype(np.float64)
        return p.mean(axis=1) if head is None else p[:, head]


def select(values: np.ndarray, layer: int | None, head: int | None) -> np.ndarray:
    """(…,) of a (layer, head, …) array: one layer / head, or the mean over them where None."""
    v = values.astype(np.float64)
    v = v.mean(axis=0) if layer is None else v[layer]
    return v.mean(axis=0) if head is None else v[head]


def segment_sums(per_token: np.ndarray, tokenized: TokenizedPrompt) -> np.ndarray:
    """(layer, head, S) sums of (layer, head, T) per-token values over each segment's token span."""
    out = np.zeros((*per_token.shape[:2], len(tokenized.spans)), dtype=np.float64)
    for i, s in enumerate(tokenized.spans):
        out[..., i] = per_token[..., s.start : s.end].astype(np.float64).sum(axis=-1)
    return out


def token_texts(prompt: Prompt, tokenizer: Any, use_chat_template: bool, input_ids: tuple[int, ...]) -> tuple[str, ...]:
    """The characters of each token of the prompt's model input (whitespace before a token goes with it).

    Raises:
        ProbeError: the tokenizer does not give the ids the prompt was tokenized to.
    """
    from probe.prompts.tokenize import render_chat

    full, _, add_special = render_chat(prompt.text, tokenizer, use_chat_template)
    enc = tokenizer(full, add_special_tokens=add_special, return_offsets_mapping=True)
    if tuple(enc["input_ids"]) != tuple(input_ids):
        raise ProbeError(f"prompt {prompt.prompt_id}: re-tokenizing the input did not give the same ids")
    pieces: list[str] = []
    prev = 0
    for tid, (s, e) in zip(enc["input_ids"], enc["offset_mapping"]):
        if e <= s:  # a special token with no characters in the text (e.g. an added BOS)
            pieces.append(str(tokenizer.convert_ids_to_tokens(int(tid))))
            continue
        pieces.append(full[prev:e] if e > prev else "")
        prev = max(prev, e)
    if pieces and prev < len(full):
        pieces[-1] += full[prev:]
    return tuple(pieces)


def _record_of(run: Run, prompt_id: str, model: str, tokenized: TokenizedPrompt, per_token: SegmentAttention,
               options: ProbeOptions) -> tuple[SegmentAttention | None, str]:
    """The run's record of the prompt when it fits the recomputation, and a note on it for the page."""
    if not run.has_attention(prompt_id, model):
        return None, "no attention record in the run (probing was off, or the run stopped before this prompt); " \
                     "segment masses are recomputed"
    path = run.attention_path(prompt_id, model)
    record = run.attention(prompt_id, model)
    spans = tuple((s.start, s.end) for s in tokenized.spans)
    if record.segment_spans != spans:
        return None, (f"the record {path.name} covers other tokens (query set {record.options.get('query')!r}, "
                      f"{record.n_tokens} tokens); segment masses are recomputed")
    if record.options.get("query") != options.query:
        return None, (f"the record {path.name} has query set {record.options.get('query')!r}, the page "
                      f"{options.query!r}; segment masses are recomputed")
    gap = float(np.nanmax(np.abs(segment_sums(per_token.seg_mass_segment, tokenized) - record.seg_mass_segment)))
    if not gap <= RECORD_TOLERANCE:
        return record, (f"segment masses from the run's record {path.name}; the recomputation differs from it by up "
                        f"to {gap:.2g} (other weights or dtype than the run's?)")
    return record, f"segment masses from the run's record {path.name} (recomputation agrees to {gap:.1g})"


def view_prompt(run: str | Path | Run, prompt_id: str, *, model: str | LoadedModel | None = None,
                query: str | None = None, device: str | None = None) -> PromptView:
    """Recompute one prompt's per-token attention (see docs/probes.md#seeing-one-prompt).

    Args:
        run: the run folder (or a loaded Run).
        prompt_id: the prompt's id.
        model: the run's model: the name of its card, or the model already loaded (else it is loaded from the
            run's card); may be left out when the run has one local model.
        query: the query set, ``question`` or ``last`` (default: the run's ``probe.query``).
        device: where to load the model (None: CUDA when available).

    Raises:
        UnknownPromptError / UnknownNameError: an unknown prompt id / model. ProbeError: a loaded ``model`` that is
            not the prompt's.
        ConfigError: a query set that cannot be shown per token (``generated``, ``segment:<i>``).
    """
    import dataclasses

    from probe.attention import build_plan
    from probe.attention.tokens import token_attention
    from probe.loading import LoadedModel, load_model
    from probe.prompts.tokenize import encode_prompt

    run = load_run(run)
    prompt = run.prompt(prompt_id)
    loaded: LoadedModel | None = None
    if isinstance(model, LoadedModel):
        loaded, model = model, model.card.name
    if model is None and prompt.tokenizer in run.models and run.is_local(prompt.tokenizer):
        model = prompt.tokenizer  # the model whose tokenizer built the prompt
    model = run.local_model(model)
    if not run.is_local(model):
        raise ProbeError(f"model {model!r} of run {run.path} is served: it has no local weights to recompute "
                         "attention with")
    if loaded is None:
        loaded = load_model(run.card(model), device=device)
    elif loaded.card.name != model:
        raise ProbeError(f"the loaded model is {loaded.card.name!r}, the prompt's model {model!r}")
    options = run.config.probe if query is None else dataclasses.replace(run.config.probe, query=query)
    tokenized = encode_prompt(prompt, loaded.tokenizer, loaded.card.use_chat_template)
    texts = token_texts(prompt, loaded.tokenizer, loaded.card.use_chat_template, tokenized.input_ids)
    per_token = token_attention(loaded.model, tokenized, options)
    record, note = _record_of(run, prompt_id, model, tokenized, per_token, options)
    plan = build_plan(tokenized, dataclasses.replace(options, residue=False))
    return PromptView(run_path=run.path, model=model, prompt=prompt, tokenized=tokenized, token_text=texts,
                      per_token=per_token, query_positions=tuple(int(q) for q in plan.query_positions),
                      options=options, record=record, record_note=note,
                      trials=tuple(t for t in run.trials_of(prompt_id) if t.model == model))


__all__ = ["PromptView", "RECORD_TOLERANCE", "segment_sums", "select", "token_texts", "view_prompt"]
