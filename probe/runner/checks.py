"""What a run checks before it writes anything: model cards and weights, probes and interventions against the
cards, the generation budget, the task files (:func:`check_inputs`)."""

from __future__ import annotations

from typing import Sequence

from probe.backends import capabilities, check_card, check_probe_supported
from probe.config import ExperimentConfig
from probe.errors import ConfigError
from probe.runner.resolve import resolve_interventions
from probe.loading import ModelCard, get_card, model_shape
from probe.prompts.builder import question_segment
from probe.runner.prompts import load_all_tasks, tokenizer_groups
from probe.types import Task


def check_generation_budget(cfg: ExperimentConfig, cards: Sequence[ModelCard]) -> None:
    """Refuse a ``generation.max_new_tokens`` that leaves no room for a prompt in a model's context window (every
    trial would be recorded as skipped).

    Raises:
        ConfigError: naming the field, the card and its context window.
    """
    n = cfg.generation.max_new_tokens
    for c in cards:
        if n >= c.context_window:
            raise ConfigError(
                f"generation.max_new_tokens: {n} leaves no room for a prompt in the context window of "
                f"{c.context_window} tokens of model {c.name!r} ({c.card_path or 'its card'}: context_window); every "
                f"trial would be skipped. Give a budget well below {c.context_window} (answers need tens of tokens)"
            )


def check_inputs(cfg: ExperimentConfig, generating: bool = True) -> tuple[list[ModelCard], list[Task]]:
    """Everything about an experiment that can be checked without loading a model or writing a file: the model
    cards and their weights, probes and interventions against the cards (the interventions' layers, heads, sweep
    windows and ``heads.from`` selection against each local model's configuration, where it can be read without
    loading the model: :func:`probe.loading.model_shape`), the generation budget against each context window (when
    ``generating``: ``probe build`` generates nothing), and every task file (the tasks are returned).

    Raises:
        ConfigError, ModelUnavailableError, TaskFormatError, DataUnavailableError: naming the file and field.
    """
    from probe.loading import check_weights_present

    cards = [get_card(m) for m in cfg.experiment.models]
    for c in cards:
        check_card(c)  # the backend is registered and the card holds what it needs
    tokenizer_groups(cfg)  # an experiment of served models alone has no tokenizer to count loads in
    for c in cards:
        check_weights_present(c)
        if cfg.probe.enabled:
            check_probe_supported(c)
            if c.probe_with is not None:  # a two-stage run: the local weights that probe the served answers
                check_weights_present(get_card(c.probe_with))
    check_interventions_supported(cfg, cards)
    tasks = load_all_tasks(cfg)
    questions = {question_segment(t.question).strip() for t in tasks}
    for c in cards if cfg.interventions else ():
        shape = model_shape(c)  # layers, heads and windows against the model's config, before any prompt is built
        if shape is not None:
            resolve_interventions(cfg, c.name, *shape, questions=questions)
    if generating:
        check_generation_budget(cfg, cards)
    return cards, tasks


def check_interventions_supported(cfg: ExperimentConfig, cards: Sequence[ModelCard]) -> None:
    """Refuse ``[[interventions]]`` on a served model (the runner applies them with local weights).

    Raises:
        ConfigError: naming the card and what to do.
    """
    if not cfg.interventions:
        return
    for c in cards:
        if not capabilities(c).local:
            raise ConfigError(f"{c.card_path or c.name}: model {c.name!r} is served; [[interventions]] run with local "
                              "weights (knockouts and steers edit attention inside the model). Run the interventions in an experiment of "
                              "local models (source = package | gguf | local | hub)")


__all__ = ["check_generation_budget", "check_inputs", "check_interventions_supported"]
