"""The analysis of a run as typed results, and its file ``analysis.json`` (versioned schema).

An analysis is one :class:`Analysis`: what was read (:class:`Inputs`), the settings and seed used, counts, and one
result per task family that has trials (``families``: family name -> that family's result type, e.g.
:class:`probe.analysis.ice.IceResult`, :class:`probe.analysis.cogniload.CogniloadResult`). Every result is a
frozen dataclass; the report and ``probe compare`` read these types, never a dict.

``analysis.json`` is :func:`to_json` of the :class:`Analysis`; :func:`read_analysis` turns it back into the same
types with :func:`from_json`, which checks every field against the dataclass (a missing or unknown field is an
error, never a default). The file carries ``schema`` (:data:`SCHEMA_VERSION`); a file of another version is refused
with the instruction to re-run ``probe analyze``: an analysis is derived data, rewritten from the run's records by
that one command, so no older layout is read or upgraded (docs/records.md says which files are primary data, read
in every format they were written in).

Additive sections (no schema change): a field whose metadata carries :data:`OMIT_EMPTY` is written only when it
holds something and read as empty when absent: ``families.ice.retrieval`` (retrieval heads,
:class:`probe.analysis.retrieval.RetrievalHeads`, present when probe records hold an answer capture).

Freshness: an analysis records the sha256 of the ``trials.jsonl`` it read; :func:`read_analysis` refuses one whose
trials have changed since (:class:`StaleAnalysisError`) unless asked not to check.

Arrays: a result holds each array as a :class:`probe.analysis.grid.Grid` field. :func:`write_analysis` writes
them to ``attention_summary.npz`` under their place in the analysis (``families.ice.attention_cells[3].enrichment``),
puts that name in the JSON and the file's sha256 under ``arrays_sha256``; :func:`read_analysis` checks the sha256
and reads each array back into its field.

Optional sections: a field declared with ``metadata={OPTIONAL: True}`` (default None) is written only when it holds
a value, and a field absent from the file takes its default: ``families.ice.hop_tracking`` (hop tracking, present
when the run captured attention while the answer was written).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import types
import typing
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Union

import numpy as np

from probe.analysis.grid import Grid
from probe.analysis.interventions import InterventionResult
from probe.config import AnalysisSection
from probe.errors import ProbeError
from probe.records_import import ImportSummary
from probe.runfolder import ATTENTION_SUMMARY, RunFolder, write_atomic

SCHEMA_VERSION = 8
# the key of ``analysis.json`` holding the sha256 of the ``attention_summary.npz`` written with it (absent: no arrays)
ARRAYS_SHA256 = "arrays_sha256"

OPTIONAL = "optional"  # field metadata: written only when not None, read as None when absent (module docstring)
# field metadata key of an additive section: written only when non-empty, read as its (empty) default when absent,
# so files written before the section existed, or by runs without its inputs, read unchanged
OMIT_EMPTY = "omit_empty"

JsonValue = Union[None, bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"]]


class AnalysisFileError(ProbeError):
    """``analysis.json`` cannot be used as it is: missing, of another schema, malformed, or stale."""


class AnalysisMissingError(AnalysisFileError):
    """The run folder has no ``analysis.json``."""


class AnalysisSchemaError(AnalysisFileError):
    """``analysis.json`` was written with another schema version, or does not match this one."""


class StaleAnalysisError(AnalysisFileError):
    """``trials.jsonl`` changed after ``analysis.json`` was written."""


# ------------------------------------------------------------------------------------------------- codec


def _place(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def to_json(x: object, arrays: dict[str, np.ndarray] | None = None, where: str = "") -> JsonValue:
    """A JSON-ready value: dataclasses by field, tuples as lists, NaN/inf as None, numpy scalars as Python.

    A :class:`~probe.analysis.grid.Grid` is put into ``arrays`` under its place ``where`` (field names joined by
    dots, ``[i]`` for an item: ``families.ice.attention_cells[3].enrichment``) and stands in the JSON as that name;
    without ``arrays`` (a CSV row, a comparison of numbers) a Grid is left out.
    """
    if isinstance(x, Grid):
        assert arrays is not None and where not in arrays, where
        arrays[where] = x.values
        return where
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        out: dict[str, JsonValue] = {}
        for f in dataclasses.fields(x):
            value = getattr(x, f.name)
            if (f.metadata.get(OPTIONAL) and value is None) or (f.metadata.get(OMIT_EMPTY) and not value) or (
                    isinstance(value, Grid) and arrays is None):
                continue
            out[f.name] = to_json(value, arrays, _place(where, f.name))
        return out
    if isinstance(x, dict):
        return {str(k): to_json(v, arrays, _place(where, str(k))) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_json(v, arrays, f"{where}[{i}]") for i, v in enumerate(x)]
    if isinstance(x, np.ndarray):
        return [to_json(v) for v in x.tolist()]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(float(x)) else None
    if x is None or isinstance(x, str):
        return x
    raise TypeError(f"{type(x).__name__} {x!r} has no JSON form in an analysis")


class _Mismatch(Exception):
    """A value that does not fit the field's type (caught and re-raised as AnalysisSchemaError)."""


def _type_name(tp: object) -> str:
    return getattr(tp, "__name__", None) or str(tp)


