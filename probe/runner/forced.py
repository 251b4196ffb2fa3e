"""Stage two of a two-stage run: a served model's recorded answers probed on local weights of the same model
(docs/probes.md#two-stage-runs)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from probe.attention.result import SegmentAttention
from probe.backends.base import Backend, ProbingBackend, probing
from probe.config import ExperimentConfig
from probe.errors import ConfigError
from probe.loading import ModelCard, get_card, load_tokenizer
from probe.prompts.tokenize import encode_prompt
from probe.records import TrialRecord, index_records, load_trials
from probe.runfolder import inside, prompt_digest, write_atomic
from probe.types import Prompt, TokenizedPrompt

log = logging.getLogger(__name__)

ANSWER_BAND = 32  # answer tokens: stage two batches answers within one band of lengths together (probe_served)
ENGINE_IDS = "forced:engine-ids"
RETOKENIZED = "forced:retokenized"


@dataclass
class ForcedSummary:
    """What stage two did for one served model: prompts probed (each probe stored under every prompt id of the same
    text and answer), by where the answer's ids came from, and the trials it could not probe, with why."""

    probed: dict[str, int] = field(default_factory=lambda: {ENGINE_IDS: 0, RETOKENIZED: 0})
    not_probed: dict[str, str] = field(default_factory=dict)  # trial id -> why


@dataclass(frozen=True)
class _Item:
    """One answer to probe: the prompt as the local tokenizer encodes it, the answer's ids and their origin, and the
    trials (prompt ids) that share it."""

    tokenized: TokenizedPrompt
    answer: list[int]
    origin: str
    text: str
    records: tuple[TrialRecord, ...]
    digest: str  # of the prompt text (probe.runfolder.prompt_digest), carried by the record


def check_served_tokenizer(backend: Backend, card: ModelCard, prompt: Prompt) -> bool:
    """Refuse a two-stage run whose server tokenizes a prompt otherwise than the local card in ``probe_with``: the
    server's tokens of the prompt's chat messages (vLLM's ``/tokenize``) against the local tokenizer's.

    Returns:
        True when compared and equal; False when the server cannot say (no ``/tokenize``): each trial's prompt token
        count is still compared before it is probed.

    Raises:
        ConfigError: the tokens differ (naming both cards and the first difference).
    """
    asked = getattr(backend, "server_tokens", None)
    theirs = asked(prompt) if asked is not None else None
    local = get_card(card.probe_with) if card.probe_with else None
    if theirs is None or local is None:
        log.info("%s: the server does not tokenize on request; each trial's prompt token count is compared instead",
                 card.name)
        return False
    ours = list(encode_prompt(prompt, load_tokenizer(local), local.use_chat_template).input_ids)
    if ours != theirs:
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        raise ConfigError(
            f"{card.card_path or card.name}: probe_with: the server tokenizes prompt {prompt.prompt_id} into "
            f"{len(theirs)} tokens, {local.name!r} into {len(ours)} (first difference at token {at}); a two-stage run "
            "probes the served answers with the same tokenizer and chat template: name the local card of the "
            "weights the server serves"
        )
    return True


def answer_ids(record: TrialRecord, tokenizer: Any, eos: set[int]) -> tuple[list[int], str] | str:
    """The answer's token ids and their origin, or why there are none usable.

    The engine's ids (the end tokens it may include cut off, as generation cuts them) are kept when they decode to
    the recorded text; else the text is re-tokenised and kept when it decodes back to itself.
    """
    text = record.output or ""
    if record.output_ids is not None:
        ids = list(record.output_ids)
        while ids and ids[-1] in eos:
            ids.pop()
        if tokenizer.decode(ids, skip_special_tokens=True) == text:
            return ids, ENGINE_IDS
        return "the engine's token ids do not decode to the recorded output (another tokenizer?)"
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if tokenizer.decode(ids, skip_special_tokens=True) != text:
        return "the recorded output does not re-tokenise to itself (decoding its tokens changes the text)"
    return ids, RETOKENIZED


