"""A finished (or interrupted) run folder read back: its config, prompts, trials and attention records
(docs/architecture.md#the-python-api)."""

from __future__ import annotations

import difflib
import logging
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probe.errors import ArgumentError, ProbeError, UnknownNameError
from probe.runfolder import RunFolder

if TYPE_CHECKING:
    import pandas as pd

    from probe.analysis.results import Analysis
    from probe.attention.result import SegmentAttention
    from probe.config import ExperimentConfig
    from probe.loading import ModelCard
    from probe.records import TrialRecord
    from probe.types import Prompt

log = logging.getLogger(__name__)


class RunNotFoundError(ProbeError):
    """A path is not a run folder (it has no ``config.toml``)."""


class UnknownPromptError(ProbeError):
    """A prompt id that the run's ``prompts.jsonl`` does not hold (the message suggests close ids)."""


class Run:
    """The records of one run folder (see docs/architecture.md#the-python-api).

    Args:
        root: the run folder (``outputs/<name>``) or a :class:`RunFolder`.

    Raises:
        RunNotFoundError: the folder has no ``config.toml`` (it is not a run folder).
    """

    def __init__(self, root: str | Path | RunFolder) -> None:
        self.folder = root if isinstance(root, RunFolder) else RunFolder(root)
        if not self.folder.config.is_file():
            raise RunNotFoundError(f"{self.folder.root}: not a run folder (no {self.folder.config.name}); give the "
                                   "folder `probe run` wrote, outputs/<experiment name>")

    def __repr__(self) -> str:
        return f"Run({str(self.folder.root)!r})"

    @property
    def path(self) -> Path:
        """The run folder."""
        return self.folder.root

    @cached_property
    def config(self) -> ExperimentConfig:
        """The resolved experiment the run was made with (``config.toml``)."""
        from probe.config import load_config

        return load_config(self.folder.config)

    @cached_property
    def models(self) -> tuple[str, ...]:
        """The model names of the run's records (card names), in the experiment's order.

        They come from ``manifest.json``; before any model has run, from the experiment's ``models`` resolved to
        their cards (an entry may be a card name or a path to a card TOML).
        """
        if self.manifest is not None and isinstance(self.manifest.get("models"), dict):
            return tuple(self.manifest["models"])
        return tuple(c.name for c in self.cards.values())

    @cached_property
    def cards(self) -> dict[str, ModelCard]:
        """The experiment's model cards by card name (read from ``models/`` or the paths the experiment gives).

        Raises:
            UnknownNameError: a card of the experiment is not found here.
        """
        from probe.loading import get_card

        cards = [get_card(m) for m in self.config.experiment.models]
        return {c.name: c for c in cards}

    def card(self, model: str) -> ModelCard:
        """The card of one of the run's models.

        Raises:
            UnknownNameError: not a model of the run.
        """
        if model not in self.cards:
            raise UnknownNameError(f"model of run {self.path}", model, list(self.cards))
        return self.cards[model]

    def is_local(self, model: str) -> bool:
        """Whether the run ran ``model`` from local weights (so it has attention records and can be recomputed)."""
        entry = (self.manifest or {}).get("models", {}).get(model)
        if isinstance(entry, dict) and "backend" in entry:
            return bool(entry["backend"] == "transformers")
        from probe.backends import capabilities

        return capabilities(self.card(model)).local

    @cached_property
    def manifest(self) -> dict[str, Any] | None:
        """``manifest.json`` (toolkit commit, package versions, model revisions), or None before any model ran."""
        return self.folder.read_manifest()

    @cached_property
    def prompts(self) -> dict[str, Prompt]:
        """Every built prompt by prompt id, in file order (empty before the prompts are built)."""
        from probe.records import load_prompts

        return {p.prompt_id: p for p in load_prompts(self.folder.prompts)}

    def prompt(self, prompt_id: str) -> Prompt:
        """One prompt by id.

        Raises:
            UnknownPromptError: no such prompt in ``prompts.jsonl`` (close ids suggested). ArgumentError: not a str.
        """
        if not isinstance(prompt_id, str):
            raise ArgumentError(f"prompt_id: a prompt id as in {self.folder.prompts.name} (e.g. "
                                f"{next(iter(self.prompts), 't0|Control|L0|r0')!r}), got {prompt_id!r}")
        if prompt_id in self.prompts:
            return self.prompts[prompt_id]
        close = difflib.get_close_matches(prompt_id, list(self.prompts), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownPromptError(f"{self.folder.prompts} holds no prompt {prompt_id!r} ({len(self.prompts)} prompts)"
                               f"{hint}")

    @cached_property
    def trials(self) -> list[TrialRecord]:
        """Every trial record of ``trials.jsonl`` (one per trial id; a later successful retry replaces a backend
        error)."""
        from probe.records import load_trials

        return load_trials(self.folder.trials)

    def trials_of(self, prompt_id: str) -> list[TrialRecord]:
        """The trials of one prompt (one per model that ran it)."""
        return [t for t in self.trials if t.prompt_id == prompt_id]

    def trials_frame(self) -> pd.DataFrame:
        """The trials as a pandas DataFrame, one row per trial (the fields of ``TrialRecord``)."""
        import pandas as pd

        return pd.DataFrame([t.to_dict() for t in self.trials])

    def attention_path(self, prompt_id: str, model: str | None = None) -> Path:
        """Where the probe record of (model, prompt id) is, whether or not it exists."""
        return self.folder.attention_record(self.local_model(model), prompt_id)

    def has_attention(self, prompt_id: str, model: str | None = None) -> bool:
        """Whether the run holds a probe record for (model, prompt id)."""
        return self.attention_path(prompt_id, model).is_file()

    def attention(self, prompt_id: str, model: str | None = None) -> SegmentAttention:
        """The probe record of one prompt.

        Args:
            prompt_id: the prompt's id (as in ``prompts.jsonl`` and ``trials.jsonl``).
            model: the model card; may be left out when the run has one local model.

        Raises:
            UnknownNameError: an unknown model. UnknownPromptError: an unknown prompt id.
            ProbeError: the run holds no record for it (probing off, or the run stopped before it).
            AttentionRecordError: the record does not match its prompt, its model's layers and heads, or the sha256
                it was written with.
        """
        from probe.analysis.frame import probe_records

        path = self.attention_path(prompt_id, model)
        if not path.is_file():
            if prompt_id not in self.prompts:
                self.prompt(prompt_id)  # raises, suggesting close ids
            why = ("the run was made with [probe] enabled = false (turn it on and run again to probe)"
                   if not self.config.probe.enabled else
                   "the run has not probed it (stopped before it, or the trial was skipped or failed; run the same "
                   "experiment again to finish it)")
            raise ProbeError(f"{path}: no attention record for prompt {prompt_id!r}: {why}")
        model = self.local_model(model)
        return next(sa for _, sa in probe_records(self.folder, [(model, prompt_id)], self.prompts))

    def local_model(self, model: str | None = None) -> str:
        """``model`` checked against the run's models, or the run's one local model when None.

        Raises:
            UnknownNameError: ``model`` is not a model of the run. ProbeError: None, and the run has several local
                models (or none).
        """
        if model is not None:
            if model not in self.models:
                raise UnknownNameError(f"model of run {self.path}", model, list(self.models))
            return model
        local = [m for m in self.models if self.is_local(m)]
        if len(local) != 1:
            raise ProbeError(f"run {self.path} has {len(local)} local models ({', '.join(local)}); name one with "
                             "model=...")
        return local[0]

    def analysis(self) -> "Analysis":
        """The run's analysis as ``probe analyze`` wrote it (:func:`probe.analysis.results.read_analysis`).

        Raises:
            ProbeError: the run has not been analysed yet, or its analysis is older than its trials.
        """
        from probe.analysis.results import read_analysis

        if not self.folder.analysis.is_file():
            raise ProbeError(f"{self.folder.analysis}: the run has not been analysed; run `probe analyze "
                             f"{self.path}` or probe.analyze(run)")
        return read_analysis(self.folder)


def load_run(path: str | Path | RunFolder | Run) -> Run:
    """A run folder's records (see :class:`Run`); a :class:`Run` is returned as it is.

    Raises:
        RunNotFoundError: ``path`` is not a run folder. ArgumentError: ``path`` is neither a path nor a Run.
    """
    if isinstance(path, Run):
        return path
    if not isinstance(path, (str, Path, RunFolder)):
        raise ArgumentError(f"load_run: path must be a run folder (a path, e.g. 'outputs/demo') or a Run, got "
                            f"{type(path).__module__}.{type(path).__qualname__}")
    return Run(path)


__all__ = ["Run", "RunNotFoundError", "UnknownPromptError", "load_run"]
