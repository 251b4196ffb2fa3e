"""Shards: one share of a run's prompts in a run folder of its own, ``<run>/shards/<i>-of-<N>/``, joined by one
merge. ``probe run EXP --shard i/N`` (independent machines, a SLURM array, then ``probe merge``) and each process of
a data-parallel launch (shard ``rank + 1`` of ``world``, merged by rank 0) make the same shards
(docs/performance.md#shards-slurm-arrays-and-independent-machines)."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path

from probe.config import ExperimentConfig, dump_config, read_run_config
from probe.errors import ProbeError
from probe.records import TrialRecord, index_records, load_prompts, load_trials, write_jsonl
from probe.runfolder import RunFolder, RunLock, write_atomic
from probe.runner.folder import record_differences
from probe.types import Prompt

SHARDS_DIR = "shards"
SHARD_FILE = "shard.json"
S_SIM_TOLERANCE = 1e-5  # S_sim of one prompt built on two machines: float32 embeddings, summed in another order
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
log = logging.getLogger(__name__)


class ShardError(ProbeError):
    """Shards that cannot be merged, or a shard given wrongly; the message says which and what to do."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (1-based: ``2/4`` is the second of four)."""

    index: int
    count: int

    @staticmethod
    def parse(text: str) -> "Shard":
        """``"i/N"`` with 1 <= i <= N.

        Raises:
            ShardError: not of that form.
        """
        m = _SPEC.match(text)
        if m is None or not 1 <= int(m.group(1)) <= int(m.group(2)):
            raise ShardError(f"--shard {text!r}: give i/N with 1 <= i <= N (the second of four shards is 2/4; "
                             "in a SLURM array of --array=1-N, --shard $SLURM_ARRAY_TASK_ID/N)")
        return Shard(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def name(self) -> str:
        """The shard folder's name, ``<i>-of-<N>``."""
        return f"{self.index}-of-{self.count}"

    def config(self, cfg: ExperimentConfig) -> ExperimentConfig:
        """The experiment as this shard runs it: the same settings, its run folder ``<run>/shards/<i>-of-<N>``."""
        folder = Path(cfg.experiment.output_dir) / cfg.experiment.name / SHARDS_DIR
        return replace(cfg, experiment=replace(cfg.experiment, output_dir=str(folder), name=self.name))

    def select(self, prompts: list[Prompt]) -> list[Prompt]:
        """This shard's share of the prompts (every N-th in prompt order, from the i-th)."""
        return prompts[self.index - 1::self.count]

    def write_marker(self, cfg: ExperimentConfig) -> None:
        """``shard.json`` in the shard folder: which shard, of which experiment's run folder."""
        marker = {"index": self.index, "count": self.count, "experiment": cfg.experiment.name,
                  "output_dir": cfg.experiment.output_dir}
        write_atomic(self.config(cfg).run_dir / SHARD_FILE, json.dumps(marker, indent=2) + "\n")


@dataclass(frozen=True)
class MergeSummary:
    """What :func:`merge_shards_into` wrote.

    Attributes:
        run_dir: the merged run folder.
        shards: the shard folders merged, by index.
        n_trials: trials in the merged trial file; n_errors: of them, trials that ended in a backend error (run the
            shard again to retry them before merging, or run the merged folder: a run retries them).
        n_probe_records: probe records copied.
    """

    run_dir: Path
    shards: tuple[Path, ...]
    n_trials: int
    n_errors: int
    n_probe_records: int


def _read_marker(folder: Path) -> tuple[Shard, dict]:
    path = folder / SHARD_FILE
    try:
        marker = json.loads(path.read_text())
        return Shard(int(marker["index"]), int(marker["count"])), marker
    except FileNotFoundError:
        raise ShardError(f"{folder}: not a shard folder (no {SHARD_FILE}); a shard is written by "
                         "`probe run EXP --shard i/N`") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ShardError(f"{path}: unreadable ({e}); run the shard again with `probe run EXP --shard i/N`") from None


def find_shards(run_dir: str | Path) -> list[Path]:
    """The shard folders under ``<run>/shards/`` (those with a ``shard.json``), by name."""
    root = Path(run_dir) / SHARDS_DIR
    return sorted(p for p in root.iterdir() if (p / SHARD_FILE).is_file()) if root.is_dir() else []


def _check_set(folders: list[Path]) -> dict[int, Path]:
    """The shard folders by index: one count, every index once."""
    by: dict[int, Path] = {}
    counts: dict[int, Path] = {}
    for folder in folders:
        shard, _ = _read_marker(folder)
        counts.setdefault(shard.count, folder)
        if shard.index in by:
            raise ShardError(f"shard {shard} is given twice: {by[shard.index]} and {folder}; merge one of them")
        by[shard.index] = folder
    if len(counts) > 1:
        raise ShardError("the shards split the run in different ways: "
                         + ", ".join(f"{f} is one of {n}" for n, f in sorted(counts.items()))
                         + "; merge the shards of one split")
    count = next(iter(counts))
    missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in by]
    if missing:
        raise ShardError(f"shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} of {count} "
                         f"{'are' if len(missing) > 1 else 'is'} missing: run `probe run EXP --shard "
                         f"{missing[0]}` (each on its machine), copy the folders into <run>/{SHARDS_DIR}/, and merge "
                         "again")
    return dict(sorted(by.items()))


