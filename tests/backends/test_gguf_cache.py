"""The de-quantised copy of a GGUF is cached by what the weights are, not by where the file lies.

A second virtual environment (a fresh clone, a CI run) installs the same weight package at a new path; keyed by
path, each one wrote another float32 copy (517 MB for the default model) and named a different revision in the
manifest. The packages here are fake installed distributions under temporary ``site`` folders.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest

from probe.loading import ModelCard, _gguf_cache_path, gguf_location, read_card


def _card(tmp_path: Path, name: str, body: str) -> ModelCard:
    p = tmp_path / f"{name}.toml"
    p.write_text(body)
    return read_card(p)


def _site(root: Path, version: str, payload: bytes) -> Path:
    """A site folder holding the distribution ``fakegguf`` (``fakegguf/m.gguf``) at ``version``."""
    (root / "fakegguf").mkdir(parents=True)
    (root / "fakegguf" / "__init__.py").write_text("")
    (root / "fakegguf" / "m.gguf").write_bytes(payload)
    info = root / f"fakegguf-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakegguf\nVersion: {version}\n")
    return root


def _cache_of_package(monkeypatch: pytest.MonkeyPatch, site: Path, card: ModelCard) -> Path:
    with monkeypatch.context() as m:
        m.syspath_prepend(str(site))
        importlib.invalidate_caches()
        folder, file = gguf_location(card)
        assert folder == site / "fakegguf"  # the file is found in this environment, not in another
        return _gguf_cache_path(card, folder / file)


def test_one_package_version_in_two_environments_shares_one_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("ICE_PROBE_CACHE", str(tmp_path / "cache"))
    card = _card(tmp_path, "fake", 'source = "package"\npackage = "fakegguf"\ngguf_file = "m.gguf"\n')
    first = _cache_of_package(monkeypatch, _site(tmp_path / "venv-a", "1.0", b"GGUF weights"), card)
    again = _cache_of_package(monkeypatch, _site(tmp_path / "venv-b", "1.0", b"GGUF weights"), card)
    other = _cache_of_package(monkeypatch, _site(tmp_path / "venv-c", "1.1", b"GGUF weights v1.1"), card)
    assert first == again
    assert other != first
    assert first.parent == tmp_path / "cache" and first.name.startswith("fake-")


def test_a_gguf_file_is_keyed_by_its_content(tmp_path, monkeypatch):
    monkeypatch.setenv("ICE_PROBE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = tmp_path / "a" / "m.gguf"
    a.write_bytes(b"GGUF " + bytes(range(256)) * 40)
    b = tmp_path / "b" / "m.gguf"
    shutil.copy(a, b)
    card_a = _card(tmp_path, "own-a", f'name = "own"\nsource = "gguf"\npath = "{a}"\n')
    card_b = _card(tmp_path, "own-b", f'name = "own"\nsource = "gguf"\npath = "{b}"\n')
    assert _gguf_cache_path(card_a, a) == _gguf_cache_path(card_b, b)
    b.write_bytes(b"GGUF " + bytes(range(256)) * 39 + bytes(256))  # same size, other weights
    assert _gguf_cache_path(card_b, b) != _gguf_cache_path(card_a, a)
