"""ICE-Probe: how extraneous information degrades LLM reasoning, measured behaviourally and in attention.

The public API (:mod:`probe.api`), imported on first use so that ``import probe`` loads neither torch nor
transformers; every function and method is listed in docs/architecture.md#the-python-api."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "load_model": "probe.api",
    "load_tasks": "probe.api",
    "run": "probe.api",
    "analyze": "probe.api",
    "render_report": "probe.api",
    "load_run": "probe.api",
    "show": "probe.api",
    "Model": "probe.api",
    "ArgumentError": "probe.errors",
    "Intervention": "probe.interventions",
    "RowEdit": "probe.interventions",
    "Run": "probe.loaded_run",
    "ProbeError": "probe.errors",
}

if TYPE_CHECKING:  # what type checkers and editors see; at run time each name is imported on first use
    from probe.api import Model, analyze, load_model, load_run, load_tasks, render_report, run, show
    from probe.interventions import Intervention, RowEdit
    from probe.errors import ArgumentError, ProbeError
    from probe.loaded_run import Run


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'probe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = ["ArgumentError", "Intervention", "Model", "ProbeError", "RowEdit", "Run", "__version__", "analyze",
           "load_model", "load_run", "load_tasks", "render_report", "run", "show"]
