"""The interface between the runner and whatever produces text for a prompt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Protocol, cast

from probe.config import GenerationSection
from probe.probe_options import ProbeOptions
from probe.errors import ConfigError
from probe.types import Prompt, TokenizedPrompt

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


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do besides writing text: one value per registered backend
    (:mod:`probe.backends.registry`), the same whether asked of a card before anything loads or of the backend.

    Attributes:
        local: it runs local weights: it has the model's tokenizer (prompts are built and loads counted in it), it
            probes attention while it generates and probes answers written elsewhere (it is a
            :class:`ProbingBackend`), and it generates under attention interventions.
        records_ids: a trial keeps the answer's token ids as the backend returned them (a served engine's: what
            stage two of a two-stage run checks its re-tokenisation against).
    """

    local: bool
    records_ids: bool = False


LOCAL = Capabilities(local=True)
SERVED = Capabilities(local=False, records_ids=True)


class Backend(Protocol):
    """Produces generations; ``generate`` may yield in any order but yields each prompt exactly once. What else it
    can do is its ``capabilities``; a backend asked for what it cannot do raises :class:`~probe.errors.ConfigError`.
    """

    @property
    def model_name(self) -> str:
        """The model card's name (read-only: a backend may hold it as a plain attribute or derive it)."""
        ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def revision(self) -> str | None:
        """The weights' revision for the run's manifest (None where the backend cannot know it: a served model)."""
        ...

    def layers_and_heads(self) -> tuple[int, int]:
        """(layers, attention heads) of the model (what an intervention is resolved against)."""
        ...

    def generate(self, prompts: list[Prompt], gen: GenerationSection, probe: ProbeOptions | None = None,
                 intervention: Intervention | None = None) -> Iterator[tuple[Prompt, Generation]]: ...


class ProbingBackend(Backend, Protocol):
    """A backend of local weights (``capabilities.local``): besides generating, it tokenizes as the run does and
    probes answers written elsewhere in one teacher-forced pass (stage two of a two-stage run)."""

    @property
    def tokenizer(self) -> Any: ...

    def eos_ids(self) -> set[int]: ...

    def tokenize(self, prompt: Prompt) -> TokenizedPrompt: ...

    def probe_answers(self, prompts: list[TokenizedPrompt], answers: list[list[int]], texts: list[str],
                      probe: ProbeOptions) -> list[SegmentAttention]: ...


def probing(backend: Backend) -> ProbingBackend:
    """``backend`` as a :class:`ProbingBackend`.

    Raises:
        ConfigError: the backend runs no local weights (a served model), naming it.
    """
    if not backend.capabilities.local:
        raise ConfigError(f"model {backend.model_name!r} is served: it has no local weights to probe with; name the "
                          "local card of the same weights in the served card's `probe_with`")
    return cast(ProbingBackend, backend)
