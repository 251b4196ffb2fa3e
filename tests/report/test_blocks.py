"""The report's blocks (probe/report/blocks.py): one list of blocks written as HTML and as Markdown, and the one
merge of several runs' results."""

from __future__ import annotations

from dataclasses import dataclass, field

from probe.config import AnalysisSection
from probe.report.blocks import (Bullets, Heading, Note, Plot, ReportContext, Text, merge_results, table_of, to_html,
                                 to_markdown)

BLOCKS = [Heading("Results <b>"), Note("a | b < c"), Bullets(("one", "two"), "model <x>"),
          table_of(["model", Text("q", "BH")], [["m|1", Text("0.01", "n=3", strong=True)], ["m2", "0.5"]]),
          Heading("Figures"), Plot("f", "a figure", lambda: None), Heading("After", 2), Note("end")]


def test_html_escapes_every_text_and_marks_what_is_strong():
    page = to_html(BLOCKS, ReportContext(AnalysisSection()))
    assert "<h2>Results &lt;b&gt;</h2>" in page and '<p class="note">a | b &lt; c</p>' in page
    assert "<h3>model &lt;x&gt;</h3><ul><li>one</li><li>two</li></ul>" in page
    assert '<span class="sig">0.01<br><span class="note">n=3</span></span>' in page
    assert 'q<br><span class="note">BH</span>' in page and "<figure" not in page  # the plot drew nothing


def test_markdown_keeps_the_tables_and_leaves_out_the_plots_and_their_heading():
    md = "\n".join(to_markdown(BLOCKS))
    assert md.startswith("## Results &lt;b>\n\na | b < c\n\n### model &lt;x>\n\n- one\n- two\n")  # no tag opens
    assert "| model | q (BH) |\n|---|---|\n| m\\|1 | **0.01** (n=3) |\n| m2 | 0.5 |" in md
    assert "Figures" not in md and "## After\n\nend" in md


@dataclass(frozen=True)
class Row:
    model: str
    value: float


@dataclass(frozen=True)
class Part:
    rows: tuple[Row, ...]
    n: int = field(metadata={"merge": "sum"})
    reason: str | None = None
    labels: tuple[str, ...] = ("hop", "other")  # names, not rows: a part that could not run keeps them


@dataclass(frozen=True)
class Spec:
    name: str
    model: str | None = None


@dataclass(frozen=True)
class Result:
    models: tuple[str, ...]
    rows: tuple[Row, ...]
    by_model: dict[str, float]
    specs: tuple[Spec, ...]
    part: Part | None
    alpha: float = 0.05


def test_the_merge_renames_every_model_keeps_every_row_and_sums_what_adds_up():
    a = Result(("m",), (Row("m", 1.0),), {"m": 2.0}, (Spec("ko"), Spec("top", "m")), Part((Row("m", 3.0),), 4))
    b = Result(("m", "n"), (Row("m", 5.0), Row("n", 6.0)), {"n": 7.0}, (Spec("ko"), Spec("top", "n")),
               Part((), 0, reason="not run"))
    merged = merge_results([("two", b), ("one", a)])  # the part that did not run first: its reason is not taken
    assert merged.part == Part((Row("one: m", 3.0),), 4)
    merged = merge_results([("one", a), ("two", b)])
    assert merged.models == ("one: m", "two: m", "two: n")
    assert [(r.model, r.value) for r in merged.rows] == [("one: m", 1.0), ("two: m", 5.0), ("two: n", 6.0)]
    assert merged.by_model == {"one: m": 2.0, "two: n": 7.0}
    assert merged.specs == (Spec("ko"), Spec("top", "one: m"), Spec("top", "two: n"))  # a shared declaration once
    assert merged.part == Part((Row("one: m", 3.0),), 4)  # the run whose part reports nothing adds nothing
    both = merge_results([("one", a), ("three", a)])
    assert both.part is not None and both.part.n == 8 and len(both.part.rows) == 2  # a count that adds up, added
