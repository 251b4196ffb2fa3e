"""Scoring: a generation + its task -> answer, EM and the rates of docs/method.md#scoring (and CogniLoad's progressive
match).

- :mod:`probe.scoring.answers` — ICE answers: extraction (``\\boxed{}``, ``Answer:``, last line), normalised exact
  match, hop recall, truncated / uninterpretable.
- :mod:`probe.scoring.cogniload` — CogniLoad's progressive exact match (docs/cogniload.md#scoring).
"""

from __future__ import annotations

from probe.scoring.answers import Score

__all__ = ["Score"]