def pending_records(cfg: ExperimentConfig, model: str, prompts: Sequence[Prompt]) -> list[TrialRecord]:
    """The served model's baseline trials among ``prompts`` that have an answer and no whole probe record (a record
    cut short is removed, with a warning, and probed again)."""
    run = cfg.run_folder
    mine = {p.prompt_id for p in prompts}
    records: dict[str, TrialRecord] = {}
    for r in load_trials(run.trials):
        if r.model == model and r.intervention is None and r.prompt_id in mine:
            records[r.trial_id] = r
    out = []
    for r in records.values():
        if r.skipped or r.error is not None or r.output is None:
            continue
        path = run.attention_record(model, r.prompt_id)
        if path.is_file() and not SegmentAttention.is_whole(path):
            log.warning("%s: not a readable probe record (cut short?); removing it: the run probes the prompt again",
                        path)
            path.unlink()
        if not path.is_file():
            out.append(r)
    return out


def probe_served(cfg: ExperimentConfig, model: str, local: Backend, prompts: Sequence[Prompt],
                 progress: bool = True) -> ForcedSummary:
    """Probe the recorded answers of served model ``model`` with ``local``, a local backend of the same weights
    (docs/probes.md#two-stage-runs), batch by batch (``generation.batch_size`` prompts, by length), each probe record written as
    its batch ends.

    Raises:
        ConfigError: ``local`` runs no local weights (a served card named in ``probe_with``).
    """
    from tqdm import tqdm

    backend = probing(local)
    summary = ForcedSummary()
    by_id = {p.prompt_id: p for p in prompts}
    items = _items(backend, pending_records(cfg, model, prompts), by_id, summary)
    for trial, why in summary.not_probed.items():
        log.warning("%s: not probed: %s", trial, why)
    if not items:
        return summary
    log.info("%s: probing %d recorded answers with %s (teacher-forced)", model, len(items), backend.model_name)
    # generate's layout fills every answer of a batch to the longest, so like answers go together
    # (docs/probes.md#two-stage-runs)
    items.sort(key=batch_order)
    size = cfg.generation.batch_size
    with tqdm(total=len(items), desc=f"{model} [probe with {backend.model_name}]", disable=not progress,
              unit="answer") as bar:
        for b in range(0, len(items), size):
            batch = items[b : b + size]
            results = backend.probe_answers([it.tokenized for it in batch], [it.answer for it in batch],
                                            [it.text for it in batch], cfg.probe)
            for it, att in zip(batch, results):
                _save(cfg, model, it, replace(att, origin=it.origin, prompt_digest=it.digest))
                summary.probed[it.origin] += 1
            bar.update(len(batch))
    return summary


def batch_order(item: _Item) -> tuple[int, int]:
    """Stage two's sort key: the answer's band of lengths, then the prompt's length (see :func:`probe_served`)."""
    return len(item.answer) // ANSWER_BAND, len(item.tokenized.input_ids)


def _items(backend: ProbingBackend, records: list[TrialRecord], by_id: dict[str, Prompt], summary: ForcedSummary) -> list[_Item]:
    """One item per (prompt text, answer): greedy Control replications share one probe."""
    tok = backend.tokenizer
    eos = backend.eos_ids()
    grouped: dict[tuple[str, str], list[TrialRecord]] = {}
    for r in records:
        grouped.setdefault((by_id[r.prompt_id].text, r.output or ""), []).append(r)
    items = []
    for (prompt_text, text), group in grouped.items():
        first = group[0]
        tokenized = backend.tokenize(by_id[first.prompt_id])
        n = len(tokenized.input_ids)
        if first.prompt_tokens and first.prompt_tokens != n:
            why = (f"the server counted {first.prompt_tokens} prompt tokens, the local tokenizer {n}: the served "
                   "model's tokenizer or chat template differs from probe_with's")
            summary.not_probed.update({r.trial_id: why for r in group})
            continue
        got = answer_ids(first, tok, eos)
        if isinstance(got, str):
            summary.not_probed.update({r.trial_id: got for r in group})
            continue
        ids, origin = got
        items.append(_Item(tokenized, ids, origin, text, tuple(group), prompt_digest(prompt_text)))
    return items


def _save(cfg: ExperimentConfig, model: str, item: _Item, att: SegmentAttention) -> None:
    """The probe under the prompt id of every trial of the item (atomic writes; the first one written once)."""
    run = cfg.run_folder
    paths = [run.attention_record(model, r.prompt_id) for r in item.records]
    att.save(inside(run.root, paths[0]))
    for p in paths[1:]:
        write_atomic(p, paths[0].read_bytes(), root=run.root)
    index_records(run, paths, att.prompt_digest)


__all__ = ["ENGINE_IDS", "ForcedSummary", "RETOKENIZED", "answer_ids", "check_served_tokenizer", "pending_records",
           "probe_served"]
