"""``analyze_run``: the records of a run folder -> an :class:`Analysis` in ``analysis.json``, each family on its
baseline trials and the interventions on theirs (docs/statistics.md#what-probe-analyze-reports)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from pathlib import Path


from probe.analysis.families import FamilyData, FamilyOutput, family_analysis, family_order
from probe.analysis.frame import RunRecords, load_run_records
from probe.analysis.interventions import METHODS as INTERVENTION_METHODS
from probe.analysis.interventions import analyze_run_interventions, baseline_only
from probe.analysis.results import SCHEMA_VERSION, Analysis, Inputs, from_json, trials_sha256, write_analysis
from probe.config import AnalysisSection, load_config
from probe.errors import ConfigError
from probe.records_import import ImportSummary, import_external
from probe.runfolder import RunFolder

log = logging.getLogger(__name__)

DEFAULT_SEED = 0  # the seed of a run folder without config.toml (documented; recorded as seed_source "default")

METHODS = {
    "errors": "skipped trials and backend errors are counted, never scored as wrong",
}


class AnalysisConfigError(ConfigError):
    """The run's ``config.toml`` cannot be read, so the analysis does not know its gates and seed."""


def _as_run(run_dir: str | Path | RunFolder) -> RunFolder:
    return run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)


def resolve_settings(run: RunFolder, settings: AnalysisSection | None, seed: int | None
                     ) -> tuple[AnalysisSection, int, str]:
    """The analysis gates and seed of a run, and where they came from (see docs/statistics.md#what-probe-analyze-reports).

    Args:
        run: the run folder.
        settings: gates given by the caller, or None to read ``[analysis]`` of ``config.toml``.
        seed: seed given by the caller, or None to read ``[experiment] seed``.

    Returns:
        (settings, seed, source): source is ``argument`` (both given), ``config.toml`` or ``default`` (no
        ``config.toml``).

    Raises:
        AnalysisConfigError: ``config.toml`` exists but cannot be read (names the file and the problem).
    """
    if settings is not None and seed is not None:
        return settings, seed, "argument"
    if not run.config.is_file():
        return settings or AnalysisSection(), DEFAULT_SEED if seed is None else seed, "default"
    try:
        cfg = load_config(run.config)
    except ConfigError as e:
        raise AnalysisConfigError(
            f"{e} (the analysis reads its [analysis] gates and the experiment's seed from this file: fix it, or "
            "pass the settings and seed explicitly, and analyse again)") from None
    return (settings or cfg.analysis, cfg.experiment.seed if seed is None else seed, "config.toml")


def _family_data(run: RunFolder, data: RunRecords, family: str, settings: AnalysisSection, seed: int) -> FamilyData:
    rows = (data.frame["family"] == family).to_numpy()
    return FamilyData(family=family, run=run, frame=data.frame[rows],
                      trials=tuple(t for t, keep in zip(data.trials, rows) if keep), prompts=data.prompts,
                      tasks=data.tasks, settings=settings, seed=seed)


def analyze_run(
    run_dir: str | Path | RunFolder,
    settings: AnalysisSection | None = None,
    *,
    seed: int | None = None,
) -> Analysis:
    """Analyse a run folder and write ``analysis.json`` (and ``attention_summary.npz``) into it.

    Args:
        run_dir: the run folder (``outputs/<name>``) holding ``trials.jsonl``.
        settings: the analysis gates; None reads ``[analysis]`` of the run's ``config.toml``.
        seed: the seed of every random draw; None reads ``[experiment] seed`` of ``config.toml``.

    Returns:
        The :class:`probe.analysis.results.Analysis` written to ``analysis.json``.

    Raises:
        ProbeError: the folder holds no trial records; AnalysisConfigError: its ``config.toml`` is unreadable;
        UnknownNameError: trials of a family without a registered analysis.
    """
    run = _as_run(run_dir)
    settings, seed, seed_source = resolve_settings(run, settings, seed)
    notes: list[str] = []
    if seed_source == "default":
        notes.append(f"no config.toml in the run folder: default analysis gates and seed {seed} used")
    everything = load_run_records(run)
    data = baseline_only(everything)
    df = everything.frame
    sha = trials_sha256(run)
    families: dict[str, object] = {}
    methods = dict(METHODS)
    n_records = 0
    for name in family_order(set(data.frame["family"])):
        entry = family_analysis(name)
        out: FamilyOutput = entry.analyze(_family_data(run, data, name, settings, seed))
        if not isinstance(out.result, entry.result_type):
            raise TypeError(f"family {name!r}: analysis returned {type(out.result).__name__}, registered "
                            f"{entry.result_type.__name__}")
        families[name] = out.result
        notes += out.notes
        methods.update(entry.methods)
        n_records += out.n_attention_records
    if run.has_attention() and n_records == 0:
        notes.append("attention/ holds no record matching a trial (model, prompt_id)")
    interventions = analyze_run_interventions(run, everything, settings.alpha, seed)
    if interventions is not None:
        methods.update(INTERVENTION_METHODS)
        notes += interventions.notes
    analysis = Analysis(
        schema=SCHEMA_VERSION,
        run_dir=str(run.root),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        inputs=Inputs(trials=str(run.trials), trials_sha256=sha, n_prompts=len(data.prompts)),
        settings=settings,
        seed=seed,
        seed_source=seed_source,
        n_trials=int(len(df)),
        n_scored=int(df["is_scored"].sum()),
        n_error=int(df["error"].notna().sum()),
        n_skipped=int(df["skipped"].sum()),
        n_trials_by_family={name: int((df["family"] == name).sum()) for name in families},
        models=tuple(sorted(df["model"].unique().tolist())),
        families=families,
        notes=tuple(notes),
        methods=methods,
        imported=_import_summary(run),
        interventions=interventions,
    )
    write_analysis(analysis, run)
    log.info("%s: analysis of %d trials, %d models, families %s written", run.root, len(df), len(analysis.models),
             ", ".join(families))
    return analysis


