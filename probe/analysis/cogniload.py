"""CogniLoad's family analysis: the load-sensitivity GLMs, the capacity thresholds with bootstrap intervals, accuracy
cells and needle/hay attention, per model. Specified in docs/cogniload.md#the-glm-and-the-capacity-thresholds."""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import pandas as pd

from probe import formatting as fmt
from probe.analysis.cogniload_attention import NeedleHaySummary, cogniload_attention
from probe.analysis.estimate import Estimate
from probe.analysis.estimates import Cell, cell_summaries
from probe.analysis.families import FamilyAnalysis, FamilyData, FamilyOutput
from probe.analysis.glm import LogitFit, fit_logit
from probe.errors import ProbeError
from probe.records import TrialRecord
from probe.tasks.cogniload import PuzzleParams

log = logging.getLogger(__name__)

FAMILY = "cogniload"  # the task family whose trials this module analyses (probe.tasks)
KNOBS: tuple[str, ...] = ("d", "N", "rho")
MIN_BOOT_SHARE = 0.9  # below this share of defined bootstrap replicates the CI carries a warning note
FITS: dict[str, tuple[str, ...]] = {
    "quadratic": ("const", "d", "log10_N", "rho", "rho2"),
    "linear": ("const", "d", "log10_N", "rho"),
    "d_x_N": ("const", "d", "log10_N", "rho", "rho2", "d:log10_N"),
    "d_x_rho": ("const", "d", "log10_N", "rho", "rho2", "d:rho"),
}
Status = Literal["ok", "above_range", "below_range", "not_estimable", "degenerate"]


class CogniloadAnalysisError(ProbeError):
    """A CogniLoad trial record lacks the d, N, rho meta the GLM needs."""


@dataclass(frozen=True)
class GlmFit:
    """One GLM of one model (``quadratic``, ``linear``, ``d_x_N``, ``d_x_rho``).

    Attributes:
        status: ``ok``, ``not_estimable`` or ``degenerate``; reason: why not ``ok``, else None.
        terms: the terms fitted; dropped: term -> why it was left out; n: trials.
        params: term -> its :class:`~probe.analysis.estimate.Estimate` (logit scale, 95 % CI; ``df`` None for the
            normal reference of a model-based fit; empty unless ``ok``); aic: the fit's AIC (None unless ``ok``).
        se_method: how the standard errors were computed, and why there are none where a fit gives coefficients
            only (None unless ``ok``).
    """

    status: Status
    reason: str | None
    terms: tuple[str, ...]
    dropped: dict[str, str]
    n: int
    params: dict[str, Estimate]
    aic: float | None
    se_method: str | None


@dataclass(frozen=True)
class Threshold:
    """One capacity threshold (ECL50, NT50, ID50) of the main fit (docs/cogniload.md#the-glm-and-the-capacity-thresholds).

    Attributes:
        value: the threshold inside the tested range, else None; ci_low, ci_high: percentile bootstrap CI.
        status: ``ok``, ``above_range``, ``below_range``, ``not_estimable`` or ``degenerate``; reason: why there is
            no value, else None; extrapolated: the fitted crossing outside the range, if any.
        unit: the variable's unit; n_boot_defined, n_boot_undefined: bootstrap refits with and without a crossing;
        ci_note: caveats of the interval.
    """

    value: float | None
    ci_low: float | None
    ci_high: float | None
    status: Status
    reason: str | None
    extrapolated: float | None
    unit: str
    n_boot_defined: int
    n_boot_undefined: int
    ci_note: str | None


@dataclass(frozen=True)
class DeltaRho:
    """Δρ = Acc(lowest tested rho) − Acc(highest tested rho) with a puzzle-bootstrap CI.

    Attributes:
        value, ci_low, ci_high: the difference and its CI; low_rho, high_rho: the two rho levels (percent);
        acc_low, acc_high: raw accuracies there; n_low, n_high: trials there.
    """

    value: float | None
    ci_low: float | None
    ci_high: float | None
    low_rho: int | float
    high_rho: int | float
    acc_low: float
    acc_high: float
    n_low: int
    n_high: int


