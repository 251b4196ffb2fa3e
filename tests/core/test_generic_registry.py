"""probe.registry.Registry: duplicates refused, typos answered with close matches, lazy modules imported once."""

import sys
import types

import pytest

from probe.errors import ProbeError, UnknownNameError
from probe.registry import DuplicateEntryError, Registry


def test_register_and_get():
    r: Registry[int] = Registry("colour")
    assert r.register("red", 1) == 1
    r.register("green", 2)
    assert r.get("green") == 2
    assert r.names() == ("red", "green")
    assert "red" in r and "blue" not in r
    assert r.items() == [("red", 1), ("green", 2)]


def test_duplicate_refused():
    r: Registry[int] = Registry("colour")
    r.register("red", 1)
    with pytest.raises(DuplicateEntryError, match="colour 'red' is registered already"):
        r.register("red", 3)
    assert r.get("red") == 1


def test_typo_suggests():
    r: Registry[int] = Registry("colour")
    r.register("green", 2)
    with pytest.raises(UnknownNameError, match="did you mean 'green'"):
        r.get("gren")


def test_lazy_module_imported_on_first_lookup(monkeypatch):
    r: Registry[str] = Registry("thing", lazy={"lazy": "probe_test_lazy_mod"})
    mod = types.ModuleType("probe_test_lazy_mod")
    calls = []

    class Finder:
        def find_spec(self, name, path=None, target=None):
            if name != "probe_test_lazy_mod":
                return None
            import importlib.util

            class Loader:
                def create_module(self, spec):
                    return mod

                def exec_module(self, module):
                    calls.append(1)
                    r.register("lazy", "loaded")

            return importlib.util.spec_from_loader(name, Loader())

    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "probe_test_lazy_mod", raising=False)
    assert "lazy" in r and len(r) == 0
    assert r.get("lazy") == "loaded"
    assert r.get("lazy") == "loaded"
    assert calls == [1]


def test_pattern_module_missing_is_unknown_name():
    r: Registry[str] = Registry("report section", module_pattern="probe.report.{name}")
    with pytest.raises(UnknownNameError):
        r.get("no_such_family_xyz")


def test_module_that_registers_nothing_is_named(monkeypatch):
    r: Registry[str] = Registry("thing", lazy={"x": "json"})
    with pytest.raises(ProbeError, match="json registers no thing 'x'"):
        r.get("x")
