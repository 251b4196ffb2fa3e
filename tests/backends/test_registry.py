"""Backends by name (probe/backends/registry.py): a backend of one's own is one class, one registration and its
card; the runner, the checks and ``probe models`` ask its capabilities, never its class or the card's kind."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from probe.backends import BackendEntry, Capabilities, Generation, capabilities, check_card, register_backend
from probe.backends.registry import BACKENDS
from probe.config import load_config
from probe.errors import ConfigError
from probe.loading import get_card
from probe.records import load_trials
from probe.runner import run_experiment
from tests.fixtures.experiment import tiny_experiment

TOY = Capabilities(local=False)


@dataclass
class ToyBackend:
    """Answers every prompt with the same boxed text, and records what it was asked."""

    model_name: str
    calls: list[list[str]] = field(default_factory=list)
    capabilities: Capabilities = TOY
    revision: str | None = None

    def layers_and_heads(self) -> tuple[int, int]:
        raise ConfigError("a toy has no layers")

    def generate(self, prompts: list, gen: Any, probe: Any = None, intervention: Any = None
                 ) -> Iterator[tuple[Any, Generation]]:
        self.calls.append([p.prompt_id for p in prompts])
        for p in prompts:
            yield p, Generation(text="\\boxed{Mirhei}", truncated=False, prompt_tokens=1, completion_tokens=4)


@pytest.fixture
def toy() -> Iterator[list[ToyBackend]]:
    made: list[ToyBackend] = []

    def make(card: Any, device: str | None, seed: int) -> ToyBackend:
        made.append(ToyBackend(card.name))
        return made[-1]

    register_backend(BackendEntry("toy", TOY, make, lambda card: [] if card.served_model else ["toy needs "
                                                                                               "`served_model`"]))
    yield made
    BACKENDS.unregister("toy")


@pytest.mark.integration
def test_a_registered_backend_runs_an_experiment_end_to_end(toy, tmp_path: Path, tiny_card: Path) -> None:
    card = tmp_path / "toy.toml"
    card.write_text('name = "toy-model"\nsource = "api"\nbackend = "toy"\nserved_model = "t"\n')
    exp = tiny_experiment(tmp_path / "exp.toml", [tiny_card, card], experiment={"name": "toy"},
                          generation={"max_new_tokens": 4})
    run_dir = run_experiment(load_config(exp), progress=False, device="cpu")
    trials = [t for t in load_trials(run_dir / "trials.jsonl") if t.model == "toy-model"]
    (backend,) = toy
    asked = [pid for call in backend.calls for pid in call]
    assert trials and sorted(asked) == sorted({t.prompt_id for t in trials})  # each prompt once
    assert all(t.output == "\\boxed{Mirhei}" and t.answer == "Mirhei" for t in trials)
    assert capabilities(get_card(str(card))) == TOY


def test_a_card_is_held_to_its_backend(toy, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "toy-bad"\nsource = "api"\nbackend = "toy"\n')
    with pytest.raises(ConfigError, match="toy needs `served_model`"):
        check_card(get_card(str(bad)))
    typo = tmp_path / "typo.toml"
    typo.write_text('name = "typo"\nsource = "api"\nbackend = "tyo"\nserved_model = "t"\n')
    with pytest.raises(ConfigError, match=r"typo\.toml: backend: unknown backend 'tyo'; did you mean 'toy'"):
        check_card(get_card(str(typo)))
