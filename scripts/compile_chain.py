"""Does ``torch.compile`` win back the probe's elementwise chain? One layer's chain at T = 8192 (SmolLM2-135M's
heads: 9 query, 3 key-value, width 64; 256 query rows; 21 segments): QKᵀ, softmax, the segment masses P·S, the
column sums and A·V, eager against ``torch.compile(dynamic=True)`` of the same function, 8 blocks, fastest of 5,
2 threads (docs/performance.md#where-the-time-goes).

    python scripts/compile_chain.py
"""

from __future__ import annotations

import time
from typing import Callable

import torch

HEADS, KV_HEADS, WIDTH, KEYS, ROWS, SEGMENTS = 9, 3, 64, 8192, 256, 21
Chain = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]


def chain(q: torch.Tensor, key_t: torch.Tensor, value: torch.Tensor, segments: torch.Tensor
          ) -> tuple[torch.Tensor, ...]:
    """The block engine's work on one block of rows: scores, softmax, masses, column sums, the layer's output."""
    probs = torch.softmax(torch.bmm(q, key_t), -1)
    return probs @ segments, probs.sum(1), torch.bmm(probs, value)


def timed(fn: Chain, args: tuple[torch.Tensor, ...], blocks: int = 8, rounds: int = 5) -> tuple[float, float]:
    """(seconds of the first call, fastest of ``rounds`` over ``blocks`` calls)."""
    t0 = time.perf_counter()
    fn(*args)
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(blocks):
            fn(*args)
        best = min(best, time.perf_counter() - t0)
    return first, best


def main() -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    q = torch.randn(KV_HEADS, (HEADS // KV_HEADS) * ROWS, WIDTH)
    key_t, value = torch.randn(KV_HEADS, WIDTH, KEYS), torch.randn(KV_HEADS, KEYS, WIDTH)
    segments = torch.zeros(KEYS, SEGMENTS)
    segments[torch.arange(KEYS), torch.randint(0, SEGMENTS, (KEYS,))] = 1
    args = (q, key_t, value, segments)
    compiled: Chain = torch.compile(chain, dynamic=True)
    for name, fn in (("eager", chain), ("compiled", compiled)):
        first, best = timed(fn, args)
        print(f"{name:<9} first call {first:6.2f} s   8 blocks, fastest of 5: {best:.3f} s")
    diff = max(float((a - b).abs().max()) for a, b in zip(chain(*args), compiled(*args)))
    print(f"largest difference between the two: {diff:.1e}")


if __name__ == "__main__":
    main()
