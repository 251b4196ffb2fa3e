"""Trial records written by other tools (CSV or JSONL), re-scored with the toolkit's scoring into a run folder
(docs/records.md#records-written-by-another-tool)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import re
import tomllib
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from probe.errors import ConfigError, ProbeError, UnknownNameError
from probe.records import TrialRecord, make_trial_id, write_jsonl
from probe.runfolder import RunFolder, make_prompt_id, write_atomic
from probe.types import CONDITIONS, Task
log = logging.getLogger(__name__)

FIELDS: tuple[str, ...] = ("model", "condition", "output", "gold", "task_id", "question", "load", "replication",
                           "run", "truncated", "completion_tokens", "source_em")
REQUIRED: tuple[str, ...] = ("model", "condition", "output", "gold")

CONDITION_ALIASES: dict[str, str] = {
    "control": "Control",
    "longcontrol": "LongControl",
    "longcontextcontrol": "LongControl",
    "saturation": "Saturation",
    "contextsaturation": "Saturation",
    "residue": "Residue",
    "attentionalresidue": "Residue",
}

PRESETS: dict[str, dict[str, str]] = {
    "ice-paper": {"model": "model", "condition": "condition", "output": "output", "gold": "ground_truth",
                  "load": "irrelevant_percent", "replication": "replication", "run": "source_file",
                  "source_em": "accuracy"},
}

DEFAULT_ERROR_PATTERN = r"^\s*API_ERROR\b"
_MISSING = ("", "none", "nan", "null")


class ExternalTrialsError(ProbeError):
    """A row of another tool's trial file cannot be read (names ``file:line``, the column and the value)."""


@dataclass(frozen=True)
class ImportSummary:
    """How another tool's trial file was read (``manifest.json`` ``imported_from``; ``Analysis.imported``).

    Attributes:
        file, sha256: the file and its sha256; n_rows: rows read.
        mapping: field -> column used; preset: the preset applied (``ice-paper``) or None;
        condition_aliases: condition names of the file -> toolkit conditions.
        truncation_rule: the rule that decided truncation (docs/records.md#records-written-by-another-tool); error_pattern: the backend-error
            regex; max_new_tokens, tokenizer: as given.
        n_error, n_skipped, n_truncated, n_uninterpretable, n_scored: rows of each kind; n_duplicate_keys: rows
            repeating a (model, task, condition, load, replication) key; n_tasks: distinct task ids.
    """

    file: str
    sha256: str
    n_rows: int
    mapping: dict[str, str]
    preset: str | None
    condition_aliases: dict[str, str]
    truncation_rule: str
    error_pattern: str
    max_new_tokens: int | None
    tokenizer: str | None
    n_error: int
    n_skipped: int
    n_truncated: int
    n_uninterpretable: int
    n_scored: int
    n_duplicate_keys: int
    n_tasks: int
_SENTENCE_END = set(".!?)]}\"'*`”’»")


def parse_mapping(spec: str | Path | dict[str, str] | None) -> tuple[dict[str, str], dict[str, str]]:
    """Read a column mapping: ``"field=column,..."``, a TOML file, or a dict.

    A TOML file has a ``[map]`` table (field = "column") and optionally a ``[conditions]`` table
    ("name in the file" = "toolkit condition").

    Returns:
        (mapping field -> column, condition aliases file name -> toolkit condition).

    Raises:
        ConfigError: an unknown field, a malformed pair or an alias to an unknown condition.
    """
    aliases: dict[str, str] = {}
    if spec is None:
        return {}, aliases
    if isinstance(spec, dict):
        mapping = dict(spec)
    elif isinstance(spec, Path) or str(spec).endswith(".toml"):
        path = Path(spec)
        if not path.is_file():
            raise ConfigError(f"{path}: mapping file not found")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        except RecursionError:
            raise ConfigError(f"{path}: tables nested deeper than a mapping's") from None
        unknown = set(data) - {"map", "conditions"}
        if unknown:
            raise ConfigError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}; valid: map, conditions")
        mapping = {str(k): str(v) for k, v in data.get("map", {}).items()}
        aliases = {str(k): str(v) for k, v in data.get("conditions", {}).items()}
    else:
        mapping = {}
        for pair in str(spec).split(","):
            if not pair.strip():
                continue
            if "=" not in pair:
                raise ConfigError(f"--map: {pair!r} is not field=column (e.g. condition=cond)")
            k, v = pair.split("=", 1)
            mapping[k.strip()] = v.strip()
    for k in mapping:
        if k not in FIELDS:
            raise UnknownNameError("mapping field", k, FIELDS)
    for k, v in aliases.items():
        if v not in CONDITIONS:
            raise ConfigError(f"[conditions] {k} = {v!r}: not one of {', '.join(CONDITIONS)}")
    return mapping, aliases


