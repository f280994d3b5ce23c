"""Benchmark of a counter-based normal generator's parts against ``tensor.normal_`` (not a test; issue 22's
feasibility record).

Issue 22 asks for keyed init values that are a function of (key, global element index) through a counter-based
generator, evaluated with ``torch.compile`` at most 1.2x ``normal_`` per element at 1 thread. This measures the
recipe the issue names, in plain torch integer ops compiled by inductor (static shapes, one 1M-element chunk):
Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) at the pair index
``i // 2`` of the elements, two 52-bit uniforms from its four 32-bit words (bit-cast into float64), and
Box-Muller in float64 rounded to float32 (``r cos t`` for one element of the pair, ``r sin t`` for the other).
Each part is timed alone and the whole in one kernel; then the first pass of a ziggurat on the same words (Marsaglia
& Tsang, "The ziggurat method for generating random variables", J. Stat. Softw. 5(8), 2000: 128 layers and a sign
bit, 64 bits per element; the pass that accepts the candidates inside their layer's rectangle and the +-2 sigma
bounds, leaving the rest to a later pass). Ratios are medians of back-to-back pairs with ``normal_`` on the same
number of float32 elements. Compile seconds are reported separately (the first call; inductor's cache may hold
the kernel already).

Usage: ``python benchmarks/bench_counter_rng.py [--reps 20] [--threads 1]`` from the repo root (needs a C++
compiler for inductor).
"""

import math
import time

import torch
from bench_init import median_ratio, timing_args
from machine_load import reported_load

N = 2**20
"""float32 elements per call (a chunk that bounds the temporaries)."""
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
MASK32 = 0xFFFFFFFF
EXPONENT_52 = 0x4330000000000000
"""The bits of the float64 2**52: OR-ing a 52-bit integer into its mantissa gives 2**52 + that integer exactly."""


def philox(c0, c1, c2, c3, k0: int, k1: int, rounds: int = 10):
    """Philox4x32 on int64 tensors holding 32-bit words: the four output words, each int64 in ``[0, 2**32)``."""
    for _ in range(rounds):
        p0, p1 = c0 * PHILOX_M[0], c2 * PHILOX_M[1]
        c0, c1, c2, c3 = ((p1 >> 32) & MASK32) ^ c1 ^ k0, p1 & MASK32, ((p0 >> 32) & MASK32) ^ c3 ^ k1, p0 & MASK32
        k0, k1 = (k0 + PHILOX_W[0]) & MASK32, (k1 + PHILOX_W[1]) & MASK32
    return c0, c1, c2, c3


