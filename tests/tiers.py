"""The test tiers: what a test may do unless it is marked, and how ``make test-unit`` chooses its tests.

A test marked ``integration``, ``slow``, ``served`` or ``gpu`` may load a model; every other test is in the unit
tier (``make test-unit``, which runs ``pytest -m`` :data:`UNIT_MARKS`) and may not: while it runs (its fixtures
included), loading a model — any transformers ``from_pretrained`` of a model class, or
:func:`probe.loading.load_model` — fails the test, naming the mark to add. Building a tiny random-weight model from a
config in memory is not a load and stays allowed. A test marked ``gpu`` is skipped without CUDA, saying so.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import pytest

MODEL_MARKS: tuple[str, ...] = ("integration", "slow", "served", "gpu")
UNIT_MARKS = " and ".join(f"not {m}" for m in MODEL_MARKS)  # the marker expression of the unit tier


def in_unit_tier(item: pytest.Item) -> bool:
    """Whether ``item`` carries none of :data:`MODEL_MARKS` (so it may load no model)."""
    return not any(item.get_closest_marker(m) for m in MODEL_MARKS)


def _refuse(test: str, what: str) -> NoReturn:
    # pytest.fail raises a BaseException, so an `except Exception` in the code under test cannot swallow it
    pytest.fail(f"{test} loads a model ({what}) but carries none of the marks {', '.join(MODEL_MARKS)}: mark it "
                "@pytest.mark.integration (or slow / served / gpu) so the unit tier (`make test-unit`) leaves it out",
                pytrace=False)


@contextmanager
def no_model_loads(test: str) -> Iterator[None]:
    """While inside, a model load (transformers ``from_pretrained`` of a model, probe's ``load_model``) fails."""
    import transformers

    import probe.loading

    model_cls: Any = transformers.PreTrainedModel
    saved_from_pretrained = model_cls.__dict__["from_pretrained"]
    saved_load_model = probe.loading.load_model

    def from_pretrained(cls: type, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(test, f"{cls.__name__}.from_pretrained")

    def load_model(*args: Any, **kwargs: Any) -> NoReturn:
        _refuse(test, "probe.loading.load_model")

    model_cls.from_pretrained = classmethod(from_pretrained)
    probe.loading.load_model = load_model
    try:
        yield
    finally:
        model_cls.from_pretrained = saved_from_pretrained
        probe.loading.load_model = saved_load_model


def cuda_available() -> bool:
    """Whether torch sees a CUDA device."""
    import torch

    return bool(torch.cuda.is_available())
