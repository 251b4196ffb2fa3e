"""The layers contract: probe/'s imports follow the data flow (tests/import_layers.py holds the table) and no two
modules import each other. Every import counts, lazy and type-only ones included."""

from __future__ import annotations

import functools
from pathlib import Path

from tests import import_layers as il

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _probe_imports() -> tuple[il.Import, ...]:
    return tuple(il.imports(ROOT))


def test_every_module_of_probe_is_in_a_layer() -> None:
    assert il.unplaced(ROOT) == []


def test_no_module_of_probe_imports_a_higher_layer() -> None:
    problems = il.layer_violations(list(_probe_imports()))
    assert not problems, "\n".join(problems)


def test_no_import_circle_between_modules_of_probe() -> None:
    problems = il.cycle_messages(list(_probe_imports()))
    assert not problems, "\n\n".join(problems)


def test_pending_circles_still_exist() -> None:
    assert il.stale_pending(list(_probe_imports())) == []


# --- the checker itself, on small generated packages -----------------------------------------------------------


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "probe" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


LAYERS = (("base", ("errors", "types")), ("task", ("tasks",)), ("analysis", ("analysis",)))


def test_an_upward_import_fails_naming_file_line_and_rule(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "__init__.py": "",
        "errors.py": "class ProbeError(Exception):\n    pass\n",
        "types.py": ("from probe.errors import ProbeError\n\n\n"
                     "def family(source: str) -> str:\n"
                     "    from probe.tasks import family_of  # lazy, still a dependency\n"
                     "    return family_of(source)\n"),
        "tasks/__init__.py": "from .section import family_of\n",
        "tasks/section.py": "from ..types import family\n\n\ndef family_of(s: str) -> str:\n    return s\n",
        "analysis/__init__.py": "",
    })
    found = il.imports(root)
    problems = il.layer_violations(found, LAYERS)
    assert problems == ["probe/types.py:5: probe.types (base layer) imports probe.tasks (task layer): a layer may "
                        "import only its own and lower layers (tests/import_layers.py)"]
    # relative imports resolve: tasks/section.py imports probe.types, a lower layer (allowed)
    assert il.Import("probe.tasks.section", "probe.types", Path("probe/tasks/section.py"), 1) in found


def test_a_circle_fails_even_through_type_checking_and_pending_must_stay_true(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "__init__.py": "",
        "errors.py": "",
        "types.py": ("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from probe.errors import X\n"),
        "tasks/__init__.py": "",
        "tasks/a.py": "import probe.tasks.b\n",
        "tasks/b.py": "def f() -> None:\n    from probe.tasks import a\n",
    })
    found = il.imports(root)
    assert il.cycles(found) == [["probe.tasks.a", "probe.tasks.b"]]
    (message,) = il.cycle_messages(found, frozenset())
    assert "probe.tasks.a, probe.tasks.b" in message
    assert "probe/tasks/a.py:1: probe.tasks.a imports probe.tasks.b" in message
    assert "probe/tasks/b.py:2: probe.tasks.b imports probe.tasks.a" in message
    # the type-only import is an edge too
    assert il.Import("probe.types", "probe.errors", Path("probe/types.py"), 4) in found
    # an allow-listed edge hides its circle, and must exist and still close one
    pending = frozenset({("probe.tasks.b", "probe.tasks.a")})
    assert il.cycle_messages(found, pending) == []
    assert il.stale_pending(found, pending) == []
    assert il.stale_pending(found, frozenset({("probe.types", "probe.tasks")})) == [
        "probe.types -> probe.tasks: no such import any more; remove it from PENDING (tests/import_layers.py)"]
    assert il.stale_pending(found, frozenset({("probe.types", "probe.errors")})) == [
        "probe.types -> probe.errors: closes no import circle any more; remove it from PENDING "
        "(tests/import_layers.py)"]


def test_a_module_in_no_layer_is_named(tmp_path: Path) -> None:
    root = _package(tmp_path, {"__init__.py": "", "errors.py": "", "newthing.py": "import probe.errors\n"})
    assert il.unplaced(root, layers=(("base", ("errors",)), ("entry", ("__init__",)))) == [
        "probe/newthing.py: 'newthing' is in no layer; place it in LAYERS (tests/import_layers.py)"]
