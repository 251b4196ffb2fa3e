"""The local backend: batched generation with a transformers model (left padding, KV cache), and the attention
probe of each batch when asked (docs/probes.md#probing-during-generation)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterator

from probe.backends.base import LOCAL, Capabilities, Generation
from probe.config import GenerationSection
from probe.probe_options import ProbeOptions
from probe.loading import LoadedModel
from probe.prompts.tokenize import encode_prompt, token_char_spans
from probe.types import Prompt, TokenizedPrompt

if TYPE_CHECKING:
    from probe.interventions import Intervention, RowEdit

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Batch:
    """One batch of runnable prompts: left-padded ids and, under an intervention, each prompt's edit."""

    items: list[tuple[Prompt, TokenizedPrompt]]
    input_ids: Any  # (B, W) torch.long, left-padded
    mask: Any  # (B, W) attention mask
    pads: list[int]  # left padding of each row
    edits: list[RowEdit] | None  # one per row under an intervention, else None

    @property
    def tokenized(self) -> list[TokenizedPrompt]:
        return [tp for _, tp in self.items]

    @property
    def width(self) -> int:
        return int(self.input_ids.shape[1])


@dataclass(frozen=True)
class _Answer:
    """One row's generated tokens, cut at the first end token, and whether it ran out of new tokens instead."""

    ids: list[int]
    truncated: bool


