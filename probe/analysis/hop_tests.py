"""Question-clustered tests of the hop masses: where the tokens naming a hop's answer look, by outcome and condition.
Specified in docs/statistics.md#hop-mass-tests."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, Sequence

import numpy as np

from probe.analysis.attention_link import EXTRANEOUS_CONDITIONS, LayerTests, _layer_tests
from probe.analysis.attention_tests import attention_failure_tests, condition_contrast_tests
from probe.analysis.head_tests import HeadTests, fitted_head_tests, with_max_t
from probe.analysis.inference import ManyFits


class HopRow(Protocol):
    """What the tests read of a trial-hop (:class:`probe.analysis.hops.HopRow`, which imports this module)."""

    @property
    def trial_id(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def condition(self) -> str: ...
    @property
    def load(self) -> int: ...
    @property
    def hop(self) -> int: ...
    @property
    def n_hops(self) -> int: ...
    @property
    def em(self) -> float | None: ...

FAILED_CORRECT = "failed - correct"
SATURATION_CONTROL = "Saturation - Control"
SATURATION_LONGCONTROL = "Saturation - LongControl"
MASS_NAMES = {"hop": "mass on the hop's own fact", "extraneous": "mass on the extraneous segments"}
TESTED = ((FAILED_CORRECT, ("hop", "extraneous")), (SATURATION_CONTROL, ("hop",)), (SATURATION_LONGCONTROL, ("hop",)))
# the condition each condition contrast sets Saturation against, and whether it matches the load (LongControl's
# length follows the Saturation load it is matched to; Control has one length)
REFERENCE = {SATURATION_CONTROL: ("Control", False), SATURATION_LONGCONTROL: ("LongControl", True)}


@dataclass(frozen=True)
class HopMassTest:
    """One test of a hop mass (docs/statistics.md#hop-mass-tests): per layer (heads pooled) and per head.

    Attributes:
        model: the model; measure: ``raw`` or ``value``; category: the mass (``hop`` or ``extraneous``).
        contrast: ``failed - correct``, ``Saturation - Control`` or ``Saturation - LongControl``; load: the Saturation
            load of the condition contrasts (None for failed − correct, which pools loads and adjusts for them).
        estimand: what the estimate means, with its unit.
        n: trial-hops; n_trials: trials; n_questions: questions.
        layers: per layer, the head-pooled mass (BH across layers); None without a fit.
        heads: per head (BH over the map, and the max-T correction over it, whose ``n_questions`` are the
            questions with trials on both sides); None without a fit.
        reason: why nothing was fitted, else None.
    """

    model: str
    measure: str
    category: str
    contrast: str
    load: int | None
    estimand: str
    n: int
    n_trials: int
    n_questions: int
    layers: LayerTests | None
    heads: HeadTests | None
    reason: str | None


def _covariates(rows: Sequence[HopRow], base: list[np.ndarray], extra: list[np.ndarray]) -> list[np.ndarray]:
    """The columns of ``extra`` plus hop position (last hop; each hop index) that raise the rank of ``base`` and of
    those kept before them (a constant or collinear column is left out)."""
    hop = np.array([float(r.hop) for r in rows])
    last = np.array([float(r.hop == r.n_hops - 1) for r in rows])
    cands = [*extra, last] + [(hop == h).astype(float) for h in sorted(set(hop.tolist()))[1:]]
    kept: list[np.ndarray] = []
    for c in cands:
        if np.linalg.matrix_rank(np.column_stack([*base, *kept, c])) > len(base) + len(kept):
            kept.append(c)
    return kept


def _plans(rows: Sequence[HopRow], idx: list[int]) -> list[tuple[str, int | None]]:
    """(contrast, load) of every test to run: failed − correct once, each reference contrast per Saturation load
    that has trials of its reference condition."""
    loads = sorted({int(rows[i].load) for i in idx if rows[i].condition == "Saturation"})
    plans: list[tuple[str, int | None]] = [(FAILED_CORRECT, None)]
    for contrast, (reference, by_load) in REFERENCE.items():
        plans += [(contrast, ld) for ld in loads
                  if any(rows[i].condition == reference and (not by_load or int(rows[i].load) == ld) for i in idx)]
    return plans


def _estimand(contrast: str, load: int | None, name: str) -> tuple[str, str]:
    """(which trials, the estimand in words) of a contrast on the mass ``name``."""
    reference, by_load = REFERENCE.get(contrast, ("", False))
    if contrast == FAILED_CORRECT:
        where, equal = "Saturation and Residue trials", "at equal load, placement and hop position"
    elif by_load:
        where = f"Saturation and {reference} trials at {load} %"
        equal = "at equal prompt length and hop position"
    else:
        where, equal = f"Saturation at {load} % and {reference} trials", "at equal hop position"
    return where, f"{contrast} difference in the {name} (a share) while the hop's answer is written, {equal} ({where})"


def _fits(contrast: str, load: int | None, sub: list[HopRow], Y: np.ndarray, groups: np.ndarray,
          alpha: float) -> tuple[np.ndarray, ManyFits, ManyFits, np.ndarray]:
    """(side, layer fits, head fits, nuisance columns) of one contrast: the side is failed (1) vs correct for
    failed − correct, Saturation (1) vs the reference condition otherwise."""
    if contrast == FAILED_CORRECT:
        side = np.array([float(r.em is not None and r.em < 0.5) for r in sub])
        load_col = np.array([float(r.load) for r in sub])
        residue = np.array([float(r.condition == "Residue") for r in sub])
        base_cols = [np.ones(len(sub)), side] + ([load_col] if np.ptp(load_col) > 0 else [])
        cov = _covariates(sub, base_cols, [residue])
        covm = np.column_stack(cov) if cov else None
        return (side, attention_failure_tests(Y.mean(axis=2), side, load_col, groups, covm, alpha),
                attention_failure_tests(Y, side, load_col, groups, covm, alpha),
                np.column_stack([base_cols[0], *base_cols[2:], *cov]))
    side = np.array([float(r.condition == "Saturation") for r in sub])
    cov = _covariates(sub, [np.ones(len(sub)), side], [])
    covm = np.column_stack(cov) if cov else None
    what = f"Saturation at {load} % - {REFERENCE[contrast][0]}"
    return (side, condition_contrast_tests(Y.mean(axis=2), side, groups, covm, alpha, what=what),
            condition_contrast_tests(Y, side, groups, covm, alpha, what=what),
            np.column_stack([np.ones(len(sub)), *cov]))


def hop_mass_tests(rows: Sequence[HopRow], masses: Sequence[np.ndarray | None], model: str, measure: str,
                   categories: Sequence[str], alpha: float = 0.05, seed: int = 0) -> list[HopMassTest]:
    """Every test of one model and measure (docs/statistics.md#hop-mass-tests).

    Args:
        rows: the trial-hops (:class:`probe.analysis.hops.HopRow`: model, task_id, condition, load, hop, n_hops,
            em).
        masses: their ``(L, H, C)`` category masses of this measure (None: not named).
        model: the model tested (other rows are ignored).
        measure: ``raw`` or ``value`` (copied into the results).
        categories: the mass columns (:data:`probe.analysis.hops.CATEGORIES`).
        alpha: test level, FDR level and 1 − confidence level.
        seed: seed of the max-T's Monte Carlo sign assignments.

    Returns:
        The tests (their per-head grids held in their head maps).
    """
    out: list[HopMassTest] = []
    idx = [i for i, r in enumerate(rows) if r.model == model and masses[i] is not None
           and r.em is not None]
    shapes = {np.asarray(masses[i]).shape for i in idx}
    if len(shapes) > 1:  # e.g. records of two probe configurations in one folder: heads cannot be compared
        why = (f"the named trial-hops' masses come in {len(shapes)} shapes {sorted(shapes)}: layers and heads cannot "
               "be compared across them (one probe configuration per run folder)")
        return [HopMassTest(model=model, measure=measure, category=category, contrast=FAILED_CORRECT, load=None,
                            estimand="", n=len(idx), n_trials=len({rows[i].trial_id for i in idx}),
                            n_questions=len({rows[i].task_id for i in idx}), layers=None, heads=None, reason=why)
                for category in dict(TESTED)[FAILED_CORRECT]]
    for contrast, load in _plans(rows, idx):
        reference, by_load = REFERENCE.get(contrast, ("", False))  # failed - correct has no reference condition
        if contrast == FAILED_CORRECT:
            sel = [i for i in idx if rows[i].condition in EXTRANEOUS_CONDITIONS]
        else:
            sel = [i for i in idx if (rows[i].condition == reference and (not by_load or int(rows[i].load) == load))
                   or (rows[i].condition == "Saturation" and int(rows[i].load) == load)]
        sub = [rows[i] for i in sel]
        groups = np.array([str(r.task_id) for r in sub], dtype=object)
        for category in dict(TESTED)[contrast]:
            name = MASS_NAMES[category] + (" (value-weighted)" if measure == "value" else "")
            where, estimand = _estimand(contrast, load, name)
            base = HopMassTest(model=model, measure=measure, category=category, contrast=contrast, load=load,
                               estimand=estimand, n=len(sub), n_trials=len({r.trial_id for r in sub}),
                               n_questions=len(set(groups.tolist())), layers=None, heads=None, reason=None)
            if len(sub) < 3:
                out.append(replace(base, reason=f"{len(sub)} named trial-hop(s) ({where}); need 3"))
                continue
            c = list(categories).index(category)
            Y = np.stack([np.asarray(masses[i], dtype=float)[..., c] for i in sel])  # (n, L, H)
            side, layer_fits, head_fits, nuisance = _fits(contrast, load, sub, Y, groups, alpha)
            if np.ptp(side) == 0:
                out.append(replace(base, reason=str(layer_fits.reason)))
                continue
            layers = _layer_tests(layer_fits, alpha, f"head-pooled {name} per layer", estimand, len(sub))
            heads = fitted_head_tests(head_fits, alpha, measure=f"{name} per head", estimand=estimand, n=len(sub))
            heads = with_max_t(heads, head_fits, Y, side, groups, nuisance, alpha, seed,
                               "contrasts of adjusted residuals")
            out.append(replace(base, layers=layers, heads=heads))
    return out


__all__ = ["FAILED_CORRECT", "HopMassTest", "SATURATION_CONTROL", "SATURATION_LONGCONTROL", "hop_mass_tests"]
