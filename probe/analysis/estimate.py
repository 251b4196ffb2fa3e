"""One estimate with its uncertainty: the type every fit and test of the analysis reports.

A regression coefficient (:mod:`probe.analysis.glm`, :mod:`probe.analysis.inference`), the H1 slope and its
logistic robustness fit, a CogniLoad GLM term, an attention ↔ behaviour coefficient, H3's correlations, an
intervention's paired difference and its recovered share are each one :class:`Estimate`; a result with more to
say (its model, its odds ratio, its power) holds an :class:`Estimate` beside those fields rather than repeating
the estimate's. See docs/statistics.md for the methods.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Estimate:
    """An estimate, its standard error, (1 − alpha) interval, degrees of freedom, p- and q-value.

    Attributes:
        value: the point estimate (given also when descriptive; None when it cannot be estimated).
        se, ci_low, ci_high, p: standard error, interval and two-sided p-value; None when descriptive (see
            ``reason``).
        df: degrees of freedom of the t reference (Bell–McCaffrey for CR2, G − 1 for CR1); None for a normal
            reference or when descriptive.
        q: Benjamini–Hochberg q-value within the estimate's family of tests; None outside a family or when
            descriptive.
        method: how the standard error and reference were computed, in words (None where the holder says it).
        reason: why there is no estimate, no test or no interval, else None.
        is_test: whether a test was made (``p`` given, and ``se`` and the interval where the method has them); an
            interval without a test (Fieller's for a ratio of means) leaves it False.
    """

    value: float | None
    se: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    df: float | None = None
    p: float | None = None
    q: float | None = None
    method: str | None = None
    reason: str | None = None
    is_test: bool = False

    @classmethod
    def descriptive(cls, value: float | None, reason: str | None, method: str | None = None) -> Estimate:
        """An estimate without a test (no standard error, interval or p), and why."""
        return cls(value=value, method=method, reason=reason, is_test=False)

    def with_q(self, q: float | None) -> Estimate:
        """The same estimate with its q-value within a family."""
        return replace(self, q=q)


__all__ = ["Estimate"]
