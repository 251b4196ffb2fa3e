"""Max-T permutation correction across a whole grid (the layer × head map), permuting at the question level.

Per-head tests come in a family of L × H tests. Benjamini–Hochberg (the default family correction,
docs/statistics.md#families-for-multiple-comparisons) controls the false discovery rate; the max-T procedure of
Westfall & Young controls the family-wise error rate (the chance of *any* false positive on the map) and uses the
dependence between heads instead of ignoring it.

Input: one contrast per question and grid cell, ``D[g, ...]`` (e.g. a head's retrieval score under Saturation minus
under Control, both pooled within question g). Under the null hypothesis of a cell the two sides of the contrast
are exchangeable within a question, so ``D[g]`` is symmetric about 0 and its sign can be flipped; flipping a whole
question (every cell at once) keeps the dependence between cells. For each sign assignment the one-sample t of every
cell is computed and the largest |t| over the map kept; a cell's adjusted p is the share of assignments whose
max |t| reaches the cell's observed |t| (``(1 + #) / (1 + B)`` for Monte Carlo). All ``2^G`` assignments are
enumerated up to :data:`EXACT_MAX` questions, else ``n_resamples`` seeded ones. Its family-wise error at G = 7, 10
and 20 questions on an 8 × 8 map of independent or correlated heads, measured by :func:`simulate_null` and written in
docs/statistics.md#max-t-permutation-correction, is 3.7–5.4 %: within two Monte Carlo standard errors of 5 %.

A two-group contrast within questions (failed − correct trials, Saturation − Control trials) becomes one contrast per
question with :func:`question_contrasts`: per question, the mean over its trials of one side minus the mean over its
trials of the other, on the residuals of a nuisance regression (load, placement, hop position) fitted over all
trials, and only for the questions that have trials on both sides. :func:`simulate_failed_null` measures the
family-wise error of that contrast under no effect, with failure and attention both driven by load (the confounding
the residualisation removes), and the power at a planted head (docs/statistics.md#hop-mass-tests).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from probe.analysis.inference import MIN_CLUSTERS, InferenceInputError, bh_qvalues, few_clusters_reason

EXACT_MAX = 12  # up to 2^12 = 4,096 sign assignments are enumerated exactly
N_RESAMPLES = 1_999


@dataclass(frozen=True, eq=False)
class MaxT:
    """Per-cell one-sample tests of question-level contrasts, with BH and max-T adjusted p-values.

    Attributes:
        estimate: mean contrast over the questions with a finite value (grid shape).
        t: one-sample t (mean / (sd / sqrt(G))); p: two-sided p on t(G − 1); q: BH q over the grid.
        p_max_t: max-T adjusted p (family-wise over the grid); NaN where the cell has no variation.
        n_questions: questions with a contrast; n_assignments: sign assignments used; is_exact: all enumerated.
        seed: seed of the Monte Carlo assignments (None when exact); is_test: False below the minimum of questions.
        reason: why there is no test, else None.
    """

    estimate: np.ndarray
    t: np.ndarray
    p: np.ndarray
    q: np.ndarray
    p_max_t: np.ndarray
    n_questions: int
    n_assignments: int
    is_exact: bool
    seed: int | None
    is_test: bool
    reason: str | None


def _t_stat(D: np.ndarray) -> np.ndarray:
    """One-sample t of (..., G, m) contrasts over the question axis (-2); NaN where sd = 0."""
    g = D.shape[-2]
    mean = D.mean(axis=-2)
    sd = D.std(axis=-2, ddof=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = mean / (sd / math.sqrt(g))
    return np.where(sd > 1e-12 * np.maximum(1.0, np.abs(mean)), t, np.nan)


def max_t_sign_flip(D: np.ndarray, n_resamples: int = N_RESAMPLES, seed: int = 0, exact_max: int = EXACT_MAX,
                    min_clusters: int = MIN_CLUSTERS, chunk: int = 256) -> MaxT:
    """Max-T sign-flip correction of per-cell one-sample tests of question-level contrasts (module docstring).

    Args:
        D: (G, *grid) contrasts, one row per question; every value finite (drop questions without one first).
        n_resamples: Monte Carlo sign assignments above ``exact_max`` questions.
        seed: seed of those assignments.
        exact_max: most questions whose 2^G assignments are enumerated.
        min_clusters: below this many questions the result is descriptive (estimates only).
        chunk: assignments evaluated at once (memory).

    Returns:
        The :class:`MaxT`, arrays of the grid's shape.

    Raises:
        InferenceInputError: D has no question axis or holds non-finite values.
    """
    import scipy.stats

    D = np.asarray(D, dtype=float)
    if D.ndim < 2:
        raise InferenceInputError(f"D: expected (question, *grid) contrasts, got shape {D.shape}")
    if not np.all(np.isfinite(D)):
        raise InferenceInputError("D: non-finite contrasts; keep only questions with a contrast in every cell")
    g, grid = D.shape[0], D.shape[1:]
    flat = D.reshape(g, int(np.prod(grid)))
    est = flat.mean(axis=0) if g else np.full(flat.shape[1], np.nan)
    nan = np.full(flat.shape[1], np.nan)
    if g < min_clusters:
        return MaxT(est.reshape(grid), nan.reshape(grid), nan.reshape(grid), nan.reshape(grid), nan.reshape(grid),
                    g, 0, False, None, False, few_clusters_reason(g, min_clusters))
    t = _t_stat(flat)
    p = 2 * scipy.stats.t.sf(np.abs(t), g - 1)
    is_exact = g <= exact_max
    if is_exact:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=g)))  # the identity first
    else:
        rng = np.random.default_rng(seed)
        signs = np.vstack([np.ones(g), rng.choice((1.0, -1.0), size=(n_resamples, g))])
    max_abs = np.empty(len(signs))
    for a in range(0, len(signs), chunk):
        s = signs[a:a + chunk]  # (b, G)
        tt = _t_stat(s[:, :, None] * flat[None, :, :])  # (b, m)
        max_abs[a:a + chunk] = np.nanmax(np.abs(np.nan_to_num(tt, nan=0.0)), axis=1)
    obs = np.abs(t)
    if is_exact:
        p_max = (max_abs[None, :] >= obs[:, None] - 1e-12).mean(axis=1)
    else:  # the identity is one of the 1 + B assignments
        p_max = (max_abs[None, :] >= obs[:, None] - 1e-12).sum(axis=1) / len(signs)
    p_max = np.where(np.isfinite(t), p_max, np.nan)
    return MaxT(est.reshape(grid), t.reshape(grid), p.reshape(grid), bh_qvalues(p).reshape(grid),
                p_max.reshape(grid), g, len(signs), is_exact, None if is_exact else seed, True, None)


def simulate_null(n_sims: int = 200, n_questions: int = 10, grid: tuple[int, int] = (8, 8), rho: float = 0.5,
                  alpha: float = 0.05, n_resamples: int = 499, seed: int = 0) -> dict[str, float]:
    """Family-wise rejection rates under the global null, for max-T and for uncorrected / BH per-cell tests.

    Each simulated study has ``n_questions`` question contrasts on a ``grid`` of heads; heads share a question
    effect with correlation ``rho`` (a common factor) and the contrasts are t(5)-distributed (heavier tails than
    normal), symmetric about 0: no head has an effect. A study rejects when any head's adjusted p (or q) < alpha.

    Returns:
        ``{"max_t": rate, "bh": rate, "uncorrected": rate, "n_sims": n_sims}``.
    """
    rng = np.random.default_rng(seed)
    m = int(np.prod(grid))
    hits = {"max_t": 0, "bh": 0, "uncorrected": 0}
    for i in range(n_sims):
        common = rng.standard_t(5, size=(n_questions, 1))
        own = rng.standard_t(5, size=(n_questions, m))
        D = (math.sqrt(rho) * common + math.sqrt(1 - rho) * own).reshape(n_questions, *grid)
        r = max_t_sign_flip(D, n_resamples=n_resamples, seed=seed + i + 1)
        hits["max_t"] += bool(np.nanmin(r.p_max_t) < alpha)
        hits["bh"] += bool(np.nanmin(r.q) < alpha)
        hits["uncorrected"] += bool(np.nanmin(r.p) < alpha)
    return {**{k: v / n_sims for k, v in hits.items()}, "n_sims": float(n_sims)}


@dataclass(frozen=True, eq=False)
class QuestionContrasts:
    """One two-group contrast per question (:func:`question_contrasts`).

    Attributes:
        D: (G', *grid) per-question contrasts, mean of side 1 minus mean of side 0, for the G' questions with both.
        questions: those questions, in order of first appearance.
        n_rows: trials (rows) of those questions.
        n_dropped: questions with trials on one side only (left out).
    """

    D: np.ndarray
    questions: tuple[str, ...]
    n_rows: int
    n_dropped: int


def question_contrasts(values: np.ndarray, side: np.ndarray, groups: np.ndarray,
                       nuisance: np.ndarray | None = None) -> QuestionContrasts:
    """Per question, the mean over its side-1 rows minus the mean over its side-0 rows, of every grid cell.

    With ``nuisance`` (an (n, k) design with the constant, e.g. [1, load, Residue, last hop]), the means are of the
    residuals of the OLS of each cell on it, fitted over every row: so a contrast between, say, failed and correct
    trials of a question is not the difference in load between them (failed trials sit at higher loads). Under the
    null that, given the nuisance columns, a cell's value does not depend on the side, the residuals of a question
    are exchangeable between its sides and the question's contrast is close to symmetric about 0, which the
    sign flip of :func:`max_t_sign_flip` needs (approximately, since the residuals share one fit: the family-wise
    error this gives is measured by :func:`simulate_failed_null`). Questions with rows on one side only carry no
    contrast and are left out.

    Args:
        values: (n, *grid) finite values, one row per trial (or trial-hop).
        side: (n,) 0/1 (or bool): which side of the contrast the row is on.
        groups: (n,) question ids.
        nuisance: (n, k) nuisance design including the constant, or None (raw means).

    Raises:
        InferenceInputError: shapes disagree, or values / nuisance hold non-finite numbers.
    """
    Y = np.asarray(values, dtype=float)
    if Y.ndim < 2:
        raise InferenceInputError(f"values: expected (row, *grid), got shape {Y.shape}")
    n, grid = Y.shape[0], Y.shape[1:]
    s = np.asarray(side, dtype=float).reshape(-1)
    g = np.asarray(groups).reshape(-1)
    if len(s) != n or len(g) != n:
        raise InferenceInputError(f"side ({len(s)}) and groups ({len(g)}) must have one entry per row ({n})")
    if not np.all(np.isfinite(Y)):
        raise InferenceInputError("values: non-finite entries; keep only rows with a value in every cell")
    flat = Y.reshape(n, -1)
    if nuisance is not None:
        N = np.asarray(nuisance, dtype=float).reshape(n, -1)
        if not np.all(np.isfinite(N)):
            raise InferenceInputError("nuisance: non-finite entries")
        beta, *_ = np.linalg.lstsq(N, flat, rcond=None)
        flat = flat - N @ beta
    questions: list[str] = []
    rows: list[np.ndarray] = []
    n_rows = dropped = 0
    for q in dict.fromkeys(g.tolist()):
        at = g == q
        one, zero = at & (s > 0.5), at & (s <= 0.5)
        if not one.any() or not zero.any():
            dropped += 1
            continue
        questions.append(str(q))
        rows.append(flat[one].mean(axis=0) - flat[zero].mean(axis=0))
        n_rows += int(at.sum())
    D = np.stack(rows).reshape(len(rows), *grid) if rows else np.zeros((0, *grid))
    return QuestionContrasts(D=D, questions=tuple(questions), n_rows=n_rows, n_dropped=dropped)


def _failed_study(rng: np.random.Generator, n_questions: int, grid: tuple[int, int], rho: float, effect: float,
                  planted: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One simulated study of trial-hops: (values, failed, load, groups, covariates) (:func:`simulate_failed_null`)."""
    m = int(np.prod(grid))
    vals, failed, load, groups, cov = [], [], [], [], []
    for q in range(n_questions):
        difficulty = rng.normal()
        q_effect = math.sqrt(rho) * rng.standard_t(5) + math.sqrt(1 - rho) * rng.standard_t(5, size=m)
        for cond in (0.0, 1.0):  # Saturation, Residue
            for ld in (20.0, 80.0):
                high = ld == 80.0
                fail = rng.random() < 1 / (1 + math.exp(-(-0.8 + difficulty + 1.6 * high)))
                trial = math.sqrt(rho) * rng.standard_t(5) + math.sqrt(1 - rho) * rng.standard_t(5, size=m)
                for hop in (0.0, 1.0):
                    own = math.sqrt(rho) * rng.standard_t(5) + math.sqrt(1 - rho) * rng.standard_t(5, size=m)
                    v = 0.5 * q_effect + 0.3 * trial + 0.5 * own + 0.8 * high + 0.3 * hop + 0.2 * cond
                    if fail and effect:
                        v = v.reshape(grid)
                        v[planted] += effect
                        v = v.reshape(-1)
                    vals.append(v)
                    failed.append(float(fail))
                    load.append(ld)
                    groups.append(q)
                    cov.append((cond, hop))
    return (np.array(vals).reshape(-1, *grid), np.array(failed), np.array(load), np.array(groups),
            np.array(cov))


def simulate_failed_null(n_sims: int = 200, n_questions: int = 10, grid: tuple[int, int] = (8, 8),
                         rho: float = 0.5, alpha: float = 0.05, n_resamples: int = 499, seed: int = 0,
                         effect: float = 0.0, planted: tuple[int, int] = (0, 0),
                         clustered: bool = True) -> dict[str, float]:
    """Family-wise rejection rates of the failed − correct map, max-T on :func:`question_contrasts` vs per-head tests.

    Each simulated study has ``n_questions`` questions with one trial at each of two placements (Saturation,
    Residue) and two loads (20, 80 %), two hops per trial: 8 trial-hops per question, as in a study with one
    replication. A trial fails with a probability that rises with the question's difficulty and with load; every
    head's value rises with load too (and with the hop and the placement), and carries question, trial and
    trial-hop terms shared by the heads with correlation ``rho``, all t(5)-distributed. With ``effect = 0`` no head
    depends on failure given load: failed trials still attend more, through load alone, the confounding the
    nuisance regression has to remove. With ``effect`` > 0 the ``planted`` head gains that much in failed trials.

    Per study: the max-T sign flip (:func:`max_t_sign_flip`) on the per-question failed − correct contrast of
    residuals on [1, load, Residue, hop] (``max_t``) and of raw values (``max_t_raw``: without the adjustment); and,
    with ``clustered``, the clustered per-head test of the attention ↔ behaviour analysis with BH over the map
    (:func:`probe.analysis.attention_tests.attention_failure_tests`, ``bh_clustered``). A study rejects when any
    head other than the planted one (any head under no effect) has p_max_t (q) < alpha; ``found`` is the share of
    studies whose max-T p of the planted head is < alpha (with ``effect`` > 0).

    Returns:
        ``{"max_t", "max_t_raw", "bh_clustered", "found", "found_bh", "questions_used", "n_sims"}`` (rates and the
        mean number of questions that had failed and correct trials).
    """
    from probe.analysis.attention_tests import attention_failure_tests

    rng = np.random.default_rng(seed)
    hits = {"max_t": 0, "max_t_raw": 0, "bh_clustered": 0, "found": 0, "found_bh": 0}
    used = 0.0
    others = np.ones(grid, dtype=bool)
    if effect:
        others[planted] = False
    for i in range(n_sims):
        Y, failed, load, groups, cov = _failed_study(rng, n_questions, grid, rho, effect, planted)
        N = np.column_stack([np.ones(len(load)), load, cov])
        adj = question_contrasts(Y, failed, groups, N)
        raw = question_contrasts(Y, failed, groups)
        used += len(adj.questions)
        r = max_t_sign_flip(adj.D, n_resamples=n_resamples, seed=seed + i + 1)
        rr = max_t_sign_flip(raw.D, n_resamples=n_resamples, seed=seed + i + 1)
        if r.is_test:
            pm = np.nan_to_num(r.p_max_t, nan=1.0)
            hits["max_t"] += bool((pm[others] < alpha).any())
            hits["found"] += bool(effect and pm[planted] < alpha)
        if rr.is_test:
            hits["max_t_raw"] += bool((np.nan_to_num(rr.p_max_t, nan=1.0)[others] < alpha).any())
        if clustered:
            fits = attention_failure_tests(Y, failed, load, groups, cov, alpha)
            if fits.is_test:
                qv = np.nan_to_num(fits.q, nan=1.0)
                hits["bh_clustered"] += bool((qv[others] < alpha).any())
                hits["found_bh"] += bool(effect and qv[planted] < alpha)
    return {**{k: v / n_sims for k, v in hits.items()}, "questions_used": used / n_sims, "n_sims": float(n_sims)}


__all__ = ["EXACT_MAX", "MaxT", "N_RESAMPLES", "QuestionContrasts", "max_t_sign_flip", "question_contrasts",
           "simulate_failed_null", "simulate_null"]
