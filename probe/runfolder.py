"""The run folder: every file name and path of a run, and the one grammar of prompt ids.

A run of an experiment lives in ``outputs/<name>/``; this module is the only place that knows what is in it::

    config.toml               the resolved experiment (probe.config.dump_config)
    manifest.json             toolkit commit, package versions, model sources and revisions, seed
    prompts.jsonl             one built prompt per line (probe.types.Prompt)
    trials.jsonl              one trial per line (probe.records.TrialRecord); trials.rank<r>.jsonl while a
                              data-parallel run is in flight
    interventions.json        the run's [[interventions]] as each model runs them (probe.interventions)
    attention/<model>/<stem>.npz   one probe record per prompt (probe.attention.SegmentAttention)
    attention/<model>/intervention=<name>/<stem>.npz   the same under an intervention
    analysis.json, analysis.md, attention_summary.npz, tables/*.csv     probe analyze
    report.html, figures/*.png                                          probe report
    show/<model>/<stem>[.L<layer>][.H<head>].html                       probe show (one prompt's attention)

**Prompt ids.** ``<task_id>|<condition>|L<load>|r<replication>``, plus ``|@<tokenizer>`` when an experiment builds
prompts for several tokenizers. Free-text parts (task id, condition, tokenizer) are percent-escaped where they hold
``%`` or ``|``, so any task id a JSONL file allows round-trips: :func:`parse_prompt_id` gives back the parts.

**File names.** A prompt id becomes a file stem that is safe on any file system (:func:`record_stem`): characters
other than letters, digits and ``-_.,=+@`` are percent-escaped and ``|`` becomes ``~``; a stem longer than
:data:`MAX_STEM` bytes (a long or non-Latin task id) keeps a readable prefix and a hash of the whole id. Paths are
only ever computed from ids (never parsed back), so the writer and every reader agree by construction.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
import os
from pathlib import Path
from urllib.parse import quote, unquote

from probe.errors import ProbeError

CONFIG = "config.toml"
MANIFEST = "manifest.json"
PROMPTS = "prompts.jsonl"
TRIALS = "trials.jsonl"
INTERVENTIONS = "interventions.json"
ANALYSIS = "analysis.json"
ANALYSIS_MD = "analysis.md"
ATTENTION_SUMMARY = "attention_summary.npz"
REPORT = "report.html"
ATTENTION_DIR = "attention"
FIGURES_DIR = "figures"
TABLES_DIR = "tables"
SHOW_DIR = "show"

SEPARATOR = "|"
MAX_STEM = 160  # bytes; file systems allow 255 per name, leaving room for suffixes and temporary names
_SHARD = re.compile(r"^trials\.rank(\d+)\.jsonl$")
_STEM_SAFE = "-_.,=+@"


class PromptIdError(ProbeError):
    """A string is not a prompt id of the grammar ``<task_id>|<condition>|L<load>|r<replication>[|@<tokenizer>]``."""


def escape_part(text: str) -> str:
    """``text`` with ``%`` and ``|`` percent-escaped, so it can be one part of a prompt id."""
    return text.replace("%", "%25").replace(SEPARATOR, "%7C")


def unescape_part(text: str) -> str:
    """The inverse of :func:`escape_part`."""
    return text.replace("%7C", SEPARATOR).replace("%25", "%")


@dataclass(frozen=True)
class PromptKey:
    """The parts of a prompt id.

    Attributes:
        task_id: the task's id (any non-empty string).
        condition: ``Control``, ``LongControl``, ``Saturation``, ``Residue`` or a family's own (``CogniLoad``).
        load: target load in percent (0 for Control).
        replication: 0-based replication.
        tokenizer: the model card whose tokenizer built the prompt, where an experiment has several; else None.
    """

    task_id: str
    condition: str
    load: int
    replication: int
    tokenizer: str | None = None

    @property
    def prompt_id(self) -> str:
        parts = [escape_part(self.task_id), escape_part(self.condition), f"L{self.load}", f"r{self.replication}"]
        if self.tokenizer:
            parts.append("@" + escape_part(self.tokenizer))
        return SEPARATOR.join(parts)


def make_prompt_id(task_id: str, condition: str, load: int, replication: int, tokenizer: str | None = None) -> str:
    """The prompt id of (task, condition, load, replication[, tokenizer]); see the module docstring."""
    return PromptKey(task_id, condition, load, replication, tokenizer).prompt_id


def parse_prompt_id(prompt_id: str) -> PromptKey:
    """The parts of a prompt id made by :func:`make_prompt_id`.

    Raises:
        PromptIdError: the string does not follow the grammar (names the string and the grammar).
    """
    parts = prompt_id.split(SEPARATOR)
    tokenizer = None
    if len(parts) == 5 and parts[4].startswith("@"):
        tokenizer = unescape_part(parts.pop()[1:])
    if len(parts) != 4 or not re.fullmatch(r"L\d+", parts[2]) or not re.fullmatch(r"r\d+", parts[3]) \
            or not parts[0] or not parts[1]:
        raise PromptIdError(f"{prompt_id!r} is not a prompt id <task_id>|<condition>|L<load>|r<replication>"
                            "[|@<tokenizer>]")
    return PromptKey(unescape_part(parts[0]), unescape_part(parts[1]), int(parts[2][1:]), int(parts[3][1:]),
                     tokenizer)


def record_stem(name: str) -> str:
    """A file-system-safe stem for a prompt id (or a model name): see the module docstring.

    Distinct names give distinct stems: the escaping is injective, and a shortened stem ends in a hash of the
    whole name.
    """
    stem = quote(name, safe=_STEM_SAFE + SEPARATOR).replace("~", "%7E").replace(SEPARATOR, "~")
    if stem.startswith("."):  # no hidden files (and never "." or "..")
        stem = "%2E" + stem[1:]
    if len(stem.encode()) > MAX_STEM:
        digest = hashlib.sha256(name.encode()).hexdigest()[:20]
        stem = stem[: MAX_STEM - len(digest) - 1] + "-" + digest
    return stem


def stem_name(stem: str) -> str:
    """The name behind a stem that :func:`record_stem` did not shorten (for display; paths never need it)."""
    return unquote(stem.replace("~", SEPARATOR))


class RunFolder:
    """The files of one run folder (see the module docstring). Creates nothing until asked to write.

    Args:
        root: the run folder, ``<output_dir>/<experiment name>``.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.root)!r})"

    def __fspath__(self) -> str:
        return str(self.root)

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def prompts(self) -> Path:
        return self.root / PROMPTS

    @property
    def trials(self) -> Path:
        return self.root / TRIALS

    @property
    def analysis(self) -> Path:
        return self.root / ANALYSIS

    @property
    def interventions(self) -> Path:
        """The resolved interventions of the run, one JSON list (:mod:`probe.interventions`)."""
        return self.root / INTERVENTIONS

    @property
    def analysis_md(self) -> Path:
        return self.root / ANALYSIS_MD

    @property
    def attention_summary(self) -> Path:
        return self.root / ATTENTION_SUMMARY

    @property
    def report(self) -> Path:
        return self.root / REPORT

    @property
    def figures(self) -> Path:
        return self.root / FIGURES_DIR

    @property
    def tables(self) -> Path:
        return self.root / TABLES_DIR

    @property
    def attention_root(self) -> Path:
        return self.root / ATTENTION_DIR

    def trials_shard(self, rank: int) -> Path:
        """The trial file of data-parallel rank ``rank`` while its run is in flight."""
        return self.root / f"trials.rank{rank}.jsonl"

    def trial_shards(self) -> list[Path]:
        """The shard files present, by rank."""
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir() if (m := _SHARD.match(p.name))]
        return [p for _, p in sorted(found)]

    def trial_files(self) -> list[Path]:
        """``trials.jsonl`` and every shard file (those that exist)."""
        return [p for p in [self.trials, *self.trial_shards()] if p.is_file()]

    def attention_dir(self, model: str) -> Path:
        """The folder of one model's probe records."""
        return self.attention_root / record_stem(model)

    def attention_record(self, model: str, prompt_id: str, intervention: str | None = None) -> Path:
        """The probe record of (model, prompt id): ``attention/<model>/<stem>.npz``; under an intervention (the probe
        then measures the intervened model) ``attention/<model>/intervention=<name>/<stem>.npz``."""
        folder = self.attention_dir(model)
        if intervention is not None:
            folder = folder / f"intervention={record_stem(intervention)}"
        return folder / f"{record_stem(prompt_id)}.npz"

    def show_page(self, model: str, prompt_id: str, layer: int | None = None, head: int | None = None) -> Path:
        """The page ``probe show`` writes for (model, prompt id[, layer][, head]) by default."""
        suffix = ("" if layer is None else f".L{layer}") + ("" if head is None else f".H{head}")
        return self.root / SHOW_DIR / record_stem(model) / f"{record_stem(prompt_id)}{suffix}.html"

    def has_attention(self) -> bool:
        """Whether any probe record exists."""
        return self.attention_root.is_dir() and any(self.attention_root.rglob("*.npz"))


__all__ = ["PromptIdError", "PromptKey", "RunFolder", "escape_part", "make_prompt_id", "parse_prompt_id",
           "record_stem", "stem_name", "unescape_part"]