@dataclass
class LocalBackend:
    """Batched greedy generation with a local transformers model (left padding, KV cache)."""

    loaded: LoadedModel
    seed: int = 0  # the experiment's seed: sampled generations draw from it (greedy decoding draws nothing)

    @property
    def model_name(self) -> str:
        return self.loaded.card.name

    @property
    def capabilities(self) -> Capabilities:
        return LOCAL

    @property
    def revision(self) -> str | None:
        return self.loaded.revision

    def layers_and_heads(self) -> tuple[int, int]:
        from probe.attention.implementation import layers_and_heads

        return layers_and_heads(self.loaded.model)

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def eos_ids(self) -> set[int]:
        """The token ids that end an answer (the model's generation config's and the tokenizer's)."""
        return _eos_ids(self.loaded.model, self.loaded.tokenizer)

    def tokenize(self, prompt: Prompt) -> TokenizedPrompt:
        return encode_prompt(prompt, self.loaded.tokenizer, self.loaded.card.use_chat_template)

    def probe_answers(self, prompts: list[TokenizedPrompt], answers: list[list[int]], texts: list[str],
                      probe: ProbeOptions) -> list[Any]:
        """Probe answers written elsewhere (a served engine's, in a two-stage run): each prompt + answer in one
        teacher-forced pass (:func:`probe.attention.probe_forced`), or for query ``generated`` the forward pass over
        prompt + answer that query reads; each answer token located in its text as in :meth:`generate`.

        Returns:
            One ``SegmentAttention`` per prompt (None for an empty answer under query ``generated``).
        """
        import torch

        from probe.attention import is_prompt_query, probe_batch, probe_forced

        with torch.inference_mode():
            if is_prompt_query(probe):
                results: list[Any] = probe_forced(self.loaded.model, prompts, answers, probe,
                                                  self.loaded.tokenizer.pad_token_id or 0)
            else:
                results = [None] * len(prompts)
                rows = [i for i, a in enumerate(answers) if a]
                found = probe_batch(self.loaded.model, [prompts[i] for i in rows], probe, [answers[i] for i in rows])
                for i, r in zip(rows, found):
                    results[i] = r
        for att, text in zip(results, texts):
            self._locate(att, text)
        return results

    def _locate(self, att: Any, text: str) -> None:
        """Where each answer token of a probe's answer capture lies in the output text (what hop tracking reads)."""
        if getattr(att, "answer", None) is not None:
            att.answer = replace(att.answer, chars=token_char_spans(att.answer.tokens.tolist(), text,
                                                                    self.loaded.tokenizer))

    def generate(self, prompts: list[Prompt], gen: GenerationSection, probe: ProbeOptions | None = None,
                 intervention: Intervention | None = None) -> Iterator[tuple[Prompt, Generation]]:
        """Yield each prompt's generation; prompts are batched by similar length to waste little padding.

        Args:
            prompts: the prompts to run.
            gen: decoding settings and batch size.
            probe: probe options, or None for no probe. With options, each generated prompt's
                :class:`Generation` carries its ``attention`` (a ``SegmentAttention``): computed during the batch's
                prefill, or for query ``generated`` in one forward pass per batch after generation (None for an
                empty answer, which that query cannot probe).
            intervention: an attention intervention the model generates (and is probed) under, or None. Each
                prompt's keys come from its spans (``matched-random`` draws seeded by the backend's seed and the
                prompt id); its :class:`Generation` carries ``intervention_keys``.
        """
        from probe.attention import is_prompt_query

        skipped, runnable = self._admit(prompts, gen.max_new_tokens)
        yield from skipped
        ride_along = probe is not None and is_prompt_query(probe)
        eos = _eos_ids(self.loaded.model, self.loaded.tokenizer)
        for batch in self._batches(runnable, gen.batch_size, intervention):
            out, attention, rows = self._decode(batch, gen, probe if ride_along else None, intervention)
            answers = [_cut(out[i, batch.width:].tolist(), eos, gen.max_new_tokens) for i in range(len(batch.items))]
            if rows is not None:  # answer capture: each row's tokens up to its end token
                captured = rows.results([a.ids for a in answers], [tp.input_ids for tp in batch.tokenized])
                for att, ans in zip(attention, captured):
                    att.answer = ans
            if probe is not None and not ride_along:  # query "generated": prompt + answer, one forward per batch
                attention = self._probe_answers(batch, answers, probe, intervention)
            yield from self._assemble(batch, answers, attention)

    def _admit(self, prompts: list[Prompt], max_new_tokens: int
               ) -> tuple[list[tuple[Prompt, Generation]], list[tuple[Prompt, TokenizedPrompt]]]:
        """Tokenize; a prompt that cannot fit its answer in the context window is skipped (its Generation says why).

        Returns:
            The skipped prompts with their generations, and the runnable ones sorted by token count.
        """
        window = self.loaded.card.context_window
        skipped: list[tuple[Prompt, Generation]] = []
        runnable: list[tuple[Prompt, TokenizedPrompt]] = []
        for p in prompts:
            tp = self.tokenize(p)
            n = len(tp.input_ids)
            if n + max_new_tokens > window:
                skipped.append((p, Generation(None, False, prompt_tokens=n, skip_reason=(
                    f"prompt of {n} tokens + max_new_tokens {max_new_tokens} exceeds the context window "
                    f"of {window} tokens"))))
            else:
                runnable.append((p, tp))
        runnable.sort(key=lambda x: len(x[1].input_ids))
        return skipped, runnable

    def _batches(self, runnable: list[tuple[Prompt, TokenizedPrompt]], batch_size: int,
                 intervention: Intervention | None) -> Iterator[_Batch]:
        """Consecutive batches of ``batch_size`` prompts, left-padded, with each prompt's edit under an intervention."""
        from probe.attention import left_pad
        from probe.attention.edits import row_edit

        for b in range(0, len(runnable), batch_size):
            items = runnable[b : b + batch_size]
            input_ids, mask, pads = left_pad([tp.input_ids for _, tp in items], self.loaded.tokenizer.pad_token_id)
            edits = ([row_edit(tp, intervention, self.seed, p.prompt_id) for p, tp in items]
                     if intervention is not None else None)
            yield _Batch(items=items, input_ids=input_ids, mask=mask, pads=pads, edits=edits)

    def _editing(self, edits: list[RowEdit] | None, pads: list[int],
                 intervention: Intervention | None) -> contextlib.AbstractContextManager[Any]:
        """The context that applies a batch's edits in the model's attention (nothing without an intervention)."""
        if edits is None or intervention is None:
            return contextlib.nullcontext()
        from probe.attention.implementation import attach_edit, layers_and_heads
        from probe.attention.edits import BatchEdit

        n_layers, n_heads = layers_and_heads(self.loaded.model)
        return attach_edit(self.loaded.model, BatchEdit(edits, pads, intervention, n_layers, n_heads,
                                                        self.loaded.device))

    def _decode(self, batch: _Batch, gen: GenerationSection, ride_along: ProbeOptions | None,
                intervention: Intervention | None) -> tuple[Any, list[Any], Any]:
        """``model.generate`` over one batch, under its edit, seeded when sampling, the probe riding on the prefill
        (and, with ``answer = true``, capturing every generation step:
        docs/probes.md#attention-while-the-answer-is-written).

        Returns:
            The generated ids (B, W + new tokens), one ``SegmentAttention`` per row (all None without
            ``ride_along``) and the answer capture (``AnswerRows``, None without ``answer``).
        """
        import torch

        from probe.attention import probe_generation

        model = self.loaded.model
        device = self.loaded.device  # the input embedding's (a dispatched model's first weights may be on `meta`)
        editing = self._editing(batch.edits, batch.pads, intervention)
        inputs = {"input_ids": batch.input_ids.to(device), "attention_mask": batch.mask.to(device)}
        kwargs = decoding_kwargs(gen, self.loaded.tokenizer.pad_token_id)
        attention: list[Any] = [None] * len(batch.items)
        rows = None
        with torch.inference_mode(), self._seeded(gen, [p.prompt_id for p, _ in batch.items]), editing:
            if ride_along is not None:
                with probe_generation(model, batch.tokenized, batch.pads, ride_along) as capture:
                    out = model.generate(**inputs, **kwargs)
                attention = list(capture.results())
                rows = capture.answer
            else:
                out = model.generate(**inputs, **kwargs)
        return out, attention, rows

    def _seeded(self, gen: GenerationSection, prompt_ids: list[str]) -> contextlib.AbstractContextManager[Any]:
        """Sampling: a forked torch generator state seeded by :func:`sample_seed` (greedy decoding draws nothing)."""
        if gen.temperature <= 0:
            return contextlib.nullcontext()
        return _forked_seed(sample_seed(self.seed, prompt_ids), self.loaded.device)

    def _probe_answers(self, batch: _Batch, answers: list[_Answer], probe: ProbeOptions,
                       intervention: Intervention | None) -> list[Any]:
        """Query ``generated``: probe prompt + answer in one forward pass, under the same edit; None for no answer."""
        from probe.attention import probe_batch

        attention: list[Any] = [None] * len(batch.items)
        rows = [i for i, a in enumerate(answers) if a.ids]
        if not rows:
            return attention
        tokenized = batch.tokenized
        edits, pads = None, []
        if batch.edits is not None:  # the same edit, laid out for the batch of prompt + answer
            full = [len(tokenized[i].input_ids) + len(answers[i].ids) for i in rows]
            pads = [max(full) - n for n in full]
            edits = [_extend(batch.edits[i], len(answers[i].ids)) for i in rows]
        with self._editing(edits, pads, intervention):
            results = probe_batch(self.loaded.model, [tokenized[i] for i in rows], probe,
                                  [answers[i].ids for i in rows])
        for i, r in zip(rows, results):
            attention[i] = r
        return attention

    def _assemble(self, batch: _Batch, answers: list[_Answer], attention: list[Any]
                  ) -> Iterator[tuple[Prompt, Generation]]:
        """Each row's :class:`Generation`: decoded text, token counts, ids, attention and key count."""
        tok = self.loaded.tokenizer
        for i, ((p, tp), answer, att) in enumerate(zip(batch.items, answers, attention)):
            keys = batch.edits[i].count if batch.edits is not None else None
            text = tok.decode(answer.ids, skip_special_tokens=True)
            self._locate(att, text)
            yield p, Generation(text, answer.truncated,
                                prompt_tokens=len(tp.input_ids), completion_tokens=len(answer.ids),
                                output_ids=tuple(answer.ids), attention=att, intervention_keys=keys)


