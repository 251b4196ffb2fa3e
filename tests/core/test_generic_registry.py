"""probe.registry.Registry: duplicates refused, typos answered with close matches."""

import pytest

from probe.errors import UnknownNameError
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