def read_rows(path: Path) -> list[tuple[int, dict[str, str]]]:
    """Rows of a CSV (leading blank lines allowed) or JSONL file as (line, dict of strings / JSON values).

    ``line`` is the 1-based line of the file where the row starts (a CSV cell may span lines).

    Raises:
        ProbeError: unreadable file or unknown extension.
    """
    if not path.is_file():
        raise ProbeError(f"{path}: no such file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        lineno = raw[:e.start].count(b"\n") + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise ProbeError(f"{path}:{lineno}: not UTF-8 text: byte 0x{raw[e.start]:02x} at column {column} (byte offset "
                         f"{e.start} in the file); save the file as UTF-8 (is it Latin-1?)") from None
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        rows = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append((i, json.loads(line)))
                except json.JSONDecodeError as e:
                    raise ProbeError(f"{path}:{i}: not a JSON object ({e})") from None
                except RecursionError:
                    raise ProbeError(f"{path}:{i}: JSON nested deeper than a trial record is") from None
        return rows
    if suffix in (".csv", ".tsv"):
        body = text.lstrip("\r\n")
        skipped = text[: len(text) - len(body)].count("\n")  # blank lines before the header
        reader = csv.DictReader(io.StringIO(body), delimiter="\t" if suffix == ".tsv" else ",")
        out: list[tuple[int, dict[str, str]]] = []
        start = 2  # the header is line 1 of the body
        try:
            for row in reader:
                out.append((skipped + start, row))
                start = reader.line_num + 1
        except csv.Error as e:  # a cell over the csv module's field limit (128 KiB), a NUL, a broken quote
            raise ProbeError(f"{path}:{skipped + reader.line_num + 1}: not a readable CSV row ({e}); a trial's cell is "
                             "never that long: check the file's quoting") from None
        return out
    raise ProbeError(f"{path}: unknown file type {suffix!r}; give a .csv, .tsv or .jsonl file")


def resolve_mapping(columns: list[str], mapping: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """Complete a mapping with same-named columns, or apply a preset when nothing was given.

    Returns:
        (complete mapping, preset name or None).

    Raises:
        ConfigError: a mapped column is missing, or a required field has no column.
    """
    preset = None
    if not mapping:
        for name, pm in PRESETS.items():
            if all(c in columns for c in pm.values()):
                mapping, preset = dict(pm), name
                break
    full = dict(mapping)
    for f in FIELDS:
        if f not in full and f in columns:
            full[f] = f
    for f, c in full.items():
        if c not in columns:
            raise ConfigError(f"mapping {f}={c}: the file has no column {c!r} (columns: {', '.join(columns)})")
    missing = [f for f in REQUIRED if f not in full]
    if missing:
        raise ConfigError(f"mapping: no column for {', '.join(missing)}; give --map {missing[0]}=<column> "
                          f"(columns: {', '.join(columns)})")
    return full, preset


def canonical_condition(name: str, aliases: dict[str, str]) -> str:
    """The toolkit condition of a file's condition name (exact, user alias, or built-in alias, case-insensitive).

    Raises:
        UnknownNameError: no match.
    """
    if name in CONDITIONS:
        return name
    if name in aliases:
        return aliases[name]
    key = re.sub(r"[^a-z]", "", name.lower())
    if key in CONDITION_ALIASES:
        return CONDITION_ALIASES[key]
    raise UnknownNameError("condition", name, [*CONDITIONS, *aliases, "ContextSaturation", "LongContextControl",
                                               "AttentionalResidue"])


def has_final_answer(text: str) -> bool:
    """Whether an output states an explicit final answer: a complete ``\\boxed{}`` or an "Answer:" line.

    Uses the extraction of :mod:`probe.scoring.answers`, so "explicit" means what the scorer would take as the answer
    before falling back to the last line.
    """
    probe_task = Task(task_id="", source="", question="", gold="", hops=())
    return _scorer()(text, probe_task, False).extraction in ("boxed", "answer_line")


def ends_mid_sentence(text: str) -> bool:
    """Whether an output stops mid-sentence (see docs/records.md#records-written-by-another-tool's text rule)."""
    body = text.rstrip()
    if not body:
        return False
    if body[-1] not in _SENTENCE_END:
        return True
    last_line = body.splitlines()[-1]
    if body.count("\\[") > body.count("\\]") or body.count("\\(") > body.count("\\)"):
        return True
    return last_line.count("**") % 2 == 1


def _as_bool(v: object) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "y", "t")


def _as_int(v: object, field: str, column: str, where: str) -> int:
    """The integer in a cell; a blank or ``nan`` cell is an error naming ``where`` (file:line) and the column."""
    s = "" if v is None else str(v).strip()
    if s.lower() in _MISSING:
        raise ExternalTrialsError(f"{where}: column {column!r} ({field}) is {'blank' if not s else repr(s)}; every "
                                  f"row needs a number there (fill it in, or map another column)")
    try:
        return int(float(s))
    except ValueError:
        raise ExternalTrialsError(f"{where}: column {column!r} ({field}) = {v!r} is not a number") from None


def _scorer() -> Callable:
    try:
        from probe.scoring.answers import score_output
    except ImportError as e:
        raise ProbeError(f"probe.scoring is not available ({e}); external records cannot be re-scored") from None
    return score_output


def _token_counter(tokenizer: str | None) -> Callable[[str], int] | None:
    if tokenizer is None:
        return None
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ProbeError(f"tokenizer {tokenizer!r} cannot be loaded offline ({e}); give a local folder") from None
    return lambda text: len(tok(text, add_special_tokens=False)["input_ids"])


def load_external_trials(
    path: str | Path,
    mapping: str | Path | dict[str, str] | None = None,
    *,
    aliases: dict[str, str] | None = None,
    max_new_tokens: int | None = None,
    tokenizer: str | None = None,
    error_pattern: str = DEFAULT_ERROR_PATTERN,
) -> tuple[list[TrialRecord], ImportSummary]:
    """Read and re-score another tool's trial file.

    Args:
        path: CSV/TSV/JSONL file.
        mapping: column mapping (see :func:`parse_mapping`); None uses same-named columns or a preset.
        aliases: extra condition-name aliases (file name -> toolkit condition).
        max_new_tokens: the generation limit the tool used (truncation rule 2).
        tokenizer: local tokenizer folder to count output tokens with (rule 2).
        error_pattern: regex; an output matching it is a backend error.

    Returns:
        (trial records, :class:`ImportSummary` with the mapping, truncation rule and counts).

    Raises:
        ProbeError / ConfigError: unreadable file, bad mapping, unknown condition.
        ExternalTrialsError: a blank, ``nan`` or non-numeric cell in a mapped numeric column (``file:line``).
    """
    path = Path(path)
    map_given, file_aliases = parse_mapping(mapping)
    aliases = {**file_aliases, **(aliases or {})}
    rows = read_rows(path)
    if not rows:
        raise ProbeError(f"{path}: holds no row")
    full, preset = resolve_mapping(list(rows[0][1].keys()), map_given)
    count = _token_counter(tokenizer) if max_new_tokens is not None else None
    reader = _RowReader(path, full, aliases, max_new_tokens, count, re.compile(error_pattern), _scorer())
    reader.index_replications(rows)
    trials: list[TrialRecord] = []
    seen: Counter[str] = Counter()
    for i, (line, row) in enumerate(rows, 1):
        base = reader.record(i, f"{path}:{line}", row)
        seen[base.trial_id] += 1
        if seen[base.trial_id] > 1:
            base = replace(base, trial_id=f"{base.trial_id}#{seen[base.trial_id]}")
        trials.append(reader.scored(base, row, f"{path}:{line}"))
    dups = sum(v - 1 for v in seen.values() if v > 1)
    summary = ImportSummary(
        file=str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest(), n_rows=len(rows), mapping=full,
        preset=preset, condition_aliases=aliases, truncation_rule=reader.truncation_rule(tokenizer),
        error_pattern=error_pattern, max_new_tokens=max_new_tokens, tokenizer=tokenizer,
        n_error=sum(t.error is not None for t in trials), n_skipped=sum(t.skipped for t in trials),
        n_truncated=sum(t.truncated for t in trials), n_uninterpretable=sum(t.uninterpretable for t in trials),
        n_scored=sum(t.is_scored for t in trials), n_duplicate_keys=dups, n_tasks=len({t.task_id for t in trials}),
    )
    if dups:
        log.warning("%s: %d rows repeat a (model, task, condition, load, replication) key; map a run column", path, dups)
    return trials, summary


@dataclass
class _RowReader:
    """Reads the rows of one file into trial records through its column mapping (``full``: field -> column)."""

    path: Path
    full: dict[str, str]
    aliases: dict[str, str]
    max_new_tokens: int | None
    count: Callable[[str], int] | None  # the tokenizer's output-token count (rule 2), when one is given
    error_re: re.Pattern
    score_output: Callable
    rep_index: dict[tuple[str, int], int] = field(default_factory=dict)

    def get(self, row: dict, name: str, default: object = None) -> object:
        """A mapped field of a row (``default`` when the field is not mapped)."""
        return row.get(self.full[name], default) if name in self.full else default

    def number(self, row: dict, name: str, where: str) -> int:
        """A mapped numeric field of a row (0 when the field is not mapped: the documented default)."""
        return _as_int(self.get(row, name), name, self.full[name], where) if name in self.full else 0

    def index_replications(self, rows: list[tuple[int, dict]]) -> None:
        """Number the (run, replication) pairs of the file 0, 1, … (a run column makes each run's reps distinct)."""
        pairs = {(str(self.get(r, "run", "")), self.number(r, "replication", f"{self.path}:{line}"))
                 for line, r in rows}
        self.rep_index = {k: i for i, k in enumerate(sorted(pairs))}

    def truncation_rule(self, tokenizer: str | None) -> str:
        """How truncation is decided, in words (the import summary's ``truncation_rule``)."""
        if "truncated" in self.full:
            return f"column {self.full['truncated']!r}"
        if self.max_new_tokens is not None and ("completion_tokens" in self.full or self.count is not None):
            how = (f"column {self.full['completion_tokens']!r}" if "completion_tokens" in self.full
                   else f"counted with {tokenizer}")
            return f">= {self.max_new_tokens} output tokens ({how})"
        rule = "text: no explicit final answer and stops mid-sentence"
        if self.max_new_tokens is not None:
            rule += f" (max_new_tokens={self.max_new_tokens} given without token counts or a tokenizer)"
        return rule

    def record(self, i: int, where: str, row: dict) -> TrialRecord:
        """The unscored trial record of the ``i``-th row (1-based) at ``where`` (``file:line``)."""
        model = str(self.get(row, "model", "")).strip()
        if not model:
            raise ProbeError(f"{where}: empty model ({self.full['model']})")
        condition = canonical_condition(str(self.get(row, "condition", "")).strip(), self.aliases)
        load = 0 if condition == "Control" else self.number(row, "load", where)
        gold_raw = self.get(row, "gold")
        gold = gold_raw if isinstance(gold_raw, (list, dict)) else str(gold_raw)
        question = self.get(row, "question")
        task_id = str(self.get(row, "task_id") or question or gold)
        run = str(self.get(row, "run", ""))
        rep_raw = self.number(row, "replication", where)
        replication = self.rep_index[(run, rep_raw)] if "run" in self.full else rep_raw
        output_raw = self.get(row, "output")
        meta: dict = {"source_file": self.path.name, "source_row": i}
        if "run" in self.full:
            meta.update(run=run, source_replication=rep_raw)
        if "source_em" in self.full:
            meta["source_em"] = self.get(row, "source_em")
        prompt_id = make_prompt_id(task_id, condition, load, replication)
        return TrialRecord(trial_id=make_trial_id(model, prompt_id), model=model, prompt_id=prompt_id,
                           task_id=task_id, source=self.path.name, condition=condition, load=load,
                           achieved_load=float(load), replication=replication, prompt_tokens=0,
                           output=None if output_raw is None else str(output_raw), answer=None, gold=gold, em=None,
                           hop_recall=None, truncated=False, uninterpretable=False, meta=meta)

    def scored(self, base: TrialRecord, row: dict, where: str) -> TrialRecord:
        """``base`` re-scored: skipped without output, an error when the output matches the error pattern."""
        output = base.output
        if output is None or not output.strip():
            return replace(base, skipped=True, skip_reason="no output in the file")
        if self.error_re.search(output):
            return replace(base, error=output.strip().splitlines()[0][:300])
        n_tokens: int | None = None
        if "completion_tokens" in self.full:
            n_tokens = self.number(row, "completion_tokens", where)
        elif self.count is not None:
            n_tokens = self.count(output)
        if "truncated" in self.full:
            truncated = _as_bool(self.get(row, "truncated"))
        elif self.max_new_tokens is not None and n_tokens is not None:
            truncated = n_tokens >= self.max_new_tokens
        else:
            truncated = not has_final_answer(output) and ends_mid_sentence(output)
        task = Task(task_id=base.task_id, source=self.path.name, question=str(self.get(row, "question") or ""),
                    gold=base.gold, hops=())
        score = self.score_output(output, task, truncated)
        return replace(base, answer=score.answer, em=float(score.em), truncated=score.truncated,
                       extraction=score.extraction, uninterpretable=score.uninterpretable, completion_tokens=n_tokens)


def import_external(
    path: str | Path,
    mapping: str | Path | dict[str, str] | None = None,
    out_dir: str | Path | None = None,
    *,
    max_new_tokens: int | None = None,
    tokenizer: str | None = None,
    aliases: dict[str, str] | None = None,
) -> tuple[RunFolder, ImportSummary]:
    """Re-score another tool's trial file into a run folder.

    Writes ``trials.jsonl`` (replacing any earlier import) and ``manifest.json`` (``imported_from``: the source
    file, its sha256, the mapping and the truncation rule, an :class:`ImportSummary`) into ``out_dir``, which must
    be new, empty or an earlier import: a probe run's folder (its config or prompts) and a folder that is not a run
    folder are refused, and nothing in them changes.

    Args:
        path: the external CSV/JSONL file.
        mapping: column mapping (see :func:`parse_mapping`).
        out_dir: run folder to create; default ``outputs/<file stem>``.
        max_new_tokens: the generation limit the tool used.
        tokenizer: local tokenizer folder to count output tokens with.
        aliases: extra condition-name aliases.

    Returns:
        (the run folder, the :class:`ImportSummary`).

    Raises:
        ExternalTrialsError: the file cannot be read, or ``out_dir`` holds what an import must not replace.
    """
    path = Path(path)
    trials, summary = load_external_trials(path, mapping, aliases=aliases, max_new_tokens=max_new_tokens,
                                           tokenizer=tokenizer)
    out = RunFolder(Path(out_dir) if out_dir is not None
                    else Path("outputs") / re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem))
    earlier = out.foreign() == [] and not out.config.exists() and not out.prompts.exists()
    if not earlier:  # a probe run's records, or a folder that is not a run folder: never replaced
        found = ", ".join(out.foreign() or [p.name for p in (out.config, out.prompts) if p.exists()])
        raise ExternalTrialsError(f"{out.root}: holds {found}, which an import would replace; nothing was written. "
                                  "Import into a new folder (--out)")
    out.root.mkdir(parents=True, exist_ok=True)
    out.mark()
    write_jsonl(out.trials, (t.to_dict() for t in trials), root=out.root)
    write_atomic(out.manifest, json.dumps({"imported_from": asdict(summary)}, indent=1), root=out.root)
    return out, summary


__all__ = ["DEFAULT_ERROR_PATTERN", "ExternalTrialsError", "ImportSummary", "import_external", "load_external_trials",
           "parse_mapping"]
