"""Per model × condition × load summaries: EM mean, SEM, its bounded interval clustered by question, strict EM, the
scoring-path test against Control and the rates. Specified in docs/statistics.md#em-of-a-cell-a-bounded-interval-clustered-by-question."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable

import numpy as np
import pandas as pd
import scipy.stats

from probe.analysis.inference import PairedTest, paired_sign_flip, proportion_ci
from probe.scoring.answers import STRICT_EXTRACTIONS
from probe.types import CONDITIONS


def finite(x: float | np.floating | None) -> float | None:
    """A finite float, or None (NaN/inf become None, so that a missing estimate is null, never NaN)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def key_int(key: Hashable) -> int:
    """An integer-valued pandas group key (a load or level) as an int.

    pandas types group keys as ``Hashable``; the trial table's ``load`` column holds int (or, after a NaN,
    float) values.

    Raises:
        TypeError: the key is not a number.
    """
    if not isinstance(key, (int, float, np.integer, np.floating)):
        raise TypeError(f"group key {key!r} ({type(key).__name__}) is not a number")
    return int(key)


@dataclass(frozen=True)
class MeanCI:
    """A share of correct answers with its interval clustered by question (:func:`em_interval`).

    Attributes:
        mean: the mean; None without observations.
        sem: plain standard error of the mean over observations (``scipy.stats.sem``).
        se: the CR1 cluster-robust standard error behind the design effect.
        ci_low, ci_high: the (1 − alpha) interval, inside [0, 1].
        design_effect: clustered variance over binomial variance (floored at 1).
        n_effective: the effective sample size the Wilson interval is taken at.
        n: observations; n_clusters: distinct clusters.
        ci_method: how the CI was made (see docs/statistics.md#em-of-a-cell-a-bounded-interval-clustered-by-question), None without a CI.
        ci_reason: why there is a mean but no interval (one question), else None.
        reason: why there is no estimate, else None.
    """

    mean: float | None
    sem: float | None
    se: float | None
    ci_low: float | None
    ci_high: float | None
    design_effect: float | None
    n_effective: float | None
    n: int
    n_clusters: int
    ci_method: str | None
    ci_reason: str | None
    reason: str | None


@dataclass(frozen=True)
class Cell:
    """EM and rates of the trials of one model × condition × load (or × knob level).

    Attributes:
        model, condition: the cell's model and condition.
        load: load in percent; None for a cell pooled over loads.
        level: the level of another variable the cell is taken at, where a family groups its trials by one (a
            knob of the task); None otherwise.
        n_trials: trials in the cell; n: scored trials; n_skipped, n_error: skipped trials and backend errors
            (never scored as wrong); n_clusters: questions among the scored trials.
        em_mean, em_sem, em_se, em_ci_low, em_ci_high, em_design_effect, em_n_effective, ci_method, ci_reason: the
            :class:`MeanCI` of EM.
        hop_recall_mean: mean hop recall of the scored trials.
        truncated_rate, uninterpretable_rate: shares of the trials with an output.
        s_sim_mean: mean S_sim of the cell's trials.
        em_interpretable_mean: EM of the scored trials neither truncated nor uninterpretable.
        reason: why there is no estimate, else None.
        strict_em_mean, strict_em_ci_low, strict_em_ci_high: strict EM (correct *and* decided by a box or an answer
            line) over the scored trials, with EM's interval; None where a scored trial has no recorded rule
            (records written before trials carried one).
        extraction_shares: share of each scoring rule among the outputs (rules that occur in the cell); None
            where an output has no recorded rule.
        scoring_path_p: the sign-flip p-value of the cell's share of box-or-answer-line outputs against the same
            model's Control cell (None for Control, or without a test: see ``scoring_path_reason``).
        scoring_path_delta: that share minus Control's, averaged over questions.
        scoring_path_shift: p < alpha: the cell's scoring path differs from Control's beyond chance.
        scoring_path_reason: why there is no test, else None.
    """

    model: str
    condition: str
    load: int | None
    level: int | None
    n_trials: int
    n: int
    n_skipped: int
    n_error: int
    n_clusters: int
    em_mean: float | None
    em_sem: float | None
    em_se: float | None
    em_ci_low: float | None
    em_ci_high: float | None
    em_design_effect: float | None
    em_n_effective: float | None
    ci_method: str | None
    ci_reason: str | None
    hop_recall_mean: float | None
    truncated_rate: float | None
    uninterpretable_rate: float | None
    s_sim_mean: float | None
    em_interpretable_mean: float | None
    reason: str | None
    strict_em_mean: float | None = None
    strict_em_ci_low: float | None = None
    strict_em_ci_high: float | None = None
    extraction_shares: dict[str, float] | None = None
    scoring_path_p: float | None = None
    scoring_path_delta: float | None = None
    scoring_path_shift: bool | None = None
    scoring_path_reason: str | None = None


