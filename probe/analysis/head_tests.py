"""One result type for every per-head test over a layer × head map, :class:`HeadTests`: Benjamini–Hochberg and max-T
lists kept apart (docs/statistics.md#max-t-permutation-correction)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from probe.analysis.estimate import Estimate
from probe.analysis.estimates import finite
from probe.codec import Grid
from probe.analysis.inference import ManyFits
from probe.analysis.max_t import MaxT, max_t_sign_flip, question_contrasts


@dataclass(frozen=True)
class HeadHit:
    """One head whose test survives BH across the layer × head map (q < α), or the max-T correction: its estimate,
    CI, p, the q-value across the map and its max-T adjusted p (None without a max-T test)."""

    layer: int
    head: int
    estimate: Estimate
    p_max_t: float | None = None

    @property
    def value(self) -> float:
        """The estimate (always given: only tested heads are hits)."""
        assert self.estimate.value is not None
        return self.estimate.value

    @property
    def q(self) -> float:
        assert self.estimate.q is not None
        return self.estimate.q


@dataclass(frozen=True)
class HeadMaxT:
    """The max-T correction over a per-head map (family-wise; :mod:`probe.analysis.max_t`): per question, the
    contrast of each head (of its residuals on the covariates, where the test adjusts for some), signs of whole
    questions flipped.

    Attributes:
        p_max_t: the (layer, head) max-T adjusted p-values (None when there is no test).
        n_questions: questions with a contrast (the max-T's G).
        significant: every head with max-T p < α (either sign), smallest p first.
        method: the correction in words, or why there is none.
    """

    p_max_t: Grid | None
    n_questions: int
    significant: tuple[HeadHit, ...]
    method: str


@dataclass(frozen=True)
class HeadTests:
    """A per-head test of one model over its layer × head map: one BH family over the map, and the max-T option.

    Attributes:
        measure: what is tested per head (``P_ext enrichment per head``); estimand: what the estimate means.
        n: observations (trials, trial-hops or questions); n_questions: questions; n_layers, n_heads: the map;
            n_tested: heads with a p-value.
        is_test: False when the map is descriptive (see ``reason``); method: the test in words; reason: why no test.
        df: the degrees of freedom shared by the complete heads (None when descriptive).
        estimates, q_values: the (layer, head) estimates and q-values (None without a map).
        significant: every head with q < α (either sign), smallest q first.
        max_t: the family-wise max-T option over the same map (:class:`HeadMaxT`); None without it.
    """

    measure: str
    estimand: str
    n: int
    n_questions: int
    n_layers: int
    n_heads: int
    n_tested: int
    is_test: bool
    method: str
    reason: str | None
    df: float | None
    estimates: Grid | None
    q_values: Grid | None
    significant: tuple[HeadHit, ...]
    max_t: HeadMaxT | None = None

    def listed(self) -> list[tuple[HeadHit, str]]:
        """Every head named by either correction, with the correction(s) it passed (``BH``, ``max-T``, ``BH and
        max-T``): BH's heads in their order, then the max-T-only ones."""
        by_max_t = {(h.layer, h.head): h for h in (self.max_t.significant if self.max_t is not None else ())}
        out = [(h, "BH and max-T" if (h.layer, h.head) in by_max_t else "BH") for h in self.significant]
        bh = {(h.layer, h.head) for h in self.significant}
        return out + [(h, "max-T") for key, h in by_max_t.items() if key not in bh]

    @classmethod
    def untested(cls, measure: str, estimand: str, n: int, n_questions: int, reason: str) -> HeadTests:
        """A map that could not be fitted, with the reason."""
        return cls(measure=measure, estimand=estimand, n=n, n_questions=n_questions, n_layers=0, n_heads=0,
                   n_tested=0, is_test=False, method="", reason=reason, df=None, estimates=None, q_values=None,
                   significant=())


def _how(res: MaxT) -> str:
    return ("exact, all 2^G sign assignments" if res.is_exact else
            f"Monte Carlo, {res.n_assignments - 1} sign assignments, seed {res.seed}")


def fitted_head_tests(fits: ManyFits, alpha: float, *, measure: str, estimand: str, n: int) -> HeadTests:
    """The BH part of a per-head test from its clustered fits (one coefficient per head)."""
    n_layers, n_heads = fits.estimate.shape
    hits = [HeadHit(layer=int(li), head=int(h), estimate=fits.estimate_at((int(li), int(h))))
            for li, h in fits.significant(alpha)] if fits.is_test else []
    hits.sort(key=lambda x: (x.q, x.layer, x.head))
    dfs = fits.df[np.isfinite(fits.df)]
    return HeadTests(measure=measure, estimand=estimand, n=n, n_questions=fits.n_clusters, n_layers=int(n_layers),
                     n_heads=int(n_heads), n_tested=int(np.isfinite(fits.p).sum()), is_test=fits.is_test,
                     method=fits.method, reason=fits.reason, df=float(np.median(dfs)) if dfs.size else None,
                     estimates=Grid(fits.estimate), q_values=Grid(fits.q), significant=tuple(hits))


def with_max_t(heads: HeadTests, fits: ManyFits, Y: np.ndarray, side: np.ndarray, groups: np.ndarray,
               nuisance: np.ndarray, alpha: float, seed: int, contrasts: str, over: str = "map") -> HeadTests:
    """``heads`` with the max-T correction over its map (docs/statistics.md#max-t-permutation-correction).

    Per question, the mean of one side minus the other (``side`` 1 vs 0) of the residuals of each head on
    ``nuisance`` (:func:`probe.analysis.max_t.question_contrasts`), over the rows with a finite value in every head
    and the questions with both sides; signs of whole questions flipped. A head no row has a value for (a layer
    without attention) is left out of the map and its p-value is NaN.

    Args:
        heads: the BH part (:func:`fitted_head_tests`) of ``fits``.
        Y: (row, layer, head) values; side: 1 / 0 per row; groups: the question of each row; nuisance: the
            covariates (with the constant) whose residuals are contrasted.
        alpha: the family-wise level; seed: seed of the Monte Carlo sign assignments.
        contrasts: the contrasts in words (``failed - correct contrasts of residuals on load and Residue``) and
            over: what the correction runs over (``map``, ``grid``), for the method's text.
    """
    present = np.isfinite(Y).any(axis=0)  # a cell no row has is a layer without attention (a hybrid's state-space)
    cells = Y[:, present]
    full = np.all(np.isfinite(cells), axis=1)
    qc = question_contrasts(cells[full], side[full], groups[full], nuisance[full])
    res = max_t_sign_flip(qc.D, seed=seed)
    if not res.is_test or not fits.is_test:
        return replace(heads, max_t=HeadMaxT(p_max_t=None, n_questions=len(qc.questions), significant=(),
                                             method=f"no max-T correction ({res.reason or fits.reason})"))
    pm = np.full(present.shape, np.nan)
    pm[present] = res.p_max_t

    def hit(li: int, h: int) -> HeadHit:
        return HeadHit(layer=li, head=h, estimate=fits.estimate_at((li, h)), p_max_t=finite(pm[li, h]))

    sig = sorted((hit(int(li), int(h)) for li, h in np.argwhere(np.nan_to_num(pm, nan=1.0) < alpha)),
                 key=lambda x: (x.p_max_t if x.p_max_t is not None else 1.0, x.layer, x.head))
    dropped = f", {int((~full).sum())} row(s) without a value in every head left out" if (~full).any() else ""
    return replace(heads, significant=tuple(replace(x, p_max_t=finite(pm[x.layer, x.head]))
                                            for x in heads.significant),
                   max_t=HeadMaxT(p_max_t=Grid(pm), n_questions=len(qc.questions), significant=tuple(sig),
                                  method=f"max-T sign-flip correction over the {over} on per-question {contrasts}, "
                                         f"{len(qc.questions)} question(s) with both{dropped} ({_how(res)})"))


def max_t_head_tests(D: np.ndarray, alpha: float, seed: int, *, measure: str, estimand: str) -> HeadTests:
    """A per-head test of per-question contrasts ``D`` (question, layer, head): the one-sample t on t(G − 1) with
    BH over the map, and the max-T correction of the same contrasts."""
    res = max_t_sign_flip(D, seed=seed)
    g = res.n_questions

    def hit(li: int, h: int) -> HeadHit:
        e = Estimate(value=finite(res.estimate[li, h]), df=float(g - 1), p=finite(res.p[li, h]),
                     q=finite(res.q[li, h]), method="one-sample t", is_test=True)
        return HeadHit(layer=li, head=h, estimate=e, p_max_t=finite(res.p_max_t[li, h]))

    n_layers, n_heads = res.estimate.shape
    bh = [hit(int(li), int(h)) for li, h in np.argwhere(np.nan_to_num(res.q, nan=1.0) < alpha)] if res.is_test else []
    mt = [hit(int(li), int(h)) for li, h in np.argwhere(np.nan_to_num(res.p_max_t, nan=1.0) < alpha)
          ] if res.is_test else []
    bh.sort(key=lambda x: (x.q, x.layer, x.head))
    mt.sort(key=lambda x: (x.p_max_t if x.p_max_t is not None else 1.0, x.layer, x.head))
    return HeadTests(
        measure=measure, estimand=estimand, n=g, n_questions=g, n_layers=int(n_layers), n_heads=int(n_heads),
        n_tested=int(np.isfinite(res.p).sum()), is_test=res.is_test,
        method="one-sample t of per-question differences on t(G-1), BH over the layer x head map",
        reason=res.reason, df=float(g - 1) if res.is_test else None, estimates=Grid(res.estimate),
        q_values=Grid(res.q), significant=tuple(bh),
        max_t=HeadMaxT(p_max_t=Grid(res.p_max_t) if res.is_test else None, n_questions=g, significant=tuple(mt),
                       method=f"max-T sign-flip correction over the map ({_how(res)})" if res.is_test
                       else f"no max-T correction ({res.reason})"))


__all__ = ["HeadHit", "HeadMaxT", "HeadTests", "fitted_head_tests", "max_t_head_tests", "with_max_t"]
