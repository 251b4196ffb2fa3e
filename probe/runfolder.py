"""The run folder: every file name and path of a run, the one grammar of prompt ids, file stems, the run lock and the
one safe writer (docs/records.md#run-folder, #prompt-ids, #file-stems)."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import re
import time
import unicodedata
from dataclasses import dataclass
import os
from pathlib import Path
from types import TracebackType
from typing import IO
from urllib.parse import quote, unquote

from probe.errors import ProbeError

CONFIG = "config.toml"
MANIFEST = "manifest.json"
TASKS = "tasks.jsonl"
PROMPTS = "prompts.jsonl"
TRIALS = "trials.jsonl"
INTERVENTIONS = "interventions.json"
ANALYSIS = "analysis.json"
ANALYSIS_MD = "analysis.md"
ATTENTION_SUMMARY = "attention_summary.npz"
REPORT = "report.html"
ATTENTION_DIR = "attention"
ATTENTION_INDEX = "attention_index.jsonl"
FIGURES_DIR = "figures"
TABLES_DIR = "tables"
SHOW_DIR = "show"
LOCK = "run.lock"
MARKER = ".ice-probe-run"  # written into every run folder the toolkit makes: what --force may move aside
SUPERSEDED_PREFIX = "superseded-"
FILE_MODE = 0o666  # every file of a run folder, less the umask (as open() makes): records, config, probe records

SEPARATOR = "|"
MAX_STEM = 160  # bytes; file systems allow 255 per name, leaving room for suffixes and temporary names
_STEM_SAFE = "-_.,=+@"


log = logging.getLogger(__name__)


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
    """The prompt id of (task, condition, load, replication[, tokenizer]); see docs/records.md#run-folder."""
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


