"""The run folder is a boundary: a folder received from elsewhere, with links planted to send the toolkit's writes
anywhere, is analysed, reported and shown without any file outside it changing (every write that would go through a
link is refused, naming the link); a folder that is not a run folder is never taken over, with or without --force;
the importer never replaces a probe run's records."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from probe.cli import main
from tests.fixtures.synthetic_run import Plan, make_run
from tests.security.tree import tree_digest


@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> Path:
    """A small synthetic run, analysed and reported once (copied by each test)."""
    run = tmp_path_factory.mktemp("src") / "run"
    make_run(run, Plan(n_tasks=8, n_reps=1, loads=(50,), conditions=("Control", "Saturation")))
    assert main(["analyze", str(run)]) == 0
    assert main(["report", str(run)]) == 0
    return run


def _copy(analysed: Path, tmp_path: Path) -> tuple[Path, Path]:
    run = tmp_path / "received"
    shutil.copytree(analysed, run, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("one line that must stay\n")
    (outside / "dir").mkdir()
    (outside / "dir" / "keep.csv").write_text("a,b\n1,2\n")
    return run, outside


# the planted link -> what it points to (relative to the outside folder) -> the command that would write through it
LINKS = {
    "report.html": ("precious.txt", ["report"]),
    "analysis.md": ("precious.txt", ["analyze"]),
    "analysis.json": ("precious.txt", ["analyze"]),
    "tables": ("dir", ["analyze"]),
    "figures": ("dir", ["report"]),
    "figures/index.json": ("precious.txt", ["report"]),
}


@pytest.mark.parametrize("name", list(LINKS))
def test_a_planted_link_is_refused_and_nothing_outside_changes(analysed, tmp_path, capsys, name):
    run, outside = _copy(analysed, tmp_path)
    target, command = LINKS[name]
    planted = run / name
    if planted.is_dir() and not planted.is_symlink():
        shutil.rmtree(planted)
    else:
        planted.unlink(missing_ok=True)
    planted.symlink_to(outside / target)
    before = tree_digest(outside)
    rc = main([*command, str(run)])
    err = capsys.readouterr().err
    assert tree_digest(outside) == before, f"{name}: a file outside the run folder changed"
    assert rc == 2 and "is a link" in err and "Traceback" not in err, err


def test_appending_trials_never_goes_through_a_link(tmp_path):
    from probe.records import append_jsonl
    from probe.runfolder import OutsideRunError

    outside = tmp_path / "precious.txt"
    outside.write_text("one line without its newline")  # a 'half-written last line' to be cut, were it followed
    link = tmp_path / "run" / "trials.jsonl"
    link.parent.mkdir()
    link.symlink_to(outside)
    with pytest.raises(OutsideRunError, match="is a link"):
        append_jsonl(link, [{"x": 1}])
    assert outside.read_text() == "one line without its newline"


def test_the_temporary_name_of_an_atomic_write_is_not_followed(tmp_path):
    from probe.runfolder import write_atomic

    outside = tmp_path / "precious.txt"
    outside.write_text("keep")
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.html.tmp").symlink_to(outside)
    write_atomic(run / "report.html", "page", root=run)
    assert outside.read_text() == "keep" and (run / "report.html").read_text() == "page"


def _experiment(tmp_path: Path, name: str = "taken") -> Path:
    exp = tmp_path / "exp.toml"
    exp.write_text(f'[experiment]\nname = "{name}"\noutput_dir = "{tmp_path / "out"}"\n'
                   '[[tasks]]\nsource = "synthetic"\nn = 1\n[ice]\nconditions = ["Control"]\n')
    return exp


@pytest.mark.parametrize("force", [False, True])
def test_a_folder_that_is_not_a_run_folder_is_never_taken_over(tmp_path, capsys, force):
    folder = tmp_path / "out" / "taken"
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text('[tool.someone-else]\nkey = "value"\n')
    (folder / "notes.md").write_text("my notes\n")
    exp = _experiment(tmp_path)
    before = tree_digest(tmp_path)
    rc = main(["run", str(exp), *(["--force"] if force else [])])
    err = capsys.readouterr().err
    assert rc == 2 and "not a run folder" in err and "notes.md" in err and "Traceback" not in err
    assert tree_digest(tmp_path) == before


def test_the_importer_never_replaces_a_probe_runs_records(analysed, tmp_path, capsys):
    run = tmp_path / "demo"
    shutil.copytree(analysed, run)
    csv = Path(__file__).resolve().parents[1] / "fixtures" / "external_trials.csv"
    mapping = Path(__file__).resolve().parents[1] / "fixtures" / "external_mapping.toml"
    before = tree_digest(run)
    rc = main(["analyze", str(csv), "--map", str(mapping), "--out", str(run)])
    err = capsys.readouterr().err
    assert rc == 2 and "which an import would replace" in err
    assert tree_digest(run) == before
    again = tmp_path / "imported"
    assert main(["analyze", str(csv), "--map", str(mapping), "--out", str(again)]) == 0
    assert main(["analyze", str(csv), "--map", str(mapping), "--out", str(again)]) == 0  # an earlier import


def test_a_run_folder_is_marked_and_force_still_starts_a_run_of_the_toolkit_over(tmp_path):
    from probe.config import load_config
    from probe.runfolder import MARKER
    from probe.runner.folder import prepare_run_dir

    cfg = load_config(_experiment(tmp_path, "mine"))
    root = prepare_run_dir(cfg)
    assert (root / MARKER).is_file() and cfg.run_folder.foreign() == []
    os.remove(root / MARKER)  # a folder written before the marker existed: its prompts say it is a run
    (root / "prompts.jsonl").write_text("")
    assert cfg.run_folder.foreign() == []
