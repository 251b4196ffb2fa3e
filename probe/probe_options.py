"""What the attention probe computes: :class:`ProbeOptions`, the engine's own options type.

The engine (:mod:`probe.attention`), the backends and the Python API take a ProbeOptions; an experiment's
``[probe]`` table is :class:`probe.config.ProbeSection`, these options and ``enabled`` (whether a run probes at
all). Definitions of each measure: docs/probes.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from probe.errors import ConfigError

QUERY_SETS = ("question", "last", "generated")


@dataclass(frozen=True)
class ProbeOptions:
    """The probe's options (docs/probes.md).

    Attributes:
        query: the query set: ``question``, ``last``, ``generated`` or ``segment:<i>``.
        gamma: the AR_k threshold γ, in (0, 1).
        residue: compute AR_k (the rows of every germane, question and earlier extraneous token).
        residue_mode: ``cosine`` or ``mass``.
        exclude_sink: leave the first token (the attention sink) out of every share.
        block_size: query rows computed at a time for AR_k.
        answer: capture the attention of every generated token.
    """

    query: str = "question"
    gamma: float = 0.5
    residue: bool = True
    residue_mode: str = "cosine"
    exclude_sink: bool = True
    block_size: int = 256
    answer: bool = False

    def __post_init__(self) -> None:
        if self.query not in QUERY_SETS and not (
            self.query.startswith("segment:") and self.query.split(":", 1)[1].isdigit()
        ):
            raise ConfigError(f"probe.query: {self.query!r}; use question, last, generated or segment:<i>")
        if not 0 < self.gamma < 1:
            raise ConfigError(f"probe.gamma: {self.gamma} must lie in (0, 1)")
        if self.residue_mode not in ("cosine", "mass"):
            raise ConfigError(f"probe.residue_mode: {self.residue_mode!r} is not 'cosine' or 'mass'")
        if self.answer and self.query == "generated":
            raise ConfigError("probe.answer = true with probe.query = 'generated': the answer capture already holds "
                              "the attention of every generated token (their mean is the generated query set); use "
                              "query 'question' or 'last' with answer = true, or answer = false")


__all__ = ["ProbeOptions", "QUERY_SETS"]
