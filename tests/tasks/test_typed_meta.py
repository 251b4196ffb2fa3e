"""Typed values that travel in ``meta``: CogniLoad's puzzle parameters and an intervention's key count.

Each has one writer (``to_meta``) and one reader (``from_meta``); the on-disk keys are the ones records have
always held, so a record written before the types existed reads the same (the literal lines below were written by
the generator and runner as they were before).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from probe.analysis.cogniload import CogniloadAnalysisError, analyze_cogniload
from probe.analysis.frame import trials_frame
from probe.errors import ProbeError
from probe.interventions import KeyCount
from probe.records import TrialRecord, load_trials
from probe.runfolder import RunFolder
from probe.tasks.cogniload import PuzzleParams, PuzzleParamsError, generate_puzzle, n_needles
from tests.fixtures.cogniload_run import make_cogniload_run

# Task.meta of generate_puzzle(3, 20, 25, default_rng(5), index=2), as the generator wrote it before PuzzleParams
OLD_META = ('{"d": 3, "N": 20, "rho": 25, "n_needles": 5, "n_hay": 15, "n_people": 3, "n_values": 4, '
            '"poi": "Anthony", "category": "pet", "n_poi_changes": 3, "gold_is_initial": 0}')


def test_generated_meta_is_byte_identical_to_the_old_writer() -> None:
    task = generate_puzzle(3, 20, 25, np.random.default_rng(5), index=2)
    assert json.dumps(task.meta) == OLD_META  # same keys, same order, same JSON types (0, not false)


def test_old_meta_reads_into_typed_parameters() -> None:
    p = PuzzleParams.from_meta(json.loads(OLD_META), "task cl-d3-N20-r25-0002")
    assert (p.d, p.n_statements, p.rho, p.n_people, p.poi, p.category) == (3, 20, 25, 3, "Anthony", "pet")
    assert p.gold_is_initial is False and p.n_needles == n_needles(20, 25) and p.n_hay == 20 - p.n_needles
    assert json.dumps(p.to_meta()) == OLD_META


@pytest.mark.parametrize(("d", "n", "rho"), [(1, 5, 5), (5, 50, 50), (10, 7, 95)])
def test_round_trip_over_the_grid(d: int, n: int, rho: int) -> None:
    task = generate_puzzle(d, n, rho, np.random.default_rng(d * 100 + n), index=0)
    p = PuzzleParams.from_meta(task.meta, task.task_id)
    assert p.to_meta() == task.meta
    assert (p.d, p.n_statements, p.rho, p.n_people) == (d, n, rho, max(d, 2))  # docs/cogniload.md#a-puzzle
    assert f"what is the {p.category} of {p.poi}?" in task.question


def test_fixture_records_with_partial_meta_still_read(tmp_path: object) -> None:
    """The synthetic CogniLoad run's records carry only d, N, rho, n_needles, n_hay, n_people."""
    run = tmp_path / "cl"  # type: ignore[operator]
    make_cogniload_run(run)
    trials = load_trials(RunFolder(run).trials)
    for t in trials[:20]:
        on_disk = t.meta or {}
        p = PuzzleParams.from_meta(on_disk, f"trial {t.trial_id}", needs=("n_people",))
        assert (p.d, p.n_statements, p.rho, p.n_people) == tuple(on_disk[k] for k in ("d", "N", "rho", "n_people"))
        assert p.poi is None and p.category is None
        assert p.to_meta() == on_disk
    with pytest.raises(PuzzleParamsError, match="'poi'"):
        PuzzleParams.from_meta(trials[0].meta, "trial x", needs=("poi",))


@pytest.mark.parametrize(("meta", "match"), [
    ({"d": 3, "rho": 25}, r"trial t1: meta needs 'N'.*\['d', 'rho'\]"),
    (None, "meta needs 'd'"),
    ({"d": 2.5, "N": 20, "rho": 25}, "d=2.5 must be a whole number"),
    ({"d": 3, "N": "20", "rho": 25}, "N='20' must be a number"),
    ({"d": 3, "N": 0, "rho": 25}, "N=0 must be positive"),
    ({"d": 3, "N": 20, "rho": 25, "poi": ""}, "poi='' must be a non-empty string"),
])
def test_bad_parameters_name_the_trial_and_the_key(meta: dict | None, match: str) -> None:
    with pytest.raises(PuzzleParamsError, match=match):
        PuzzleParams.from_meta(meta, "trial t1")


def test_analysis_reports_a_trial_without_knobs_with_its_own_error() -> None:
    base = dict(model="m", prompt_id="p", task_id="cl-x", source="cogniload", condition="CogniLoad", load=0,
                achieved_load=0.0, replication=0, prompt_tokens=10, output="x", answer="x", gold="x", em=1.0,
                hop_recall=None, truncated=False, uninterpretable=False, family="cogniload")
    t = TrialRecord(trial_id="m::cl-x", meta={"d": 3, "rho": 25}, **base)  # type: ignore[arg-type]
    with pytest.raises(CogniloadAnalysisError, match=r"m::cl-x.*'N'"):
        analyze_cogniload([t], n_bootstrap=0, seed=0)


# --------------------------------------------------------------------------------------------------------------
# KeyCount


def test_key_count_writes_the_old_keys() -> None:
    assert KeyCount(edited=40, wanted=40).to_meta() == {"intervention_keys": 40}
    assert KeyCount(edited=90, wanted=212).to_meta() == {"intervention_keys": 90, "intervention_keys_wanted": 212}


@pytest.mark.parametrize(("meta", "expected"), [
    (None, None),
    ({"d": 3}, None),  # a baseline trial: no count
    ({"intervention_keys": 40}, (40, 40, 0)),
    ({"intervention_keys": 90, "intervention_keys_wanted": 212}, (90, 212, 122)),
    ({"intervention_keys_wanted": 7}, (0, 7, 7)),
])
def test_key_count_reads_old_records(meta: dict | None, expected: tuple[int, int, int] | None) -> None:
    c = KeyCount.from_meta(meta)
    assert (None if c is None else (c.edited, c.wanted, c.shortfall)) == expected
    if c is not None:
        assert KeyCount.from_meta(c.to_meta()) == c


def test_key_count_refuses_a_damaged_value() -> None:
    with pytest.raises(ProbeError, match=r"trial m::p::ko: meta intervention_keys=-3"):
        KeyCount.from_meta({"intervention_keys": -3}, "trial m::p::ko")


def test_trials_frame_shortfall_comes_from_the_count() -> None:
    base = dict(model="m", prompt_id="p", task_id="t", source="synthetic", condition="Control", load=0,
                achieved_load=0.0, replication=0, prompt_tokens=10, output="x", answer="x", gold="x", em=1.0,
                hop_recall=None, truncated=False, uninterpretable=False)
    trials = [TrialRecord(trial_id="a", meta=None, **base),  # type: ignore[arg-type]
              TrialRecord(trial_id="b", meta={"intervention_keys": 90, "intervention_keys_wanted": 212},
                          intervention="ko-random", **base),  # type: ignore[arg-type]
              TrialRecord(trial_id="c", meta={"intervention_keys": 5}, intervention="ko",
                          **base)]  # type: ignore[arg-type]
    frame = trials_frame(trials)
    assert frame.set_index("trial_id")["keys_shortfall"].to_dict() == {"a": 0, "b": 212 - 90, "c": 0}
