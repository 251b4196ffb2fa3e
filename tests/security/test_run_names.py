"""A name that becomes a path is one folder name: `.`, `..`, separators, NUL and control characters are refused
when the experiment is read, before anything is written, and other runs beside the folder are never moved."""

from __future__ import annotations

from pathlib import Path

import pytest

from probe.cli import main
from probe.config import config_from_dict
from probe.errors import ConfigError
from tests.security.tree import tree_digest

BAD_NAMES = [".", "..", "a/b", "a\\b", "run\x00x", "run\nx", "tab\tx", "del\x7fx", " ", ""]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_a_run_name_that_is_not_one_folder_name_is_refused(name):
    with pytest.raises(ConfigError, match=r"experiment\.name: .* one folder name"):
        config_from_dict({"experiment": {"name": name}, "tasks": [{"source": "synthetic", "n": 1}]})


@pytest.mark.parametrize("name", ["demo", "study-1.5b", "run.v2", "…ünïcode", "a b"])
def test_ordinary_run_names_pass(name):
    assert config_from_dict({"experiment": {"name": name}, "tasks": [{"source": "synthetic", "n": 1}]}).experiment.name == name


@pytest.mark.parametrize("name", ["..", "."])
def test_force_with_dot_names_moves_no_other_run(tmp_path: Path, name: str, capsys):
    out = tmp_path / "outputs"
    other = out / "other-run"
    other.mkdir(parents=True)
    (other / "config.toml").write_text('[experiment]\nname = "other-run"\n')
    (other / "trials.jsonl").write_text('{"x": 1}\n')
    exp = tmp_path / "exp.toml"
    exp.write_text(f'[experiment]\nname = "{name}"\noutput_dir = "{out}"\n'
                   '[[tasks]]\nsource = "synthetic"\nn = 1\n[ice]\nconditions = ["Control"]\n')
    before = tree_digest(tmp_path, skip=("exp.toml",))
    rc = main(["run", str(exp), "--force"])
    err = capsys.readouterr().err
    assert rc == 2 and "experiment.name" in err and "Traceback" not in err
    assert tree_digest(tmp_path, skip=("exp.toml",)) == before


def test_a_nul_in_the_name_is_a_clear_error_at_validate_and_build(tmp_path: Path, capsys):
    exp = tmp_path / "exp.toml"
    exp.write_text('[experiment]\nname = "run\\u0000x"\n[[tasks]]\nsource = "synthetic"\nn = 1\n')
    for cmd in ("validate", "build"):
        assert main([cmd, str(exp)]) == 2
        err = capsys.readouterr().err
        assert "experiment.name" in err and "Traceback" not in err
