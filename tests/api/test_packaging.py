"""The wheel holds the toolkit: built from this checkout and installed outside it (``pip install --target``, a
working directory elsewhere), it lists its own model cards, reads its shipped experiments by name, reports its
version, and puts a user's own cards folder (``$ICE_PROBE_MODELS``) on top of the shipped ones."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from probe.cli import main

ROOT = Path(__file__).resolve().parents[2]
CARDS = sorted(p.name for p in (ROOT / "models").glob("*.toml"))
EXPERIMENTS = sorted(p.name for p in (ROOT / "experiments").glob("*.toml"))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel of this checkout, installed into a folder of its own (no dependencies: those come from the
    environment the tests run in)."""
    work = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(work / "dist"), str(ROOT)], check=True, capture_output=True, text=True)
    wheel = next((work / "dist").glob("ice_probe-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert sorted(Path(n).name for n in names if n.startswith("probe/cards/")) == CARDS
    assert sorted(Path(n).name for n in names if n.startswith("probe/experiments/")) == EXPERIMENTS
    assert not [n for n in names if n.startswith(("scripts/", "tests/", "benchmarks/"))]  # research scripts stay out
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(work / "site"),
                    str(wheel)], check=True, capture_output=True, text=True)
    return work


def _python(installed: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by this interpreter in an empty folder, importing ``probe`` from the installed wheel (the
    environment's packages after it; the checkout's editable install is not on the path)."""
    cwd = installed / "cwd"
    cwd.mkdir(exist_ok=True)
    path = os.pathsep.join([str(installed / "site"), sysconfig.get_paths()["purelib"]])
    return subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path[:0] = {path.split(os.pathsep)!r}\n"
                           + code], cwd=cwd, capture_output=True, text=True, env={**os.environ, **env})


def test_the_installed_wheel_lists_its_own_cards_and_reads_the_demo_by_name(installed: Path) -> None:
    done = _python(installed, "import probe, probe.cli\n"
                              "assert probe.__file__.startswith(sys.path[0]), probe.__file__\n"
                              "raise SystemExit(probe.cli.main(['models']))")
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines()[1:] if line.strip()}
    assert {p[:-len(".toml")] for p in CARDS} <= listed
    done = _python(installed, "from probe.config import load_config\n"
                              "cfg = load_config('demo')\n"
                              "print(cfg.experiment.name, cfg.experiment.models)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "demo" and "smollm2-135m-instruct" in done.stdout
    done = _python(installed, "import probe.cli; probe.cli.main(['--version'])")
    assert "ICE-Probe) 0.1.0" in done.stdout


def test_a_users_cards_folder_comes_first(installed: Path, tmp_path: Path) -> None:
    mine = tmp_path / "cards"
    mine.mkdir()
    (mine / "my-model.toml").write_text('name = "my-model"\nsource = "local"\npath = "/nowhere"\n')
    (mine / "smollm2-135m-instruct.toml").write_text(
        'name = "smollm2-135m-instruct"\nsource = "local"\npath = "/my/copy"\ndescription = "mine"\n')
    done = _python(installed, "from probe.loading import get_card, list_cards\n"
                              "print(get_card('smollm2-135m-instruct').description)\n"
                              "print(sorted(c.name for c in list_cards()))", ICE_PROBE_MODELS=str(mine))
    assert done.returncode == 0, done.stderr
    description, names = done.stdout.splitlines()
    assert description == "mine" and "'my-model'" in names and "'gemma-3-270m'" in names


def test_an_unknown_experiment_name_lists_the_shipped_ones(capsys) -> None:
    assert main(["validate", "no-such-experiment"]) == 2
    err = capsys.readouterr().err
    assert "no-such-experiment: no such experiment file" in err and "demo" in err and "study" in err


def test_probe_bench_from_the_wheel_says_the_benchmarks_are_in_the_checkout(installed: Path) -> None:
    done = _python(installed, "from probe.cli import main\nraise SystemExit(main(['bench', 'attention', '--lengths', "
                              "'64']))")
    assert done.returncode == 2, done.stderr
    assert "the benchmarks live in the source checkout (benchmarks/)" in done.stderr and "Traceback" not in done.stderr
