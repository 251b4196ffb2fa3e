"""Max-T permutation correction across a whole layer × head map, permuting whole questions. Specified in
docs/statistics.md#max-t-permutation-correction."""

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
    """One-sample t of (..., G, m) contrasts over the question axis (-2). Where the contrasts do not vary (sd = 0):
    ±inf when every question has the same non-zero contrast (the strongest evidence a sign flip can see: only the
    assignments that flip every question or none reach it), NaN when they are all 0 (nothing to test)."""
    g = D.shape[-2]
    mean = D.mean(axis=-2)
    sd = D.std(axis=-2, ddof=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = mean / (sd / math.sqrt(g))
    flat = sd <= 1e-12 * np.maximum(1.0, np.abs(mean))
    constant = np.where(mean > 0, np.inf, np.where(mean < 0, -np.inf, np.nan))
    return np.where(flat, constant, t)


def max_t_sign_flip(D: np.ndarray, n_resamples: int = N_RESAMPLES, seed: int = 0, exact_max: int = EXACT_MAX,
                    min_clusters: int = MIN_CLUSTERS, chunk: int = 256) -> MaxT:
    """Max-T sign-flip correction of per-cell one-sample tests of question-level contrasts (docs/statistics.md#max-t-permutation-correction).

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
        max_abs[a:a + chunk] = np.max(np.abs(np.where(np.isnan(tt), 0.0, tt)), axis=1)  # inf stays inf
    obs = np.abs(t)
    if is_exact:
        p_max = (max_abs[None, :] >= obs[:, None] - 1e-12).mean(axis=1)
    else:  # the identity is one of the 1 + B assignments
        p_max = (max_abs[None, :] >= obs[:, None] - 1e-12).sum(axis=1) / len(signs)
    p_max = np.where(np.isnan(t), np.nan, p_max)
    return MaxT(est.reshape(grid), t.reshape(grid), p.reshape(grid), bh_qvalues(p).reshape(grid),
                p_max.reshape(grid), g, len(signs), is_exact, None if is_exact else seed, True, None)


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
    error this gives is measured by ``simulate_failed_null`` in ``scripts/simulate.py``). Questions with rows on one side only carry no
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


__all__ = ["EXACT_MAX", "MaxT", "N_RESAMPLES", "QuestionContrasts", "max_t_sign_flip", "question_contrasts"]
