"""A result holds its arrays (:class:`probe.codec.Grid`): the codec writes each to ``attention_summary.npz``
under its place in the analysis and reads it back into the same field, so a new result with an array needs no
member name made by hand; a pair of files from two analyses is refused."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np
import pytest
from matplotlib.figure import Figure

from probe.analysis import analyze_run, read_analysis
from probe.analysis.families import ANALYSES, FamilyAnalysis, register_family_analysis
from probe.codec import Grid
from probe.analysis.results import AnalysisSchemaError, from_json, write_analysis
from probe.codec import encode
from probe.report import render_report
from probe.config import AnalysisSection
from probe.report.blocks import Block, Heading, Plot
from probe.report.sections import SECTIONS, ReportSection, register_section
from probe.runfolder import RunFolder
from tests.fixtures.synthetic_run import Plan, make_run


@dataclass(frozen=True)
class ToyResult:
    """A toy family's result: a label and one array."""

    label: str
    curve: Grid


def toy_figure(result: ToyResult) -> Figure:
    fig = Figure(figsize=(3, 2))
    fig.subplots().plot(result.curve.values)
    return fig


def toy_blocks(result: ToyResult, settings: AnalysisSection) -> list[Block]:
    """The toy section: the curve drawn, and its sum as text (what the page shows comes from the array)."""
    return [Heading(f"Toy {result.label}: sum {result.curve.values.sum():.1f}"),
            Plot("toy_curve", "a toy", lambda: toy_figure(result))]


@pytest.fixture
def toy_family():
    """The toy family registered for its analysis and its report section (and taken out again)."""
    register_family_analysis(FamilyAnalysis(name="toy", result_type=ToyResult, analyze=lambda d: None,
                                            tabulate=lambda d: None, methods={}))
    register_section(ReportSection(family="toy", blocks=toy_blocks, tables=lambda r: []))
    try:
        yield
    finally:
        ANALYSES.unregister("toy")
        SECTIONS.unregister("toy")


def test_a_new_result_with_an_array_is_written_read_back_and_drawn_without_naming_a_key(tmp_path, toy_family):
    run = RunFolder(tmp_path / "r")
    make_run(run.root, Plan(n_tasks=6, n_reps=1, loads=(50,), seed=1))
    analysis = analyze_run(run.root)
    toy = ToyResult("one", Grid(np.arange(4.0)))
    write_analysis(dataclasses.replace(analysis, families={**analysis.families, "toy": toy}), run)
    assert read_analysis(run).families["toy"] == toy
    with np.load(run.attention_summary) as z:
        assert z.files == ["families.toy.curve"]  # named by its place in the analysis
        np.testing.assert_array_equal(z["families.toy.curve"], [0.0, 1.0, 2.0, 3.0])
    page = render_report(run).read_text()
    assert "Toy one: sum 6.0" in page and (run.figures / "toy_curve.png").is_file()


def test_a_pair_of_files_from_two_analyses_is_refused(tmp_path, toy_family):
    run = RunFolder(tmp_path / "r")
    make_run(run.root, Plan(n_tasks=6, n_reps=1, loads=(50,), seed=1))
    analysis = analyze_run(run.root)
    write_analysis(dataclasses.replace(analysis, families={**analysis.families, "toy": ToyResult(
        "a", Grid(np.zeros(3)))}), run)
    first = run.attention_summary.read_bytes()
    write_analysis(dataclasses.replace(analysis, families={**analysis.families, "toy": ToyResult(
        "b", Grid(np.ones(3)))}), run)
    run.attention_summary.write_bytes(first)  # the arrays of the first analysis beside the JSON of the second
    with pytest.raises(AnalysisSchemaError, match=r"attention_summary\.npz is not the file .*probe analyze"):
        read_analysis(run)
    run.attention_summary.unlink()
    with pytest.raises(AnalysisSchemaError, match=r"attention_summary\.npz: cannot be read .*probe analyze"):
        read_analysis(run)


def test_without_an_arrays_sink_a_grid_is_left_out_and_a_missing_array_is_named():
    toy = ToyResult("x", Grid(np.ones((2, 2))))
    assert encode(toy) == {"label": "x"}  # a CSV row or a comparison of numbers: no array
    arrays: dict[str, np.ndarray] = {}
    data = encode(toy, arrays, "families.toy")
    assert data == {"label": "x", "curve": "families.toy.curve"} and set(arrays) == {"families.toy.curve"}
    assert from_json(ToyResult, json.loads(json.dumps(data)), arrays=arrays) == toy
    with pytest.raises(AnalysisSchemaError, match=r"analysis.curve: names the array 'families.toy.curve', "
                                                  r"which the arrays file lacks"):
        from_json(ToyResult, data, arrays={})


def test_grids_are_equal_by_value_nan_included():
    assert Grid(np.array([1.0, np.nan])) == Grid(np.array([1.0, np.nan]))
    assert Grid(np.array([1.0, 2.0])) != Grid(np.array([1.0, 2.5]))
    assert Grid(np.zeros((2, 2))) != Grid(np.zeros(4))
    assert Grid(np.arange(3)).values.dtype == np.float32  # what attention_summary.npz stores
