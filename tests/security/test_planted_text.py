"""Text from a run folder or a card reaches pages, tables and figures as text: a model name holding `$\\foo$`
(matplotlib's mathtext), `|` or HTML; a task id a spreadsheet would run as a formula; a chunk template that reaches
into an attribute; an attention record whose header claims terabytes; a CSV cell over the csv module's limit."""

from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from probe.cli import main
from tests.fixtures.synthetic_run import Plan, make_run

NAME = "m$\\foo$|<b>x</b>"


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("src") / "run"
    make_run(run, Plan(models=(NAME,), n_tasks=6, n_reps=1, loads=(50,), conditions=("Control", "Saturation")))
    return run


def test_a_model_name_of_mathtext_and_html_is_drawn_and_written_as_text(planted, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(planted, run)
    assert main(["analyze", str(run)]) == 0
    rc = main(["report", str(run)])
    err = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in err, err
    md = (run / "analysis.md").read_text()
    assert "<b>" not in md and "&lt;b>" in md and "m$\\foo$\\|" in md
    assert "<b>x</b>" not in (run / "report.html").read_text()


def test_csv_cells_a_spreadsheet_would_run_are_neutralised():
    from probe.report.tables import csv_text

    import csv

    text = csv_text([{"task_id": "=HYPERLINK(\"x\")", "d": "-0.25", "m": "@SUM(A1)", "ok": "plain"}])
    row = next(csv.DictReader(io.StringIO(text)))
    assert row == {"task_id": "'=HYPERLINK(\"x\")", "d": "-0.25", "m": "'@SUM(A1)", "ok": "plain"}


@pytest.mark.parametrize("template", ["part{n.real.foo}", "part{n[0]}", "part{n!r}", "part{x}", "part{n:>3}", "{"])
def test_a_chunk_template_may_use_only_n_and_i(template):
    from probe.errors import ConfigError
    from probe.gguf_chunks import ChunkSet

    table = {"packages": template, "files": "f{n}.bin", "count": 2, "version": "1", "size": 10, "sha256": "0" * 64}
    with pytest.raises(ConfigError, match=r"chunks\.packages: .*only \{n\} and \{i\}"):
        ChunkSet.from_table(table, "card.toml")


def test_a_bad_chunk_template_is_a_row_of_probe_models_not_its_end(tmp_path, monkeypatch, capsys):
    (tmp_path / "bad.toml").write_text('name = "bad"\nsource = "package"\ngguf_file = "x.gguf"\n'
                                       '[chunks]\npackages = "p{n.real.foo}"\nfiles = "f{n}"\ncount = 2\n'
                                       'version = "1"\nsize = 10\nsha256 = "' + "0" * 64 + '"\n')
    monkeypatch.setenv("ICE_PROBE_MODELS", str(tmp_path))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "bad card" in out and "smollm2-135m-instruct" in out


def test_a_record_whose_header_claims_terabytes_is_a_damaged_record(tmp_path):
    from probe.attention.result import AttentionRecordError, SegmentAttention

    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, dtype=np.float32))
    header["shape"] = (1 << 40,)
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    path = tmp_path / "p.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("meta.npy", _npy(np.array('{"format": 3, "measures": ["p_ext"], "answer": false}')))
        z.writestr("p_ext.npy", buf.getvalue() + b"\0" * 16)
        z.writestr("chance.npy", _npy(np.zeros(2, dtype=np.float32)))
    with pytest.raises(AttentionRecordError, match="not a readable probe record"):
        SegmentAttention.load(path)


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_a_csv_cell_over_the_field_limit_names_the_file_and_line(tmp_path, capsys):
    csv = tmp_path / "t.csv"
    csv.write_text("task_id,condition,output\nq1,Control,ok\nq2,Control," + "x" * 200_000 + "\n")
    assert main(["analyze", str(csv), "--map", "task_id=task_id", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{csv}:3: not a readable CSV row" in err and "Traceback" not in err
