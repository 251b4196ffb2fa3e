"""What the model wrote per cell, tested against Control (probe.analysis.writing), checked against direct counts,
an enumerated sign-flip test and statsmodels' Benjamini–Hochberg."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests

from probe.analysis import analyze_run, read_analysis
from probe.analysis.writing import MEASURES
from probe.config import AnalysisSection
from probe.records import TrialRecord, append_jsonl
from probe.report import write_tables
from probe.report.render import render_report
from probe.types import Hop, Task

FIRST, LAST = "{0} was born in the city of Molvia.", "The city of Molvia lies in the valley of {1}."


def _task(q: int) -> Task:
    name, gold = f"Vorlan{q}", f"Tesh{q}"
    return Task(task_id=f"q{q}", source="s", question=f"Which valley holds the birthplace of {name}?", gold=gold,
                hops=(Hop(FIRST.format(name, gold), "Molvia"), Hop(LAST.format(name, gold), gold)))


def _output(cond: str, q: int, rep: int) -> tuple[str, str, float, int]:
    """(output, answer, EM, tokens): Control reasons in three sentences and marks a bare answer; at 80 % the model
    writes one sentence, restating the last fact for questions 0-5 and the first for 6-8 (question 9 varies by
    replication); Residue reasons as Control does."""
    t = _task(q)
    if cond != "Saturation":
        return (f"{t.hops[0].fact}\n{t.hops[1].fact}\nAnswer: {t.gold}", t.gold, 1.0, 40 + q)
    fact = 1 if q < 6 or (q == 9 and rep == 0) else 0
    line = t.hops[fact].fact
    return line, line, float(fact == 1), 12 + rep


def _run(root: Path, n_questions: int = 10, tasks: bool = True, long: bool = False) -> Path:
    """The trials of ``_output``; with ``long``, LongControl 80 % trials too, written as Control's, and each trial's
    scoring rule recorded (an answer line where the output has one, else the last line)."""
    root.mkdir(parents=True)
    trials, i = [], 0
    cells = (("Control", 0), ("Saturation", 80), ("Residue", 80)) + ((("LongControl", 80),) if long else ())
    for q, rep in itertools.product(range(n_questions), range(2)):
        for cond, load in cells:
            out, answer, em, n = _output(cond, q, rep)
            rule = ("answer_line" if "Answer:" in out else "last_line") if long else None
            trials.append(TrialRecord(
                trial_id=f"m::{i}", model="m", prompt_id=str(i), task_id=f"q{q}", source="s", condition=cond,
                load=load, achieved_load=float(load), replication=rep, prompt_tokens=10, output=out, answer=answer,
                gold=f"Tesh{q}", em=em, hop_recall=None, truncated=False, uninterpretable=False,
                completion_tokens=n, extraction=rule))
            i += 1
    append_jsonl(root / "trials.jsonl", (t.to_dict() for t in trials))
    if tasks:
        append_jsonl(root / "tasks.jsonl", (_task(q).to_dict() for q in range(n_questions)))
    return root


def _sign_flip_p(d: np.ndarray) -> float:
    """Exact two-sided sign-flip p of the mean of ``d``, enumerating every sign assignment."""
    obs = abs(d.mean())
    return float(np.mean([abs((np.array(s) * d).mean()) >= obs - 1e-12
                          for s in itertools.product((1, -1), repeat=len(d))]))


def _cells(analysis) -> dict:
    return {c.condition: c for c in analysis.families["ice"].writing}


def test_cells_match_a_direct_count(tmp_path):
    run = _run(tmp_path / "run")
    cells = _cells(analyze_run(run, AnalysisSection()))
    sat, control = cells["Saturation"], cells["Control"]
    assert sat.n_outputs == 20 and sat.one_sentence_share == 1.0 and sat.sentences_median == 1.0
    assert control.one_sentence_share == 0.0 and control.sentences_median == 3.0  # two facts and the answer line
    assert sat.tokens_median == 12.5 and control.tokens_mean == pytest.approx(np.mean([40 + q for q in range(10)]))
    # last fact: questions 0-5 twice, question 9 once; first fact: 6-8 twice, question 9 once
    assert sat.restated_shares == pytest.approx({"first": 7 / 20, "last": 13 / 20})
    assert sat.restated_em == {"first": 0.0, "last": 1.0} and sat.restated_n == {"first": 7, "last": 13}
    assert control.restated_shares == {"none": 1.0} and control.tests == ()


def test_each_measure_is_the_sign_flip_test_of_per_question_differences_with_bh_across_the_model(tmp_path):
    run = _run(tmp_path / "run")
    cells = _cells(analyze_run(run, AnalysisSection()))
    per_trial = {
        "tokens": lambda cond, q, rep: _output(cond, q, rep)[3],
        "one_sentence": lambda cond, q, rep: float(cond == "Saturation"),
        "restates_last": lambda cond, q, rep: float(cond == "Saturation" and _output(cond, q, rep)[2] == 1.0),
        "restates_first": lambda cond, q, rep: float(cond == "Saturation" and _output(cond, q, rep)[2] == 0.0),
    }
    ps = []
    for cond in ("Saturation", "Residue"):
        tests = {t.measure: t for t in cells[cond].tests}
        assert list(tests) == list(MEASURES)
        for m, value in per_trial.items():
            d = np.array([np.mean([value(cond, q, r) - value("Control", q, r) for r in range(2)]) for q in range(10)])
            assert tests[m].delta == pytest.approx(d.mean()) and tests[m].n_questions == 10
            assert tests[m].p == pytest.approx(_sign_flip_p(d)) if d.any() else tests[m].p == 1.0
            ps.append(tests[m].p)
    q = multipletests(ps, method="fdr_bh")[1]
    got = [t.q for cond in ("Saturation", "Residue") for t in cells[cond].tests]
    assert got == pytest.approx(list(q))
    sat = {t.measure: t for t in cells["Saturation"].tests}
    assert sat["one_sentence"].p == pytest.approx(2 / 2 ** 10) and sat["restates_last"].p == pytest.approx(2 / 2 ** 7)  # 7 questions carry it


def test_without_task_records_lengths_are_tested_and_restatement_says_why_not(tmp_path):
    cells = _cells(analyze_run(_run(tmp_path / "run", tasks=False), AnalysisSection()))
    sat = cells["Saturation"]
    assert sat.restated_shares is None and sat.restated_em is None
    tests = {t.measure: t for t in sat.tests}
    assert tests["tokens"].p is not None and tests["one_sentence"].p is not None
    assert tests["restates_last"].p is None and "paired with a Control output" in tests["restates_last"].reason


def test_below_six_questions_there_is_no_test(tmp_path):
    sat = _cells(analyze_run(_run(tmp_path / "run", n_questions=5), AnalysisSection()))["Saturation"]
    assert all(t.p is None and t.q is None and "fewer than the minimum of 6" in t.reason for t in sat.tests)


def test_written_read_back_and_shown(tmp_path):
    run = _run(tmp_path / "run")
    analysis = analyze_run(run, AnalysisSection())
    assert read_analysis(run).families["ice"].writing == analysis.families["ice"].writing
    write_tables(analysis, run)
    cells = pd.read_csv(run / "tables" / "writing.csv")
    tests = pd.read_csv(run / "tables" / "writing_tests.csv")
    assert len(cells) == 3 and "tests" not in cells.columns and len(tests) == 2 * len(MEASURES)
    assert cells.loc[cells["condition"] == "Saturation", "restated_shares_last"].item() == pytest.approx(0.65)
    html = render_report(run).read_text()
    assert "What the model wrote" in html and "one-sentence share" in html
    assert "Saturation 80%" in html and "+1.00 (p 0.002" in html


def test_distractors_are_tested_against_filler_of_the_same_length_in_the_writing_family(tmp_path):
    """Saturation and Residue at 80 % are also tested against LongControl at 80 % (here written as Control is), with
    the same per-question sign-flip test, and the BH family is every writing test of the model."""
    analysis = analyze_run(_run(tmp_path / "run", long=True), AnalysisSection())
    cells = _cells(analysis)
    assert cells["LongControl"].long_tests == () and cells["Control"].long_tests == ()
    long = {t.measure: t for t in cells["Saturation"].long_tests}
    assert list(long) == list(MEASURES) and long["one_sentence"].n_questions == 10
    assert long["one_sentence"].delta == pytest.approx(1.0) and long["one_sentence"].p == pytest.approx(2 / 2 ** 10)
    assert {t.measure: t.delta for t in cells["Residue"].long_tests}["one_sentence"] == 0.0
    every = [t for cond in ("Saturation", "Residue", "LongControl") for part in ("tests", "long_tests")
             for t in getattr(cells[cond], part)]
    # 1e-12: the same adjustment computed by statsmodels over the whole family
    want = multipletests([t.p for t in every], method="fdr_bh")[1]
    assert [t.q for t in every] == pytest.approx(list(want), abs=1e-12)


def test_h2_on_strict_em_counts_only_answers_decided_by_a_box_or_an_answer_line(tmp_path):
    """Strict EM: Saturation's correct answers are bare last-fact lines (no answer line), so its strict EM is 0;
    Control's and LongControl's are answer lines. H2 on strict EM holds the EM of each condition to a direct count,
    and its Saturation vs LongControl difference to the per-question mean."""
    ice = analyze_run(_run(tmp_path / "run", long=True), AnalysisSection()).families["ice"]
    strict = {(r.a, r.b): r for r in ice.h2_strict}
    loose = {(r.a, r.b): r for r in ice.h2}
    sat = strict["Saturation", "LongControl"]
    assert sat.test.em_a == 0.0 and sat.test.em_b == 1.0 and sat.test.delta == pytest.approx(-1.0)
    assert loose["Saturation", "LongControl"].test.em_a == pytest.approx(13 / 20)  # EM counts the bare lines
    assert strict["LongControl", "Control"].test.delta == 0.0
