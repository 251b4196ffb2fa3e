"""One model over its prompts: the baseline and each intervention, batch by batch, into trial records (and the
probe records its backend computed while it generated); resumable without duplicates."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

from probe.backends.base import Backend, Generation
from probe.config import ExperimentConfig
from probe.errors import ConfigError
from probe.interventions import MATCHED_DRAWS, Intervention
from probe.prompts.reinject import reinject
from probe.records import TrialRecord, append_jsonl, index_records, make_trial_id
from probe.runfolder import inside, prompt_digest, write_atomic
from probe.runner.folder import done_ids
from probe.scoring import score as score_family
from probe.types import Prompt, Task

log = logging.getLogger(__name__)


def make_record(model: str, prompt: Prompt, task: Task, gen: Generation,
                intervention: str | None = None, keep_ids: bool = False) -> TrialRecord:
    """Score a generation with its family's scorer (:mod:`probe.tasks`) and flatten it into a trial record.

    ``intervention`` names the intervention the model ran under (None: the baseline); such a record's ``meta``
    holds its :class:`~probe.interventions.KeyCount` (``intervention_keys``, the key tokens edited, and, when a
    matched-random draw found too few tokens, ``intervention_keys_wanted``). ``keep_ids`` records the answer's
    token ids (a served engine's, for a two-stage run's probe: :mod:`probe.runner.forced`).
    """
    meta = dict(task.meta)
    if intervention is not None and gen.intervention_keys is not None:
        meta.update(gen.intervention_keys.to_meta())
    record = partial(TrialRecord, trial_id=make_trial_id(model, prompt.prompt_id, intervention), model=model,
                     prompt_id=prompt.prompt_id, task_id=prompt.task_id, source=prompt.source,
                     condition=prompt.condition, load=prompt.load, achieved_load=prompt.achieved_load,
                     replication=prompt.replication, prompt_tokens=gen.prompt_tokens or 0, gold=task.gold,
                     s_sim=prompt.s_sim, completion_tokens=gen.completion_tokens, meta=meta or None,
                     family=prompt.family, intervention=intervention)
    if gen.skip_reason or gen.error:
        return record(output=gen.text, answer=None, em=None, hop_recall=None, truncated=False,
                      uninterpretable=False, skipped=gen.skip_reason is not None, skip_reason=gen.skip_reason,
                      error=gen.error)
    score = score_family(prompt.family, gen.text, task, gen.truncated)
    ids = list(gen.output_ids) if keep_ids and gen.output_ids is not None else None
    return record(output=gen.text, answer=score.answer, em=float(score.em), hop_recall=score.hop_recall,
                  truncated=score.truncated, uninterpretable=score.uninterpretable, extraction=score.extraction,
                  output_ids=ids)


def run_model(cfg: ExperimentConfig, backend: Backend, prompts: list[Prompt], tasks: dict[str, Task],
              progress: bool = True,
              on_batch: Callable[[list[TrialRecord]], None] | None = None,
              interventions: Sequence[Intervention] = ()) -> int:
    """Run one model over its prompts, appending trial records; returns the number of new trials.

    Each prompt runs once as the baseline and once under each intervention (trial ids and probe records name it),
    one intervention at a time, batched. Under greedy decoding, prompts with the same text (Control replications)
    are generated once and recorded once per prompt (per prompt id under matched keys and re-injected neutral
    sentences, which are drawn per prompt id). A ``reinject`` runs the prompt with its germane facts or as many
    neutral sentences repeated before the question (:mod:`probe.prompts.reinject`), recorded under the prompt's own
    id, unprobed. Records are written after every generation batch.

    Raises:
        ConfigError: interventions on a served model (the runner applies them with local weights).
    """
    if interventions and not backend.capabilities.local:
        raise ConfigError(f"model {backend.model_name!r}: interventions run with local weights (a served model gives "
                          "text only); remove [[interventions]] or the model")
    written = 0
    for iv in [None, *interventions]:
        written += _run_arm(cfg, backend, prompts, tasks, iv, progress, on_batch)
    return written


def _run_arm(cfg: ExperimentConfig, backend: Backend, prompts: list[Prompt], tasks: dict[str, Task],
             iv: Intervention | None, progress: bool,
             on_batch: Callable[[list[TrialRecord]], None] | None) -> int:
    """The baseline (``iv`` None) or one intervention over the model's prompts (see :func:`run_model`)."""
    from tqdm import tqdm

    run = cfg.run_folder
    model = backend.model_name
    name = iv.name if iv is not None else None
    done = done_ids(run)
    mine = prompts
    if iv is not None:  # an intervention's conditions / loads: the prompts it runs on
        mine = [p for p in mine if iv.applies_to(p.condition, p.load)]
    pending = [p for p in mine if make_trial_id(model, p.prompt_id, name) not in done]
    log.info("%s%s: %d trials to run, %d already recorded in %s", model, "" if name is None else f" [{name}]",
             len(pending), len(mine) - len(pending), run.root)
    # a reinject edits the prompt, not attention: its prompts are not the recorded ones, so it is not probed
    # a served model's answers are probed after it ran, on local weights (stage two: probe.runner.forced)
    probing = cfg.probe.enabled and backend.capabilities.local and (iv is None or iv.edits_attention)
    # a recorded trial whose probe record cannot be read is generated again (greedy: the same answer) to probe it
    # again; its trial record is kept
    reprobe = _unreadable_probes(cfg, model, [p for p in mine if p not in pending], name) if probing else []
    if not pending and not reprobe:
        return 0
    members = _groups(cfg, iv, pending + reprobe)
    out_path = run.trials
    probe_opts = cfg.probe if probing else None
    written = 0
    bar = tqdm(total=len(pending), desc=model if name is None else f"{model} [{name}]", disable=not progress,
               unit="trial")
    buffer: list[TrialRecord] = []
    try:  # the backend computes the probe while it generates, batch by batch
        sent = [first for first, _ in members.values()]
        edit = iv if iv is not None and iv.edits_attention else None
        for prompt, gen in backend.generate(sent, cfg.generation, probe_opts, edit):
            group = members[prompt.prompt_id][1]
            if probe_opts is not None and gen.error is None and gen.skip_reason is None:
                save_probe(cfg, backend.model_name, group, gen, name)
            for p in group:
                if make_trial_id(model, p.prompt_id, name) not in done:
                    buffer.append(make_record(model, p, tasks[p.task_id], gen, name,
                                              keep_ids=backend.capabilities.records_ids))
            if len(buffer) >= cfg.generation.batch_size:
                rows, buffer = buffer, []
                written += _flush(out_path, rows, on_batch)
                bar.update(len(rows))
    finally:  # an interruption (Ctrl-C, crash in the backend) still records the trials already generated
        rows, buffer = buffer, []
        if rows:
            written += _flush(out_path, rows, on_batch)
            bar.update(len(rows))
        bar.close()
    return written


