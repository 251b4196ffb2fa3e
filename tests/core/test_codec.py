"""The one codec of the experiment TOML, interventions.json and analysis.json (probe/codec.py): what it writes reads
back equal, and what does not fit its type is refused at its place."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np
import pytest

from probe.codec import ALL_WHEN_NONE, KEY, OMIT, CodecError, Grid, decode, encode
from probe.errors import FieldError


@dataclass(frozen=True)
class Window:
    size: int
    stride: int = 1

    def __post_init__(self) -> None:
        if self.size < 1:
            raise FieldError("Window", "size", f"{self.size} must be >= 1")


@dataclass(frozen=True)
class Thing:
    name: str
    source: str = field(default="", metadata={KEY: "from"})
    layers: str | tuple[int, ...] | Window = "all"
    heads: tuple[tuple[int, int], ...] | None = field(default=None, metadata={ALL_WHEN_NONE: True})
    ratio: float | None = None
    extra: tuple[Window, ...] = field(default=(), metadata={OMIT: True})
    curve: Grid | None = field(default=None, metadata={OMIT: True})


def _round_trip(x: Thing) -> Thing:
    arrays: dict[str, np.ndarray] = {}
    plain = json.loads(json.dumps(encode(x, arrays), allow_nan=False))
    back: Thing = decode(Thing, plain, arrays=arrays)
    return back


@pytest.mark.parametrize("thing", [
    Thing("a"),
    Thing("b", source="run", layers=(0, 2), heads=((0, 1), (2, 3)), ratio=2),
    Thing("c", layers=Window(3, 2), extra=(Window(1),), curve=Grid(np.array([[0.5, np.nan]]))),
])
def test_what_is_written_reads_back_equal(thing: Thing) -> None:
    assert _round_trip(thing) == thing


def test_keys_renames_omissions_and_arrays_in_the_plain_form() -> None:
    arrays: dict[str, np.ndarray] = {}
    plain = encode(Thing("c", source="r", ratio=float("nan"), curve=Grid(np.ones(2))), arrays, "top")
    assert plain == {"name": "c", "from": "r", "layers": "all", "heads": "all", "ratio": None, "curve": "top.curve"}
    assert set(arrays) == {"top.curve"} and arrays["top.curve"].dtype == np.float32
    assert "curve" not in encode(Thing("c", curve=Grid(np.ones(2))))  # no arrays sink (a CSV row): left out
    assert encode(np.int64(3)) == 3 and encode(np.float32(0.5)) == 0.5 and encode(np.bool_(True)) is True


@pytest.mark.parametrize("plain, where, problem", [
    ({"name": "a", "colour": 1}, "", "unknown key(s) colour; valid keys: curve, extra, from, heads, layers, name, "
                                     "ratio"),
    ({"source": "x"}, "", "unknown key(s) source"),
    ({}, "", "missing key(s) name"),
    ({"name": 3}, "name", "expected str, got 3"),
    ({"name": "a", "ratio": True}, "ratio", "expected float, got True"),  # a bool is no number here
    ({"name": "a", "heads": [[0, 1], [2]]}, "heads[1]", "expected a list of 2, got [2]"),
    ({"name": "a", "layers": [0, "1"]}, "layers[1]", "expected int, got '1'"),  # the list's own error, not "none of"
    ({"name": "a", "layers": {"size": 2, "step": 1}}, "layers", "unknown key(s) step"),
    ({"name": "a", "layers": {"size": 0}}, "layers.size", "0 must be >= 1"),  # the type's own check, at its place
    ({"name": "a", "layers": 5}, "layers", "5 is none of str | tuple[int, ...] | Window"),
    ({"name": "a", "curve": "c"}, "curve", "names the array 'c', which the arrays file lacks"),
])
def test_what_does_not_fit_is_refused_at_its_place(plain: dict, where: str, problem: str) -> None:
    with pytest.raises(CodecError) as e:
        decode(Thing, plain)
    assert e.value.where == where and e.value.problem.startswith(problem), e.value


def test_an_int_is_read_where_a_float_is_declared() -> None:
    value = decode(Thing, {"name": "a", "ratio": 2})
    assert value.ratio == 2.0 and isinstance(value.ratio, float)


def test_the_experiment_and_interventions_files_are_written_without_numpy() -> None:
    code = ("import sys\nfrom probe.codec import encode\nfrom probe.config import load_config\n"
            "encode(load_config('demo'))\nprint('numpy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
