"""The probe engine's entry points (``probe_tokenized``, ``probe_batch``, ``probe_generation``, ``probe_forced``):
per-segment attention measures at the model's fast attention's speed and memory (docs/probes.md#how-the-engine-computes-them)."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch
from transformers import PreTrainedModel

from probe.attention.capacity import ModelShape, block_elements
from probe.attention.capture import Capture
from probe.attention.decode import AnswerRows
from probe.attention.architecture import n_layers_of, value_measures_apply
from probe.attention.implementation import attach_probe, probed_layers, text_config_of
from probe.attention.plan import build_plan
from probe.attention.reduce import SCRATCH_COPIES
from probe.attention.result import SegmentAttention
from probe.probe_options import ProbeOptions
from probe.errors import ConfigError
from probe.compat import input_device
from probe.loading import LoadedModel
from probe.types import TokenizedPrompt

log = logging.getLogger(__name__)

# Query sets whose rows lie inside the prompt: they can be probed during generation's prefill.
PROMPT_QUERY_SETS = ("question", "last")


def is_prompt_query(options: ProbeOptions) -> bool:
    """Whether the query set lies inside the prompt (``question``, ``last``, ``segment:<i>``), so that the probe
    can ride on generation's prefill; ``generated`` needs a forward pass over prompt + answer."""
    return options.query in PROMPT_QUERY_SETS or options.query.startswith("segment:")


