"""The one number formatter: how every estimate is written as text (reports, tables, summaries, analysis reasons)."""

from __future__ import annotations

from typing import Iterable, Sequence

import math

DASH = "—"
P_FLOOR = 0.001  # p-values below this are written as "<0.001"


def _missing(x: float | int | None) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def num(x: float | int | None, spec: str = ".3f") -> str:
    """``x`` formatted with ``spec``, or :data:`DASH` when missing."""
    return DASH if _missing(x) else format(x, spec)


def pct(x: float | None, digits: int = 0) -> str:
    """A share in [0, 1] as a percentage with ``digits`` decimals (0.25 -> ``"25%"``), or :data:`DASH`."""
    return DASH if _missing(x) else f"{100 * x:.{digits}f}%"  # type: ignore[operator]


def p_value(p: float | None, *, html: bool = False) -> str:
    """A p-value for a table cell: ``<0.001`` below :data:`P_FLOOR`, else three decimals; :data:`DASH` if missing.

    Args:
        p: the p-value.
        html: escape ``<`` as ``&lt;`` (the cell goes into HTML as is).
    """
    if _missing(p):
        return DASH
    if p < P_FLOOR:  # type: ignore[operator]
        return ("&lt;" if html else "<") + f"{P_FLOOR:g}"
    return f"{p:.3f}"


def p_phrase(p: float) -> str:
    """A p-value inside a sentence: ``p < 0.001`` or ``p = 0.012``."""
    return f"p < {P_FLOOR:g}" if p < P_FLOOR else f"p = {p:.3f}"


def ci(low: float | None, high: float | None, spec: str = ".3f") -> str:
    """An interval ``[low, high]`` with ``spec``; :data:`DASH` when either end is missing."""
    if _missing(low) or _missing(high):
        return DASH
    return f"[{format(low, spec)}, {format(high, spec)}]"


def count(n: int | None) -> str:
    """An integer count, or :data:`DASH` when missing."""
    return DASH if n is None else str(n)


def first_clause(reason: str) -> str:
    """A reason's first clause (up to its first parenthesis, colon or semicolon; a leading "no interval: " is
    skipped), for a table cell: the whole reason stays in the CSV and ``analysis.json``."""
    reason = reason.removeprefix("no interval: ")
    for stop in (" (", ":", ";"):
        reason = reason.split(stop)[0]
    return reason.strip()


def int_ranges(values: Iterable[int]) -> str:
    """``0-3, 7, 9-11`` for sorted ints (layer lists)."""
    out: list[str] = []
    run: list[int] = []
    for i in values:
        if run and i != run[-1] + 1:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run = []
        run.append(i)
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ", ".join(out)


def layers_have(layers: Sequence[int]) -> str:
    """``layer 4 has`` or ``layers 0-3, 5 have`` (sorted ints), for sentences about layers."""
    return f"layer {layers[0]} has" if len(layers) == 1 else f"layers {int_ranges(layers)} have"


__all__ = ["DASH", "P_FLOOR", "ci", "count", "first_clause", "int_ranges", "layers_have", "num", "p_phrase", "p_value", "pct"]
