"""The one intervention type and its file form: every resolved variant (layers all or listed, sweep windows,
explicit head pairs, top-k heads with their selection, the random control) round-trips through ``to_json`` /
``from_json`` and through the run folder's ``interventions.json``; a file written before ``conditions`` / ``loads``
existed still reads; a malformed entry is refused naming the file, the entry and the field."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import probe.runner.resolve as resolve
from probe.config import ExperimentConfig, config_from_dict
from probe.errors import FieldError
from probe.interventions import (HeadSelection, Intervention, InterventionSpec,
                                 InterventionsFileError, LayerWindow, TopHeads, load_interventions,
                                 write_interventions)
from probe.runner.resolve import resolve_interventions

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "interventions_v1.json"
TOP = ((1, 3), (0, 2), (1, 0))  # what the (stubbed) selection run ranks first

SECTIONS = [
    {"name": "ko", "kind": "knockout"},
    {"name": "ko-l1", "kind": "knockout", "keys": "matched-random", "layers": [1], "conditions": ["Residue"]},
    {"name": "sweep", "kind": "steer", "alpha": 0.25, "queries": "after", "layers": {"window": 1, "stride": 1},
     "loads": [0, 50]},
    {"name": "pairs", "kind": "steer", "alpha": 0.0, "keys": "germane", "heads": [[0, 1], [1, 2]]},
    {"name": "top", "kind": "knockout", "heads": {"top_k": 3, "from": "outputs/select", "by": "p_ext",
                                                   "random_control": True}},
]


@pytest.fixture
def resolved(monkeypatch) -> list[Intervention]:
    def select_heads(from_run, model, k, by, n_layers, n_heads, prompts, questions):  # no selection run: fixed heads
        return TOP[:k], 4

    monkeypatch.setattr(resolve, "select_heads", select_heads)
    return resolve_interventions(_config(), "tiny-llama", 2, 4)


def _config() -> ExperimentConfig:
    return config_from_dict({"experiment": {"name": "iv"}, "tasks": [{"source": "synthetic"}],
                             "ice": {"conditions": ["Control", "Residue"], "loads": [50]}, "interventions": SECTIONS})


def test_a_declared_intervention_and_a_resolved_one_are_two_types(resolved) -> None:
    """An ``[[interventions]]`` table reads as an InterventionSpec (a sweep or a top-k selection allowed); resolving
    it gives Interventions that keep every field the table gave and set only the layers, the heads, the name and
    where they came from. An Intervention, what the engine applies and the file holds, refuses a sweep or a
    selection, from Python and from the file."""
    declared = {d.name: d for d in _config().interventions}
    assert all(type(x) is InterventionSpec for x in declared.values())
    assert all(type(x) is Intervention for x in resolved)
    assert declared["sweep"].layers == LayerWindow(window=1, stride=1)
    assert isinstance(declared["top"].heads, TopHeads)
    kept = {f.name for f in dataclasses.fields(InterventionSpec)} - {"layers", "heads", "name"}
    for r in resolved:
        d = declared[r.group]
        assert {f: getattr(r, f) for f in kept} == {f: getattr(d, f) for f in kept}, r.name
        assert r.model == "tiny-llama" and not isinstance(r.layers, LayerWindow) and not isinstance(r.heads, TopHeads)
    with pytest.raises(FieldError, match="a layer sweep or top-k heads"):
        Intervention(kind="knockout", layers=LayerWindow(window=2))  # type: ignore[arg-type]
    entry = {**resolved[0].to_json(), "layers": {"window": 1, "stride": 1}}
    with pytest.raises(InterventionsFileError, match="field 'layers': a layer sweep or top-k heads"):
        Intervention.from_json(entry, "f.json: entry 0")


def test_every_variant_round_trips_through_its_file_form(resolved) -> None:
    names = [r.name for r in resolved]
    assert names == ["ko", "ko-l1", "sweep@L0-0", "sweep@L1-1", "pairs", "top", "top+random"]
    by = {r.name: r for r in resolved}
    # the resolved values, against the sections above
    assert by["ko"].layers == (0, 1) and by["ko"].heads is None and by["ko"].model == "tiny-llama"
    assert by["ko-l1"].layers == (1,) and by["ko-l1"].conditions == ("Residue",)
    assert by["sweep@L1-1"].window == (1, 1) and by["sweep@L1-1"].group == "sweep" and by["sweep@L1-1"].loads == (0, 50)
    assert by["pairs"].heads == ((0, 1), (1, 2)) and by["pairs"].layers == (0, 1) and by["pairs"].alpha == 0.0
    assert by["top"].heads == TOP and by["top"].selection == HeadSelection(from_run="outputs/select", k=3,
                                                                            by="p_ext", n_prompts=4)
    rnd = by["top+random"]
    assert rnd.selection is not None and rnd.selection.control_of == "top" and len(rnd.heads or ()) == 3
    assert not set(rnd.heads or ()) & set(TOP)
    for r in resolved:
        text = json.dumps(r.to_json())  # plain JSON: no tuple or dataclass left
        back = Intervention.from_json(json.loads(text), "test")
        assert back == r and back.selection == r.selection  # selection too, field by field
        assert back.to_json() == r.to_json()
    d = by["top"].to_json()
    assert d["heads"] == [list(h) for h in TOP] and d["selection"]["from"] == "outputs/select"
    assert by["ko"].to_json()["heads"] == "all"


def test_the_run_folder_file_keeps_other_models(resolved, tmp_path) -> None:
    write_interventions(tmp_path, "tiny-llama", resolved)
    other = [dataclasses.replace(r, model=None) for r in resolved[:2]]  # the same names for another model
    write_interventions(tmp_path, "other", other)
    back = load_interventions(tmp_path)
    assert list(back) == [*resolved, *(dataclasses.replace(r, model="other") for r in other)]
    write_interventions(tmp_path, "tiny-llama", resolved[:1])  # rewriting one model leaves the other as it was
    assert [(r.model, r.name) for r in load_interventions(tmp_path)] == [("other", "ko"), ("other", "ko-l1"),
                                                                        ("tiny-llama", "ko")]


def test_a_file_of_the_first_version_still_reads(tmp_path) -> None:
    """``interventions.json`` as the runner wrote it before ``conditions`` / ``loads`` (tests/fixtures)."""
    shutil.copy(FIXTURE, tmp_path / "interventions.json")
    raw = json.loads(FIXTURE.read_text())
    assert not any("conditions" in e or "loads" in e for e in raw)
    got = {r.name: r for r in load_interventions(tmp_path)}
    assert list(got) == [e["name"] for e in raw]
    for e in raw:  # every value as the file spells it
        r = got[e["name"]]
        assert (r.model, r.group, r.kind, r.alpha, r.keys, r.queries) == (
            e["model"], e["group"], e["kind"], e["alpha"], e["keys"], e["queries"])
        assert r.layers == tuple(e["layers"]) and r.conditions is None and r.loads is None
        assert r.heads == (None if e["heads"] == "all" else tuple(map(tuple, e["heads"])))
        assert r.window == (None if e["window"] is None else tuple(e["window"]))
        sel = e["selection"]
        assert (r.selection is None) == (sel is None)
        if sel is not None and r.selection is not None:
            assert (r.selection.from_run, r.selection.k, r.selection.by, r.selection.n_prompts,
                    r.selection.control_of) == (sel["from"], sel["k"], sel["by"], sel["n_prompts"], sel["control_of"])
    # written again it says the same, now with conditions and loads (null)
    write_interventions(tmp_path, "other", [])
    again = json.loads((tmp_path / "interventions.json").read_text())
    assert [{k: v for k, v in e.items() if k not in ("conditions", "loads")} for e in again] == raw
    # in the key order runs have written since conditions / loads came in, so a rewritten file diffs clean
    assert all(list(e) == ["kind", "keys", "queries", "alpha", "conditions", "loads", "layers", "heads", "name",
                           "group", "window", "selection", "model"] for e in again)


def test_an_entry_with_only_the_first_required_fields_reads() -> None:
    """A hand-written entry: name, kind, keys, queries, layers, heads; the rest takes its default."""
    r = Intervention.from_json({"name": "x", "kind": "knockout", "keys": "filler", "queries": "after",
                                "layers": [2], "heads": "all"})
    assert r == Intervention(kind="knockout", keys="filler", queries="after", layers=(2,), name="x")
    assert r.group == "x" and r.model is None and r.window is None and r.selection is None


ENTRY = {"name": "top", "model": "m", "group": "top", "kind": "knockout", "alpha": None, "keys": "extraneous",
         "queries": "answer", "layers": [0, 1], "heads": [[0, 1], [1, 0]], "window": None,
         "selection": {"from": "outputs/select", "k": 2, "by": "enrichment", "n_prompts": 3, "control_of": None}}


@pytest.mark.parametrize("change, field", [
    ({"keys": "everything"}, "keys"),
    ({"kind": "cut"}, "kind"),
    ({"alpha": 0.5}, "alpha"),
    ({"queries": 3}, "queries"),
    ({"layers": "0-1"}, "layers"),
    ({"layers": [0, True]}, "layers"),
    ({"heads": "some"}, "heads"),
    ({"heads": [[0]]}, "heads"),
    ({"heads": [[0, 1], [3, 0]]}, "heads"),  # a head outside the layers
    ({"window": [1]}, "window"),
    ({"selection": {"from": "x", "k": "2"}}, "selection"),
    ({"selection": {"from": "x", "k": 0}}, "selection"),
    ({"conditions": "Residue"}, "conditions"),
    ({"loads": [50, 50]}, "loads"),
    ({"colour": 1}, "colour"),
])
def test_a_malformed_entry_names_file_entry_and_field(tmp_path, change, field) -> None:
    (tmp_path / "interventions.json").write_text(json.dumps([{**ENTRY, "name": "fine"}, {**ENTRY, **change}]))
    with pytest.raises(InterventionsFileError) as e:
        load_interventions(tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "interventions.json") in msg and "entry 1 (top)" in msg
    assert f"field '{field}" in msg or f"unknown key(s) {field};" in msg, msg


def test_a_missing_field_and_a_repeated_name_are_named(tmp_path) -> None:
    path = tmp_path / "interventions.json"
    path.write_text(json.dumps([{k: v for k, v in ENTRY.items() if k != "heads"}]))
    with pytest.raises(InterventionsFileError, match=r"interventions.json: entry 0 \(top\) has no field 'heads'"):
        load_interventions(tmp_path)
    path.write_text(json.dumps(["top"]))
    with pytest.raises(InterventionsFileError, match=r"interventions.json: entry 0 is str, not an object"):
        load_interventions(tmp_path)
    path.write_text(json.dumps([ENTRY, {**ENTRY, "model": "n"}, ENTRY]))
    with pytest.raises(InterventionsFileError, match=r"'top' of model 'm' is declared more than once"):
        load_interventions(tmp_path)