def folder_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be one folder name of a run (None when it can): empty or blank, ``.`` or ``..``, a path
    separator, NUL or another control character. Names that become paths are checked with this once, where they
    are read, so no later join can leave the folder it means."""
    if not name.strip():
        return "is empty or blank"
    if name in (".", ".."):
        return f"is {name!r}, which names an existing folder, not a new one"
    bad = sorted({c for c in name if c in "/\\" or unicodedata.category(c) == "Cc"})
    if bad:
        return f"holds {', '.join(repr(c) for c in bad)} (a path separator or a control character)"
    return None


def prompt_digest(text: str) -> str:
    """The digest a probe record carries of the prompt text it measured (sha256, 16 hex digits): a record moved to
    another prompt's name is refused when it is read."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def record_stem(name: str) -> str:
    """A file-system-safe stem for a prompt id (or a model name): see docs/records.md#run-folder.

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
    """The files of one run folder (see docs/records.md#run-folder). Creates nothing until asked to write.

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
    def tasks(self) -> Path:
        return self.root / TASKS

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
    def figure_index(self) -> Path:
        """``figures/index.json``: the report's figures in the order the report shows them, with their captions."""
        return self.root / FIGURES_DIR / "index.json"

    @property
    def tables(self) -> Path:
        return self.root / TABLES_DIR

    @property
    def attention_root(self) -> Path:
        return self.root / ATTENTION_DIR

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

    @property
    def attention_index(self) -> Path:
        """``attention_index.jsonl``: one line per probe record as written (its path under ``attention/``, sha256,
        prompt digest), which the analysis holds each record to (beside ``attention/``, whose entries are models)."""
        return self.root / ATTENTION_INDEX

    def has_attention(self) -> bool:
        """Whether any probe record exists."""
        return self.attention_root.is_dir() and any(self.attention_root.rglob("*.npz"))


    @property
    def lock(self) -> Path:
        """The lock file of the one process writing the folder (:class:`RunLock`)."""
        return self.root / LOCK

    def record_paths(self) -> list[Path]:
        """The records of a run present in the folder: prompts, trials, interventions, probe records
        (not the config, the tasks it loads, the manifest, what the analysis and report wrote, or superseded
        runs)."""
        if not self.root.is_dir():
            return []
        paths = [p for p in (self.prompts, self.interventions, self.trials) if p.is_file()]
        if self.attention_root.is_dir():
            paths += sorted(self.attention_root.rglob("*.npz"))
        return [p for p in paths if p.stat().st_size > 0]

    def foreign(self) -> list[str]:
        """What makes the folder not a run folder of the toolkit: [] when it is absent, empty (or holds only a lock),
        or the toolkit's (its marker, or, written before the marker existed, a run's manifest.json or prompts.jsonl);
        else the names it holds (the first five). Nothing else is ever overwritten or moved aside."""
        if not self.root.is_dir():
            return []
        # the lock and a write in flight (another run making the folder this instant) are no one's files yet
        names = sorted(p.name for p in self.root.iterdir() if p.name != LOCK and not p.name.endswith(".tmp"))
        if not names or MARKER in names or PROMPTS in names or (MANIFEST in names and self._manifest_is_a_run()):
            return []
        return names[:5] + (["..."] if len(names) > 5 else [])

    def _manifest_is_a_run(self) -> bool:
        try:
            data = self.read_manifest()
        except ProbeError:
            return False
        return data is not None and ("toolkit_commit" in data or "imported_from" in data)

    def read_manifest(self) -> dict | None:
        """``manifest.json`` as a dict, or None when the folder has none.

        Raises:
            ProbeError: it is not a JSON object (damaged, truncated, nested past reason), naming the file.
        """
        path = self.manifest
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as e:
            why = "nested deeper than a manifest is" if isinstance(e, RecursionError) else f"not valid JSON ({e})"
            raise ProbeError(f"{path}: {why}; restore it, or run the experiment again to write it") from None
        if not isinstance(data, dict):
            raise ProbeError(f"{path}: not a JSON object; restore it, or run the experiment again to write it")
        return data

    def mark(self) -> None:
        """Write the marker that makes the folder a run folder of the toolkit (:meth:`foreign`)."""
        if not (self.root / MARKER).is_file():
            write_atomic(self.root / MARKER, "a run folder of ICE-Probe (docs/records.md#run-folder)\n", root=self.root)

    def supersede(self, keep: tuple[str, ...] = ()) -> Path | None:
        """Move every file and folder of the run (all but the lock, earlier superseded runs and the names in
        ``keep``) into a new ``superseded-<time>/`` folder of the run folder; returns it (None when there was nothing
        to move)."""
        if not self.root.is_dir():
            return None
        items = [p for p in sorted(self.root.iterdir())
                 if p.name != LOCK and not p.name.startswith(SUPERSEDED_PREFIX) and p.name not in keep]
        if not items:
            return None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        dest = self.root / f"{SUPERSEDED_PREFIX}{stamp}"
        n = 1
        while dest.exists():
            n += 1
            dest = self.root / f"{SUPERSEDED_PREFIX}{stamp}-{n}"
        dest.mkdir()
        for p in items:
            p.rename(dest / p.name)
        return dest


class RunLockedError(ProbeError):
    """Another process (named by its pid) is writing the run folder."""


class RunLock:
    """An exclusive lock on a run folder for the one process that writes it (``probe run``, ``probe build``).

    ``fcntl.flock`` on ``<run>/run.lock``, taken without waiting: a second process stops at once with
    :class:`RunLockedError` naming the holder's pid (written into the file), rather than waiting behind a run
    that may take hours. The kernel releases the lock when its holder ends, however it ends (a crash, kill -9),
    so a stale lock file never blocks a rerun. Where ``fcntl`` does not exist (Windows) no lock is taken.

    Args:
        run: the run folder (created when absent).
    """

    def __init__(self, run: str | os.PathLike[str] | RunFolder) -> None:
        self.folder = run if isinstance(run, RunFolder) else RunFolder(run)
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not a POSIX system
            log.warning("%s: no file locking on this system; do not start two runs into one folder", self.folder)
            return
        self.folder.root.mkdir(parents=True, exist_ok=True)
        lock = self.folder.lock
        if lock.is_symlink() or (lock.exists() and not lock.is_file()):
            what = "a link" if lock.is_symlink() else "a folder" if lock.is_dir() else "not a plain file"
            raise ProbeError(f"{lock}: is {what}, where the run's lock file belongs (nothing else is ever there); "
                             "remove it, then run the command again")
        try:
            fh = open(lock, "a+", encoding="utf-8")
        except OSError as e:
            raise ProbeError(f"{lock}: cannot be opened to lock the run folder ({e.strerror or e}); check the "
                             "folder's permissions") from None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                fh.close()
                raise
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise RunLockedError(
                f"{self.folder.root}: another `probe run` / `probe build` (pid {holder}) is writing this run folder; "
                "wait for it to finish (or stop it), then run the command again. Two runs into one folder would "
                "record every trial twice"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:  # the file stays: removing it would race with a process about to lock it
            self._fh.close()
            self._fh = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def file_mode() -> int:
    """The mode every file of a run folder is written with: :data:`FILE_MODE` less the process's umask."""
    global _MODE
    if _MODE is None:
        mask = os.umask(0)
        os.umask(mask)
        _MODE = FILE_MODE & ~mask
    return _MODE


_MODE: int | None = None


class OutsideRunError(ProbeError):
    """A write would leave the run folder through a link (the message names the link and what to do)."""


def inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """``path``, after checking that a write to it stays inside the folder ``root``: it lies under ``root``, and no
    folder between them, nor ``path`` itself, is a symbolic link (a run folder received from elsewhere may hold
    links planted to send the toolkit's writes anywhere).

    Raises:
        OutsideRunError: naming the link (and where it points) or the path outside ``root``.
    """
    root, path = Path(root), Path(path)
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise OutsideRunError(f"{path}: outside the folder {root} being written") from None
    here = root
    for part in rel.parts:
        if part == "..":
            raise OutsideRunError(f"{path}: leaves the folder {root} being written ('..')")
        here = here / part
        if here.is_symlink():
            raise OutsideRunError(
                f"{here}: is a link (to {os.readlink(here)}); the toolkit writes a run folder's files only inside "
                f"it and never through a link. Remove the link (a folder received from elsewhere may carry one), then "
                "run the command again")
    return path


def write_atomic(path: str | os.PathLike[str], data: bytes | str,
                 root: str | os.PathLike[str] | None = None) -> Path:
    """Write ``path`` whole under a temporary name in its folder, fsynced, then renamed into place (mode
    :data:`FILE_MODE` less the umask): a reader sees the old file or the new, and a failure (a full disk) leaves
    the old file and no temporary one. With ``root`` (the run folder), the write is refused when it would go
    through a link (:func:`inside`) and the folders on the way are made; the temporary file is never opened through
    one.

    Raises:
        OutsideRunError: ``path`` is not inside ``root``, or a link lies on the way.
        OSError: the write failed (the temporary file is removed first).
    """
    path = Path(path)
    if root is not None:
        inside(root, path)
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        tmp.unlink(missing_ok=True)  # a link planted under the temporary name goes, not what it points to
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), file_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


__all__ = ["OutsideRunError", "PromptIdError", "PromptKey", "RunFolder", "RunLock", "RunLockedError", "escape_part",
           "folder_name_problem", "inside", "make_prompt_id", "parse_prompt_id", "prompt_digest", "record_stem", "stem_name", "unescape_part", "file_mode", "write_atomic"]
