"""Scoring: a generation + its task -> answer, EM and the rates of docs/method.md#scoring (and CogniLoad's progressive
match, docs/cogniload.md#scoring)."""

from __future__ import annotations

from probe.scoring.answers import Score

__all__ = ["Score"]