@dataclass(frozen=True)
class LevelAccuracy:
    """Raw accuracy of the trials at one level of one knob."""

    acc: float
    n: int


@dataclass(frozen=True)
class CogniloadFits:
    """The GLMs, thresholds and Δρ of one model (:func:`analyze_cogniload`).

    Attributes:
        n: scored trials; n_puzzles: distinct puzzles; accuracy: mean correct; truncation_rate: share truncated.
        levels: knob (``d``, ``N``, ``rho``) -> tested levels; means: ``d``, ``log10_N``, ``rho`` -> mean.
        accuracy_by: knob -> level (as text) -> :class:`LevelAccuracy`.
        fits: fit name -> :class:`GlmFit`; aic_preferred: ``quadratic`` or ``linear`` (None without both);
            delta_aic: AIC(linear) − AIC(quadratic).
        thresholds: ``ECL50``, ``NT50``, ``ID50`` -> :class:`Threshold`; delta_rho: :class:`DeltaRho`.
    """

    n: int
    n_puzzles: int
    accuracy: float
    truncation_rate: float
    levels: dict[str, tuple[int | float, ...]]
    means: dict[str, float]
    accuracy_by: dict[str, dict[str, LevelAccuracy]]
    fits: dict[str, GlmFit]
    aic_preferred: str | None
    delta_aic: float | None
    thresholds: dict[str, Threshold]
    delta_rho: DeltaRho


@dataclass(frozen=True)
class CogniloadGlm:
    """:func:`analyze_cogniload` of every model: ``n_bootstrap`` replicates drawn with ``seed``; model -> fits."""

    n_bootstrap: int
    seed: int
    models: dict[str, CogniloadFits]


@dataclass(frozen=True)
class KnobCells:
    """Accuracy cells of one model: ``overall`` (load and level None) and one :class:`Cell` per level of each knob
    (``Cell.level`` holds the level; pooled over the other knobs)."""

    overall: Cell
    d: tuple[Cell, ...]
    N: tuple[Cell, ...]
    rho: tuple[Cell, ...]

    def by(self, knob: str) -> tuple[Cell, ...]:
        """The cells of ``knob`` (``d``, ``N`` or ``rho``)."""
        if knob not in KNOBS:
            raise KeyError(f"{knob!r} is not one of {KNOBS}")
        return getattr(self, knob)


@dataclass(frozen=True)
class CogniloadResult:
    """The CogniLoad family's result (``Analysis.families["cogniload"]``).

    Attributes:
        n_bootstrap, seed: the bootstrap's replicates and seed.
        models: model -> :class:`CogniloadFits` (empty in the quick table of ``probe run``).
        cells: model -> :class:`KnobCells`.
        attention: needle/hay enrichment (None without probe records).
    """

    n_bootstrap: int
    seed: int
    models: dict[str, CogniloadFits]
    cells: dict[str, KnobCells]
    attention: NeedleHaySummary | None


@dataclass(frozen=True)
class _Data:
    """One model's scored trials as columns (row = trial)."""

    y: np.ndarray  # (n,) 0/1
    d: np.ndarray  # (n,) intrinsic difficulty
    n_stmt: np.ndarray  # (n,) N, statements
    rho: np.ndarray  # (n,) needle ratio, percent
    cluster: np.ndarray  # (n,) puzzle index 0..n_clusters-1

    def column(self, term: str) -> np.ndarray:
        log_n = np.log10(self.n_stmt)
        cols = {
            "const": np.ones_like(self.d),
            "d": self.d,
            "log10_N": log_n,
            "rho": self.rho,
            "rho2": self.rho**2,
            "d:log10_N": self.d * log_n,
            "d:rho": self.d * self.rho,
        }
        return cols[term]


@dataclass(frozen=True)
class _Fit:
    status: Status
    reason: str | None
    terms: tuple[str, ...]
    params: dict[str, float]
    result: LogitFit | None  # the fit when status == "ok"