def em_interval(y: np.ndarray, groups: np.ndarray, alpha: float = 0.05) -> MeanCI:
    """Mean EM of a cell with its bounded interval clustered by ``groups`` (docs/statistics.md#em-of-a-cell-a-bounded-interval-clustered-by-question).

    Args:
        y: (n,) outcomes in [0, 1] (EM).
        groups: (n,) cluster labels (task ids).
        alpha: 1 − confidence level.

    Returns:
        The :class:`MeanCI` (``reason`` set when no estimate could be made, ``ci_reason`` when there is a mean but
        no interval).
    """
    y = np.asarray(y, dtype=float)
    n = int(y.size)
    iv = proportion_ci(y, np.asarray(groups), alpha)
    if iv.mean is None:
        return MeanCI(None, None, None, None, None, None, None, n, iv.n_clusters, None, None, iv.reason)
    sem = finite(scipy.stats.sem(y)) if n > 1 else None
    has_ci = iv.ci_low is not None
    return MeanCI(mean=finite(iv.mean), sem=sem, se=finite(iv.se) if iv.se is not None else None,
                  ci_low=iv.ci_low, ci_high=iv.ci_high, design_effect=iv.design_effect, n_effective=iv.n_effective,
                  n=n, n_clusters=iv.n_clusters, ci_method=iv.method if has_ci else None,
                  ci_reason=None if has_ci else iv.reason, reason=None)


def _rate(mask: pd.Series, base: pd.Series) -> float | None:
    n = int(base.sum())
    return None if n == 0 else float((mask & base).sum() / n)


def cell_groups(df: pd.DataFrame) -> dict[tuple[str, str, int], pd.DataFrame]:
    """The trial table's rows per (model, condition, load), in model, paper-condition, load order."""
    order = {c: i for i, c in enumerate(CONDITIONS)}
    groups = {(str(model), str(condition), key_int(load)): g
              for (model, condition, load), g in df.groupby(["model", "condition", "load"])}
    return {k: groups[k] for k in sorted(groups, key=lambda k: (k[0], order.get(k[1], 99), k[1], k[2]))}


def cell_summaries(df: pd.DataFrame, alpha: float = 0.05, level: bool = False) -> list[Cell]:
    """One :class:`Cell` per model × condition × load present in ``df``.

    Args:
        df: the trial table of :func:`probe.analysis.frame.trials_frame`.
        alpha: 1 − confidence level of the CI.
        level: the ``load`` column holds the level of another variable: it goes to ``Cell.level`` and
            ``Cell.load`` is None.

    Returns:
        Cells sorted by model, condition (paper order), load.
    """
    out: list[Cell] = []
    groups = cell_groups(df)
    for (model, condition, load), g in groups.items():
        scored = g[g["is_scored"]]
        est = em_interval(scored["em"].to_numpy(), scored["task_id"].to_numpy(), alpha)
        path = _scoring_path(g, scored, alpha)
        if condition != "Control" and not level:
            control = next((k for k in groups if k[0] == model and k[1] == "Control"), None)
            path |= _path_shift(g, groups[control] if control else None, alpha)
        clean = scored[~scored["truncated"] & ~scored["uninterpretable"]]
        hop = scored["hop_recall"].dropna()
        ssim = g["s_sim"].dropna()
        out.append(Cell(
            model=model, condition=condition, load=None if level else load,
            level=load if level else None, n_trials=int(len(g)), n=est.n,
            n_skipped=int(g["skipped"].sum()), n_error=int((g["error"].notna() & ~g["skipped"]).sum()),
            n_clusters=est.n_clusters, em_mean=est.mean, em_sem=est.sem, em_se=est.se,
            em_ci_low=est.ci_low, em_ci_high=est.ci_high, em_design_effect=est.design_effect,
            em_n_effective=est.n_effective, ci_method=est.ci_method, ci_reason=est.ci_reason,
            hop_recall_mean=finite(hop.mean()) if len(hop) else None,
            truncated_rate=_rate(g["truncated"], g["has_output"]),
            uninterpretable_rate=_rate(g["uninterpretable"], g["has_output"]),
            s_sim_mean=finite(ssim.mean()) if len(ssim) else None,
            em_interpretable_mean=finite(clean["em"].mean()) if len(clean) else None,
            reason=est.reason, **path,
        ))
    return out


