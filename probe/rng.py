"""Scalar random draws that give exactly what ``numpy.random.Generator`` gives, at a fraction of the cost per call.

The prompt builder draws names and sentences one scalar at a time (thousands of ``rng.integers(n)`` and
``rng.random()`` calls per distractor pool), and numpy's per-call overhead is most of its time. :func:`scalar_draws`
wraps a PCG64 ``Generator`` (what ``numpy.random.default_rng`` makes): it reads the bit generator's raw 64-bit
outputs in bulk and forms each draw as numpy's C code does —

- ``random()``: ``(next64 >> 11) / 2**53`` (``next_double``);
- ``integers(low, high)``: ``low`` + Lemire's bounded draw on 32-bit outputs (``buffered_bounded_lemire_uint32``,
  used for ranges below 2**32), where a 32-bit output is the low half of a 64-bit one and the high half is kept
  for the next 32-bit request (PCG64's ``has_uint32`` buffer);

and when the block ends it leaves the generator exactly where the same calls on the generator itself would have
left it (state advanced by the 64-bit outputs used, the 32-bit buffer set). The tests hold it to numpy call for
call. Another bit generator is passed through untouched.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Protocol

import numpy as np


class ScalarRng(Protocol):
    """What the name and sentence generators draw from: a ``numpy.random.Generator`` or :class:`ScalarDraws`."""

    def integers(self, low: int, high: int | None = None) -> int: ...

    def random(self) -> float: ...


_TWO_53 = 1.0 / 9007199254740992.0
_MASK32 = 0xFFFFFFFF


class ScalarDraws:
    """numpy-exact scalar ``integers`` and ``random`` from a PCG64 generator's raw outputs (see the module docstring).

    Use through :func:`scalar_draws`, which puts the generator's state right afterwards.

    Args:
        rng: a ``numpy.random.Generator`` over ``PCG64``.
        chunk: raw outputs read at a time.
    """

    def __init__(self, rng: np.random.Generator, chunk: int = 1024) -> None:
        bg = rng.bit_generator
        if not isinstance(bg, np.random.PCG64):
            raise TypeError(f"ScalarDraws emulates PCG64 only, got {type(bg).__name__}; use scalar_draws(rng)")
        self._bg: np.random.PCG64 = bg
        self._start = self._bg.state
        self._has32 = int(self._start["has_uint32"])
        self._u32 = int(self._start["uinteger"])
        self._chunk = chunk
        self._raw: list[int] = []
        self._pos = 0
        self._used = 0  # 64-bit outputs consumed

    def _next64(self) -> int:
        if self._pos == len(self._raw):
            self._raw = self._bg.random_raw(self._chunk).tolist()
            self._pos = 0
        v = self._raw[self._pos]
        self._pos += 1
        self._used += 1
        return v

    def _next32(self) -> int:
        if self._has32:
            self._has32 = 0
            return self._u32
        v = self._next64()
        self._has32, self._u32 = 1, v >> 32
        return v & _MASK32

    def random(self) -> float:
        """A float in [0, 1), as ``Generator.random()``."""
        return (self._next64() >> 11) * _TWO_53

    def integers(self, low: int, high: int | None = None) -> int:
        """An int in [low, high) (or [0, low) with one argument), as ``Generator.integers``.

        Raises:
            ValueError: an empty range.
            NotImplementedError: a range of 2**32 values or more (numpy draws those from 64-bit outputs; the
                builder never asks for one).
        """
        if high is None:
            low, high = 0, low
        span = high - low - 1  # numpy's inclusive range
        if span < 0:
            raise ValueError(f"integers: empty range [{low}, {high})")
        if span == 0:
            return low
        if span > _MASK32:
            raise NotImplementedError("integers: ranges of 2**32 values or more are not emulated")
        if span == _MASK32:
            return low + self._next32()
        excl = span + 1
        m = self._next32() * excl
        leftover = m & _MASK32
        if leftover < excl:
            threshold = (_MASK32 - span) % excl
            while leftover < threshold:
                m = self._next32() * excl
                leftover = m & _MASK32
        return low + (m >> 32)

    def sync(self) -> None:
        """Put the generator where the same draws on it would have left it."""
        self._bg.state = self._start
        self._bg.advance(self._used)  # also clears the 32-bit buffer, set below
        self._bg.state = {**self._bg.state, "has_uint32": self._has32, "uinteger": self._u32}


@contextmanager
def scalar_draws(rng: np.random.Generator) -> Iterator[ScalarRng]:
    """Fast numpy-exact scalar draws from ``rng`` for the duration of the block (``rng`` itself for a bit generator
    other than PCG64); afterwards ``rng`` is in the state the same draws on it would have left.

    Do not draw from ``rng`` directly inside the block.
    """
    if type(rng.bit_generator) is not np.random.PCG64:
        yield rng
        return
    draws = ScalarDraws(rng)
    try:
        yield draws
    finally:
        draws.sync()
