"""Family registries: a benchmark adds one analysis and one report section, found by its family's name; the shared
stages (analysis run, results file, tables, text, report, comparison) name no family. The toy family here is what
docs/architecture.md#extending-the-toolkit lists for an analysis result with a figure: its result type, its analysis,
its section's blocks (a plot among them) and its tables; several runs merge by the generic rule."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

import probe
from probe.analysis import analyze_run, read_analysis
from probe.analysis import families as analysis_families
from probe.analysis.estimates import Cell, cell_summaries
from probe.analysis.families import FamilyAnalysis, FamilyData, FamilyOutput, family_analysis
from probe.errors import UnknownNameError
from probe.records import TrialRecord, append_jsonl
from probe.report import compare_runs, main_table_text, render_report, write_tables
from probe.report import sections as report_sections
from probe.report.blocks import Block, Bullets, Heading, Plot, table_of
from probe.report.sections import ReportSection
from probe.config import AnalysisSection
from probe.report.tables import rows_of
from probe.runfolder import RunFolder
from tests.fixtures.synthetic_run import Plan, make_run

PROBE = Path(probe.__file__).parent
SHARED = ["analysis/__init__.py", "analysis/run.py", "analysis/results.py", "analysis/families.py",
          "analysis/frame.py", "analysis/estimates.py", "analysis/glm.py", "report/__init__.py", "report/render.py",
          "report/compare.py", "report/tables.py", "report/text.py", "report/sections.py", "report/html.py",
          "report/figures.py", "formatting.py"]
FAMILY_NAMES = ("ice", "cogniload")


def _names_in_code(path: Path) -> list[str]:
    """String constants (docstrings left out) and imported module names of a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append(node.value)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


@pytest.mark.parametrize("module", SHARED)
def test_shared_modules_name_no_family(module):
    for name in _names_in_code(PROBE / module):
        low = name.lower()
        assert "cogniload" not in low and low != "ice" and not low.endswith(".ice"), f"{module}: {name!r}"
        assert not any(low.startswith(f"probe.{stage}.{f}") for stage in ("analysis", "report")
                       for f in FAMILY_NAMES), f"{module} imports {name}"


# ----------------------------------------------------------------------------------- a family added in a test


@dataclass(frozen=True)
class ToyResult:
    """A made-up family's result: its cells and the mean prompt length per model."""

    models: tuple[str, ...]
    cells: tuple[Cell, ...]
    mean_prompt_tokens: dict[str, float]


def _toy_analyze(data: FamilyData) -> FamilyOutput:
    df = data.frame
    tokens = {m: float(df.loc[df["model"] == m, "prompt_tokens"].mean()) for m in sorted(set(df["model"]))}
    result = ToyResult(models=tuple(tokens), cells=tuple(cell_summaries(df, data.settings.alpha)),
                       mean_prompt_tokens=tokens)
    return FamilyOutput(result=result, notes=(f"toy: {len(df)} trials",))


def _toy_figure(result: ToyResult):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    fig.subplots().bar(list(result.mean_prompt_tokens), list(result.mean_prompt_tokens.values()))
    return fig


def _toy_blocks(result: ToyResult, settings: AnalysisSection) -> list[Block]:
    tokens = result.mean_prompt_tokens
    return [Heading("Toy benchmark"), Bullets(tuple(f"{m}: {v:.1f} prompt tokens" for m, v in tokens.items())),
            Plot("toy_tokens", "Mean prompt tokens per model.", lambda: _toy_figure(result)),
            table_of(["model", "prompt tokens"], [[m, f"{v:.1f}"] for m, v in tokens.items()])]


TOY_ANALYSIS = FamilyAnalysis(name="toy", result_type=ToyResult, analyze=_toy_analyze,
                              tabulate=lambda data: _toy_analyze(data).result, methods={"toy": "mean prompt length"})
TOY_SECTION = ReportSection(  # what it says (its blocks) and what it publishes; runs merge by the generic rule
    family="toy", blocks=_toy_blocks, tables=lambda result: [("toy_cells", rows_of(result.cells))],
    main_rows=lambda result: [(c, "") for c in result.cells],
    main_lines=lambda result, settings: [f"toy {m}: {v:.1f} tokens" for m, v in result.mean_prompt_tokens.items()])


