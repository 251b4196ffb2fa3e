"""The built-in attention measures, one module per family (each registers its entries on import).

- :mod:`~probe.attention.measures.mass`: ``seg_mass_segment`` (per segment), ``seg_mass`` (per key kind) and
  ``p_ext`` (with its chance level and enrichment);
- :mod:`~probe.attention.measures.residue`: ``ar_k``, the attentional residue (cosine or mass mode).

- :mod:`~probe.attention.measures.value`: ``value_share_segment`` and ``value_p_ext``, the value-weighted share.

Every module of this package is imported by :func:`measures` (found by name, none listed), so a new measure is one
new module here (and its test): see :mod:`probe.attention.measure` for what an entry holds. A module whose measure
derives from another imports that measure's module first, so the registry holds it before.
"""

from __future__ import annotations

import importlib
import pkgutil

from probe.attention.measure import MEASURES, ORIGIN, Measure

_loaded = False
_MODULES: list[str] = []


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        _MODULES.append(f"{__name__}.{info.name}")
        importlib.import_module(_MODULES[-1])


def measures() -> list[Measure]:
    """Every registered measure: this package's modules in name order, each module's entries in the order it
    registers them, then measures registered elsewhere (a test's toy measure) in registration order. The order
    does not depend on which module happened to be imported first."""
    _load()
    rank = {m: i for i, m in enumerate(_MODULES)}
    entries = MEASURES.values()
    order = sorted(range(len(entries)), key=lambda i: (rank.get(ORIGIN.get(entries[i].id, ""), len(rank)), i))
    return [entries[i] for i in order]


def measure(measure_id: str) -> Measure:
    """The measure registered as ``measure_id`` (UnknownNameError, with close matches, for a typo)."""
    _load()
    return MEASURES.get(measure_id)


__all__ = ["measure", "measures"]
