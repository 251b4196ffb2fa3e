"""A digest of a folder tree (every path, file content and link target), to show that a command changed nothing
outside the folder it writes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def tree_digest(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Each path under ``root`` (relative, links not followed) -> the sha256 of its content, ``link:<target>`` or
    ``dir``; names in ``skip`` (at any depth) are left out."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for name in dirnames + filenames:
            if name in skip:
                continue
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = f"link:{os.readlink(p)}"
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out
