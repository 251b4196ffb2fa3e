"""ICE-Probe: how extraneous information degrades LLM reasoning, measured behaviourally and in attention.

Data flows one way: task source -> ICE prompt builder -> model runner (generation, probes) -> records on disk
-> analysis -> report.

The public API (:mod:`probe.api`; each name is imported on first use, so ``import probe`` stays cheap and loads
neither torch nor transformers):

- ``load_model(card=None, device=None)`` — a model card's model and tokenizer (default: SmolLM2-135M-Instruct).
- ``load_tasks(source="synthetic", n=1, seed=1234, **options)`` — the tasks of one task source.
- ``build_prompt(task, model, condition, load, replication)`` / ``build_prompts(task, model, ...)`` — ICE prompts
  (text + segments) for a model's tokenizer.
- ``tokenize_prompt(prompt, model)`` — the model input with one exact token span per segment.
- ``probe_prompt(model, prompt, options=None, **option_values)`` — per-layer, per-head segment attention, P_ext,
  chance, enrichment, AR_k (docs/probes.md).
- ``run(experiment, overrides=None, analyze=False, report=False)`` — an experiment end to end -> ``Run``.
- ``analyze(run)`` / ``render_report(run)`` — ``analysis.json`` / ``report.html`` of a run folder.
- ``load_run(path)`` — a run folder's config, prompts, trials and attention records (``Run``).
- ``show(run, prompt_id, layer=None, head=None)`` — one prompt's tokens shaded by attention, as an HTML page.
- ``intervention(model, prompts, Intervention(...) | **fields)`` — a context manager under which the model's
  attention from answering positions to chosen segments (or any key mask, ``RowEdit``) is knocked out or steered.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "load_model": "probe.api",
    "load_tasks": "probe.api",
    "build_prompt": "probe.api",
    "build_prompts": "probe.api",
    "tokenize_prompt": "probe.api",
    "probe_prompt": "probe.api",
    "run": "probe.api",
    "analyze": "probe.api",
    "render_report": "probe.api",
    "load_run": "probe.api",
    "show": "probe.api",
    "intervention": "probe.api",
    "Intervention": "probe.interventions",
    "RowEdit": "probe.interventions",
    "Run": "probe.loaded_run",
    "ProbeError": "probe.errors",
}

if TYPE_CHECKING:  # what type checkers and editors see; at run time each name is imported on first use
    from probe.api import (analyze, build_prompt, build_prompts, intervention, load_model, load_run, load_tasks,
                           probe_prompt, render_report, run, show, tokenize_prompt)
    from probe.interventions import Intervention, RowEdit
    from probe.errors import ProbeError
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


__all__ = ["Intervention", "ProbeError", "RowEdit", "Run", "__version__", "analyze", "build_prompt", "build_prompts",
           "intervention", "load_model", "load_run", "load_tasks", "probe_prompt", "render_report", "run", "show",
           "tokenize_prompt"]
