"""The analysis of a run as typed results, and its file ``analysis.json`` (versioned schema, arrays in
``attention_summary.npz``, freshness by the trials' sha256): docs/records.md#primary-and-derived-data."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from probe.analysis.interventions import InterventionResult
from probe.codec import DECODE, CodecError, decode, encode
from probe.config import AnalysisSection
from probe.errors import ProbeError
from probe.records_import import ImportSummary
from probe.runfolder import RunFolder, write_atomic

SCHEMA_VERSION = 8
# the key of ``analysis.json`` holding the sha256 of the ``attention_summary.npz`` written with it (absent: no arrays)
ARRAYS_SHA256 = "arrays_sha256"


class AnalysisFileError(ProbeError):
    """``analysis.json`` cannot be used as it is: missing, of another schema, malformed, or stale."""


class AnalysisMissingError(AnalysisFileError):
    """The run folder has no ``analysis.json``."""


class AnalysisSchemaError(AnalysisFileError):
    """``analysis.json`` was written with another schema version, or does not match this one."""


class StaleAnalysisError(AnalysisFileError):
    """``trials.jsonl`` changed after ``analysis.json`` was written."""


def from_json(tp: Any, data: Any, where: str = "analysis", arrays: Mapping[str, np.ndarray] | None = None) -> Any:
    """A value of type ``tp`` from its ``analysis.json`` form (:func:`probe.codec.decode`), Grids taken from
    ``arrays`` by the names the JSON gives.

    Raises:
        AnalysisSchemaError: a missing or unknown field, a value of the wrong type, or an array that ``arrays``
            lacks (names the field's path).
    """
    try:
        return decode(tp, data, where, arrays)
    except CodecError as e:
        raise AnalysisSchemaError(f"{e}; the file does not match analysis schema {SCHEMA_VERSION}") from None


# ------------------------------------------------------------------------------------------------- types


@dataclass(frozen=True)
class Inputs:
    """What an analysis read.

    Attributes:
        trials: the trial file (path as given).
        trials_sha256: its sha256 when it was read (the freshness check compares it with the file on disk).
        n_prompts: prompt records read from ``prompts.jsonl`` (0 when absent).
    """

    trials: str
    trials_sha256: str
    n_prompts: int


def _decode_families(data: Any, where: str, arrays: Mapping[str, np.ndarray]) -> dict[str, object]:
    from probe.analysis.families import family_analysis

    if not isinstance(data, dict):
        raise CodecError(where, "expected an object of family results")
    return {name: decode(family_analysis(name).result_type, value, f"{where}.{name}", arrays)
            for name, value in data.items()}


@dataclass(frozen=True)
class Analysis:
    """Everything ``probe analyze`` found in a run folder (``analysis.json``).

    Attributes:
        schema: :data:`SCHEMA_VERSION` of the file.
        run_dir: the run folder analysed.
        created: UTC time of the analysis (ISO 8601).
        inputs: the files read.
        settings: the ``[analysis]`` gates used (``alpha``, ``brittle_em``, ``confound_rate``, ``n_bootstrap``,
            ``embedder``).
        seed: the seed of every random draw of the analysis (power simulations, bootstraps).
        seed_source: where the settings and seed came from: ``config.toml``, ``argument`` or ``default`` (a run
            folder without ``config.toml``: the documented defaults, :data:`probe.analysis.run.DEFAULT_SEED`).
        n_trials: trial records; ``n_scored``, ``n_error``, ``n_skipped``: of these, scored, backend errors,
            skipped.
        n_trials_by_family: trial records per task family.
        models: every model with a trial, sorted.
        families: family name -> that family's result (the type its analysis registered).
        notes: what the analysis could not do or chose, in sentences.
        methods: method name -> one line on how it is estimated.
        imported: the import summary of a run folder made from another tool's file; None otherwise.
        interventions: the causal tests (:mod:`probe.analysis.interventions`); None when no trial ran under an
            intervention.
    """

    schema: int
    run_dir: str
    created: str
    inputs: Inputs
    settings: AnalysisSection
    seed: int
    seed_source: str
    n_trials: int
    n_scored: int
    n_error: int
    n_skipped: int
    n_trials_by_family: dict[str, int]
    models: tuple[str, ...]
    families: dict[str, object] = field(metadata={DECODE: _decode_families})
    notes: tuple[str, ...]
    methods: dict[str, str]
    imported: ImportSummary | None
    interventions: InterventionResult | None

    def family(self, name: str) -> object | None:
        """The result of family ``name``, or None when the run has no trial of it."""
        return self.families.get(name)


# ------------------------------------------------------------------------------------------------- file


def trials_sha256(run: RunFolder) -> str:
    """sha256 of the run's ``trials.jsonl`` as it is on disk now."""
    return hashlib.sha256(run.trials.read_bytes()).hexdigest()


def write_analysis(analysis: Analysis, run: RunFolder) -> Path:
    """Write ``analysis.json`` and the arrays its results hold (``attention_summary.npz``, removed when there are
    none), each whole or not at all (no NaN in the JSON: missing values are null). The arrays are written first and
    their sha256 goes into ``analysis.json`` (``arrays_sha256``), so a reader notices a pair of files from two
    analyses. Returns the path of ``analysis.json``."""
    arrays: dict[str, np.ndarray] = {}
    data = encode(analysis, arrays)
    assert isinstance(data, dict)
    if arrays:
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub: kwargs
        write_atomic(run.attention_summary, buf.getvalue(), root=run.root)
        data[ARRAYS_SHA256] = hashlib.sha256(buf.getvalue()).hexdigest()
    else:
        run.attention_summary.unlink(missing_ok=True)  # an earlier analysis' arrays would not match this one
    return write_atomic(run.analysis, json.dumps(data, indent=1, allow_nan=False, ensure_ascii=False), root=run.root)


def _read_arrays(run: RunFolder, sha: Any, redo: str) -> dict[str, np.ndarray]:
    """The arrays of ``attention_summary.npz`` that ``analysis.json`` names by their sha256 ``sha`` (None: none).

    Raises:
        AnalysisSchemaError: the file is missing, unreadable, or not the one that analysis wrote.
    """
    if sha is None:
        return {}
    path = run.attention_summary
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise AnalysisSchemaError(f"{path}: cannot be read ({e.strerror or e}), and {run.analysis} names its "
                                  f"arrays: {redo} again") from None
    if hashlib.sha256(raw).hexdigest() != sha:
        raise AnalysisSchemaError(f"{path} is not the file {run.analysis} was written with (the two are from "
                                  f"different analyses, or one was changed since): {redo} again")
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise AnalysisSchemaError(f"{path}: cannot be read ({type(e).__name__}: {e}): {redo} again") from None


def read_analysis(run_dir: str | Path | RunFolder, *, check_fresh: bool = True) -> Analysis:
    """The :class:`Analysis` in a run folder's ``analysis.json``, as it is on disk (nothing is re-estimated).

    Args:
        run_dir: the run folder.
        check_fresh: refuse an analysis of another version of ``trials.jsonl`` (sha256 differs).

    Raises:
        AnalysisMissingError: no ``analysis.json``.
        AnalysisSchemaError: written with another schema version, or not matching this one.
        StaleAnalysisError: ``trials.jsonl`` changed (or vanished) since the analysis.
        Each message names the file and says to run ``probe analyze``.
    """
    run = run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)
    redo = f"run `probe analyze {run.root}`"
    path = run.analysis
    if not path.is_file():
        raise AnalysisMissingError(f"{path}: not found; the run has not been analysed: {redo} first")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise AnalysisSchemaError(f"{path}: not valid JSON ({e}): {redo} again") from None
    found = data.get("schema") if isinstance(data, dict) else None
    if found != SCHEMA_VERSION:
        written = "schema 1 (before versions)" if found is None else f"schema {found!r}"
        raise AnalysisSchemaError(f"{path}: written with analysis {written}; this version of ICE-Probe reads schema "
                                  f"{SCHEMA_VERSION} only (an analysis is rewritten from the run's records): {redo} "
                                  "again")
    arrays = _read_arrays(run, data.pop(ARRAYS_SHA256, None), redo)
    try:
        analysis: Analysis = from_json(Analysis, data, str(path), arrays)
    except AnalysisSchemaError as e:
        raise AnalysisSchemaError(f"{e}: {redo} again") from None
    if check_fresh:
        if not run.trials.is_file():
            raise StaleAnalysisError(f"{run.trials}: gone since {path} was written: nothing to check it against")
        now = trials_sha256(run)
        if now != analysis.inputs.trials_sha256:
            raise StaleAnalysisError(
                f"{path} is stale: {run.trials} changed since it was written (sha256 "
                f"{analysis.inputs.trials_sha256[:12]}… then, {now[:12]}… now): {redo} again")
    return analysis


__all__ = ["Analysis", "AnalysisFileError", "AnalysisMissingError", "AnalysisSchemaError", "Inputs",
           "SCHEMA_VERSION", "StaleAnalysisError", "from_json", "read_analysis", "trials_sha256",
           "write_analysis"]