@dataclass(frozen=True)
class _ThresholdSpec:
    name: str  # "ECL50"
    variable: str  # "N", "d", "rho"
    term: str  # the coefficient the threshold inverts
    direction: Literal["up", "down"]  # up: largest x with P >= .5 from the low end; down: smallest x to the top
    label: str  # "length N"
    unit: str


THRESHOLDS: tuple[_ThresholdSpec, ...] = (
    _ThresholdSpec("ECL50", "N", "log10_N", "up", "length N", "statements"),
    _ThresholdSpec("NT50", "rho", "rho", "down", "needle ratio rho", "percent"),
    _ThresholdSpec("ID50", "d", "d", "up", "difficulty d", "difficulty level"),
)


def analyze_cogniload(trials: list[TrialRecord] | tuple[TrialRecord, ...], n_bootstrap: int, seed: int) -> CogniloadGlm:
    """Fit the GLMs of docs/cogniload.md and capacity thresholds for every model with CogniLoad trials.

    Args:
        trials: trial records of any sources; only scored ``family == "cogniload"`` trials are used.
        n_bootstrap: bootstrap replicates (puzzles resampled) for the threshold and delta_rho CIs; 0 skips CIs.
        seed: seed of the bootstrap generator.

    Returns:
        The :class:`CogniloadGlm` (a :class:`CogniloadFits` per model; a missing number is None).

    Raises:
        CogniloadAnalysisError: a scored CogniLoad trial lacks a numeric ``d``, ``N`` or ``rho`` in ``meta``.
    """
    by_model: dict[str, list[TrialRecord]] = {}
    for t in trials:
        if t.family == FAMILY and t.is_scored:
            by_model.setdefault(t.model, []).append(t)
    rng = np.random.default_rng(seed)
    models = {}
    for model in sorted(by_model):
        conditions = sorted({t.condition for t in by_model[model]})
        if len(conditions) > 1:
            log.warning("%s: CogniLoad trials under several conditions %s are pooled", model, conditions)
        models[model] = _analyze_model(model, by_model[model], n_bootstrap, rng)
    return CogniloadGlm(n_bootstrap=n_bootstrap, seed=seed, models=models)


def _to_data(model: str, trials: list[TrialRecord]) -> _Data:
    rows = []
    for t in trials:
        knobs = PuzzleParams.from_meta(t.meta, f"trial {t.trial_id} (model {model})", error=CogniloadAnalysisError)
        d_t, n_t, rho_t = float(knobs.d), float(knobs.n_statements), float(knobs.rho)
        if t.em is None:
            raise CogniloadAnalysisError(f"trial {t.trial_id} (model {model}) has no score; only scored trials "
                                         "enter the CogniLoad fit")
        rows.append((float(t.em), d_t, n_t, rho_t, t.task_id))
    ids = {tid: i for i, tid in enumerate(sorted({r[4] for r in rows}))}
    y, d, n, rho = (np.array([r[j] for r in rows], dtype=float) for j in range(4))
    return _Data(y=y, d=d, n_stmt=n, rho=rho, cluster=np.array([ids[r[4]] for r in rows]))


