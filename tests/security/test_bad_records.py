"""Every reader of a run folder catches what its format can throw: a trial field of the wrong kind, JSON or TOML
nested past reason, a line of 100 MB, a damaged manifest each end in `error: <file>[:<line>]: ...` and exit status 2,
never a traceback, and reading a line of 100 MB does not read it whole."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from probe.cli import main
from tests.fixtures.synthetic_run import Plan, make_run


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("src") / "run"
    make_run(run, Plan(n_tasks=6, n_reps=1, loads=(50,), conditions=("Control", "Saturation")))
    return run


def _received(source: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(source, run)
    return run


def _replace_line(path: Path, index: int, line: str) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[index] = line + "\n"
    path.write_text("".join(lines), encoding="utf-8")


def _fails_cleanly(capsys, args: list[str], *expected: str) -> str:
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    for e in expected:
        assert e in err, err
    return err


@pytest.mark.parametrize("field, value, kind", [("em", "yes", "a number or null"),
                                                ("truncated", "no", "true/false"),
                                                ("load", True, "a whole number"),
                                                ("output", 5, "text or null")])
def test_a_trial_field_of_the_wrong_kind_names_the_file_line_and_field(source, tmp_path, capsys, field, value, kind):
    run = _received(source, tmp_path)
    trials = run / "trials.jsonl"
    first = json.loads(trials.read_text().splitlines()[2])
    first[field] = value
    _replace_line(trials, 2, json.dumps(first))
    _fails_cleanly(capsys, ["analyze", str(run)], f"{trials}:3", f"field {field!r}", kind)


def test_json_nested_past_reason_is_a_damaged_line(source, tmp_path, capsys):
    run = _received(source, tmp_path)
    _replace_line(run / "trials.jsonl", 0, "[" * 100_000 + "]" * 100_000)
    _fails_cleanly(capsys, ["analyze", str(run)], f"{run / 'trials.jsonl'}:1", "nested deeper")


def test_a_line_of_100_mb_is_refused_without_reading_it_whole(source, tmp_path, capsys):
    import tracemalloc

    run = _received(source, tmp_path)
    with (run / "trials.jsonl").open("ab") as fh:
        fh.write(b'{"x": "' + b"a" * (100 * 1024 * 1024) + b'"}\n')
    tracemalloc.start()
    _fails_cleanly(capsys, ["analyze", str(run)], "longer than 16 MiB")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 60 * 1024 * 1024, f"{peak / 2**20:.0f} MiB held to read one line"


def test_toml_nested_past_reason_is_a_config_error(tmp_path, capsys):
    exp = tmp_path / "exp.toml"
    exp.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    _fails_cleanly(capsys, ["validate", str(exp)], f"{exp}: tables nested deeper")


def test_a_damaged_manifest_names_the_file(source, tmp_path, capsys):
    run = _received(source, tmp_path)
    (run / "manifest.json").write_text('{"imported_from": ')
    _fails_cleanly(capsys, ["analyze", str(run)], f"{run / 'manifest.json'}: not valid JSON")


def test_an_imported_jsonl_nested_past_reason_names_the_line(tmp_path, capsys):
    src = tmp_path / "t.jsonl"
    src.write_text('{"task_id": "q1", "condition": "Control", "output": "x"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    _fails_cleanly(capsys, ["analyze", str(src), "--map", "task_id=task_id", "--out", str(tmp_path / "o")],
                   f"{src}:2: JSON nested deeper")
