"""The built-in attention measures, one module per family, each registering its entries on import
(docs/probes.md#the-measure-registry)."""

from __future__ import annotations

import functools

from probe.attention.measure import MEASURES, Measure


@functools.cache
def built_in() -> tuple[Measure, ...]:
    """The toolkit's measures, in its order (the modules are imported here, on first use: they reach into the
    engine, which imports this package)."""
    from probe.attention.measures import mass, residue, value

    return (mass.SEG_MASS_SEGMENT, mass.SEG_MASS, mass.P_EXT, residue.AR_K, value.VALUE_MASS_SEGMENT, value.VALUE_P_EXT)


def measures() -> list[Measure]:
    """Every registered measure: :func:`built_in`, then the others in registration order."""
    first = built_in()
    return [*first, *(m for m in MEASURES.values() if all(m is not b for b in first))]


def measure(measure_id: str) -> Measure:
    """The measure registered as ``measure_id`` (UnknownNameError, with close matches, for a typo)."""
    built_in()
    return MEASURES.get(measure_id)


__all__ = ["built_in", "measure", "measures"]