def _same_prompts(a: list[Prompt], b: list[Prompt], where: Path) -> None:
    if [p.prompt_id for p in a] != [p.prompt_id for p in b]:
        raise ShardError(f"{where}: its prompts are not the first shard's (other prompt ids or order): the shards "
                         "were built from different tasks or toolkit versions; run them from one experiment file")
    for p, q in zip(a, b):
        if replace(p, s_sim=None) != replace(q, s_sim=None) or (p.s_sim is None) != (q.s_sim is None) or (
                p.s_sim is not None and q.s_sim is not None and abs(p.s_sim - q.s_sim) > S_SIM_TOLERANCE):
            raise ShardError(f"{where}: prompt {p.prompt_id!r} differs from the first shard's; the shards were "
                             "built differently: run them from one experiment file and toolkit version")


def _models(run: RunFolder) -> list[str]:
    """The models of a run folder, in the experiment's order (its manifest names each model's card)."""
    try:
        return list(json.loads(run.manifest.read_text())["models"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ShardError(f"{run.manifest}: missing or unreadable; the shard has not run: run it with "
                         "`probe run EXP --shard i/N`") from None


def _probe_records(folder: Path) -> list[Path]:
    root = RunFolder(folder).attention_root
    return sorted(root.rglob("*.npz")) if root.is_dir() else []


def _checked_records(here: RunFolder, trials: list[TrialRecord], prompts: list[Prompt]) -> list[Path]:
    """The shard's probe records, each held to its trial's prompt, its model's layers and heads and the sha256 it
    was written with (:class:`probe.attention.result.RecordCheck`): a record no trial of the shard made, or one that
    fails the check, is refused before anything is merged, so a merge never re-indexes a changed record."""
    from probe.attention.result import RecordCheck, SegmentAttention

    made = {here.attention_record(t.model, t.prompt_id, t.intervention): t for t in trials}
    check = RecordCheck.of(here, {p.prompt_id: p for p in prompts})
    paths = _probe_records(here.root)
    for path in paths:
        trial = made.get(path)
        if trial is None:
            raise ShardError(f"{path}: no trial of the shard made this probe record; remove it (or run the shard "
                             "again) before merging")
        check(path, trial.model, trial.prompt_id, SegmentAttention.load(path))
    return paths


def _check_like_first(here: RunFolder, first: RunFolder, first_cfg: ExperimentConfig, prompts: list[Prompt]) -> None:
    """A shard made as the first one: settings that determine records, prompts, tasks, interventions."""
    cfg = read_run_config(here.root)
    diffs = record_differences(first_cfg, cfg) if cfg is not None else ["config.toml missing"]
    if diffs:
        raise ShardError(f"{here.root}: made with other settings than {first.root} ({'; '.join(diffs)}); run every "
                         "shard from one experiment file")
    _same_prompts(prompts, load_prompts(here.prompts), here.root)
    for path, other, name in ((first.tasks, here.tasks, "tasks"), (first.interventions, here.interventions,
                                                                   "interventions")):
        if path.is_file() != other.is_file() or (path.is_file() and path.read_bytes() != other.read_bytes()):
            raise ShardError(f"{other}: its {name} differ from {path}; the shards were made differently: run them "
                             "from one experiment file")


def _finished_trials(here: RunFolder, shard: Shard, prompts: list[Prompt]) -> list[TrialRecord]:
    """The trials of a shard that ran its whole share and nothing else."""
    mine = {p.prompt_id for p in shard.select(prompts)}
    trials = load_trials(here.trials)
    foreign = next((t for t in trials if t.prompt_id not in mine), None)
    if foreign is not None:
        raise ShardError(f"{here.trials}: trial {foreign.trial_id!r} belongs to another shard's share; this folder is "
                         f"not shard {shard} of this run")
    baseline = {(t.model, t.prompt_id) for t in trials if t.intervention is None}
    short = [f"{m}: {len([p for p in mine if (m, p) not in baseline])}" for m in _models(here)
             if any((m, p) not in baseline for p in mine)]
    if short:
        raise ShardError(f"{here.root}: shard {shard} has not finished its share (prompts without a trial, by model: "
                         f"{', '.join(short)}); run `probe run EXP --shard {shard}` again to finish it")
    return trials


def merge_shards_into(run_dir: str | Path, shard_dirs: list[Path] | None = None, force: bool = False
                      ) -> MergeSummary:
    """Join the shards of a run into the run folder (docs/performance.md#shards-slurm-arrays-and-independent-machines).

    Args:
        run_dir: the run folder (``outputs/<name>``); its shards are looked for in ``<run>/shards/`` unless
            ``shard_dirs`` names them.
        shard_dirs: shard folders to merge (copied from other machines, anywhere).
        force: where the run folder holds trials the shards do not (a retry in a merged folder, another run), move
            its records aside (``superseded-<time>/``) and merge; without it the merge is refused. A folder whose
            trials the shards all hold (merged before) is merged again without it.

    Returns:
        The :class:`MergeSummary`.

    Raises:
        ShardError: the shards cannot be merged (the message says which and why), or the run folder holds trials
            they do not and ``force`` is not given; nothing is written then.
        RecordError: a shard's record file holds a damaged line.
    """
    run = RunFolder(run_dir)
    folders = list(shard_dirs) if shard_dirs else find_shards(run.root)
    if not folders:
        raise ShardError(f"{run.root}: no shard to merge (no {SHARDS_DIR}/<i>-of-<N>/{SHARD_FILE}); shards are "
                         "written by `probe run EXP --shard i/N`")
    by = _check_set([Path(f) for f in folders])
    first_dir = by[1]
    first_cfg = read_run_config(first_dir)
    if first_cfg is None:
        raise ShardError(f"{first_dir}: no config.toml; run the shard again")
    prompts = load_prompts(RunFolder(first_dir).prompts)
    trials: dict[str, TrialRecord] = {}
    owner: dict[str, Path] = {}
    records: dict[Path, Path] = {}  # relative path -> source
    for index, folder in by.items():
        shard = Shard(index, len(by))
        _check_like_first(RunFolder(folder), RunFolder(first_dir), first_cfg, prompts)
        done = _finished_trials(RunFolder(folder), shard, prompts)
        for t in done:
            if t.trial_id in trials:
                raise ShardError(f"trial {t.trial_id!r} is in two shards: {owner[t.trial_id]} and {folder}")
            trials[t.trial_id], owner[t.trial_id] = t, folder
        for path in _checked_records(RunFolder(folder), done, prompts):
            rel = path.relative_to(folder)
            if rel in records:
                raise ShardError(f"probe record {rel} is in two shards: {records[rel].parent} and {folder}")
            records[rel] = path
    return _write_merged(run, first_cfg, by, prompts, trials, records, force)


def _ordered(trials: dict[str, TrialRecord], prompts: list[Prompt], cfg: ExperimentConfig, models: list[str]
             ) -> list[TrialRecord]:
    """Trials in prompt order per model (the experiment's order), the baseline before each intervention."""
    model = {m: i for i, m in enumerate(models)}
    arm = {None: 0} | {iv.name: i + 1 for i, iv in enumerate(cfg.interventions)}
    order = {p.prompt_id: i for i, p in enumerate(prompts)}
    return sorted(trials.values(), key=lambda t: (model.get(t.model, len(model)), arm.get(t.intervention, len(arm)),
                                                  order[t.prompt_id]))


def _write_merged(run: RunFolder, shard_cfg: ExperimentConfig, by: dict[int, Path], prompts: list[Prompt],
                  trials: dict[str, TrialRecord], records: dict[Path, Path], force: bool) -> MergeSummary:
    _, marker = _read_marker(by[1])
    cfg = replace(shard_cfg, experiment=replace(shard_cfg.experiment, name=marker["experiment"],
                                                output_dir=marker["output_dir"]))
    with RunLock(run):
        kept = [t for t in load_trials(run.trials) if trials.get(t.trial_id) != t]
        if kept and not force:  # a merge again of the same shards (a data-parallel launch resumed) rewrites as it was
            raise ShardError(f"{run.trials}: the run folder holds {len(kept)} trials the shards do not (the first: "
                             f"{kept[0].trial_id!r}; a retry in the merged folder, or another run), which a merge "
                             "would replace: analyse the folder as it is, or merge with --force to move its records "
                             "aside first")
        if kept:
            log.warning("%s: --force: the folder's earlier records are moved to %s", run.root,
                        run.supersede(keep=(SHARDS_DIR,)))
        first = RunFolder(by[1])
        run.root.mkdir(parents=True, exist_ok=True)
        run.mark()
        write_atomic(run.config, dump_config(cfg), root=run.root)
        for src in (first.prompts, first.tasks, first.interventions):
            if src.is_file():
                write_atomic(run.root / src.name, src.read_bytes(), root=run.root)
        manifest = json.loads(first.manifest.read_text()) if first.manifest.is_file() else {}
        manifest["shards"] = [{"shard": f"{i}/{len(by)}", "folder": str(f),
                               "written": json.loads(RunFolder(f).manifest.read_text()).get("written")
                               if RunFolder(f).manifest.is_file() else None} for i, f in by.items()]
        write_atomic(run.manifest, json.dumps(manifest, indent=2, ensure_ascii=False), root=run.root)
        for rel, src in records.items():
            write_atomic(run.root / rel, src.read_bytes(), root=run.root)
        index_records(run, [run.root / rel for rel in records], None)
        ordered = _ordered(trials, prompts, cfg, _models(first))
        # last: a folder with trials is a merged one
        write_jsonl(run.trials, (t.to_dict() for t in ordered), root=run.root)
    return MergeSummary(run_dir=run.root, shards=tuple(by.values()), n_trials=len(ordered),
                        n_errors=sum(t.error is not None for t in ordered), n_probe_records=len(records))


__all__ = ["MergeSummary", "S_SIM_TOLERANCE", "SHARDS_DIR", "SHARD_FILE", "Shard", "ShardError", "find_shards",
           "merge_shards_into"]