def _toy_trials(n: int) -> list[dict]:
    return [TrialRecord(trial_id=f"toy-model::{i}", model="toy-model", prompt_id=f"toy-{i}", task_id=f"toy-{i % 4}",
                        source="toy-source", condition="Toy", load=0, achieved_load=0.0, replication=0,
                        prompt_tokens=10 + i, output="x", answer="x", gold="x", em=float(i % 3 == 0), hop_recall=None,
                        truncated=False, uninterpretable=False, family="toy").to_dict() for i in range(n)]


@pytest.fixture
def toy():
    analysis_families.register_family_analysis(TOY_ANALYSIS)
    report_sections.register_section(TOY_SECTION)
    yield
    analysis_families.ANALYSES.unregister("toy")
    report_sections.SECTIONS.unregister("toy")


def test_a_new_family_needs_one_analysis_and_one_report_section(tmp_path, toy):
    run = tmp_path / "mixed"
    make_run(run, Plan(n_tasks=6, n_reps=1, loads=(50,), seed=2))
    append_jsonl(RunFolder(run).trials, _toy_trials(12))
    analysis = analyze_run(run)
    assert list(analysis.families) == ["ice", "toy"] and analysis.n_trials_by_family["toy"] == 12
    toy_result = analysis.families["toy"]
    assert isinstance(toy_result, ToyResult) and toy_result.mean_prompt_tokens == {"toy-model": 15.5}
    assert "toy-model" not in analysis.families["ice"].models  # ICE estimates see ICE trials only
    assert read_analysis(run) == analysis  # analysis.json read back into the family's own type
    assert "toy: 12 trials" in analysis.notes and analysis.methods["toy"] == "mean prompt length"
    write_tables(analysis, run)
    assert (run / "tables" / "toy_cells.csv").read_text().count("\n") == 2  # header + one cell
    md = (run / "analysis.md").read_text()  # the section's blocks, its plot left out
    assert "## Toy benchmark\n\n- toy-model: 15.5 prompt tokens\n\n| model | prompt tokens |\n|---|---|\n" in md
    assert "| toy-model | 15.5 |" in md
    text = main_table_text(analysis)
    assert "toy-model" in text and "toy toy-model: 15.5 tokens" in text
    html = render_report(run).read_text()
    assert "<h2>Toy benchmark</h2>" in html and "Table 1" in html
    assert 'alt="toy_tokens"' in html and (run / "figures" / "toy_tokens.png").is_file()
    page = compare_runs([run, run], tmp_path / "cmp").read_text()  # the generic merge: each run's model renamed
    assert "mixed: toy-model: 15.5 prompt tokens" in page and "mixed#1: toy-model: 15.5 prompt tokens" in page


def test_trials_of_a_family_without_an_analysis_are_refused(tmp_path):
    run = tmp_path / "unknown"
    rows = _toy_trials(3)
    for r in rows:
        r["family"] = "bench9"
    append_jsonl(RunFolder(run).trials, rows)
    with pytest.raises(UnknownNameError, match=r"analysis family 'bench9'.*valid: .*cogniload.*ice"):
        analyze_run(run)
    assert not RunFolder(run).analysis.exists()
    with pytest.raises(UnknownNameError, match="bench9"):
        family_analysis("bench9")


def test_an_analysis_file_naming_an_unknown_family_is_refused(tmp_path, toy):
    run = tmp_path / "gone"
    append_jsonl(RunFolder(run).trials, _toy_trials(6))
    analyze_run(run)
    data = json.loads(RunFolder(run).analysis.read_text())
    data["families"]["bench9"] = data["families"].pop("toy")
    RunFolder(run).analysis.write_text(json.dumps(data))
    with pytest.raises(UnknownNameError, match="bench9"):
        read_analysis(run)


def test_a_second_report_section_or_analysis_for_a_family_is_refused_and_a_typo_answered(toy):
    from probe.registry import DuplicateEntryError

    with pytest.raises(DuplicateEntryError, match="report section 'toy' is registered already"):
        report_sections.register_section(TOY_SECTION)
    with pytest.raises(DuplicateEntryError, match="analysis family 'toy' is registered already"):
        analysis_families.register_family_analysis(TOY_ANALYSIS)
    with pytest.raises(UnknownNameError, match="report section 'cogniloda'; did you mean 'cogniload'"):
        report_sections.report_section("cogniloda")
    with pytest.raises(UnknownNameError, match="analysis family 'cogniloda'; did you mean 'cogniload'"):
        analysis_families.family_analysis("cogniloda")
