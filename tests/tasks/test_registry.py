"""The task-source registry: layouts, families, options with no effect refused, and a user's own segments."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from probe.runner import run_experiment
from probe.runner.prompts import build_run_prompts, needs_embedder
from probe.analysis import analyze_run
from probe.cli import main
from probe.config import config_from_dict, dump_config, load_config
from probe.errors import ConfigError, UnknownNameError
from probe.records import load_trials
from probe.tasks import FAMILIES, SOURCES, get_source
from probe.types import CONDITIONS, Hop, Task


def test_every_source_names_a_registered_family_and_an_options_type_that_reads_n() -> None:
    from dataclasses import fields, is_dataclass

    for source in SOURCES.values():
        assert source.family in FAMILIES
        assert is_dataclass(source.options_type) and source.options == {f.name for f in fields(source.options_type)}
        assert "n" in source.options and "source" not in source.options, source.name
        assert source.layout in ("ice", "native", "task")


def test_unknown_source_suggests_the_close_one() -> None:
    with pytest.raises(UnknownNameError, match="did you mean 'cogniload'"):
        get_source("cognilaod")


def test_layout_of_a_user_task_follows_its_segments() -> None:
    jsonl = get_source("jsonl")
    plain = Task("a", "jsonl", "Who?", "x", (Hop("fact."),))
    own = Task("b", "jsonl", "Who?", "x", (Hop("fact."),), segments=(("germane", "fact."),))
    assert not jsonl.is_native(plain) and jsonl.is_native(own)
    assert get_source("cogniload").is_native(plain) and not get_source("synthetic").is_native(own)


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(body)
    return path


@pytest.mark.parametrize(
    "body, match",
    [
        ('[experiment]\nname = "x"\n[[tasks]]\nsource = "fanoutqa"\nhops = 3\n',
         r"tasks\[0\]\.hops: has no effect for source 'fanoutqa'"),
        ('[experiment]\nname = "x"\n[[tasks]]\nsource = "synthetic"\nneedle_ratio = [5]\n',
         r"tasks\[0\]\.needle_ratio: has no effect for source 'synthetic' \(it reads hops, n\)"),
        ('[experiment]\nname = "x"\n[[tasks]]\nsource = "synthetic"\n[[tasks]]\nsource = "cogniload"\nhops = 2\n',
         r"tasks\[1\]\.hops: has no effect for source 'cogniload'"),
        ('[experiment]\nname = "x"\n[[tasks]]\nsource = "cogniload"\n[ice]\nreplications = 1\n',
         r"ice\.replications: the \[ice\] section has no effect"),
    ],
)
def test_options_without_effect_are_refused_naming_the_key(tmp_path, body, match) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(ConfigError, match=match) as err:
        load_config(path)
    assert str(path) in str(err.value)


def test_probe_validate_refuses_an_idle_option(tmp_path, capsys) -> None:
    path = _write(tmp_path, '[experiment]\nname = "x"\n[[tasks]]\nsource = "cogniload"\n[ice]\nloads = [20]\n')
    assert main(["validate", str(path)]) == 2
    assert "ice.loads" in capsys.readouterr().err


def test_ice_section_is_kept_when_one_source_uses_it(tmp_path) -> None:
    body = ('[experiment]\nname = "x"\n[[tasks]]\nsource = "cogniload"\nn = 1\n[[tasks]]\nsource = "synthetic"\n'
            '[ice]\nloads = [20]\n')
    cfg = load_config(_write(tmp_path, body))
    assert cfg.ice.loads == (20,)


def test_dumped_config_holds_only_options_with_an_effect_and_round_trips(tmp_path) -> None:
    cfg = load_config(_write(tmp_path, '[experiment]\nname = "x"\n[[tasks]]\nsource = "cogniload"\nn = 2\n'
                                       'difficulty = [1, 3]\n'))
    text = dump_config(cfg)
    assert "[ice]" not in text and "hops" not in text and "max_hops" not in text
    assert config_from_dict(tomllib.loads(text)) == cfg


@pytest.mark.parametrize(
    "tasks, ice, expected",
    [
        ([{"source": "cogniload"}], None, False),  # S_sim is not defined for CogniLoad
        ([{"source": "synthetic"}], {"conditions": ["Control", "LongControl"]}, False),  # nothing extraneous
        ([{"source": "synthetic"}], {"conditions": ["Control", "Saturation"]}, True),
        ([{"source": "jsonl", "path": "x.jsonl"}], {"conditions": ["Control"]}, True),  # own segments may hold some
        ([{"source": "synthetic"}], {"conditions": ["Control"], "distractor_strategy": "stratified"}, True),
    ],
)
def test_the_embedder_loads_only_where_a_prompt_needs_it(tasks, ice, expected) -> None:
    data: dict = {"experiment": {"name": "x"}, "tasks": tasks}
    if ice is not None:
        data["ice"] = ice
    assert needs_embedder(config_from_dict(data)) is expected


@pytest.mark.integration
def test_a_user_task_with_its_own_segments_is_laid_out_as_written_and_analysed_as_ice(tmp_path, tiny_card) -> None:
    own = {"task_id": "own-1", "question": "Where does Brannoc live?", "gold": "Velt",
           "hops": [{"fact": "Brannoc lives in Velt.", "answer": "Velt"}],
           "segments": [["extraneous", "The river Oss is wide."], ["germane", "Brannoc lives in Velt."]]}
    named = {**own, "task_id": "own-2", "condition": "Saturation"}
    plain = {k: v for k, v in own.items() if k != "segments"} | {"task_id": "plain-1"}
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in (own, named, plain)) + "\n")
    cfg = config_from_dict({
        "experiment": {"name": "own", "seed": 1, "models": [str(tiny_card)], "output_dir": str(tmp_path)},
        "tasks": [{"source": "jsonl", "path": str(path)}],
        "ice": {"conditions": ["Control", "Saturation"], "loads": [50], "replications": 1},
        "generation": {"max_new_tokens": 2},
        "analysis": {"embedder": ""},
    })
    run_dir = run_experiment(cfg, progress=False)
    trials = {t.task_id: [] for t in load_trials(run_dir / "trials.jsonl")}
    for t in load_trials(run_dir / "trials.jsonl"):
        trials[t.task_id].append(t)
    assert all(t.family == "ice" for ts in trials.values() for t in ts)
    (custom,), (sat,) = trials["own-1"], trials["own-2"]
    assert custom.condition == "Custom" and sat.condition == "Saturation"
    assert custom.load == sat.load == round(custom.achieved_load) and 0 < custom.load < 100  # measured, rounded
    assert sorted(t.condition for t in trials["plain-1"]) == ["Control", "Saturation"]
    prompts = {json.loads(line)["task_id"]: json.loads(line) for line in (run_dir / "prompts.jsonl").open()}
    kinds = [s["kind"] for s in prompts["own-1"]["segments"]]
    assert kinds == ["instruction", "extraneous", "germane", "question"]  # as written, between instruction and question
    analysis = analyze_run(run_dir)
    assert list(analysis.families) == ["ice"]  # nothing analysed as CogniLoad
    ice = analysis.families["ice"]
    cells = {(c.condition, c.load) for c in ice.cells}
    assert {("Custom", custom.load), ("Saturation", sat.load), ("Saturation", 50), ("Control", 0)} <= cells
    h1 = ice.h1_of(custom.model, "Saturation")
    assert h1.n == 3  # Control + the built Saturation prompt + the user's own Saturation prompt
    assert "Custom" not in CONDITIONS


def test_building_cogniload_prompts_never_loads_the_embedder(tmp_path, monkeypatch) -> None:
    """S_sim is not defined for CogniLoad (the family's ``has_s_sim`` is False): building its prompts, with the
    default embedder configured, must not load the sentence embedder at all — it took 60 s for 40 prompts."""
    import probe.prompts.similarity as similarity

    loads: list[str] = []

    def refuse(model: str = "") -> None:
        loads.append(model)
        raise AssertionError(f"the embedder {model!r} was loaded to build CogniLoad prompts")

    monkeypatch.setattr(similarity, "get_embedder", refuse)
    data = {"experiment": {"name": "cl", "seed": 3, "output_dir": str(tmp_path)},
            "tasks": [{"source": "cogniload", "n": 1, "difficulty": [1, 3], "length": [20], "needle_ratio": [5, 95]}]}
    cfg = config_from_dict(data)
    assert cfg.analysis.embedder  # the default embedder is configured; it must still not be loaded
    prompts = build_run_prompts(cfg, progress=False)
    built = [p for ps in prompts.values() for p in ps]
    assert len(built) == 4 and all(p.family == "cogniload" and p.s_sim is None for p in built)
    assert loads == []
    # the same guard does fire where S_sim is defined: an ICE Saturation prompt asks for the embedder
    ice = config_from_dict({**data, "experiment": {**data["experiment"], "name": "ice"},
                            "tasks": [{"source": "synthetic", "n": 1, "hops": 2}],
                            "ice": {"conditions": ["Control", "Saturation"], "loads": [20], "replications": 1}})
    with pytest.raises(AssertionError, match="embedder"):
        build_run_prompts(ice, progress=False)


def test_a_section_holds_its_own_sources_options_type() -> None:
    from probe.tasks import TaskSection
    from probe.tasks.options import CogniloadOptions, SyntheticOptions

    assert TaskSection("synthetic").options == SyntheticOptions()  # no options: the source's defaults
    assert TaskSection.of("synthetic", n=3).options == SyntheticOptions(n=3)
    with pytest.raises(ConfigError, match="source 'synthetic' takes SyntheticOptions, got CogniloadOptions"):
        TaskSection("synthetic", CogniloadOptions())
    with pytest.raises(ConfigError, match=r"tasks\.hops: has no effect for source 'cogniload'"):
        TaskSection.of("cogniload", hops=2)
    with pytest.raises(ConfigError, match=r"tasks\.path: a jsonl task source needs"):
        TaskSection.of("jsonl")