def tabulate_run(run_dir: str | Path | RunFolder, alpha: float | None = None) -> Analysis:
    """The cells of a run folder (every family's ``tabulate``), computed from its trials without writing anything.

    The quick table ``probe run`` prints: no fit, no power, no attention, no file written. The returned
    :class:`Analysis` is not the run's analysis: its families hold cells only.

    Args:
        run_dir: the run folder.
        alpha: 1 − confidence level of the cells' CIs; None takes the run's settings (as :func:`analyze_run`).
    """
    run = _as_run(run_dir)
    settings, seed, source = resolve_settings(run, None, None)
    if alpha is not None:
        settings = dataclasses.replace(settings, alpha=alpha)
    everything = load_run_records(run)
    data = baseline_only(everything)
    df = everything.frame
    families = {name: family_analysis(name).tabulate(_family_data(run, data, name, settings, seed))
                for name in family_order(set(data.frame["family"]))}
    return Analysis(
        schema=SCHEMA_VERSION, run_dir=str(run.root), created=dt.datetime.now(dt.timezone.utc).isoformat(
            timespec="seconds"), inputs=Inputs(str(run.trials), trials_sha256(run), len(data.prompts)),
        settings=settings, seed=seed, seed_source=source, n_trials=int(len(df)), n_scored=int(df["is_scored"].sum()),
        n_error=int(df["error"].notna().sum()), n_skipped=int(df["skipped"].sum()),
        n_trials_by_family={name: int((df["family"] == name).sum()) for name in families},
        models=tuple(sorted(df["model"].unique().tolist())), families=families, notes=(), methods={},
        imported=_import_summary(run), interventions=None)


def _import_summary(run: RunFolder) -> ImportSummary | None:
    """The import summary of a run folder made from another tool's file (None for the toolkit's own runs).

    Raises:
        ProbeError: ``manifest.json`` is not valid JSON, or its import summary does not match
            :class:`probe.records_import.ImportSummary`.
    """
    manifest = run.read_manifest()
    if manifest is None or manifest.get("imported_from") is None:
        return None
    return from_json(ImportSummary, manifest["imported_from"], f"{run.manifest}: imported_from")


IMPORT_SEED = 0  # another tool's file carries no experiment seed: the analysis' power simulations use this one


def analyze_external(
    path: str | Path,
    mapping: str | Path | dict[str, str] | None = None,
    out_dir: str | Path | None = None,
    *,
    max_new_tokens: int | None = None,
    tokenizer: str | None = None,
    aliases: dict[str, str] | None = None,
    settings: AnalysisSection | None = None,
    seed: int = IMPORT_SEED,
) -> tuple[Analysis, Path]:
    """Re-score another tool's trial file into a run folder (:func:`probe.records_import.import_external`), then
    analyse that folder like any other (:func:`analyze_run`).

    Args:
        path: the external CSV/JSONL file.
        mapping: column mapping (see :func:`probe.records_import.parse_mapping`).
        out_dir: run folder to create; default ``outputs/<file stem>``.
        max_new_tokens: the generation limit the tool used.
        tokenizer: local tokenizer folder to count output tokens with.
        aliases: extra condition-name aliases.
        settings: analysis gates (default :class:`probe.config.AnalysisSection`).
        seed: seed of the analysis' random draws (the file carries no experiment seed; default
            :data:`IMPORT_SEED`).

    Returns:
        (the :class:`probe.analysis.results.Analysis`, path of ``analysis.json``).
    """
    out, _ = import_external(path, mapping, out_dir, max_new_tokens=max_new_tokens, tokenizer=tokenizer,
                             aliases=aliases)
    analysis = analyze_run(out, settings or AnalysisSection(), seed=seed)
    return analysis, out.analysis


__all__ = ["AnalysisConfigError", "DEFAULT_SEED", "IMPORT_SEED", "analyze_external", "analyze_run", "resolve_settings",
           "tabulate_run"]
