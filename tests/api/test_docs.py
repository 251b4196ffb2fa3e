"""The documentation holds together: no reference to a file users do not have, and every docs/ link resolves.

- "SPEC" (the maintainers' specification, not shipped) must not appear in ``probe/``, ``README.md`` or ``docs/``:
  a user has ``docs/`` instead.
- Every ``docs/<page>.md`` and ``docs/<page>.md#<anchor>`` cited from code (``probe/``, ``tests/``), the README or
  the docs, and every relative Markdown link and ``#anchor`` in the README and the docs, names a file that exists
  and a heading that it holds. Anchors follow GitHub's rule (lower-case, punctuation dropped, spaces to hyphens,
  ``-1``, ``-2`` for repeated headings), computed here independently of any renderer.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARKDOWN = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
CODE = sorted((ROOT / "probe").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py"))

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_DOCS_REF = re.compile(r"(?<![\w./-])docs/([\w.-]+\.md)(?:#([\w-]+))?")
_MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup removed, lower-case, everything but word characters, hyphens and
    spaces dropped, spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (headings inside code fences are not headings)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else _HEADING.match(line)
        if m is None:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of a Markdown file outside code fences."""
    out = []
    in_fence = False
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            out.append((i, line))
    return out


def _rel(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def broken_references(files: list[Path], markdown: list[Path]) -> list[str]:
    """Every cited docs page or anchor that does not exist, as ``file:line: what``."""
    cache: dict[Path, set[str]] = {}

    def check(where: str, target: Path, anchor: str | None) -> str | None:
        if not target.is_file():
            return f"{where}: {_rel(target)} does not exist"
        if anchor and target.suffix == ".md":
            if target not in cache:
                cache[target] = anchors_of(target)
            if anchor not in cache[target]:
                return f"{where}: {target.name} has no heading with anchor #{anchor}"
        return None

    problems: list[str] = []
    for path in files:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in _DOCS_REF.finditer(line):
                err = check(f"{_rel(path)}:{i}", DOCS / m.group(1), m.group(2))
                if err:
                    problems.append(err)
    for path in markdown:
        for lineno, text in _prose_lines(path):
            for m in _MD_LINK.finditer(text):
                link = m.group(1)
                if re.match(r"^[a-z]+:", link):  # https:, mailto:
                    continue
                file_part, _, anchor = link.partition("#")
                target = (path.parent / file_part).resolve() if file_part else path
                err = check(f"{_rel(path)}:{lineno}", target, anchor or None)
                if err:
                    problems.append(err)
    return problems


def test_no_reference_to_the_unshipped_spec() -> None:
    hits = []
    for path in [*sorted((ROOT / "probe").rglob("*.py")), *MARKDOWN]:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\bSPEC\b", line):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "cite a docs/ page instead of SPEC:\n" + "\n".join(hits)


def test_every_cited_docs_page_and_anchor_exists() -> None:
    problems = broken_references(CODE + MARKDOWN, MARKDOWN)
    assert not problems, "\n".join(problems)


def test_the_reference_check_finds_a_broken_anchor_and_a_missing_page(tmp_path: Path) -> None:
    src = tmp_path / "mod.py"
    docs = "docs/"  # spelled apart so that this file does not cite the broken targets itself
    src.write_text(f'"""See {docs}method.md#no-such-heading and {docs}no-such-page.md."""\n', encoding="utf-8")
    md = DOCS / "method.md"
    problems = broken_references([src], [])
    assert len(problems) == 2, problems
    assert "#no-such-heading" in problems[0] and "no-such-page.md does not exist" in problems[1]
    assert "objects" in anchors_of(md)  # the check itself reads real headings


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Attention ↔ behaviour, per layer and per head", "attention--behaviour-per-layer-and-per-head"),
        ("Task similarity S_sim", "task-similarity-s_sim"),
        ("What `probe analyze` reports", "what-probe-analyze-reports"),
        ("A worked run: experiments/knockout-demo.toml", "a-worked-run-experimentsknockout-demotoml"),
        ("In brief: the statistics at 7–50 questions", "in-brief-the-statistics-at-750-questions"),
    ],
)
def test_github_slug(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_every_command_of_the_readme_table_exists_in_the_cli() -> None:
    from probe.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    commands = sub.choices  # type: ignore[attr-defined]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Commands"):]
    table = table[: table.index("\n## ", 1)]
    named = re.findall(r"^\| `probe ([a-z-]+)(?: ([a-z-]+))?", table, re.MULTILINE)
    assert named, "the README's commands table lists no command"
    for command, rest in named:
        assert command in commands, f"README names `probe {command}`, which the CLI does not have"
    what = next(a for a in commands["bench"]._actions if a.dest == "what")
    benches = re.findall(r"`probe bench ([a-z-]+)`((?: / `[a-z-]+`)*)", table)
    assert benches, "the README's commands table lists no benchmark"
    for first, more in benches:
        for name in [first, *re.findall(r"`([a-z-]+)`", more)]:
            assert name in what.choices, f"README names `probe bench {name}`, which the CLI does not have"