def is_strict(g: pd.DataFrame) -> np.ndarray:
    """(n,) whether each trial's answer was decided by a box or an answer line."""
    return g["extraction"].isin(list(STRICT_EXTRACTIONS)).to_numpy()


def _scoring_path(g: pd.DataFrame, scored: pd.DataFrame, alpha: float) -> dict:
    """Strict EM with its interval and the share of each scoring rule of one cell (docs/statistics.md#em-of-a-cell-a-bounded-interval-clustered-by-question)."""
    out: dict = {}
    if len(scored) and scored["extraction"].notna().all():
        strict = em_interval(scored["em"].to_numpy() * is_strict(scored), scored["task_id"].to_numpy(), alpha)
        out |= {"strict_em_mean": strict.mean, "strict_em_ci_low": strict.ci_low, "strict_em_ci_high": strict.ci_high}
    outputs = g[g["has_output"]]
    if len(outputs) and outputs["extraction"].notna().all():
        shares = outputs["extraction"].value_counts(normalize=True)
        out["extraction_shares"] = {str(k): float(v) for k, v in sorted(shares.items())}
    return out


def against_control(cell: pd.DataFrame, control: pd.DataFrame, column: str, alpha: float,
                    seed: int = 0) -> PairedTest | str:
    """A per-trial value of a cell against its model's Control cell: the outputs of each paired by (task_id,
    replication), H2's sign-flip test of the per-question mean difference (cell − Control).

    Args:
        cell, control: rows of the trial table; only outputs with a value in ``column`` take part.
        column: the value compared.
        alpha / seed: the test's level (power) and Monte Carlo seed.

    Returns:
        The :class:`probe.analysis.inference.PairedTest`, or why there is none: ``"ambiguous"`` (several outputs
        share a pair key) or ``"no pair"``.
    """
    key = ["task_id", "replication"]
    a, b = (part[part["has_output"] & part[column].notna()][key + [column]] for part in (cell, control))
    if a[key].duplicated().any() or b[key].duplicated().any():
        return "ambiguous"
    merged = a.merge(b, on=key, suffixes=("_a", "_b"))
    if merged.empty:
        return "no pair"
    return paired_sign_flip(merged[f"{column}_a"].to_numpy(float), merged[f"{column}_b"].to_numpy(float),
                            merged["task_id"].to_numpy(), alpha=alpha, seed=seed)


AMBIGUOUS_PAIRS = "several outputs share a (task_id, replication): pairs are ambiguous"


def _path_shift(g: pd.DataFrame, control: pd.DataFrame | None, alpha: float) -> dict:
    """The sign-flip test of a cell's box-or-answer-line share against its model's Control cell."""
    if control is None:
        return {"scoring_path_reason": "no Control cell of this model to compare the scoring path with"}
    def strict(part: pd.DataFrame) -> pd.DataFrame:  # 1 / 0 where a scoring rule is recorded, else NaN
        return part.assign(strict=pd.Series(is_strict(part), index=part.index, dtype=float)
                           .where(part["extraction"].notna()))

    t = against_control(strict(g), strict(control), "strict", alpha)
    if t == "ambiguous":
        return {"scoring_path_reason": AMBIGUOUS_PAIRS}
    if t == "no pair":
        return {"scoring_path_reason": "no output with a recorded scoring rule paired with a Control output"}
    assert not isinstance(t, str)
    return {"scoring_path_p": t.p, "scoring_path_delta": t.delta,
            "scoring_path_shift": None if t.p is None else bool(t.p < alpha),
            "scoring_path_reason": t.reason if t.p is None else None}
