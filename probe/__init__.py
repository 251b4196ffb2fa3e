"""ICE-Probe: how extraneous information degrades LLM reasoning, measured behaviourally and in attention.

Data flows one way: task source -> ICE prompt builder -> model runner (generation, probes) -> records on disk
-> analysis -> report.

The public API (:mod:`probe.api`; each name is imported on first use, so ``import probe`` stays cheap and loads
neither torch nor transformers). Every call that uses a model takes it first; the model is a loaded :class:`Model`
(or a card name, loaded once per process), which also offers the stages as methods (``m.build_prompt``,
``m.tokenize``, ``m.probe``, ``m.generate``, ``m.intervention``, ``m.show``):

- ``load_model(card=None, device=None)`` — a model card's model and tokenizer as a ``Model`` (default:
  SmolLM2-135M-Instruct).
- ``load_tasks(source="synthetic", n=1, seed=1234, **options)`` — the tasks of one task source (or of a
  ``TaskSection``).
- ``build_prompt(model, task, condition, load, replication)`` / ``build_prompts(model, task, ...)`` — ICE prompts
  (text + segments) for a model's tokenizer.
- ``tokenize_prompt(model, prompt)`` — the model input with one exact token span per segment.
- ``probe_prompt(model, prompt, options=None, generated_ids=None, **option_values)`` — per-layer, per-head segment
  attention, P_ext, chance, enrichment, AR_k (docs/probes.md).
- ``generate(model, prompts, intervention=None, probe=None, **generation)`` — the answers a run would record.
- ``intervention(model, prompts, Intervention(...) | **fields)`` — a context manager under which the model's
  attention from answering positions to chosen segments (or any key mask, ``RowEdit``) is knocked out or steered.
- ``run(experiment, overrides=None, analyze=False, report=False)`` — an experiment end to end -> ``Run``.
- ``analyze(run)`` / ``render_report(run)`` — ``analysis.json`` / ``report.html`` of a run folder.
- ``load_run(path)`` — a run folder's config, prompts, trials and attention records (``Run``).
- ``show(run, prompt_id, model=None, layer=None, head=None)`` — one prompt's tokens shaded by attention, as an HTML
  page.

A call with the arguments in another order (a Task or Prompt where the model goes) raises ``ArgumentError`` (a
``TypeError`` and a ``ProbeError``) saying so.
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
    "generate": "probe.api",
    "Model": "probe.api",
    "ArgumentError": "probe.errors",
    "Intervention": "probe.interventions",
    "RowEdit": "probe.interventions",
    "Run": "probe.loaded_run",
    "ProbeError": "probe.errors",
}

if TYPE_CHECKING:  # what type checkers and editors see; at run time each name is imported on first use
    from probe.api import (Model, analyze, build_prompt, build_prompts, generate, intervention, load_model,
                           load_run, load_tasks, probe_prompt, render_report, run, show, tokenize_prompt)
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
           "build_prompt", "build_prompts", "generate", "intervention", "load_model", "load_run", "load_tasks",
           "probe_prompt", "render_report", "run", "show", "tokenize_prompt"]