def _analyze_model(model: str, trials: list[TrialRecord], n_bootstrap: int, rng: np.random.Generator
                   ) -> CogniloadFits:
    data = _to_data(model, trials)
    levels = {"d": sorted({float(v) for v in data.d}), "N": sorted({float(v) for v in data.n_stmt}),
              "rho": sorted({float(v) for v in data.rho})}
    means = {"d": float(data.d.mean()), "log10_N": float(np.log10(data.n_stmt).mean()), "rho": float(data.rho.mean())}
    fit_objs, fits = _fit_all(data, levels)
    quad, lin = fits["quadratic"], fits["linear"]
    compared = quad["status"] == "ok" and lin["status"] == "ok" and "rho2" in quad["terms"]
    main = fit_objs["quadratic"]
    _, main_dropped = _estimable_terms(FITS["quadratic"], levels)
    thresholds = {spec.name: _threshold_point(spec, main, main_dropped, levels, means) for spec in THRESHOLDS}
    delta_rho = _delta_rho_row(data, levels["rho"][0], levels["rho"][-1])
    if n_bootstrap > 0:  # fills the intervals of the thresholds and of Δρ
        _bootstrap(data, main, levels, means, thresholds, delta_rho, n_bootstrap, rng)
    return CogniloadFits(
        n=int(len(data.y)), n_puzzles=int(data.cluster.max() + 1), accuracy=float(data.y.mean()),
        truncation_rate=float(np.mean([t.truncated for t in trials])),
        levels={k: tuple(_num(v) for v in vs) for k, vs in levels.items()}, means=means,
        accuracy_by={name: {_level_key(v): LevelAccuracy(acc=float(data.y[col == v].mean()), n=int((col == v).sum()))
                            for v in levels[name]}
                     for name, col in (("d", data.d), ("N", data.n_stmt), ("rho", data.rho))},
        fits={name: GlmFit(status=f["status"], reason=f["reason"], terms=tuple(f["terms"]), dropped=f["dropped"],
                           n=f["n"], params=dict(f["params"]), aic=f["aic"], se_method=f["se_method"])
              for name, f in fits.items()},
        aic_preferred=("quadratic" if quad["aic"] < lin["aic"] else "linear") if compared else None,
        delta_aic=lin["aic"] - quad["aic"] if compared else None,
        thresholds={k: Threshold(**th) for k, th in thresholds.items()}, delta_rho=DeltaRho(**delta_rho))


def _fit_all(data: _Data, levels: dict[str, list[float]]) -> tuple[dict[str, _Fit], dict[str, dict]]:
    """Every GLM of :data:`FITS` on the terms the levels can estimate: (fits, their summaries)."""
    clustered = int(np.bincount(data.cluster).max()) > 1
    fits: dict[str, dict] = {}
    fit_objs: dict[str, _Fit] = {}
    for name, wanted in FITS.items():
        terms, dropped = _estimable_terms(wanted, levels)
        if name.startswith("d_x_") and wanted[-1] in dropped:
            fit = _Fit("not_estimable", dropped[wanted[-1]], terms, {}, None)
        else:
            fit = _fit_glm(data, terms, clustered=clustered)
        fit_objs[name] = fit
        fits[name] = _fit_summary(fit, dropped, len(data.y))
    return fit_objs, fits


def _delta_rho_row(data: _Data, low: float, high: float) -> dict:
    """Δρ = accuracy at the lowest ρ − at the highest, with each side's accuracy and count (interval left None)."""
    return {"value": _delta_rho(data.y, data.rho, low, high, np.ones_like(data.y)), "ci_low": None, "ci_high": None,
            "low_rho": _num(low), "high_rho": _num(high), "acc_low": float(data.y[data.rho == low].mean()),
            "acc_high": float(data.y[data.rho == high].mean()), "n_low": int((data.rho == low).sum()),
            "n_high": int((data.rho == high).sum())}


def _num(v: float) -> int | float:
    return int(v) if float(v).is_integer() else float(v)


def _level_key(v: float) -> str:
    return str(_num(v))


