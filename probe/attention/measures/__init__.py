"""The built-in attention measures, one module per family (each registers its entries on import).

- :mod:`~probe.attention.measures.mass`: ``seg_mass_segment`` (per segment), ``seg_mass`` (per key kind) and
  ``p_ext`` (with its chance level and enrichment);
- :mod:`~probe.attention.measures.residue`: ``ar_k``, the attentional residue (cosine or mass mode).

Every module of this package is imported by :func:`probe.attention.measure.measures`, so a new measure is one new
module here (and its test): see :mod:`probe.attention.measure` for what an entry holds. A module whose measure
derives from another imports that measure's module first, so the registry holds it before.
"""
