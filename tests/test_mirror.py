"""Tests mirror the package: a module's tests sit in the folder of ``tests/`` named for the part of ``probe/`` it
belongs to (FOLDERS), so a maintainer finds them where the module is. Only the tests of the whole project
(CROSS_CUTTING) stay at the top of ``tests/``, beside the helpers every test uses (conftest, tiers, serving,
import_layers, fixtures/), and the folders that hold the whole toolkit to one property (WHOLE_TOOLKIT: security).

The rule checked: every module and package directly under ``probe/`` is given one folder; every folder of tests/
is one of FOLDERS (and a package, so ``from tests.<folder>.<file> import`` works); every test file in a folder
imports something from that folder's part of ``probe/`` (any import, lazy ones included), or tests a file outside
``probe/`` that it names (NOT_PROBE). A new test file at the top, a new folder or a new module of ``probe/`` fails
here until it is placed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# folder of tests/ -> the modules and packages directly under probe/ whose tests it holds ("__init__" is
# probe/__init__.py, the public API)
FOLDERS: dict[str, tuple[str, ...]] = {
    "core": ("errors", "codec", "registry", "types", "formatting", "compat", "config"),
    "tasks": ("tasks",),
    "scoring": ("scoring",),
    "prompts": ("prompts",),
    "backends": ("loading", "gguf_chunks", "backends"),
    "attention": ("attention", "probe_options", "interventions"),
    "runs": ("runner", "runfolder", "records", "records_import"),
    "analysis": ("analysis",),
    "report": ("report", "prompt_view"),
    "api": ("__init__", "api", "cli", "loaded_run"),
    "bench": (),  # the benchmarks live outside probe/ (benchmarks/): NOT_PROBE
}

# test files of the whole project, at the top of tests/
CROSS_CUTTING = frozenset({
    "test_layers.py",  # the import layers of all of probe/
    "test_dependencies.py",  # every import of probe/ and tests/ declared; the warnings policy
    "test_tiers.py",  # the test tiers and their guard
    "test_mirror.py",  # this file
})

# test files whose subject is a file outside probe/: the file, which the test must name
NOT_PROBE: dict[str, str] = {
    "api/test_notebook.py": "examples/quickstart.ipynb",
    "api/test_docs_snippets.py": "README.md",
    "bench/test_gpu_check.py": "benchmarks/gpu_check.py",
}

HELPERS = frozenset({"fixtures", "__pycache__"})
# folders whose tests hold the whole toolkit to one property, every command at once (not one part of probe/)
WHOLE_TOOLKIT = {"security": "nothing outside the run folder written, no secret recorded, no traceback"}


def probe_parts(root: Path) -> set[str]:
    """The modules and packages directly under ``root / "probe"`` (``__init__`` for the package itself)."""
    probe = root / "probe"
    modules = {p.stem for p in probe.glob("*.py")}
    packages = {p.name for p in probe.iterdir() if (p / "__init__.py").is_file()}
    return modules | packages


def imported_parts(path: Path, parts: set[str]) -> set[str]:
    """The parts of probe/ that the file at ``path`` imports, at any depth of the file."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"probe.{a.name}" for a in node.names] if node.module == "probe" else [node.module]
        else:
            continue
        for name in names:
            dotted = name.split(".")
            if dotted[0] == "probe":
                out.add(dotted[1] if len(dotted) > 1 and dotted[1] in parts else "__init__")
    return out


def misplaced(root: Path, folders: dict[str, tuple[str, ...]] = FOLDERS,
              cross_cutting: frozenset[str] = CROSS_CUTTING, not_probe: dict[str, str] | None = None) -> list[str]:
    """Every break of the mirror under ``root`` (a checkout: probe/ and tests/), one line each, naming the fix."""
    not_probe = NOT_PROBE if not_probe is None else not_probe
    tests = root / "tests"
    parts = probe_parts(root)
    out: list[str] = []
    owners: dict[str, list[str]] = {}
    for folder, names in folders.items():
        for name in names:
            owners.setdefault(name, []).append(folder)
    for name in sorted(parts):
        if name not in owners:
            out.append(f"probe/{name}: in no folder of tests/; give it one in FOLDERS (tests/test_mirror.py)")
        elif len(owners[name]) > 1:
            out.append(f"probe/{name}: in several folders {owners[name]}; keep one (tests/test_mirror.py)")
    for name in sorted(set(owners) - parts):
        out.append(f"probe/{name}: no such module or package; remove it from FOLDERS (tests/test_mirror.py)")
    for path in sorted(tests.glob("test_*.py")):
        if path.name not in cross_cutting:
            out.append(f"tests/{path.name}: move it into the folder of the part of probe/ it tests "
                       f"(git mv; FOLDERS in tests/test_mirror.py), or list it in CROSS_CUTTING")
    for sub in sorted(p for p in tests.iterdir() if p.is_dir() and p.name not in HELPERS):
        if sub.name in WHOLE_TOOLKIT:
            if not (sub / "__init__.py").is_file():
                out.append(f"tests/{sub.name}/: has no __init__.py (tests/ is a package)")
            continue
        if sub.name not in folders:
            out.append(f"tests/{sub.name}/: not a folder of FOLDERS (tests/test_mirror.py)")
            continue
        if not (sub / "__init__.py").is_file():
            out.append(f"tests/{sub.name}/: has no __init__.py (tests/ is a package)")
        for path in sorted(sub.rglob("test_*.py")):
            key = path.relative_to(tests).as_posix()
            if key in not_probe:
                if not_probe[key] not in path.read_text(encoding="utf-8"):
                    out.append(f"tests/{key}: tests {not_probe[key]} (NOT_PROBE) but does not name it")
                continue
            found = imported_parts(path, parts)
            if not found & set(folders[sub.name]):
                where = sorted({f for name in found for f in owners.get(name, [])})
                out.append(f"tests/{key}: imports nothing of probe/{'|'.join(folders[sub.name])}; "
                           f"move it to the folder of what it tests ({', '.join(where) or 'none imported'})")
    return out


def test_every_test_file_lives_in_the_folder_of_what_it_tests() -> None:
    assert misplaced(ROOT) == []


def test_a_misplaced_test_file_a_stray_one_and_an_unplaced_module_are_named(tmp_path: Path) -> None:
    for folder in ("probe", "probe/attention", "tests", "tests/attention", "tests/scoring"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "probe" / "newthing.py").write_text("")
    (tmp_path / "tests" / "attention" / "test_ok.py").write_text("def f() -> None:\n    import probe.attention.x\n")
    (tmp_path / "tests" / "scoring" / "test_wrong.py").write_text("from probe.attention import engine\n")
    (tmp_path / "tests" / "test_stray.py").write_text("")
    folders = {"attention": ("attention",), "scoring": ("__init__",)}
    assert misplaced(tmp_path, folders, frozenset(), {}) == [
        "probe/newthing: in no folder of tests/; give it one in FOLDERS (tests/test_mirror.py)",
        "tests/test_stray.py: move it into the folder of the part of probe/ it tests "
        "(git mv; FOLDERS in tests/test_mirror.py), or list it in CROSS_CUTTING",
        "tests/scoring/test_wrong.py: imports nothing of probe/__init__; move it to the folder of what it tests "
        "(attention)"]