def decoding_kwargs(gen: GenerationSection, pad_token_id: int | None) -> dict[str, Any]:
    """``model.generate`` keyword arguments: greedy at temperature 0 (sampling knobs unset), else sampling."""
    kwargs: dict[str, Any] = {"max_new_tokens": gen.max_new_tokens, "pad_token_id": pad_token_id}
    if gen.temperature > 0:
        kwargs.update(do_sample=True, temperature=gen.temperature, top_p=gen.top_p)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    return kwargs


def _cut(new: list[int], eos: set[int], max_new_tokens: int) -> _Answer:
    """The answer up to (without) its first end token; truncated when none came within ``max_new_tokens``."""
    cut = next((j for j, t in enumerate(new) if t in eos), None)
    return _Answer(ids=new if cut is None else new[:cut], truncated=cut is None and len(new) >= max_new_tokens)


@contextlib.contextmanager
def _forked_seed(seed: int, device: Any) -> Iterator[None]:
    """Seed torch's generator (CPU and ``device``'s CUDA one) inside, restoring the caller's state after."""
    import torch

    with torch.random.fork_rng(devices=_cuda_devices(device)):
        torch.manual_seed(seed)
        yield


def _extend(edit: "RowEdit", n_answer: int) -> "RowEdit":
    """A prompt's edit over prompt + answer: the answer tokens are queries, never keys."""
    import numpy as np

    from probe.interventions import RowEdit

    return RowEdit(keys=np.concatenate([edit.keys, np.zeros(n_answer, dtype=bool)]), query_start=edit.query_start,
                   wanted=edit.wanted)


def sample_seed(seed: int, prompt_ids: list[str]) -> int:
    """The torch seed of one sampled batch: a function of the experiment seed and the batch's prompt ids alone."""
    digest = hashlib.sha256("\n".join([str(seed), *prompt_ids]).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _cuda_devices(device: Any) -> list[int]:
    """The CUDA device whose generator state ``fork_rng`` must save and restore (none on CPU)."""
    import torch

    dev = torch.device(device)
    return [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []


def _eos_ids(model: Any, tok: Any) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), tok):
        e = getattr(src, "eos_token_id", None)
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, (list, tuple)):
            ids.update(int(x) for x in e)
    return ids
