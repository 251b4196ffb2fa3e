"""The command line: every numeric flag checked when parsed, passed values never dropped, and a damaged record file
stopping ``probe run``, ``probe analyze`` and ``probe report`` with ``file:line`` before they write anything."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from probe.cli import _overrides, build_parser, main
from probe.runfolder import RunFolder
from tests.fixtures import synthetic_run
from tests.fixtures.experiment import tiny_experiment

def write_experiment(tmp_path: Path, card: str | Path) -> Path:
    """The CLI tests' experiment ("cli": 2 questions, Control and Saturation at 50 %, 2 new tokens)."""
    return tiny_experiment(tmp_path / "exp.toml", [card], experiment={"name": "cli"},
                           generation={"max_new_tokens": 2})


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    return write_experiment(tmp_path, "smollm2-135m-instruct")


@pytest.mark.parametrize("argv", [
    ["run", "{exp}", "--batch-size", "0"],
    ["run", "{exp}", "--max-new-tokens", "-3"],
    ["run", "{exp}", "--replications", "0"],
    ["build", "{exp}", "--replications", "0"],
    ["validate", "{exp}", "--replications", "0"],
    ["analyze", "outputs/x", "--max-new-tokens", "0"],
    ["bench", "generate", "--n", "0"],
    ["bench", "generate", "--batch-size", "0"],
    ["bench", "attention", "--lengths", "512,0"],
    ["bench", "attention", "--lengths", "512,,2048"],
])
def test_numeric_flags_below_one_are_refused_when_parsed(argv, experiment, capsys):
    with pytest.raises(SystemExit) as stop:
        main([a.format(exp=experiment) for a in argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "must be >= 1" in err or "comma-separated whole numbers" in err
    flag = next(a for a in argv if a.startswith("--"))
    assert f"argument {flag}" in err


@pytest.mark.parametrize("value", ["two", "1.5"])
def test_a_flag_that_is_not_a_whole_number_is_refused(value, experiment, capsys):
    with pytest.raises(SystemExit):
        main(["run", str(experiment), "--batch-size", value])
    assert "is not a whole number" in capsys.readouterr().err


def test_passed_values_reach_the_config_even_when_falsy(experiment, capsys):
    args = build_parser().parse_args(["run", str(experiment), "--name", "", "--batch-size", "5", "--no-probe"])
    assert _overrides(args) == {"experiment": {"name": ""}, "generation": {"batch_size": 5},
                                "probe": {"enabled": False}}
    assert main(["validate", str(experiment), "--name", ""]) == 2  # refused by the config, not dropped
    assert "experiment.name" in capsys.readouterr().err


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _damage(path: Path, line: int) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[line - 1] = lines[line - 1][:40] + "\n"
    path.write_text("".join(lines), encoding="utf-8")


@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> Path:
    """A run folder (records made without a model) that has been analysed once."""
    run = tmp_path_factory.mktemp("cli") / "demo"
    synthetic_run.make_run(run, synthetic_run.Plan(n_tasks=6, loads=(50,), seed=2))
    assert main(["analyze", str(run)]) == 0
    return run


@pytest.mark.parametrize("command", ["analyze", "report"])
@pytest.mark.parametrize("damaged", ["trials", "prompts"])
def test_analyze_and_report_stop_at_a_damaged_line_and_write_nothing(analysed, tmp_path, capsys, command, damaged):
    run = RunFolder(tmp_path / "demo")
    shutil.copytree(analysed, run.root)
    if damaged == "prompts":
        run.analysis.unlink()  # the report reads prompts only through a new analysis
    _damage(getattr(run, damaged), 5)
    before = _snapshot(run.root)
    capsys.readouterr()
    assert main([command, str(run.root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {getattr(run, damaged)}:5: not valid JSON")
    assert _snapshot(run.root) == before


@pytest.mark.integration
def test_run_stops_at_a_damaged_line_and_writes_nothing(tmp_path, tiny_card, capsys):
    exp = write_experiment(tmp_path, tiny_card)
    assert main(["run", str(exp), "-q"]) == 0
    run = RunFolder(tmp_path / "outputs" / "cli")
    _damage(run.trials, 2)
    before = _snapshot(run.root)
    capsys.readouterr()
    assert main(["run", str(exp), "-q", "--analyze", "--report"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {run.trials}:2: not valid JSON")
    assert _snapshot(run.root) == before


@pytest.mark.integration
def test_bench_attention_measures_the_model_named_by_model(tiny_card, monkeypatch, capsys):
    """`--model CARD` loads that card (not the default) and labels the figures with it."""
    import probe.loading

    loaded: list[str] = []
    real = probe.loading.load_model

    def spy(name, *args, **kwargs):
        loaded.append(str(name))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(probe.loading, "load_model", spy)
    assert main(["bench", "attention", "--model", str(tiny_card), "--lengths", "", "--probe-batch", "2"]) == 0
    assert loaded == [str(tiny_card)]
    assert f"batched probing (AR_k on): {tiny_card}," in capsys.readouterr().out


def test_bench_attention_refuses_lengths_beyond_the_context_window_before_loading(tiny_card, capsys):
    # a unit-tier test: loading the model would fail it (tests/tiers.py)
    assert main(["bench", "attention", "--model", str(tiny_card), "--lengths", "512,5000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --lengths: 5000 exceed(s) the 4096-token context window") and str(tiny_card) in err


def test_limit_takes_at_most_n_tasks_of_each_section(tmp_path, capsys):
    """``--limit N`` (as lm-eval's): each [[tasks]] section's n capped at N, a smaller n kept; validate says how
    many tasks the run would have."""
    from probe.cli import _load

    exp = tiny_experiment(tmp_path / "exp.toml", ["smollm2-135m-instruct"],
                          tasks=[{"source": "synthetic", "n": 5, "hops": 2}, {"source": "synthetic", "n": 1, "hops": 3}])
    cfg = _load(build_parser().parse_args(["validate", str(exp), "--limit", "2"]))
    assert [t.n for t in cfg.tasks] == [2, 1]
    assert main(["validate", str(exp), "--limit", "2"]) == 0
    assert "3 tasks" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:  # a limit of no task is refused when parsed
        main(["validate", str(exp), "--limit", "0"])
    assert stop.value.code == 2 and "--limit: 0 must be >= 1" in capsys.readouterr().err
