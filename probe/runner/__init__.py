"""The model runner: prompts x models -> trial records (and attention records when probing is on), resumable
(docs/records.md#resuming)."""


from __future__ import annotations

from pathlib import Path

from probe.backends import make_backend
from probe.config import ExperimentConfig
from probe.interventions import Intervention, write_interventions
from probe.loading import ModelCard, get_card
from probe.errors import ConfigError
from probe.runfolder import RunLock
from probe.runner.checks import check_inputs
from probe.runner.folder import check_run_dir, prepare_run_dir, write_manifest
from probe.runner.prompts import build_run_prompts
from probe.runner.resolve import resolve_interventions
from probe.runner.shards import SHARDS_DIR, Shard, find_shards
from probe.runner.forced import check_served_tokenizer, probe_served
from probe.runner.trials import run_model
from probe.types import Task


def run_experiment(cfg: ExperimentConfig, progress: bool = True, force: bool = False, device: str | None = None,
                   shard: Shard | None = None) -> Path:
    """Build (or reuse) the prompts and run every model; returns the run folder.

    Args:
        cfg: the experiment.
        progress: show progress bars.
        force: start the run over when the folder holds records of another configuration (they are moved into
            ``<run>/superseded-<time>/``; :func:`prepare_run_dir`).
        device: "cpu" / "cuda[:i]" for local models (None: CUDA when available).
        shard: run one shard of the prompts into its own run folder, ``<run>/shards/<i>-of-<N>/`` (a data-parallel
            process is shard ``rank + 1`` of ``world``; :mod:`probe.runner.shards`, whose merge joins the shards);
            returns the shard's folder.

    Raises:
        RunLockedError: another process holds the run folder's lock (:class:`probe.runfolder.RunLock`, naming the
            holder's pid).
        ConfigError: a run of the whole experiment where ``<run>/shards/`` holds shards and no trial was merged
            (finish the shards and merge them instead).
        ConfigError, RecordError, TaskFormatError, ModelUnavailableError: bad input, found before anything is
            written.
    """
    # everything that can be checked without writing is checked first: bad input leaves the folder as it was
    cards, task_list = check_inputs(cfg)
    experiment = cfg
    unmerged = [] if shard is not None or cfg.run_folder.trials.is_file() else find_shards(cfg.run_dir)
    if shard is not None:
        cfg = shard.config(cfg)
    elif unmerged:
        raise ConfigError(f"{cfg.run_dir}: its shards ({', '.join(p.name for p in unmerged)}) are not "
                          f"merged; finish each (`probe run EXP --shard i/N`, or the data-parallel launch again) and "
                          f"`probe merge {cfg.run_dir}`, or move {cfg.run_dir / SHARDS_DIR} aside to run the whole "
                          "experiment in one process")
    check_run_dir(cfg, force=force)
    with RunLock(cfg.run_folder):
        run_dir = prepare_run_dir(cfg, force=force)
        if shard is not None:
            shard.write_marker(experiment)
        _run_models(cfg, cards, task_list, progress, device, shard)
    return run_dir


def _run_models(cfg: ExperimentConfig, cards: list[ModelCard], task_list: list[Task], progress: bool,
                device: str | None, shard: Shard | None) -> None:
    """Build (or reuse) the prompts, then run every model in turn (see :func:`run_experiment`)."""
    run_dir = cfg.run_dir
    by_model = build_run_prompts(cfg, progress=progress, tasks=task_list)
    tasks = {t.task_id: t for t in task_list}
    revisions: dict[str, str] = {}
    shapes: dict[str, tuple[int, int]] = {}  # model -> (layers, heads) of the attention its records hold
    for card in cards:
        backend = make_backend(card, device=device, seed=cfg.experiment.seed)
        if backend.revision is not None:
            revisions[card.name] = backend.revision
        if backend.capabilities.local:
            shapes[card.name] = backend.layers_and_heads()
        write_manifest(run_dir, cfg, cards, revisions, shapes)
        resolved: list[Intervention] = []
        if cfg.interventions and backend.capabilities.local:
            n_layers, n_heads = backend.layers_and_heads()
            resolved = resolve_interventions(cfg, card.name, n_layers, n_heads, by_model[card.name])
            write_interventions(run_dir, card.name, resolved)
        prompts = by_model[card.name] if shard is None else shard.select(by_model[card.name])
        two_stage = cfg.probe.enabled and card.probe_with is not None
        if two_stage and prompts:  # before stage one writes anything
            check_served_tokenizer(backend, card, prompts[0])
        run_model(cfg, backend, prompts, tasks, progress=progress, interventions=resolved)
        del backend
        if two_stage:  # stage two: the recorded answers probed on local weights of the same model
            assert card.probe_with is not None
            local = make_backend(get_card(card.probe_with), device=device, seed=cfg.experiment.seed)
            shapes[card.name] = local.layers_and_heads()  # the served model's records are the local weights'
            if local.revision is not None:
                revisions[card.probe_with] = local.revision
            write_manifest(run_dir, cfg, cards, revisions, shapes)
            probe_served(cfg, card.name, local, prompts, progress=progress)
            del local


__all__ = ["run_experiment"]
