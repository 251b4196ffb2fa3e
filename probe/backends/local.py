"""The local backend: batched generation with a transformers model (left padding, KV cache), and the attention
probe of each batch when asked.

Probing rides on generation: for a query set inside the prompt (``question``, ``last``, ``segment:<i>``) the
probe's aggregates are computed during ``generate``'s own prefill of the batch
(:func:`probe.attention.probe_generation`), so a probed run does no extra forward pass. Query ``generated`` reads
the answer, so it probes each batch once more after generation, prompt + answer in one left-padded forward pass
(:func:`probe.attention.probe_batch`).

Sampling (``temperature > 0``) draws from a torch generator state seeded per batch from the experiment's seed and
the batch's prompt ids, so the same batch gives the same samples in every run, whatever ran before it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from probe.backends.base import Generation
from probe.config import GenerationSection, ProbeSection
from probe.loading import LoadedModel
from probe.prompts.tokenize import tokenize_prompt
from probe.types import Prompt, TokenizedPrompt

if TYPE_CHECKING:
    from probe.attention.intervention import Intervention, RowEdit

log = logging.getLogger(__name__)


@dataclass
class LocalBackend:
    """Batched greedy generation with a local transformers model (left padding, KV cache)."""

    loaded: LoadedModel
    seed: int = 0  # the experiment's seed: sampled generations draw from it (greedy decoding draws nothing)

    @property
    def model_name(self) -> str:
        return self.loaded.card.name

    def tokenize(self, prompt: Prompt) -> TokenizedPrompt:
        return tokenize_prompt(prompt, self.loaded.tokenizer, self.loaded.card.use_chat_template)

    def generate(self, prompts: list[Prompt], gen: GenerationSection, probe: ProbeSection | None = None,
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
        import torch

        from probe.attention import is_prompt_query, left_pad, probe_batch, probe_generation
        from probe.attention.engine import attach_edit, layers_and_heads
        from probe.attention.intervention import BatchEdit, row_edit

        tok = self.loaded.tokenizer
        model = self.loaded.model
        window = self.loaded.card.context_window
        runnable: list[tuple[Prompt, TokenizedPrompt]] = []
        for p in prompts:
            tp = self.tokenize(p)
            n = len(tp.input_ids)
            if n + gen.max_new_tokens > window:
                yield p, Generation(None, False, prompt_tokens=n, skip_reason=(
                    f"prompt of {n} tokens + max_new_tokens {gen.max_new_tokens} exceeds the context window "
                    f"of {window} tokens"))
            else:
                runnable.append((p, tp))
        runnable.sort(key=lambda x: len(x[1].input_ids))
        eos = _eos_ids(model, tok)
        pad = tok.pad_token_id
        device = self.loaded.device  # the input embedding's (a dispatched model's first weights may be on `meta`)
        ride_along = probe is not None and is_prompt_query(probe)
        n_layers, n_heads = layers_and_heads(model)
        for b in range(0, len(runnable), gen.batch_size):
            batch = runnable[b : b + gen.batch_size]
            prompts_tok = [tp for _, tp in batch]
            input_ids, mask, pads = left_pad([tp.input_ids for tp in prompts_tok], pad)
            edits = ([row_edit(tp, intervention, self.seed, p.prompt_id) for p, tp in batch]
                     if intervention is not None else None)
            editing: Any = contextlib.nullcontext()
            if edits is not None:
                editing = attach_edit(model, BatchEdit(edits, pads, intervention, n_layers, n_heads,  # type: ignore[arg-type]
                                                       device))
            width = input_ids.shape[1]
            kwargs: dict[str, Any] = {"max_new_tokens": gen.max_new_tokens, "pad_token_id": pad}
            if gen.temperature > 0:
                kwargs.update(do_sample=True, temperature=gen.temperature, top_p=gen.top_p)
            else:
                kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            inputs = {"input_ids": input_ids.to(device), "attention_mask": mask.to(device)}
            attention: list[Any] = [None] * len(batch)
            sampling = gen.temperature > 0
            with torch.inference_mode(), (torch.random.fork_rng(devices=_cuda_devices(device)) if sampling
                                          else contextlib.nullcontext()):
                if sampling:
                    torch.manual_seed(sample_seed(self.seed, [p.prompt_id for p, _ in batch]))
                with editing:
                    if ride_along:
                        with probe_generation(model, prompts_tok, pads, probe) as capture:
                            out = model.generate(**inputs, **kwargs)
                        attention = list(capture.results())
                    else:
                        out = model.generate(**inputs, **kwargs)
            answers: list[tuple[list[int], bool]] = []
            for i in range(len(batch)):
                new = out[i, width:].tolist()
                cut = next((j for j, t in enumerate(new) if t in eos), None)
                truncated = cut is None and len(new) >= gen.max_new_tokens
                answers.append((new if cut is None else new[:cut], truncated))
            if probe is not None and not ride_along:  # query "generated": prompt + answer, one forward per batch
                rows = [i for i, (kept, _) in enumerate(answers) if kept]
                if rows:
                    editing = contextlib.nullcontext()
                    if edits is not None:  # the same edit, laid out for the batch of prompt + answer
                        full = [len(prompts_tok[i].input_ids) + len(answers[i][0]) for i in rows]
                        answer_pads = [max(full) - n for n in full]
                        answer_edits = [_extend(edits[i], len(answers[i][0])) for i in rows]
                        editing = attach_edit(model, BatchEdit(answer_edits, answer_pads, intervention,  # type: ignore[arg-type]
                                                               n_layers, n_heads, device))
                    with editing:
                        results = probe_batch(model, [prompts_tok[i] for i in rows], probe,
                                              [answers[i][0] for i in rows])
                    for i, r in zip(rows, results):
                        attention[i] = r
            for i, ((p, tp), (kept, truncated), att) in enumerate(zip(batch, answers, attention)):
                text = tok.decode(kept, skip_special_tokens=True)
                keys = edits[i].count if edits is not None else None
                yield p, Generation(text, truncated, prompt_tokens=len(tp.input_ids), completion_tokens=len(kept),
                                    output_ids=tuple(kept), attention=att, intervention_keys=keys)


def _extend(edit: "RowEdit", n_answer: int) -> "RowEdit":
    """A prompt's edit over prompt + answer: the answer tokens are queries, never keys."""
    import numpy as np

    from probe.attention.intervention import RowEdit

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