def _estimable_terms(wanted: tuple[str, ...], levels: dict[str, list[float]]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The terms of ``wanted`` whose variables vary enough, and a reason for each left out."""
    n_levels = {"d": len(levels["d"]), "log10_N": len(levels["N"]), "rho": len(levels["rho"])}
    label = {"d": "d", "log10_N": "N", "rho": "rho"}
    dropped: dict[str, str] = {}
    for term in wanted:
        if term == "const":
            continue
        if term == "rho2":
            if n_levels["rho"] < 3:
                dropped[term] = f"rho^2 needs at least three rho levels; {n_levels['rho']} tested"
            continue
        for var in term.split(":"):
            if n_levels[var] < 2:
                dropped[term] = f"only one {label[var]} level was tested, so its effect cannot be estimated"
    return tuple(t for t in wanted if t not in dropped), dropped


def _fit_glm(data: _Data, terms: tuple[str, ...], clustered: bool, weights: np.ndarray | None = None) -> _Fit:
    """Binomial GLM (logit) of ``data.y`` on ``terms``; ``weights`` are bootstrap frequency weights."""
    y = data.y if weights is None else data.y[weights > 0]
    w = None if weights is None else weights[weights > 0]
    if len(y) == 0:
        return _Fit("degenerate", "no trials", terms, {}, None)
    if y.min() == y.max():
        verdict = "wrong (accuracy 0 %)" if y.max() == 0 else "correct (accuracy 100 %)"
        return _Fit(
            "degenerate",
            f"all {len(y)} trials are {verdict}; a logistic fit has no finite maximum",
            terms,
            {},
            None,
        )
    keep = slice(None) if weights is None else weights > 0
    x = np.column_stack([data.column(t)[keep] for t in terms])  # (n, p)
    if np.linalg.matrix_rank(x) < len(terms):
        return _Fit("not_estimable", f"the design of terms {', '.join(terms)} is rank deficient", terms, {}, None)
    groups = data.cluster if clustered and weights is None else None
    fit = fit_logit(y, x, groups, freq_weights=w, cluster_name="puzzle", names=tuple(terms))
    if fit.status == "separation":  # the checks ICE's logistic fits share (probe.analysis.glm.separation)
        return _Fit("degenerate", str(fit.reason).removeprefix("logistic fit not usable: "), terms, {}, None)
    if fit.status == "not_converged":
        return _Fit("degenerate", "the IRLS fit did not converge (near-separation or too few trials)", terms, {}, None)
    if fit.status == "not_finite":
        return _Fit("degenerate", "non-finite coefficients or standard errors", terms, {}, None)
    if not fit.ok:
        return _Fit("degenerate", str(fit.reason), terms, {}, None)
    params = fit.params
    return _Fit("ok", None, terms, dict(zip(terms, params.tolist())), fit)




def _fit_summary(fit: _Fit, dropped: dict[str, str], n: int) -> dict:
    out: dict = {"status": fit.status, "reason": fit.reason, "terms": list(fit.terms), "dropped": dropped, "n": n}
    if fit.status != "ok":
        out.update(params={}, aic=None, se_method=None)
        return out
    assert fit.result is not None
    out["params"] = {}
    for i, t in enumerate(fit.terms):
        c = fit.result.coefficient(i, 0.05)
        out["params"][t] = replace(c, value=fit.params[t])
    out["aic"] = fit.result.aic
    se_method = fit.result.se_method
    if fit.result.test_reason:
        se_method = f"{se_method}; coefficients only: {fit.result.test_reason}"
    out["se_method"] = se_method
    return out


def _eta_poly(spec: _ThresholdSpec, params: dict[str, float], means: dict[str, float]) -> np.ndarray:
    """Coefficients (highest power first) of the linear predictor as a function of the threshold's variable.

    The variable is d, log10 N or rho; the other variables are held at their means.
    """
    b = {t: params.get(t, 0.0) for t in ("const", "d", "log10_N", "rho", "rho2")}
    at_mean = {
        "d": b["d"] * means["d"],
        "log10_N": b["log10_N"] * means["log10_N"],
        "rho": b["rho"] * means["rho"] + b["rho2"] * means["rho"] ** 2,
    }
    own = {"N": "log10_N", "d": "d", "rho": "rho"}[spec.variable]
    c = b["const"] + sum(v for k, v in at_mean.items() if k != own)
    if spec.variable == "rho":
        return np.array([b["rho2"], b["rho"], c])
    return np.array([b[own], c])


def _crossing(coefs: np.ndarray, lo: float, hi: float, direction: str) -> tuple[str, float | None, float | None]:
    """Where the fitted curve stops being >= 0 (P >= 0.5), scanning from the low end (``up``) or high end.

    Args:
        coefs: polynomial coefficients of eta(x), highest power first.
        lo, hi: the tested range of x.
        direction: ``up``: the largest x0 with eta >= 0 on [lo, x0]; ``down``: the smallest x0 with eta >= 0 on
            [x0, hi].

    Returns:
        (status, value, extrapolated): ``ok`` with the crossing in [lo, hi]; ``start_fails`` when eta < 0 at the
        starting end (lo for ``up``, hi for ``down``); ``holds`` when eta >= 0 over the whole range. For the last
        two, ``extrapolated`` is the nearest crossing outside the range in the scanning direction, if any.
    """
    if direction == "down":  # mirror x -> -x and scan up
        k = np.arange(len(coefs))[::-1]
        status, value, extra = _crossing(coefs * (-1.0) ** k, -hi, -lo, "up")
        return status, None if value is None else -value, None if extra is None else -extra
    coefs = np.trim_zeros(np.asarray(coefs, dtype=float), "f")
    if len(coefs) == 0:
        return "holds", None, None  # eta == 0 everywhere: P = 0.5 exactly; never below
    roots = np.roots(coefs) if len(coefs) > 1 else np.array([])
    real = np.sort(roots[np.abs(roots.imag) < 1e-9].real)
    eps = 1e-9 * max(1.0, abs(hi - lo))

    def down_crossings(xs: np.ndarray) -> list[float]:
        return [float(r) for r in xs if np.polyval(coefs, r - eps) >= 0 > np.polyval(coefs, r + eps)]

    if np.polyval(coefs, lo) < 0:
        before = down_crossings(real[real < lo])
        return "start_fails", None, (before[-1] if before else None)
    after = down_crossings(real[real >= lo])
    if not after:
        return "holds", None, None
    if after[0] > hi:
        return "holds", None, after[0]
    return "ok", after[0], None


def _to_scale(spec: _ThresholdSpec, x: float | None) -> float | None:
    if x is None:
        return None
    return float(10.0**x) if spec.variable == "N" else float(x)


def _threshold_point(
    spec: _ThresholdSpec,
    fit: _Fit,
    dropped: dict[str, str],
    levels: dict[str, list[float]],
    means: dict[str, float],
) -> dict:
    out: dict = {
        "value": None,
        "ci_low": None,
        "ci_high": None,
        "status": "ok",
        "reason": None,
        "extrapolated": None,
        "unit": spec.unit,
        "n_boot_defined": 0,
        "n_boot_undefined": 0,
        "ci_note": None,
    }
    if spec.term in dropped:
        out.update(status="not_estimable", reason=dropped[spec.term])
        return out
    if fit.status != "ok":
        out.update(status=fit.status, reason=f"the main fit is {fit.status}: {fit.reason}")
        return out
    lo, hi = levels[spec.variable][0], levels[spec.variable][-1]
    to_x = math.log10 if spec.variable == "N" else float
    coefs = _eta_poly(spec, fit.params, means)
    status, value, extra = _crossing(coefs, to_x(lo), to_x(hi), spec.direction)
    p_at = {
        e: 1.0 / (1.0 + math.exp(-float(np.polyval(coefs, to_x(e))))) for e in (lo, hi)
    }
    start, end = (lo, hi) if spec.direction == "up" else (hi, lo)
    extra_v = _to_scale(spec, extra)
    others = "the other variables at their means"
    if status == "ok":
        out["value"] = _to_scale(spec, value)
        return out
    if status == "start_fails":
        out["status"] = "below_range" if spec.direction == "up" else "above_range"
        reason = (
            f"P(correct) is below 0.5 already at the {'lowest' if spec.direction == 'up' else 'highest'} tested "
            f"{spec.label} = {_num(start)} (P = {fmt.num(p_at[start], '.2f')}, {others})"
        )
    else:
        out["status"] = "above_range" if spec.direction == "up" else "below_range"
        reason = (
            f"P(correct) stays at or above 0.5 over the whole tested {spec.label} range {_num(lo)}..{_num(hi)} "
            f"(P = {fmt.num(p_at[end], '.2f')} at {_num(end)}, {others})"
        )
    if spec.variable == "rho" and extra_v is not None and not 0 <= extra_v <= 100:
        extra_v = None  # a ratio outside 0..100 % is no threshold, not even an extrapolated one
    if extra_v is not None:
        reason += f"; the fitted curve crosses 0.5 at {spec.variable} = {fmt.num(extra_v, '.3g')}, an extrapolation"
    elif status == "start_fails":
        reason += "; the fitted curve does not reach 0.5 beyond the tested range either"
    else:
        reason += "; the fitted curve does not fall below 0.5 beyond the tested range either"
    out.update(reason=reason, extrapolated=extra_v)
    return out


def _delta_rho(y: np.ndarray, rho: np.ndarray, low: float, high: float, w: np.ndarray) -> float | None:
    lo_w, hi_w = w * (rho == low), w * (rho == high)
    if lo_w.sum() == 0 or hi_w.sum() == 0:
        return None
    return float((y * lo_w).sum() / lo_w.sum() - (y * hi_w).sum() / hi_w.sum())


def _bootstrap(
    data: _Data,
    main: _Fit,
    levels: dict[str, list[float]],
    means: dict[str, float],
    thresholds: dict[str, dict],
    delta: dict,
    n_bootstrap: int,
    rng: np.random.Generator,
) -> None:
    """Fill CIs in ``thresholds`` (those with status ok) and ``delta`` by resampling puzzles (in place)."""
    n_clusters = int(data.cluster.max() + 1)
    wanted = [s for s in THRESHOLDS if thresholds[s.name]["status"] == "ok"]
    draws: dict[str, list[float]] = {s.name: [] for s in wanted}
    undefined: Counter[str] = Counter()
    deltas: list[float] = []
    low, high = levels["rho"][0], levels["rho"][-1]
    for _ in range(n_bootstrap):
        counts = np.bincount(rng.integers(n_clusters, size=n_clusters), minlength=n_clusters)
        w = counts[data.cluster].astype(float)  # (n,) frequency weight of each trial in this replicate
        dr = _delta_rho(data.y, data.rho, low, high, w)
        if dr is not None:
            deltas.append(dr)
        if not wanted:
            continue
        fit = _fit_glm(data, main.terms, clustered=False, weights=w)
        for spec in wanted:
            if fit.status != "ok":
                undefined[spec.name] += 1
                continue
            to_x = math.log10 if spec.variable == "N" else float
            lo, hi = levels[spec.variable][0], levels[spec.variable][-1]
            status, value, extra = _crossing(_eta_poly(spec, fit.params, means), to_x(lo), to_x(hi), spec.direction)
            x = value if status == "ok" else extra
            if x is None:
                undefined[spec.name] += 1
            else:
                draws[spec.name].append(_to_scale(spec, x))  # type: ignore[arg-type]
    for spec in wanted:
        th = thresholds[spec.name]
        vals = np.array(draws[spec.name])
        th["n_boot_defined"] = int(len(vals))
        th["n_boot_undefined"] = int(undefined[spec.name])
        if len(vals) >= 2:
            th["ci_low"], th["ci_high"] = (float(q) for q in np.percentile(vals, [2.5, 97.5]))
        notes = []
        if len(vals) < MIN_BOOT_SHARE * n_bootstrap:
            notes.append(
                f"only {len(vals)} of {n_bootstrap} bootstrap refits gave a crossing; the interval is unreliable"
            )
        lo, hi = levels[spec.variable][0], levels[spec.variable][-1]
        if th["ci_low"] is not None and (th["ci_low"] < lo or th["ci_high"] > hi):
            notes.append(f"the interval reaches beyond the tested range {_num(lo)}..{_num(hi)} (extrapolation)")
        th["ci_note"] = "; ".join(notes) or None
    if len(deltas) >= 2:
        delta["ci_low"], delta["ci_high"] = (float(q) for q in np.percentile(deltas, [2.5, 97.5]))


# ------------------------------------------------------------------------------------------- the family analysis


def cogniload_cells(frame: pd.DataFrame, trials: tuple[TrialRecord, ...] | list[TrialRecord], alpha: float = 0.05
                    ) -> dict[str, KnobCells]:
    """Accuracy of each model's CogniLoad trials, overall and per level of d, N and rho.

    Each cell is a :func:`probe.analysis.estimates.cell_summaries` cell (EM mean, SEM, the bounded interval of
    :func:`probe.analysis.inference.proportion_ci` clustered by puzzle, truncation and uninterpretable rates, errors,
    skipped) over the trials at that level, pooled over the other knobs; ``load`` is None and ``level`` holds the
    knob's value. Where every puzzle of a cell was answered once (the usual case) that interval is the Wilson score
    interval at n − 1 trials (the design effect of singleton clusters is n/(n − 1)).

    Args:
        frame: trial table of CogniLoad trials.
        trials: their records (``meta`` holds ``d``, ``N``, ``rho``).
        alpha: 1 − confidence level.

    Returns:
        model -> :class:`KnobCells`.
    """
    out: dict[str, KnobCells] = {}
    if frame.empty:
        return out
    meta = {t.trial_id: dict(t.meta or {}) for t in trials}
    knobs = {k: frame["trial_id"].map(lambda tid, k=k: meta.get(tid, {}).get(k)) for k in KNOBS}
    for model in sorted(frame["model"].unique().tolist()):
        rows = frame["model"] == model
        overall = replace(cell_summaries(frame[rows].assign(load=0), alpha)[0], load=None)
        by: dict[str, tuple[Cell, ...]] = {}
        for k in KNOBS:
            known = rows & knobs[k].notna()
            cells = cell_summaries(frame[known].assign(load=knobs[k][known].astype(int)), alpha, level=True)
            by[k] = tuple(cells)
        out[model] = KnobCells(overall=overall, d=by["d"], N=by["N"], rho=by["rho"])
    return out


def _analyze_family(data: FamilyData) -> FamilyOutput:
    cfg = data.settings
    glm = analyze_cogniload(data.trials, cfg.n_bootstrap, data.seed)
    attention, n_records = cogniload_attention(data.run, data.trials, cfg.alpha, data.prompts)
    result = CogniloadResult(n_bootstrap=glm.n_bootstrap, seed=glm.seed, models=glm.models,
                             cells=cogniload_cells(data.frame, data.trials, cfg.alpha), attention=attention)
    return FamilyOutput(result=result, n_attention_records=n_records)


def _tabulate_family(data: FamilyData) -> CogniloadResult:
    return CogniloadResult(n_bootstrap=data.settings.n_bootstrap, seed=data.seed, models={},
                           cells=cogniload_cells(data.frame, data.trials, data.settings.alpha), attention=None)


METHODS = {
    "cogniload": "CogniLoad trials are kept out of every ICE estimate; per model binomial GLM (logit) of correct "
                 "on d, log10 N, rho, rho^2 (AIC against the fit without rho^2; d x N and d x rho interactions); "
                 "model-based SEs with the normal reference when every puzzle was answered once, CR2 clustered by "
                 "puzzle with a t reference on Bell-McCaffrey df when puzzles repeat (coefficients only below 6 "
                 "puzzles); ECL50/NT50/ID50 where the fitted P(correct) crosses 0.5 with the other variables at their "
                 "means, percentile bootstrap CIs over puzzles (seeded with the experiment's seed); accuracy per knob "
                 "level with the bounded interval of the ICE cells (Wilson at the Korn-Graubard effective size, "
                 "clustered by puzzle; docs/statistics.md)",
    "cogniload_attention": "needle (germane statements) and hay (extraneous statements) enrichment per layer: "
                           "per-token attention share of the group from the probe's query set over the per-token "
                           "chance share (the record's P_ext chance scaled to the group's tokens), head mean per "
                           "prompt, mean over prompts with a 95% t-interval; means per level of rho, N and d",
}

ANALYSIS = FamilyAnalysis(name=FAMILY, result_type=CogniloadResult, analyze=_analyze_family,
                          tabulate=_tabulate_family, methods=METHODS)