def block_budget(model: PreTrainedModel, n_tokens: int) -> int:
    """Rows x keys per head in one block of probe rows when the forward pass holds ``n_tokens`` tokens (all rows of
    a batch: the rows are probed one at a time, so a batch's forward leaves each of them more room); see
    ``block_elements``."""
    itemsize = torch.empty((), dtype=model.dtype).element_size()
    return block_elements(ModelShape.from_config(text_config_of(model), itemsize), n_tokens, SCRATCH_COPIES)


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Left-pad token sequences into one batch.

    Args:
        sequences: token ids of each row.
        pad_id: the id written into padding positions (masked, so any valid id).

    Returns:
        ``(input_ids, attention_mask, pads)``: (B, W) int64 ids, (B, W) int64 mask (1 = token), padding per row.
    """
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    pads = []
    for i, s in enumerate(sequences):
        ids[i, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
        mask[i, width - len(s) :] = 1
        pads.append(width - len(s))
    return ids, mask, pads


def transformers_model(model: Any) -> Any:
    """The transformers model of a ``probe.load_model`` model (:class:`probe.loading.LoadedModel`), else ``model``."""
    return model.model if isinstance(model, LoadedModel) else model


def probe_batch(
    model: PreTrainedModel,
    prompts: Sequence[TokenizedPrompt],
    options: ProbeOptions | None = None,
    generated_ids: Sequence[Sequence[int]] | None = None,
    *,
    value_weighted: bool = True,
    one_attention: bool = True,
) -> list[SegmentAttention]:
    """Probe several prompts in one forward pass (left-padded); each result equals :func:`probe_tokenized`'s.

    Args:
        model: a loaded Hugging Face causal LM of a supported architecture, in eval mode (or a ``probe.load_model``
            model, whose transformers model is used).
        prompts: the prompts' ids and token spans.
        options: query set, γ, residue (AR_k or not) and its mode, sink exclusion, block size (defaults:
            ``ProbeOptions()``).
        generated_ids: per prompt, answer token ids appended after it; required by query ``generated``.
        value_weighted: compute the value-weighted measures (docs/probes.md#value-weighted-share).
        one_attention: on layers whose rows the probe forms anyway (AR_k), give the layer its output from them and
            skip the model's own kernel (docs/probes.md#one-attention-per-layer); False: the model's kernel gives
            every output, as in an unprobed forward.

    Returns:
        One :class:`SegmentAttention` per prompt, in order.

    Raises:
        HookError: unsupported architecture, a layer that did not report exactly once, or an unusable input.
        SpanError / ConfigError: a query set cannot be formed from the spans / options.
    """
    model = transformers_model(model)
    options = options or ProbeOptions()
    if not prompts:
        return []
    answers = [list(g) for g in generated_ids] if generated_ids is not None else [[] for _ in prompts]
    if len(answers) != len(prompts):
        raise ConfigError(f"probe_batch: {len(prompts)} prompts but {len(answers)} generated answers")
    plans = [build_plan(tp, options, n_generated=len(g)) for tp, g in zip(prompts, answers)]
    ids, mask, pads = left_pad([list(tp.input_ids) + g for tp, g in zip(prompts, answers)])
    width = ids.shape[1]
    n_layers, layers = probed_layers(model)
    capture = Capture(plans, n_layers, pads, block_budget(model, width * len(prompts)), layers=layers,
                      value_weighted=value_weighted and value_measures_apply(model), one_attention=one_attention)
    device = input_device(model)  # not the first parameter's: a dispatched model may keep it on `meta`
    kwargs: dict[str, torch.Tensor] = {}
    if any(pads):  # position ids from 0 in every row, as generate makes them
        kwargs = {"attention_mask": mask.to(device),
                  "position_ids": (mask.cumsum(-1) - 1).clamp_min(0).to(device)}
    log.debug("probing %d prompts of up to %d tokens", len(prompts), width)
    with torch.no_grad(), attach_probe(model, capture):
        model.base_model(input_ids=ids.to(device), use_cache=False, **kwargs)
    return capture.results()


def probe_tokenized(
    model: PreTrainedModel,
    tokenized: TokenizedPrompt,
    options: ProbeOptions | None = None,
    generated_ids: Sequence[int] | None = None,
    *,
    value_weighted: bool = True,
    one_attention: bool = True,
) -> SegmentAttention:
    """Probe one prompt: segment masses, P_ext with chance and enrichment, sink mass and AR_k (docs/probes.md).

    Runs one forward pass of the model's base (no LM head, no cache) over the prompt, or over prompt + answer when
    ``generated_ids`` are given.

    Args:
        model: a loaded Hugging Face causal LM of a supported architecture, in eval mode (or a ``probe.load_model``
            model, whose transformers model is used).
        tokenized: the prompt's ids and token spans (``probe.prompts.tokenize.encode_prompt`` makes them; any spans
            that partition the tokens will do).
        options: query set, γ, residue and its mode, sink exclusion, block size (defaults: ``ProbeOptions()``).
            ``options.residue`` computes AR_k (needs the rows of every token of the germane, question and earlier
            extraneous segments); False computes only the query set's rows.
        generated_ids: answer token ids appended after the prompt; required by query ``generated``.
        value_weighted: compute the value-weighted measures (docs/probes.md#value-weighted-share).
        one_attention: on layers whose rows the probe forms anyway (AR_k), give the layer its output from them and
            skip the model's own kernel (docs/probes.md#one-attention-per-layer); False: the model's kernel gives
            every output, as in an unprobed forward.

    Returns:
        The prompt's :class:`SegmentAttention`.

    Raises:
        HookError: unsupported architecture, a layer that did not report exactly once, or an unusable input.
        SpanError / ConfigError: the query set cannot be formed from the spans / options.
    """
    generated = [list(generated_ids)] if generated_ids is not None else None
    return probe_batch(model, [tokenized], options, generated, value_weighted=value_weighted,
                       one_attention=one_attention)[0]


@contextmanager
def probe_generation(
    model: PreTrainedModel,
    prompts: Sequence[TokenizedPrompt],
    pads: Sequence[int],
    options: ProbeOptions | None = None,
    *,
    answer: bool | None = None,
) -> Iterator[Capture]:
    """Probe a left-padded batch during ``model.generate``'s own prefill (the probe rides on generation).

    Inside the block, run ``model.generate`` on the batch laid out as :func:`left_pad` does (row i = ``pads[i]``
    padding tokens, then ``prompts[i]``); afterwards ``capture.results()`` gives one :class:`SegmentAttention` per
    prompt, equal to :func:`probe_tokenized`'s. Only the prefill (queries and keys both spanning the batch) is probed;
    decode steps pass through, and the outputs are those of the model's ``sdpa`` attention.

    Args:
        model: a loaded Hugging Face causal LM of a supported architecture, in eval mode.
        prompts: the batch's prompts (ids and token spans), in batch order.
        pads: left padding of each row.
        options: probe options (``options.residue``: compute AR_k); the query set must lie inside the prompt (not
            ``generated``).
        answer: capture the attention while the answer is written (None: ``options.answer``); then, after
            ``generate``, ``capture.answer.results(answers, prompt_ids)`` gives one
            :class:`~probe.attention.answer.AnswerAttention` per prompt
            (docs/probes.md#attention-while-the-answer-is-written).

    Yields:
        The :class:`Capture`.

    Raises:
        ConfigError: query ``generated`` (it needs the answer: probe after generation with :func:`probe_batch`).
        HookError: see :func:`attach_probe`; ``results()`` raises it when a layer did not report exactly once.
    """
    options = options or ProbeOptions()
    if not is_prompt_query(options):
        raise ConfigError(f"probe.query = {options.query!r} reads the answer; it cannot ride on generation's prefill")
    plans = [build_plan(tp, options) for tp in prompts]
    width = max(p.n_tokens + pad for p, pad in zip(plans, pads))
    rows = AnswerRows(plans, pads, width, n_layers=n_layers_of(model)) if (options.answer if answer is None else answer) \
        else None
    n_layers, layers = probed_layers(model)
    capture = Capture(plans, n_layers, pads, block_budget(model, width * len(prompts)), prefill_only=True,
                      answer=rows, layers=layers, value_weighted=value_measures_apply(model))
    with attach_probe(model, capture):
        yield capture


def probe_forced(
    model: PreTrainedModel,
    prompts: Sequence[TokenizedPrompt],
    answers: Sequence[Sequence[int]],
    options: ProbeOptions | None = None,
    pad_id: int = 0,
    one_attention: bool = True,
) -> list[SegmentAttention]:
    """Probe prompts whose answers were written elsewhere (a serving engine): each prompt followed by its recorded
    answer, in one teacher-forced forward pass (docs/probes.md#two-stage-runs).

    The batch is laid out as ``generate`` lays it out (left padding, then each answer, then filler up to the longest
    answer), with the same position ids, so every row equals what :func:`probe_generation` computes while the same
    answer is generated: the prompt's measures from the first ``width`` queries and keys (a prompt row sees no
    later key), and with ``options.answer`` the row that produced each answer token (row ``t`` at the last prompt
    position + ``t``: the attention of a token depends only on the tokens before it). One forward pass replaces one
    forward step per answer token.

    Args:
        model: a loaded Hugging Face causal LM (or a ``probe.load_model`` model).
        prompts: the prompts' ids and token spans.
        answers: per prompt, the answer's token ids as generated (the end token excluded).
        options: probe options; the query set must lie inside the prompt (query ``generated`` is
            :func:`probe_batch` with ``generated_ids``).
        pad_id: the token id of the padding and filler positions (masked or after every answer: never read).
        one_attention: on layers whose rows the probe forms anyway (AR_k), give the layer its output from them and
            skip the model's own kernel (docs/probes.md#one-attention-per-layer); False: the model's kernel gives
            every output, as in an unprobed forward.

    Returns:
        One :class:`SegmentAttention` per prompt, with ``answer`` set when ``options.answer``.

    Raises:
        ConfigError: query ``generated``, or not one answer per prompt.
        HookError: see :func:`attach_probe`.
    """
    model = transformers_model(model)
    options = options or ProbeOptions()
    if not is_prompt_query(options):
        raise ConfigError(f"probe.query = {options.query!r} reads the answer: probe it with probe_batch(..., "
                          "generated_ids=answers)")
    if len(answers) != len(prompts):
        raise ConfigError(f"probe_forced: {len(prompts)} prompts but {len(answers)} answers")
    if not prompts:
        return []
    plans = [build_plan(tp, options) for tp in prompts]
    ids, mask, pads = left_pad([tp.input_ids for tp in prompts], pad_id)
    width = int(ids.shape[1])
    longest = max(len(a) for a in answers)
    tail = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    for i, a in enumerate(answers):
        tail[i, : len(a)] = torch.tensor(list(a), dtype=torch.long)
    ids = torch.cat([ids, tail], dim=1)
    mask = torch.cat([mask, torch.ones_like(tail)], dim=1)  # generate's mask: every new position is attended
    rows = AnswerRows(plans, pads, width, n_layers=n_layers_of(model)) if options.answer else None
    n_layers, layers = probed_layers(model)
    capture = Capture(plans, n_layers, pads, block_budget(model, int(ids.shape[1]) * len(prompts)), answer=rows,
                      forced=True, layers=layers, value_weighted=value_measures_apply(model),
                      one_attention=one_attention)
    device = input_device(model)
    kwargs: dict[str, torch.Tensor] = {}
    if any(pads):  # position ids from 0 in every row, as generate makes them
        kwargs = {"attention_mask": mask.to(device), "position_ids": (mask.cumsum(-1) - 1).clamp_min(0).to(device)}
    log.debug("teacher-forcing %d prompts of up to %d tokens with answers of up to %d", len(prompts), width, longest)
    with torch.no_grad(), attach_probe(model, capture):
        model.base_model(input_ids=ids.to(device), use_cache=False, **kwargs)
    results = capture.results()
    if rows is not None:
        for att, ans in zip(results, rows.results(answers, [tp.input_ids for tp in prompts])):
            att.answer = ans
    return results


__all__ = ["PROMPT_QUERY_SETS", "block_budget", "is_prompt_query", "left_pad", "probe_batch", "probe_forced",
           "probe_generation", "probe_tokenized", "transformers_model"]
