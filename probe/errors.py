"""Errors raised by the toolkit. Every one subclasses ProbeError and says what failed and what to do."""

from __future__ import annotations

import difflib


class ProbeError(Exception):
    """Base class of every toolkit error."""


class ArgumentError(ProbeError, TypeError):
    """A public function was given an argument of the wrong kind (the message names it and what to pass).

    A ``TypeError`` too, as Python raises for a call that does not fit a function's signature.
    """


class ConfigError(ProbeError):
    """An experiment or model card is malformed (names the file and field)."""


class FieldError(ConfigError):
    """A value that does not fit its field, raised by the type that checks it; ``field`` and ``problem`` let the
    reader that knows where the value came from (a TOML table, an entry of ``interventions.json``) name that place."""

    def __init__(self, where: str, field_name: str, problem: str) -> None:
        super().__init__(f"{where}.{field_name}: {problem}")
        self.field = field_name
        self.problem = problem


class TaskFormatError(ProbeError):
    """A task file has a bad line (``file:line: field: what is wrong``)."""


class SpanError(ProbeError):
    """Segment or token spans are empty, overlapping, out of order or do not cover the prompt."""


class HookError(ProbeError):
    """The probe engine could not attach to a model, or a layer did not report."""


class ModelUnavailableError(ProbeError):
    """A model's weights cannot be found or loaded here (offline hub id, missing package)."""


class UnknownNameError(ProbeError):
    """An unknown name (model, metric, condition...); the message suggests close matches."""

    def __init__(self, what: str, name: str, valid: list[str] | tuple[str, ...]) -> None:
        close = difflib.get_close_matches(str(name), [str(v) for v in valid], n=3)  # a non-str name too
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        super().__init__(f"unknown {what} {name!r}{hint} (valid: {', '.join(sorted(valid))})")
        self.name = name


class DataUnavailableError(ProbeError):
    """A data set cannot be found or read here (package not installed, file missing, no item fits the filter)."""
