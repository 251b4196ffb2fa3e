"""One codec between the toolkit's frozen dataclasses and their plain form (a JSON object, a TOML table), every key
checked; arrays travel as :class:`Grid` fields (docs/architecture.md#how-one-trial-flows)."""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Union

from probe.errors import FieldError, ProbeError

if TYPE_CHECKING:
    import numpy as np

KEY = "key"
OMIT = "omit"
ALL_WHEN_NONE = "all_when_none"
DECODE = "decode"


class CodecError(ProbeError):
    """A plain value that does not fit its type: ``where`` is its place, ``problem`` what is wrong (the reader of a
    file re-raises it as that file's error, naming the file)."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)
        self.where = where
        self.problem = problem


@dataclass(frozen=True, eq=False)
class Grid:
    """A float32 array held by a result, written beside the plain form (see docs/architecture.md#how-one-trial-flows).

    Attributes:
        values: the array, stored as float32 (what ``attention_summary.npz`` holds).

    Two grids are equal when their shapes and values are (NaN equal to NaN).
    """

    values: np.ndarray

    def __post_init__(self) -> None:
        import numpy as np

        object.__setattr__(self, "values", np.asarray(self.values, dtype=np.float32))

    def __eq__(self, other: object) -> bool:
        import numpy as np

        if not isinstance(other, Grid):
            return NotImplemented
        return self.values.shape == other.values.shape and bool(
            np.array_equal(self.values, other.values, equal_nan=True))

    __hash__ = None  # type: ignore[assignment]  # equal by value, and the values are mutable

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)


def _place(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def encode(x: Any, arrays: "dict[str, np.ndarray] | None" = None, where: str = "") -> Any:
    """The plain form of ``x`` (docs/architecture.md#how-one-trial-flows); Grids go into ``arrays`` under their place."""
    # numpy is looked up, not imported: a value can only be a numpy type once numpy is loaded, and the experiment
    # and interventions files are written without it
    np = sys.modules.get("numpy")
    if isinstance(x, Grid):
        assert arrays is not None and where not in arrays, where
        arrays[where] = x.values
        return where
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(x):
            value = getattr(x, f.name)
            if f.metadata.get(ALL_WHEN_NONE) and value is None:
                out[f.metadata.get(KEY, f.name)] = "all"
            elif f.metadata.get(OMIT) and (value is None or value == ()):
                continue
            elif not (isinstance(value, Grid) and arrays is None):
                out[f.metadata.get(KEY, f.name)] = encode(value, arrays, _place(where, f.name))
        return out
    if isinstance(x, dict):
        return {str(k): encode(v, arrays, _place(where, str(k))) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(x)]
    if np is not None and isinstance(x, np.ndarray):
        return [encode(v) for v in x.tolist()]
    if isinstance(x, bool) or (np is not None and isinstance(x, np.bool_)):
        return bool(x)
    if isinstance(x, int) or (np is not None and isinstance(x, np.integer)):
        return int(x)
    if isinstance(x, float) or (np is not None and isinstance(x, np.floating)):
        return float(x) if math.isfinite(float(x)) else None
    if x is None or isinstance(x, str):
        return x
    raise TypeError(f"{where}: {type(x).__name__} {x!r} has no plain form")


def type_name(tp: Any) -> str:
    """``tp`` as a reader would write it (``int``, ``str | tuple[int, ...] | LayerWindow``)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is not None or not hasattr(tp, "__name__"):  # tuple[int, ...], Literal['a']
        return str(tp).replace("typing.", "")
    return str(tp.__name__)


def _shape(tp: Any) -> type | None:
    """The plain type a value of ``tp`` takes: dict for a dataclass or a dict, list for a tuple, else None."""
    if typing.get_origin(tp) is dict or (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return dict
    return list if typing.get_origin(tp) is tuple else None


def _scalar(tp: type, data: Any) -> bool:
    return isinstance(data, tp) and not (tp is not bool and isinstance(data, bool))


def decode(tp: Any, data: Any, where: str = "", arrays: Mapping[str, np.ndarray] | None = None) -> Any:
    """A value of type ``tp`` from its plain form ``data``, every key and value checked (docs/architecture.md#how-one-trial-flows).

    Raises:
        CodecError: a key that is unknown or missing, a value of the wrong type, or an array ``arrays`` lacks.
    """
    arrays = arrays or {}
    if tp is Any or tp is object:
        return data
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _decode_union(tp, data, where, arrays)
    if origin is Literal:
        if data not in typing.get_args(tp):
            raise CodecError(where, f"{data!r} is not one of {', '.join(map(repr, typing.get_args(tp)))}")
        return data
    if origin is tuple:
        if not isinstance(data, list):
            raise CodecError(where, f"expected a list, got {data!r}")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],) * len(data)
        elif len(args) != len(data):
            raise CodecError(where, f"expected a list of {len(args)}, got {data!r}")
        return tuple(decode(a, v, f"{where}[{i}]", arrays) for i, (a, v) in enumerate(zip(args, data)))
    if origin is dict:
        if not isinstance(data, dict):
            raise CodecError(where, f"expected a table, got {data!r}")
        value_tp = typing.get_args(tp)[1]
        return {k: decode(value_tp, v, _place(where, k), arrays) for k, v in data.items()}
    if tp is Grid:
        if not isinstance(data, str):
            raise CodecError(where, f"expected the name of an array, got {data!r}")
        if data not in arrays:
            raise CodecError(where, f"names the array {data!r}, which the arrays file lacks")
        return Grid(arrays[data])
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, data, where, arrays)
    if tp is float and _scalar(int, data):
        return float(data)
    if tp in (int, float, str, bool):
        if not _scalar(tp, data):
            raise CodecError(where, f"expected {tp.__name__}, got {data!r}")
        return data
    raise TypeError(f"{where}: the codec cannot read type {type_name(tp)}")


def _decode_union(tp: Any, data: Any, where: str, arrays: Mapping[str, np.ndarray]) -> Any:
    """``data`` as one of the types of the union ``tp`` (None where the union holds it)."""
    options = [a for a in typing.get_args(tp) if a is not type(None)]
    if data is None:
        if len(options) < len(typing.get_args(tp)):
            return None
        raise CodecError(where, f"null where {type_name(tp)} is required")
    for a in options:  # several scalar types (int | float): the first that takes the value as it is
        if a in (int, float, str, bool) and _scalar(a, data):
            return data
    # the options that take data of this shape (a table, a list); when one does, its own error is the one to see
    shaped = [a for a in options if _shape(a) is type(data)] if isinstance(data, (dict, list)) else options
    if len(shaped) == 1:
        return decode(shaped[0], data, where, arrays)
    for a in shaped:
        try:
            return decode(a, data, where, arrays)
        except CodecError:
            continue
    raise CodecError(where, f"{data!r} is none of {type_name(tp)}")


def _decode_dataclass(cls: type, data: Any, where: str, arrays: Mapping[str, np.ndarray]) -> Any:
    if not isinstance(data, dict):
        raise CodecError(where, f"expected a table ({cls.__name__}), got {data!r}")
    hints = typing.get_type_hints(cls)
    by_key = {f.metadata.get(KEY, f.name): f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(by_key))
    if unknown:
        raise CodecError(where, f"unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(by_key))}")
    missing = [k for k, f in by_key.items() if k not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise CodecError(where, f"missing key(s) {', '.join(missing)}")
    values: dict[str, Any] = {}
    for key, f in by_key.items():
        if key not in data:
            continue
        v, sub = data[key], _place(where, key)
        custom: Callable[[Any, str, Mapping[str, np.ndarray]], Any] | None = f.metadata.get(DECODE)
        if custom is not None:
            values[f.name] = custom(v, sub, arrays)
        elif f.metadata.get(ALL_WHEN_NONE) and v == "all":
            values[f.name] = None
        else:
            values[f.name] = decode(hints[f.name], v, sub, arrays)
    try:
        return cls(**values)
    except FieldError as e:  # a value the type refuses: named by its place, as a nested one has no other name
        if not where:
            raise
        raise CodecError(_place(where, e.field), e.problem) from None


__all__ = ["ALL_WHEN_NONE", "CodecError", "DECODE", "Grid", "KEY", "OMIT", "decode", "encode", "type_name"]
