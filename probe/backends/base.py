"""The interface between the runner and whatever produces text for a prompt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Protocol

from probe.config import GenerationSection
from probe.probe_options import ProbeOptions
from probe.types import Prompt

if TYPE_CHECKING:
    from probe.interventions import Intervention
    from probe.attention.result import SegmentAttention
    from probe.interventions import KeyCount


@dataclass(frozen=True)
class Generation:
    """What a backend returns for one prompt.

    ``error`` set means the backend failed (API error, dropped connection): the trial is recorded as an error,
    not as a wrong answer, and is retried on the next run. ``skip_reason`` set means the prompt cannot be run
    on this model at all (longer than its context window) and is recorded as skipped.
    """

    text: str | None
    truncated: bool  # hit max_new_tokens without an end token (or finish_reason == "length")
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    skip_reason: str | None = None
    # generated token ids: a local backend's (for probe query "generated"), or a served engine's where it returns
    # them (asked for in a two-stage run; the end token may be included)
    output_ids: tuple[int, ...] | None = None
    attention: "SegmentAttention | None" = None  # local backends asked to probe: the prompt's attention aggregates
    # under an intervention: the key tokens edited and asked for (they differ when a matched-random draw found too
    # few tokens)
    intervention_keys: "KeyCount | None" = None


def build_messages(prompt: Prompt) -> list[dict[str, str]]:
    """The chat messages of a prompt: one user turn holding the built ICE text (instruction first)."""
    return [{"role": "user", "content": prompt.text}]


class Backend(Protocol):
    """Produces generations; ``generate`` may yield in any order but yields each prompt exactly once.

    What a backend can do beyond text it says itself, and the runner asks (never its class): ``can_probe`` (it
    computes the probe of each prompt while it generates: ``Generation.attention``; and probes answers written
    elsewhere, a two-stage run's stage two, with ``tokenize``, ``eos_ids``, ``tokenizer`` and ``probe_answers``:
    :class:`~probe.backends.local.LocalBackend`) and ``can_intervene`` (it generates under an attention
    intervention, and knows its model's layers and heads). A backend asked for what it cannot do raises
    :class:`~probe.errors.ConfigError`.
    """

    @property
    def model_name(self) -> str:
        """The model card's name (read-only: a backend may hold it as a plain attribute or derive it)."""
        ...

    @property
    def can_probe(self) -> bool: ...

    @property
    def can_intervene(self) -> bool: ...

    @property
    def revision(self) -> str | None:
        """The weights' revision for the run's manifest (None where the backend cannot know it: a served model)."""
        ...

    def layers_and_heads(self) -> tuple[int, int]:
        """(layers, attention heads) of the model (what an intervention is resolved against)."""
        ...

    def generate(self, prompts: list[Prompt], gen: GenerationSection, probe: ProbeOptions | None = None,
                 intervention: Intervention | None = None) -> Iterator[tuple[Prompt, Generation]]: ...
