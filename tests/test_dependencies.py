"""Dependencies are honest: every imported package is declared, transformers is pinned to the tested majors and
refused otherwise, and deprecations from the engine's libraries fail the tests."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
import warnings
from importlib import metadata
from pathlib import Path

import pytest

from probe.compat import SUPPORTED_TRANSFORMERS_MAJORS, UnsupportedVersionError, check_transformers_version

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(reqs: list[str]) -> set[str]:
    return {_norm(re.match(r"[A-Za-z0-9_.\-]+", r).group(0)) for r in reqs}  # type: ignore[union-attr]


def _imported_top_modules(folder: Path) -> set[str]:
    """Top-level modules imported anywhere under ``folder`` (absolute imports only)."""
    found: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def _undeclared(folder: Path, declared: set[str], own: set[str]) -> list[str]:
    dists = metadata.packages_distributions()
    missing = []
    for mod in sorted(_imported_top_modules(folder) - set(sys.stdlib_module_names) - own):
        names = {_norm(d) for d in dists.get(mod, [mod])}
        if not names & declared:
            missing.append(f"{mod} (distribution {', '.join(sorted(names))})")
    return missing


def test_every_package_the_toolkit_imports_is_a_declared_dependency() -> None:
    declared = _requirement_names(PYPROJECT["project"]["dependencies"])
    # `probe bench` loads the checkout's benchmarks/ lazily (they are not in the wheel; the CLI says so)
    assert _undeclared(ROOT / "probe", declared, {"probe", "benchmarks"}) == []


def test_every_package_the_tests_import_is_declared_in_the_dependencies_or_an_extra() -> None:
    project = PYPROJECT["project"]
    declared = _requirement_names(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared |= _requirement_names(extra)
    assert _undeclared(ROOT / "tests", declared, {"probe", "tests", "scripts", "benchmarks"}) == []


def test_every_package_the_scripts_and_benchmarks_import_is_a_declared_dependency() -> None:
    """``scripts/`` (the simulations behind docs/statistics.md, the two-stage comparison) and ``benchmarks/``
    (``probe bench``) run in the toolkit's environment from a checkout; they may use the repository's own test
    helpers (the vLLM server of ``tests/serving.py``), whose imports the test above checks."""
    declared = _requirement_names(PYPROJECT["project"]["dependencies"])
    for folder in ("scripts", "benchmarks"):
        assert _undeclared(ROOT / folder, declared, {"probe", "scripts", "tests", "benchmarks"}) == [], folder


def test_the_import_scan_sees_a_missing_declaration() -> None:
    declared = _requirement_names(PYPROJECT["project"]["dependencies"]) - {"httpx"}
    assert any(m.startswith("httpx") for m in _undeclared(ROOT / "probe", declared, {"probe"}))


def test_transformers_is_pinned_to_the_supported_majors() -> None:
    spec = next(r for r in PYPROJECT["project"]["dependencies"] if _norm(r).startswith("transformers"))
    low, high = min(SUPPORTED_TRANSFORMERS_MAJORS), max(SUPPORTED_TRANSFORMERS_MAJORS) + 1
    assert spec.replace(" ", "") == f"transformers>={low}.0,<{high}"
    assert int(metadata.version("transformers").split(".")[0]) in SUPPORTED_TRANSFORMERS_MAJORS


@pytest.mark.parametrize("version", ["4.57.1", "6.0.0", "6.0.0.dev0", "10.2"])
def test_another_transformers_major_is_refused_naming_both_versions(version: str) -> None:
    with pytest.raises(UnsupportedVersionError) as err:
        check_transformers_version(version)
    msg = str(err.value)
    assert version in msg and "5.x" in msg and "pip install 'transformers>=5.0,<6'" in msg


def test_a_supported_transformers_is_accepted() -> None:
    assert check_transformers_version("5.0.0") == "5.0.0"
    assert check_transformers_version() == metadata.version("transformers")


def test_import_probe_attention_refuses_an_unsupported_transformers() -> None:
    code = ("import importlib.metadata as m\n"
            "real = m.version\n"
            "m.version = lambda name: '6.1.0' if name == 'transformers' else real(name)\n"
            "import probe.attention\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode != 0
    assert "UnsupportedVersionError: transformers 6.1.0 is installed" in out.stderr
    assert "transformers 5.x" in out.stderr
    assert "import transformers" not in out.stderr  # refused before the engine touches transformers


@pytest.mark.parametrize("module", ["transformers.modeling_utils", "transformers", "torch.nn.functional", "torch",
                                   "probe.attention.engine", "tests.attention.test_attention"])
@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning, FutureWarning])
def test_deprecations_from_the_engine_libraries_and_the_toolkit_fail_the_tests(module: str, category: type) -> None:
    with pytest.raises(category):
        warnings.warn_explicit("old API", category, "somefile.py", 1, module=module)


@pytest.mark.parametrize("module", ["numpy.core", "transformers_stream_generator", "torchvision"])
def test_deprecations_elsewhere_are_shown_not_raised(module: str) -> None:
    with pytest.warns(DeprecationWarning):
        warnings.warn_explicit("old API", DeprecationWarning, "somefile.py", 1, module=module)
