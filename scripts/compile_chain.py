"""Does ``torch.compile`` win back the probe's elementwise chain? One layer's chain at T = 8192 (SmolLM2-135M's
heads: 9 query, 3 key-value, width 64; 256 query rows; 21 segments): QKᵀ, softmax, the segment masses P·S, the
column sums and A·V, eager against ``torch.compile(dynamic=True)`` of the same function, 8 blocks, fastest of 5,
2 threads (docs/performance.md#where-the-time-goes)."""

import time, torch
torch.set_num_threads(2)
H, Hkv, D, T, B, S = 9, 3, 64, 8192, 256, 21
torch.manual_seed(0)
q = torch.randn(Hkv, (H//Hkv)*B, D); kt = torch.randn(Hkv, D, T); v = torch.randn(Hkv, T, D)
seg = torch.zeros(T, S); seg[torch.arange(T), torch.randint(0, S, (T,))] = 1
def chain(q, kt, v, seg):
    s = torch.bmm(q, kt)
    p = torch.softmax(s, -1)
    mass = p @ seg
    col = p.sum(1)
    o = torch.bmm(p, v)
    return mass, col, o
comp = torch.compile(chain, dynamic=True)
for f, name in ((chain, "eager"), (comp, "compiled")):
    t0 = time.perf_counter(); f(q, kt, v, seg); print(name, "first", round(time.perf_counter()-t0, 2))
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(8): f(q, kt, v, seg)
        best = min(best, time.perf_counter()-t0)
    print(name, round(best, 3))
a = chain(q, kt, v, seg); b = comp(q, kt, v, seg)
print([float((x-y).abs().max()) for x, y in zip(a, b)])