def _groups(cfg: ExperimentConfig, iv: Intervention | None, prompts: list[Prompt]
            ) -> dict[str, tuple[Prompt, list[Prompt]]]:
    """The prompts generated once for several records: under greedy decoding, every prompt of one text (Control
    replications), unless the arm draws per prompt id (matched keys, re-injected neutral sentences). Keyed by the
    id of the prompt each group sends: its first prompt, or under a reinject that prompt with the facts or as many
    neutral sentences repeated before the question (:mod:`probe.prompts.reinject`)."""
    greedy = cfg.generation.temperature == 0
    edits_prompt = iv is not None and not iv.edits_attention
    per_id = iv is not None and (iv.keys in MATCHED_DRAWS or (edits_prompt and iv.keys == "filler"))
    by_key: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_key.setdefault(p.text if greedy and not per_id else p.prompt_id, []).append(p)
    out: dict[str, tuple[Prompt, list[Prompt]]] = {}
    for group in by_key.values():
        first = reinject(group[0], iv.keys, cfg.experiment.seed) if iv is not None and edits_prompt else group[0]
        out[first.prompt_id] = (first, group)
    return out


def _unreadable_probes(cfg: ExperimentConfig, model: str, prompts: list[Prompt],
                       intervention: str | None) -> list[Prompt]:
    """The prompts whose probe record exists but is not whole (:meth:`SegmentAttention.is_whole`: cut short by a
    full disk or a bad copy); each such file is removed, with a warning, so that the run probes the prompt again."""
    from probe.attention.result import SegmentAttention

    out = []
    for p in prompts:
        path = cfg.run_folder.attention_record(model, p.prompt_id, intervention)
        if path.is_file() and not SegmentAttention.is_whole(path):
            log.warning("%s: not a readable probe record (cut short?); removing it: the run probes the prompt again",
                        path)
            path.unlink()
            out.append(p)
    return out


def _flush(path: Path, rows: list[TrialRecord], on_batch: Callable[[list[TrialRecord]], None] | None) -> int:
    n = append_jsonl(path, (r.to_dict() for r in rows), root=path.parent)
    if on_batch is not None:
        on_batch(rows)
    return n


def save_probe(cfg: ExperimentConfig, model: str, prompts: list[Prompt], gen: Generation,
               intervention: str | None = None) -> None:
    """Store the probe of one prompt text (computed by the backend while it generated) under every prompt id that
    shares the text.

    Records go to :meth:`probe.runfolder.RunFolder.attention_record` of (model, prompt id, intervention), where the
    analysis reads them; one that exists already (a resumed run) is not written again. A generation without a probe
    (query ``generated`` and an empty answer: nothing to probe) leaves none, with a warning.
    """
    run = cfg.run_folder
    todo = [p for p in (run.attention_record(model, q.prompt_id, intervention) for q in prompts) if not p.exists()]
    if not todo:
        return
    if gen.attention is None:
        log.warning("%s: no probe of prompt %s%s (an empty answer cannot be probed with query 'generated')", model,
                    prompts[0].prompt_id, "" if intervention is None else f" under intervention {intervention!r}")
        return
    gen.attention.prompt_digest = prompt_digest(prompts[0].text)
    gen.attention.save(inside(run.root, todo[0]))
    for p in todo[1:]:
        write_atomic(p, todo[0].read_bytes(), root=run.root)
    index_records(run, todo, gen.attention.prompt_digest)


__all__ = ["make_record", "run_model", "save_probe"]
