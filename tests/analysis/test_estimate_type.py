"""One estimate type: every fit and test of the analysis reports its estimate as a
:class:`probe.analysis.estimate.Estimate`, and no result repeats another result's fields.

Checked over the source (AST), so a new near-copy fails here before it reaches ``analysis.json``; and every result
type reads back from its JSON as it was (round trips)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from probe.analysis.attention_link import LayerFit, MeasureLogit
from probe.analysis.estimate import Estimate
from probe.analysis.hypotheses import H1Fit, LoadLogit
from probe.analysis.hypotheses import H3Correlation, H3Point
from probe.analysis.inference import Correlation
from probe.analysis.paired_ratio import PairedDifference, RecoveredShare
from probe.analysis.results import from_json
from probe.codec import encode

ANALYSIS = Path(__file__).resolve().parents[2] / "probe" / "analysis"

# dataclasses that still spell an estimate out (the next ones to move onto Estimate), each with why it stays;
# empty: every estimate of the analysis is an Estimate (Correlation, H3Correlation and PairedDifference were the last)
PENDING: dict[str, str] = {}
# the one type, and the grid of many fits (arrays: one Estimate per cell via ManyFits.estimate_at)
ALLOWED = {"Estimate", "ManyFits"}


def _dataclasses(root: Path) -> dict[str, tuple[str, list[str]]]:
    """Every dataclass under ``root``: name -> (module file, its annotated field names in order)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            decorated = any((isinstance(d, ast.Name) and d.id == "dataclass")
                            or (isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "dataclass")
                            for d in node.decorator_list)
            if decorated:
                fields = [s.target.id for s in node.body
                          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
                out[node.name] = (path.name, fields)
    return out


def near_copies(root: Path) -> dict[str, str]:
    """Dataclasses that declare an estimate's fields themselves (a p-value with a standard error or an interval)
    or repeat every field of another result (of five fields or more): name -> why."""
    classes = _dataclasses(root)
    found: dict[str, str] = {}
    for name, (module, fields) in classes.items():
        f = set(fields)
        if "p" in f and ("se" in f or {"ci_low", "ci_high"} <= f):
            found[name] = f"{module}: declares {sorted(f & {'estimate', 'se', 'ci_low', 'ci_high', 'df', 'p'})}"
        for other, (_, other_fields) in classes.items():
            if other != name and len(other_fields) >= 5 and set(other_fields) <= f:
                found[name] = f"{module}: repeats every field of {other}"
    return found


def test_no_module_of_the_analysis_declares_another_estimate_type():
    found = {k: v for k, v in near_copies(ANALYSIS).items() if k not in ALLOWED}
    new = {k: v for k, v in found.items() if k not in PENDING}
    assert not new, f"use probe.analysis.estimate.Estimate (compose it) instead: {new}"
    gone = sorted(set(PENDING) - set(found))
    assert not gone, f"{gone} no longer spell an estimate out: take them off PENDING"


def test_the_check_finds_a_near_copy(tmp_path):
    (tmp_path / "mod.py").write_text(
        "from dataclasses import dataclass\n\n\n@dataclass(frozen=True)\nclass Slope:\n"
        "    coef: float\n    se: float\n    ci_low: float\n    ci_high: float\n    p: float\n\n\n"
        "@dataclass\nclass Pair:\n    a: int\n    b: int\n    c: int\n    d: int\n    e: int\n\n\n"
        "@dataclass\nclass PairAndQ:\n    a: int\n    b: int\n    c: int\n    d: int\n    e: int\n    q: float\n")
    assert set(near_copies(tmp_path)) == {"Slope", "PairAndQ"}


ROUND_TRIPS = [
    Estimate(value=0.25, se=0.1, ci_low=0.05, ci_high=0.45, df=9.0, p=0.03, q=0.06, method="CR2", is_test=True),
    Estimate.descriptive(-1.5, "fewer than the minimum of 6 questions", "CR2"),
    H1Fit(model="m", condition="Saturation", n=40, n_clusters=10, loads=(0, 20), intercept=0.7, logit=LoadLogit(
        Estimate(value=-0.02, se=0.01, ci_low=-0.04, ci_high=0.0, df=8.5, p=0.07, is_test=True), 0.82),
        estimate=Estimate(value=-0.004, se=0.001, ci_low=-0.006, ci_high=-0.002, df=9.0, p=0.002, is_test=True),
        power=None),
    LayerFit(layer=2, n=120, fit=MeasureLogit(Estimate(value=3.0, se=1.0, p=0.01, q=0.04, is_test=True), 1.35),
             adjusted=None),
    H3Correlation(model="m", load=None, correlation=Correlation(
        n=10, estimate=Estimate(value=0.59, ci_low=-0.06, ci_high=0.89, p=0.07, q=0.15, method="Pearson r",
                                is_test=True),
        spearman=Estimate(value=0.64, p=0.046, method="Spearman", is_test=True), slope=0.86, intercept=-0.22),
        points=(H3Point("t0", 0.24, 0.0, 1.0, 1.0),)),
    PairedDifference(n_prompts=12, n_questions=6, em_a=0.5, em_b=0.25, estimate=Estimate(
        value=0.25, se=0.1, ci_low=0.0, ci_high=0.5, df=5.0, p=0.06, method="sign flip", is_test=True),
        is_exact=True),
    RecoveredShare(Estimate(value=0.4, ci_low=0.1, ci_high=0.8, method="Fieller"), 0.1, 0.25, 6),
    RecoveredShare.undefined(0, "no question"),
]


@pytest.mark.parametrize("value", ROUND_TRIPS, ids=lambda v: type(v).__name__)
def test_results_round_trip_through_their_json(value):
    text = json.dumps(encode(value), allow_nan=False)
    assert from_json(type(value), json.loads(text)) == value