def from_json(tp: Any, data: JsonValue, where: str = "analysis",
              arrays: Mapping[str, np.ndarray] | None = None) -> Any:
    """Build a value of type ``tp`` (a dataclass, ``tuple[X, ...]``, ``dict[str, X]``, ``X | None``, a scalar, a
    ``Literal`` or a :class:`~probe.analysis.grid.Grid`, taken from ``arrays`` by the name the JSON gives) from its
    :func:`to_json` form, checking every field.

    Raises:
        AnalysisSchemaError: a missing or unknown field, a value of the wrong type, or an array that ``arrays``
            lacks (names the field's path).
    """
    try:
        return _decode(tp, data, where, arrays or {})
    except _Mismatch as e:
        raise AnalysisSchemaError(f"{e}; the file does not match analysis schema {SCHEMA_VERSION}") from None


def _decode(tp: Any, data: Any, where: str, arrays: Mapping[str, np.ndarray]) -> Any:
    if tp is Any or tp is object:
        return data
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if data is None:
            if type(None) in args:
                return None
            raise _Mismatch(f"{where}: null where {_type_name(tp)} is required")
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _decode(options[0], data, where, arrays)
        for a in options:  # several scalar types (int | float): the first that takes the value as it is
            if a in (int, float, str, bool) and isinstance(data, a) and not (a is not bool and isinstance(data, bool)):
                return data
        for a in options:
            try:
                return _decode(a, data, where, arrays)
            except _Mismatch:
                continue
        raise _Mismatch(f"{where}: {data!r} is none of {_type_name(tp)}")
    if origin is Literal:
        if data not in typing.get_args(tp):
            raise _Mismatch(f"{where}: {data!r} is not one of {typing.get_args(tp)}")
        return data
    if origin is tuple:
        if not isinstance(data, list):
            raise _Mismatch(f"{where}: expected a list, got {type(data).__name__}")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v, f"{where}[{i}]", arrays) for i, v in enumerate(data))
        if len(args) != len(data):
            raise _Mismatch(f"{where}: expected {len(args)} items, got {len(data)}")
        return tuple(_decode(a, v, f"{where}[{i}]", arrays) for i, (a, v) in enumerate(zip(args, data)))
    if origin is dict:
        if not isinstance(data, dict):
            raise _Mismatch(f"{where}: expected an object, got {type(data).__name__}")
        _, value_tp = typing.get_args(tp)
        return {k: _decode(value_tp, v, f"{where}.{k}", arrays) for k, v in data.items()}
    if tp is Grid:
        if not isinstance(data, str):
            raise _Mismatch(f"{where}: expected the name of an array, got {data!r}")
        if data not in arrays:
            raise _Mismatch(f"{where}: names the array {data!r}, which {ATTENTION_SUMMARY} lacks")
        return Grid(arrays[data])
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, data, where, arrays)
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise _Mismatch(f"{where}: expected a number, got {data!r}")
        return float(data)
    if tp in (int, str, bool):
        if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
            raise _Mismatch(f"{where}: expected {tp.__name__}, got {data!r}")
        return data
    raise TypeError(f"{where}: the analysis codec cannot read type {_type_name(tp)}")


def _decode_dataclass(cls: type, data: Any, where: str, arrays: Mapping[str, np.ndarray]) -> Any:
    if not isinstance(data, dict):
        raise _Mismatch(f"{where}: expected an object ({cls.__name__}), got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = {f.name for f in fields}
    unknown = sorted(set(data) - names)
    if unknown:
        raise _Mismatch(f"{where}: unknown field {unknown[0]!r} of {cls.__name__}")
    # an optional or omitted-when-empty field (module docstring): absent, it takes its default
    missing = [f.name for f in fields if f.name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise _Mismatch(f"{where}: missing field {missing[0]!r} of {cls.__name__}")
    values: dict[str, Any] = {}
    for f in fields:
        if f.name not in data:
            continue
        decode: Callable[[Any, str, Mapping[str, np.ndarray]], Any] | None = f.metadata.get("decode")
        sub = f"{where}.{f.name}"
        values[f.name] = (decode(data[f.name], sub, arrays) if decode
                          else _decode(hints[f.name], data[f.name], sub, arrays))
    return cls(**values)


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
        raise _Mismatch(f"{where}: expected an object of family results")
    return {name: _decode(family_analysis(name).result_type, value, f"{where}.{name}", arrays)
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
    families: dict[str, object] = field(metadata={"decode": _decode_families})
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
    data = to_json(analysis, arrays)
    assert isinstance(data, dict)
    if arrays:
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub: kwargs
        write_atomic(run.attention_summary, buf.getvalue())
        data[ARRAYS_SHA256] = hashlib.sha256(buf.getvalue()).hexdigest()
    else:
        run.attention_summary.unlink(missing_ok=True)  # an earlier analysis' arrays would not match this one
    return write_atomic(run.analysis, json.dumps(data, indent=1, allow_nan=False, ensure_ascii=False))


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


__all__ = ["Analysis", "AnalysisFileError", "AnalysisMissingError", "AnalysisSchemaError", "Inputs", "OPTIONAL",
           "SCHEMA_VERSION", "StaleAnalysisError", "from_json", "read_analysis", "to_json", "trials_sha256",
           "write_analysis"]
