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

from probe.attention.measure import MEASURES, Measure

_loaded = False


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{info.name}")


def measures() -> list[Measure]:
    """Every registered measure, in registration order (this package's modules imported first)."""
    _load()
    return MEASURES.values()


def measure(measure_id: str) -> Measure:
    """The measure registered as ``measure_id`` (UnknownNameError, with close matches, for a typo)."""
    _load()
    return MEASURES.get(measure_id)


__all__ = ["measure", "measures"]
