"""The public API (``import probe``): cheap to import, and each name does what the stage it wraps does."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import probe
from probe import api
from probe.config import config_from_dict
from probe.errors import ConfigError, ProbeError
from probe.loaded_run import RunNotFoundError, UnknownPromptError

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "numpy", "pandas", "matplotlib", "scipy", "statsmodels", "sentence_transformers")


def test_import_probe_is_cheap_and_every_public_name_resolves() -> None:
    code = (
        "import sys, probe\n"
        f"heavy = {HEAVY!r}\n"
        "names = {n: getattr(probe, n) for n in probe.__all__}\n"  # attribute access imports no heavy library
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
        "print(sorted(n for n, v in names.items() if v is None))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    heavy_loaded, missing = out.stdout.splitlines()
    assert heavy_loaded == "[]"
    assert missing == "[]"


def test_the_public_names_are_the_api_functions() -> None:
    functions = {"load_model", "load_tasks", "run", "analyze", "render_report", "load_run", "show"}
    assert {n for n in probe.__all__ if n[0].islower() and n != "__version__"} == functions  # the stages: methods
    for name in probe.__all__:
        if name != "__version__":
            assert getattr(probe, name) is not None
            assert name in dir(probe)
    assert probe.load_model is api.load_model and probe.Run is api.Run
    with pytest.raises(AttributeError):
        probe.no_such_name  # noqa: B018


def test_load_tasks_refuses_an_option_its_source_does_not_read() -> None:
    with pytest.raises(ConfigError, match="'difficulty' has no effect for source 'synthetic'"):
        probe.load_tasks("synthetic", n=1, difficulty=[1])
    tasks = probe.load_tasks("synthetic", n=2, hops=3, seed=7)
    assert len(tasks) == 2 and all(len(t.hops) == 3 for t in tasks)


@pytest.mark.integration
def test_build_prompts_equals_what_an_experiment_builds(tmp_path: Path, tiny_card: Path) -> None:
    from probe.runner.prompts import build_run_prompts as runner_build

    cfg = config_from_dict({
        "experiment": {"name": "b", "seed": 11, "models": [str(tiny_card)], "output_dir": str(tmp_path)},
        "tasks": [{"source": "synthetic", "n": 2, "hops": 2}],
        "ice": {"loads": [20, 50], "replications": 2},
        "analysis": {"embedder": ""},
    })
    expected = runner_build(cfg, progress=False)["tiny-llama"]
    tasks = probe.load_tasks("synthetic", n=2, hops=2, seed=11)
    m = probe.load_model(str(tiny_card), device="cpu")
    got = m.build_prompts(tasks, loads=[20, 50], replications=2, seed=11)
    assert got == expected
    # one cell at a time gives the same prompt as the whole set
    by_id = {p.prompt_id: p for p in got}
    for cond, load in (("Control", 0), ("Saturation", 50), ("Residue", 20), ("LongControl", 50)):
        one = m.build_prompt(tasks[1], cond, load=load, replication=1, seed=11)
        assert one == by_id[one.prompt_id]
        assert (one.condition, one.load, one.replication, one.task_id) == (cond, load, 1, tasks[1].task_id)
    with pytest.raises(ProbeError, match="unknown condition 'Saturaton'"):
        m.build_prompt(tasks[0], "Saturaton")


@pytest.mark.integration
def test_a_task_with_its_own_segments_gives_one_prompt_and_no_condition(tiny_card: Path) -> None:
    task = probe.load_tasks("cogniload", n=1, difficulty=[1], length=[20], needle_ratio=[50])[0]
    m = probe.load_model(str(tiny_card), device="cpu")
    prompt = m.build_prompt(task)
    assert prompt.condition == "CogniLoad" and prompt.family == "cogniload"
    assert m.build_prompts(task) == [prompt]
    with pytest.raises(ProbeError, match="has no ICE condition 'Saturation'"):
        m.build_prompt(task, "Saturation")


@pytest.mark.integration
def test_the_methods_of_a_loaded_model_equal_the_stages(tiny_card: Path) -> None:
    from probe.attention import probe_tokenized
    from probe.prompts.tokenize import encode_prompt

    m = probe.load_model(str(tiny_card), device="cpu")
    assert isinstance(m, probe.Model) and repr(m) == "Model('tiny-llama', device=cpu)"
    task = probe.load_tasks("synthetic", n=1)[0]
    prompt = m.build_prompt(task, "Saturation", load=50)
    assert [prompt] == [p for p in m.build_prompts(task, loads=[50]) if p.condition == "Saturation"]
    tp = m.tokenize(prompt)
    assert tp == encode_prompt(prompt, m.tokenizer, m.card.use_chat_template)
    assert tp.count("extraneous") > 0 and tp.count("question") > 0
    res = m.probe(prompt)
    direct = probe_tokenized(m.model, tp)  # the engine on the bare transformers model
    for got in (res, m.probe(tp)):
        np.testing.assert_array_equal(got.seg_mass, direct.seg_mass)
        np.testing.assert_array_equal(got.p_ext, direct.p_ext)
    last = m.probe(tp, query="last", residue=False)
    assert last.n_queries == 1 and last.options["query"] == "last" and last.ar_k is None
    with pytest.raises(ConfigError, match="'qurey' is not a probe option"):
        m.probe(tp, qurey="last")


@pytest.mark.integration
def test_an_argument_of_the_wrong_kind_says_what_to_pass(tiny_card: Path) -> None:
    m = probe.load_model(str(tiny_card), device="cpu")
    task = probe.load_tasks("synthetic", n=1)[0]
    prompt = m.build_prompt(task, "Control")
    with pytest.raises(probe.ArgumentError, match="task must be a Task .* got a Prompt"):
        m.build_prompt(prompt)
    with pytest.raises(probe.ArgumentError, match="prompt must be a built Prompt .* got a Task"):
        m.tokenize(task)
    with pytest.raises(probe.ArgumentError, match="a prompt must be a built Prompt or a TokenizedPrompt"):
        m.probe(task)
    assert issubclass(probe.ArgumentError, ProbeError) and issubclass(probe.ArgumentError, TypeError)


@pytest.mark.integration
def test_the_engine_functions_accept_the_loaded_model_the_readme_passes(tiny_card: Path) -> None:
    """The probe engine and the intervention engine, given a ``probe.load_model`` model instead of its transformers
    model, use its transformers model (they failed on ``.config``)."""
    import torch

    from probe.attention import probe_batch, probe_tokenized
    from probe.attention.intervention import apply_intervention

    m = probe.load_model(str(tiny_card), device="cpu")
    tp = m.tokenize(m.build_prompt(probe.load_tasks("synthetic", n=1)[0], "Saturation", load=50))
    np.testing.assert_array_equal(probe_tokenized(m, tp).p_ext, probe_tokenized(m.model, tp).p_ext)
    np.testing.assert_array_equal(probe_batch(m, [tp])[0].seg_mass, probe_tokenized(m.model, tp).seg_mass)
    spec = probe.Intervention(kind="knockout", keys="extraneous")
    with torch.no_grad():
        with apply_intervention(m, [tp], spec) as b:
            via_loaded = m.model(b.input_ids, attention_mask=b.attention_mask).logits
        with apply_intervention(m.model, [tp], spec) as b:
            via_model = m.model(b.input_ids, attention_mask=b.attention_mask).logits
    torch.testing.assert_close(via_loaded, via_model, rtol=0, atol=0)


@pytest.mark.integration
def test_a_row_edit_takes_a_torch_mask_a_list_or_a_numpy_array(tiny_card: Path) -> None:
    import torch

    m = probe.load_model(str(tiny_card), device="cpu")
    tp = m.tokenize(m.build_prompt(probe.load_tasks("synthetic", n=1)[0], "Saturation", load=50))
    n = len(tp.input_ids)
    mask = np.zeros(n, dtype=bool)
    mask[5:15] = True
    logits = []
    for keys in (mask, torch.from_numpy(mask), mask.tolist()):
        edit = probe.RowEdit(keys=keys, query_start=n - 3)
        assert isinstance(edit.keys, np.ndarray) and edit.n_keys == 10
        np.testing.assert_array_equal(edit.keys, mask)
        with torch.no_grad(), m.intervention([tp], kind="knockout", row_edits=[edit]) as b:
            logits.append(m.model(b.input_ids, attention_mask=b.attention_mask).logits)
    with torch.no_grad():
        plain = m.model(torch.tensor([tp.input_ids])).logits
    assert not torch.equal(logits[0][0, -1], plain[0, -1])  # the edit reached the last query
    assert all(torch.equal(logits[0], other) for other in logits[1:])
    with pytest.raises(ConfigError, match="RowEdit.keys: a 1-D bool mask .* got torch.int64"):
        probe.RowEdit(keys=torch.ones(n, dtype=torch.int64), query_start=1)
    with pytest.raises(ConfigError, match="RowEdit.keys: a 1-D bool mask .* got list of shape \\(3,\\)"):
        probe.RowEdit(keys=[1, 0, 1], query_start=1)


def test_load_tasks_takes_a_source_name_or_a_task_section() -> None:
    from probe.tasks import TaskSection
    from probe.tasks import get_source

    section = TaskSection.of("synthetic", n=3, hops=3)
    got = probe.load_tasks(section, seed=7)
    assert got == get_source("synthetic").load(section.options, 7)  # the source itself, not the function under test
    assert got == probe.load_tasks("synthetic", n=3, hops=3, seed=7)
    with pytest.raises(probe.ArgumentError, match="a TaskSection carries its own n and options; drop n, hops"):
        probe.load_tasks(section, 2, hops=2)
    with pytest.raises(probe.ArgumentError, match="source must be a task source name .* got builtins.dict"):
        probe.load_tasks({"source": "synthetic"})


@pytest.mark.parametrize("section", ["tasks", "interventions", "models", "nonsense"])
def test_run_refuses_an_override_of_a_section_that_is_not_one_table(tmp_path: Path, section: str) -> None:
    exp = {"experiment": {"name": "x", "output_dir": str(tmp_path)}, "tasks": [{"source": "synthetic", "n": 1}]}
    path = tmp_path / "x.toml"
    path.write_text('[experiment]\nname = "x"\n[[tasks]]\nsource = "synthetic"\nn = 1\n')
    for experiment in (exp, path, config_from_dict(exp)):
        with pytest.raises(ConfigError, match=f"section {section!r} cannot be overridden key by key"):
            probe.run(experiment, {section: {"n": 2}}, progress=False)
    assert list(tmp_path.iterdir()) == [path]  # nothing written
    with pytest.raises(ConfigError, match=r"overrides\['generation'\]: a dict of key -> value"):
        api.experiment_config(exp, {"generation": 16})
    with pytest.raises(probe.ArgumentError, match="overrides: a dict of section -> key -> value"):
        api.experiment_config(exp, [("generation", {})])
    with pytest.raises(probe.ArgumentError, match="experiment: an experiment TOML path"):
        api.experiment_config(42)


def test_experiment_config_applies_overrides_to_a_file_a_dict_or_a_config(tmp_path: Path) -> None:
    exp = {"experiment": {"name": "x"}, "tasks": [{"source": "synthetic", "n": 1}]}
    over = {"experiment": {"output_dir": str(tmp_path)}, "generation": {"max_new_tokens": 5, "batch_size": None}}
    from_dict = api.experiment_config(exp, over)
    assert from_dict.run_dir == tmp_path / "x" and from_dict.generation.max_new_tokens == 5
    assert from_dict.generation.batch_size == 8  # None means "not given"
    from_cfg = api.experiment_config(config_from_dict(exp), over)
    assert from_cfg == from_dict
    path = tmp_path / "x.toml"
    path.write_text('[experiment]\nname = "x"\n[[tasks]]\nsource = "synthetic"\nn = 1\n')
    assert api.experiment_config(path, over) == from_dict
    with pytest.raises(ConfigError, match="generation.max_tokens is not a key"):
        api.experiment_config(config_from_dict(exp), {"generation": {"max_tokens": 3}})
    with pytest.raises(ConfigError, match="unknown key"):
        api.experiment_config(exp, {"generation": {"max_tokens": 3}})


def _tiny_experiment(tmp_path: Path, card: Path, probe_on: bool = True) -> dict:
    return {
        "experiment": {"name": "api", "seed": 5, "models": [str(card)], "output_dir": str(tmp_path)},
        "tasks": [{"source": "synthetic", "n": 1, "hops": 2}],
        "ice": {"conditions": ["Control", "Saturation"], "loads": [50], "replications": 1},
        "generation": {"max_new_tokens": 3, "batch_size": 2},
        "probe": {"enabled": probe_on},
        "analysis": {"embedder": ""},
    }


@pytest.mark.integration
def test_run_analyze_report_and_load_run(tmp_path: Path, tiny_card: Path) -> None:
    from probe.attention.result import SegmentAttention
    from probe.records import load_trials
    from probe.runfolder import RunFolder

    run = probe.run(_tiny_experiment(tmp_path, tiny_card), analyze=True, report=True, progress=False)
    folder = RunFolder(tmp_path / "api")
    assert isinstance(run, probe.Run) and run.path == folder.root
    assert folder.analysis.is_file() and folder.report.is_file()
    assert run.models == ("tiny-llama",) and run.is_local("tiny-llama")
    assert run.config.experiment.seed == 5 and run.manifest is not None
    assert [t.to_dict() for t in run.trials] == [t.to_dict() for t in load_trials(folder.trials)]
    assert len(run.prompts) == 2 and set(run.prompts) == {t.prompt_id for t in run.trials}
    pid = next(p for p in run.prompts if run.prompts[p].condition == "Saturation")
    att = run.attention(pid)
    disk = SegmentAttention.load(folder.attention_record("tiny-llama", pid))
    np.testing.assert_array_equal(att.seg_mass, disk.seg_mass)
    assert run.trials_of(pid)[0].prompt_id == pid and len(run.trials_frame()) == 2
    assert run.analysis() is not None
    # the same folder loaded again; analyse and report through the API
    again = probe.load_run(str(folder.root))
    assert again.prompts == run.prompts
    assert probe.render_report(again) == folder.report
    assert probe.analyze(folder.root) is not None
    control = next(p for p in run.prompts if run.prompts[p].condition == "Control")
    run.attention_path(control).unlink()
    with pytest.raises(ProbeError, match="the run has not probed it"):
        run.attention(control)
    with pytest.raises(UnknownPromptError, match="did you mean"):
        run.prompt(pid.replace("Saturation", "Saturaton"))
    with pytest.raises(RunNotFoundError, match="not a run folder"):
        probe.load_run(tmp_path)
    with pytest.raises(ConfigError, match="needs analyze=True"):
        probe.run(_tiny_experiment(tmp_path, tiny_card), report=True, progress=False)


@pytest.mark.integration
def test_a_run_without_probing_has_no_attention_record(tmp_path: Path, tiny_card: Path) -> None:
    run = probe.run(_tiny_experiment(tmp_path, tiny_card, probe_on=False), progress=False)
    pid = next(iter(run.prompts))
    assert not run.has_attention(pid)
    with pytest.raises(ProbeError, match="no attention record"):
        run.attention(pid)
    with pytest.raises(ProbeError, match="has not been analysed"):
        run.analysis()


def test_a_run_folder_is_recognised_by_its_config(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    with pytest.raises(RunNotFoundError):
        probe.load_run(tmp_path / "r")
    for call in (probe.load_run, probe.analyze, probe.render_report):
        with pytest.raises(probe.ArgumentError, match=r"(load_run: path|analyze: run|render_report: run) must be a run folder"):
            call(42)
    exp = config_from_dict({"experiment": {"name": "r", "output_dir": str(tmp_path)},
                            "tasks": [{"source": "synthetic", "n": 1}]})
    from probe.config import dump_config

    (tmp_path / "r" / "config.toml").write_text(dump_config(exp))
    run = probe.load_run(tmp_path / "r")
    assert run.prompts == {} and run.trials == [] and run.manifest is None
    with pytest.raises(probe.ArgumentError, match="prompt_id: a prompt id as in prompts.jsonl .* got 42"):
        run.prompt(42)
    assert run.models == ("smollm2-135m-instruct",)
    assert dataclasses.asdict(run.config) == dataclasses.asdict(exp)
    assert json.loads(json.dumps(run.config.to_dict())) == exp.to_dict()


# the public names that a stage also defines, with the same contract (the public one only adds defaults): a call
# that one accepts, the other accepts and answers the same way
SAME_CONTRACT = {("load_model", "probe.loading"), ("render_report", "probe.report.render")}


def test_no_stage_defines_a_public_name_of_probe_with_another_contract() -> None:
    import importlib
    import inspect
    import pkgutil

    public = {n for n in probe.__all__ if inspect.isfunction(getattr(probe, n, None))}
    clashes = []
    for info in pkgutil.walk_packages(probe.__path__, "probe."):
        if info.name in ("probe.api", "probe.__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (a weights package, a data set) that is not installed
            continue
        for name, obj in vars(module).items():
            if name in public and inspect.isfunction(obj) and obj.__module__ == info.name \
                    and obj is not getattr(probe, name) and (name, info.name) not in SAME_CONTRACT:
                clashes.append(f"{info.name}.{name}")
    assert clashes == []


@pytest.mark.integration
def test_generate_answers_as_greedy_decoding_does_and_under_an_intervention(tiny_card: Path) -> None:
    import torch

    m = probe.load_model(str(tiny_card), device="cpu")
    tasks = probe.load_tasks("synthetic", n=2)
    prompts = [m.build_prompt(t, "Saturation", load=50) for t in tasks]
    got = m.generate(prompts, max_new_tokens=4, batch_size=1)
    assert [g.text for g in got] == [g.text for g in m.generate(prompts, max_new_tokens=4)]  # batched too
    for p, g in zip(prompts, got):  # transformers' own greedy decoding of the same input
        ids = torch.tensor([m.tokenize(p).input_ids])
        with torch.no_grad():
            out = m.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                                   pad_token_id=m.tokenizer.pad_token_id)
        new = out[0, ids.shape[1]:].tolist()
        assert list(g.output_ids or ()) == new[:len(g.output_ids or ())]
        assert g.text == m.tokenizer.decode(list(g.output_ids or ()), skip_special_tokens=True)
    spec = probe.Intervention(kind="knockout", keys="extraneous")
    edited = m.generate(prompts[0], intervention=spec, max_new_tokens=4)[0]
    with torch.no_grad(), m.intervention(prompts[0], spec) as b:
        out = m.model.generate(b.input_ids, attention_mask=b.attention_mask, max_new_tokens=4, do_sample=False,
                               pad_token_id=m.tokenizer.pad_token_id)
    assert list(edited.output_ids or ())[:4] == out[0, b.input_ids.shape[1]:].tolist()[:len(edited.output_ids or ())]
    with pytest.raises(ConfigError, match="'max_tokens' is not a \\[generation\\] key"):
        m.generate(prompts[0], max_tokens=3)
    with pytest.raises(probe.ArgumentError, match="prompts must be built Prompts .* got a Task"):
        m.generate(tasks[0])


@pytest.mark.integration
def test_a_number_or_a_name_of_the_wrong_type_is_named_with_what_to_pass(tiny_card: Path) -> None:
    from probe.errors import UnknownNameError

    m = probe.load_model(str(tiny_card), device="cpu")
    task = probe.load_tasks("synthetic", n=1)[0]
    assert m.build_prompt(task, "Saturation", load=50.0) == m.build_prompt(task, "Saturation", load=50)
    assert m.build_prompt(task, "Saturation", load=np.int64(50)) == m.build_prompt(task, "Saturation", load=50)
    cases = [(lambda: m.build_prompt(task, 42), "condition must be a condition name .* got 42"),
             (lambda: m.build_prompt(task, "Saturation", load="50"), "load must be a whole number, got '50'"),
             (lambda: m.build_prompt(task, "Saturation", load=True), "load must be a whole number, got True"),
             (lambda: m.build_prompt(task, "Saturation", replication=0.5), "replication must be a whole number"),
             (lambda: m.build_prompts(task, loads=["20"]), "each of loads must be a whole number, got '20'"),
             (lambda: probe.load_tasks("synthetic", n="2"), "n must be a whole number, got '2'"),
             (lambda: probe.load_tasks("synthetic", seed=None), "seed must be a whole number, got None")]
    for call, message in cases:
        with pytest.raises(probe.ArgumentError, match=message):
            call()
    err = UnknownNameError("condition", 42, ["Control", "42x"])  # a name of another type still gets its hint
    assert "unknown condition 42; did you mean '42x'?" in str(err)
