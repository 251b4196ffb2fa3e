"""One estimate with its uncertainty: the type every fit and test of the analysis reports.

A regression coefficient (:mod:`probe.analysis.glm`, :mod:`probe.analysis.inference`), the H1 slope and its
logistic robustness fit, a CogniLoad GLM term, an attention ↔ behaviour coefficient, H3's correlations, an
intervention's paired difference and its recovered share are each one :class:`Estimate`; a result with more to
say (its model, its odds ratio, its power) holds an :class:`Estimate` beside those fields rather than repeating
the estimate's. See docs/statistics.md for the methods.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, replace
from typing import Any, Union


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


# the fields of an Estimate, as the one-type test over probe/analysis looks for them in other dataclasses
ESTIMATE_FIELDS = ("se", "ci_low", "ci_high", "p")

# ------------------------------------------------------------------------------------- older analysis files

# what an Estimate's field was called where a result spelled it out flat (analysis schema 5 and before)
OLD_NAMES = {"value": ("estimate", "coef", "beta"), "method": ("se_method",)}

# field metadata of a nested result: what its fields were called where its holder spelled it out flat
# (:func:`flat_names`)
FLAT_NAMES = "flat_names"
FLAT_ONLY = "flat_only"


def flat_names(only: bool = False, **names: str) -> dict[str, Any]:
    """Field metadata for a nested result (an :class:`Estimate` or a result holding one) whose fields an older
    analysis file spelled out flat in the holder under other names: ``names`` maps a field of the nested type to its
    old key (``value="r"``: the estimate was the holder's ``r``). With ``only``, the nested result takes those keys
    and no other (a second estimate beside the holder's first: Spearman's ``spearman_rho`` and ``spearman_p``
    beside Pearson's ``r`` and ``p``)."""
    return {FLAT_NAMES: dict(names), FLAT_ONLY: only}


def _plain(tp: Any) -> tuple[Any, bool]:
    """``X`` of ``X | None`` and whether None is allowed."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else tp), len(args) < len(typing.get_args(tp))
    return tp, False


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _spelled_flat(data: dict, f: dataclasses.Field, optional: bool) -> bool:
    """Whether a dataclass field ``f`` is missing from ``data`` as an object (its fields spelled out flat); a field
    with a default that is absent is one added later, not spelled out."""
    if f.name not in data:
        return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    value = data[f.name]
    return not isinstance(value, dict) and not (value is None and optional)


def _from_flat(cls: type, flat: dict, consumed: set[str], holder: dataclasses.Field | None = None) -> dict:
    """The fields of ``cls`` taken from a parent's flat fields (a nested dataclass field from the same flat dict),
    under the old names the holder's field declares (:func:`flat_names`)."""
    hints = typing.get_type_hints(cls)
    names: dict[str, str] = holder.metadata.get(FLAT_NAMES, {}) if holder is not None else {}
    only = bool(holder.metadata.get(FLAT_ONLY)) if holder is not None else False
    sub: dict = {}
    for f in dataclasses.fields(cls):
        tp, optional = _plain(hints[f.name])
        if _is_dataclass_type(tp) and _spelled_flat(flat, f, optional) and not only:
            sub[f.name] = _from_flat(tp, flat, consumed, f)
            continue
        if f.name in names:
            keys: tuple[str, ...] = (names[f.name],)
        elif only:
            keys = ()
        else:
            keys = (f.name, *(OLD_NAMES.get(f.name, ()) if cls is Estimate else ()))
        for key in keys:
            if key in flat:
                sub[f.name] = flat[key]
                consumed.add(key)
                break
    return _fill_estimate(sub) if cls is Estimate else sub


def _fill_estimate(d: dict) -> dict:
    """An older estimate's JSON with the fields it did not have: no q, method or reason; a test where p is given."""
    out = dict(d)
    if "value" not in out:
        for old in OLD_NAMES["value"]:
            if old in out:
                out["value"] = out.pop(old)
                break
    for name in ("se", "ci_low", "ci_high", "df", "p", "q", "method", "reason"):
        out.setdefault(name, None)
    out.setdefault("is_test", out["p"] is not None)
    return out


def nest_flat_estimates(tp: Any, data: Any) -> Any:
    """The JSON of a result of type ``tp`` written before estimates were one type (analysis schema 5 and before),
    in today's layout: an estimate spelled out flat in its holder (``coef``/``beta``/``estimate``, ``se``,
    ``ci_low``, ``ci_high``, ``p``, ``q``, ``df``, ``reason``, or the names the holder's field declares with
    :func:`flat_names`: H3's ``r``, a paired difference's ``delta``) becomes a nested :class:`Estimate`, and a
    result that repeated another's fields (a layer's fit, H3's correlation) holds that result. Every number is kept;
    fields an older estimate did not have are filled (no q, method or reason; ``is_test`` where p is given). Used
    only on older files (analysis schema 6 and before)."""
    tp, _ = _plain(tp)
    if data is None:
        return None
    origin = typing.get_origin(tp)
    if origin is tuple and isinstance(data, list):
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return [nest_flat_estimates(args[0], v) for v in data]
        return [nest_flat_estimates(a, v) for a, v in zip(args, data)]
    if origin is dict and isinstance(data, dict):
        return {k: nest_flat_estimates(typing.get_args(tp)[1], v) for k, v in data.items()}
    if not (_is_dataclass_type(tp) and isinstance(data, dict)):
        return data
    if tp is Estimate:
        return data if "value" in data else _fill_estimate(data)
    hints = typing.get_type_hints(tp)
    own = {f.name for f in dataclasses.fields(tp)}
    out = dict(data)
    consumed: set[str] = set()
    for f in dataclasses.fields(tp):
        sub, sub_optional = _plain(hints[f.name])
        if _is_dataclass_type(sub) and _spelled_flat(out, f, sub_optional):
            out[f.name] = _from_flat(sub, data, consumed, f)
    for key in consumed - own:
        out.pop(key, None)
    for f in dataclasses.fields(tp):
        if f.name in out and not f.metadata.get("decode"):
            out[f.name] = nest_flat_estimates(hints[f.name], out[f.name])
    return out


__all__ = ["ESTIMATE_FIELDS", "Estimate", "flat_names", "nest_flat_estimates"]
