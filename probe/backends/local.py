"""The local backend: batched greedy generation with a transformers model (left padding, KV cache).

Sampling (``temperature > 0``) draws from a torch generator state seeded per batch from the experiment's seed and
the batch's prompt ids, so the same batch gives the same samples in every run, whatever ran before it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Iterator

from probe.backends.base import Generation
from probe.config import GenerationSection
from probe.loading import LoadedModel
from probe.prompts.tokenize import tokenize_prompt
from probe.types import Prompt, TokenizedPrompt

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

    def generate(self, prompts: list[Prompt], gen: GenerationSection) -> Iterator[tuple[Prompt, Generation]]:
        """Yield each prompt's generation; prompts are batched by similar length to waste little padding."""
        import torch

        tok = self.loaded.tokenizer
        model = self.loaded.model
        window = self.loaded.card.context_window
        items = [(p, self.tokenize(p).input_ids) for p in prompts]
        runnable = []
        for p, ids in items:
            if len(ids) + gen.max_new_tokens > window:
                yield p, Generation(None, False, prompt_tokens=len(ids), skip_reason=(
                    f"prompt of {len(ids)} tokens + max_new_tokens {gen.max_new_tokens} exceeds the context window "
                    f"of {window} tokens"))
            else:
                runnable.append((p, ids))
        runnable.sort(key=lambda x: len(x[1]))
        eos = _eos_ids(model, tok)
        pad = tok.pad_token_id
        device = self.loaded.device  # the input embedding's (a dispatched model's first weights may be on `meta`)
        for b in range(0, len(runnable), gen.batch_size):
            batch = runnable[b : b + gen.batch_size]
            width = max(len(ids) for _, ids in batch)
            input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, (_, ids) in enumerate(batch):
                input_ids[i, width - len(ids) :] = torch.tensor(ids)
                mask[i, width - len(ids) :] = 1
            kwargs: dict[str, Any] = {"max_new_tokens": gen.max_new_tokens, "pad_token_id": pad}
            if gen.temperature > 0:
                kwargs.update(do_sample=True, temperature=gen.temperature, top_p=gen.top_p)
            else:
                kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            sampling = gen.temperature > 0
            with torch.inference_mode(), (torch.random.fork_rng(devices=_cuda_devices(device)) if sampling
                                          else contextlib.nullcontext()):
                if sampling:
                    torch.manual_seed(sample_seed(self.seed, [p.prompt_id for p, _ in batch]))
                out = model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device), **kwargs)
            for i, (p, ids) in enumerate(batch):
                new = out[i, width:].tolist()
                cut = next((j for j, t in enumerate(new) if t in eos), None)
                truncated = cut is None and len(new) >= gen.max_new_tokens
                kept = new if cut is None else new[:cut]
                text = tok.decode(kept, skip_special_tokens=True)
                yield p, Generation(text, truncated, prompt_tokens=len(ids), completion_tokens=len(kept),
                                    output_ids=tuple(kept))


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