def words(start: int, k0: int, k1: int):
    """Philox words of the ``N // 2`` element pairs from pair index ``start`` (attempt 0)."""
    pair = torch.arange(start, start + N // 2, dtype=torch.int64)
    zero = torch.zeros_like(pair)
    return philox(pair & MASK32, pair >> 32, zero, zero, k0, k1)


def uniform52(hi, lo):
    """A float64 uniform in (0, 1) from 52 bits of two words: ``(m + 0.5) / 2**52``."""
    m = ((hi & 0xFFFFF) << 32) | lo
    return ((m | EXPONENT_52).view(torch.float64) - 2.0**52 + 0.5) * 2.0**-52


def box_muller(u1, u2):
    """Two float32 normals per pair of float64 uniforms (Box-Muller in float64)."""
    r, t = torch.sqrt(-2.0 * torch.log(u1)), (2.0 * math.pi) * u2
    return (r * torch.cos(t)).float(), (r * torch.sin(t)).float()


ZIGGURAT_R, ZIGGURAT_V = 3.442619855899, 9.91256303526217e-3
"""The 128-layer ziggurat's rightmost layer edge and layer area for ``exp(-x^2 / 2)`` (Marsaglia & Tsang 2000)."""


def ziggurat_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, ratio)``: float64 ``(128,)`` layer widths (``x[0]`` the base strip's ``V / f(R)``) and ``x[i + 1] / x[i]``,
    the share of layer ``i`` inside the curve's rectangle (``x[128] = 0``)."""
    f = lambda x: math.exp(-0.5 * x * x)  # noqa: E731
    x = [ZIGGURAT_V / f(ZIGGURAT_R), ZIGGURAT_R]
    for i in range(1, 127):
        x.append(math.sqrt(-2.0 * math.log(ZIGGURAT_V / x[i] + f(x[i]))))
    x.append(0.0)
    return torch.tensor(x[:128], dtype=torch.float64), torch.tensor([x[i + 1] / x[i] for i in range(128)],
                                                                   dtype=torch.float64)


def ziggurat_element(hi, lo, widths, ratios, bound: float):
    """One element from two words: layer (7 bits), sign (1 bit), a 52-bit uniform; ``(float32 value, accepted)``."""
    layer = hi & 127
    u = uniform52(hi >> 12, lo)
    value = torch.where((hi >> 7) & 1 == 1, -u * widths[layer], u * widths[layer]).float()
    return value, (u < ratios[layer]) & (value.abs() <= bound)


def ziggurat_first_pass(start: int, k0: int, k1: int, widths, ratios):
    """Two elements per Philox call, each with its acceptance at +-2 sigma."""
    w0, w1, w2, w3 = words(start, k0, k1)
    return (*ziggurat_element(w0, w1, widths, ratios, 2.0), *ziggurat_element(w2, w3, widths, ratios, 2.0))


def words_only(start: int, k0: int, k1: int):
    """The words XOR-folded into one int32 per pair: the generator's cost without storing 16 bytes per pair."""
    w0, w1, w2, w3 = words(start, k0, k1)
    return (w0 ^ w1 ^ w2 ^ w3).to(torch.int32)


def uniforms_only(start: int, k0: int, k1: int):
    w0, w1, w2, w3 = words(start, k0, k1)
    return uniform52(w0, w1), uniform52(w2, w3)


def normals(start: int, k0: int, k1: int):
    w0, w1, w2, w3 = words(start, k0, k1)
    return box_muller(uniform52(w0, w1), uniform52(w2, w3))


def main() -> None:
    args = timing_args(__doc__, "bench_counter_rng.py", reps=20)
    x = torch.empty(N)
    base = lambda: x.normal_()  # noqa: E731
    u1, u2 = (torch.rand(N // 2, dtype=torch.float64).clamp_(min=2.0**-53) for _ in range(2))
    cases = [
        ("Philox4x32-10 (N/2 counters), folded", torch.compile(words_only, dynamic=False), (0, 1, 2)),
        ("+ two 52-bit float64 uniforms", torch.compile(uniforms_only, dynamic=False), (0, 1, 2)),
        ("Box-Muller in float64 alone", torch.compile(box_muller, dynamic=False), (u1, u2)),
        ("Philox + uniforms + Box-Muller", torch.compile(normals, dynamic=False), (0, 1, 2)),
        ("ziggurat first pass, +-2 sigma", torch.compile(ziggurat_first_pass, dynamic=False),
         (0, 1, 2, *ziggurat_tables())),
    ]
    print(f"{N:,} float32 elements per call, {args.threads} thread(s); ratios: medians over {args.reps} "
          "back-to-back pairs with normal_")
    print(f"{'part (compiled)':<38} {'compile s':>9} {'ms':>7} {'ns/elem':>8} {'x normal_':>10}")
    for label, fn, fn_args in cases:
        begin = time.perf_counter()
        fn(*fn_args)
        compile_s = time.perf_counter() - begin
        t, ratio = median_ratio(lambda: fn(*fn_args), base, args.reps)
        print(f"{label:<38} {compile_s:>9.1f} {t * 1e3:>7.2f} {t / N * 1e9:>8.2f} {ratio:>10.2f}")
    t, ratio = median_ratio(lambda: normals(0, 1, 2), base, max(1, args.reps // 5))
    print(f"{'the whole, eager':<38} {'':>9} {t * 1e3:>7.2f} {t / N * 1e9:>8.2f} {ratio:>10.2f}")
    _, accept_a, _, accept_b = ziggurat_first_pass(0, 1, 2, *ziggurat_tables())
    print(f"ziggurat: {1 - torch.cat([accept_a, accept_b]).float().mean():.4f} of the elements left to a later pass "
          "at +-2 sigma")
    a, b = torch.compile(normals, dynamic=False)(0, 1, 2)
    c, d = normals(0, 1, 2)
    print(f"compiled == eager bitwise: {torch.equal(a, c) and torch.equal(b, d)}; "
          f"mean {torch.cat([a, b]).mean():.4f}, std {torch.cat([a, b]).std():.4f}")


if __name__ == "__main__":
    with reported_load():
        main()
