"""Benchmark of a counter-based normal generator's parts against ``tensor.normal_`` (not a test;
issue 22's feasibility record).

Issue 22 asks for keyed init values that are a function of (key, global element index) through a
counter-based generator, evaluated with ``torch.compile`` at most 1.2x ``normal_`` per element at 1
thread. This measures the recipe the issue names, in plain torch integer ops compiled by inductor
(static shapes, one 1M-element chunk): Philox4x32-10 (Salmon et al., "Parallel random numbers: as
easy as 1, 2, 3", SC 2011) at the pair index ``i // 2`` of the elements, two 52-bit uniforms from
its four 32-bit words (bit-cast into float64), and Box-Muller in float64 rounded to float32
(``r cos t`` for one element of the pair, ``r sin t`` for the other). Each part is timed alone and
the whole in one kernel; then the first pass of a ziggurat on the same words (Marsaglia & Tsang,
"The ziggurat method for generating random variables", J. Stat. Softw. 5(8), 2000: 128 layers and a
sign bit, 64 bits per element; the pass that accepts the candidates inside their layer's rectangle
and the +-2 sigma bounds, leaving the rest to a later pass). Last, the same Philox words and
ziggurat first pass as a C++ loop (``torch.utils.cpp_extension.load_inline``, ``-O3 -march=native``,
vectorized by the compiler with 256-bit and with 512-bit vectors where the CPU has them), the kind
of kernel torch ops cannot express, checked equal to the torch version. Ratios are medians of
back-to-back pairs with ``normal_`` on the same number of float32 elements, 1 thread for the C++
loop. Compile seconds are reported separately (the first call; inductor's cache may hold the kernel
already).

Usage: ``python benchmarks/bench_counter_rng.py [--reps 20] [--threads 1]`` from the repo root
(needs a C++ compiler).
"""

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
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
"""The bits of the float64 2**52: OR-ing a 52-bit integer into its mantissa gives 2**52 + that
integer exactly."""


def philox(c0, c1, c2, c3, k0: int, k1: int, rounds: int = 10):
    """Philox4x32 on int64 tensors holding 32-bit words: the four output words, each int64 in
    ``[0, 2**32)``."""
    for _ in range(rounds):
        p0, p1 = c0 * PHILOX_M[0], c2 * PHILOX_M[1]
        c0, c1, c2, c3 = (
            ((p1 >> 32) & MASK32) ^ c1 ^ k0,
            p1 & MASK32,
            ((p0 >> 32) & MASK32) ^ c3 ^ k1,
            p0 & MASK32,
        )
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
"""The 128-layer ziggurat's rightmost layer edge and layer area for ``exp(-x^2 / 2)`` (Marsaglia &
Tsang 2000)."""


def ziggurat_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, ratio)``: float64 ``(128,)`` layer widths (``x[0]`` the base strip's ``V / f(R)``) and
    ``x[i + 1] / x[i]``, the share of layer ``i`` inside the curve's rectangle (``x[128] = 0``)."""
    f = lambda x: math.exp(-0.5 * x * x)  # noqa: E731
    x = [ZIGGURAT_V / f(ZIGGURAT_R), ZIGGURAT_R]
    for i in range(1, 127):
        x.append(math.sqrt(-2.0 * math.log(ZIGGURAT_V / x[i] + f(x[i]))))
    x.append(0.0)
    return torch.tensor(x[:128], dtype=torch.float64), torch.tensor(
        [x[i + 1] / x[i] for i in range(128)], dtype=torch.float64
    )


def ziggurat_element(hi, lo, widths, ratios, bound: float):
    """One element from two words: layer (7 bits), sign (1 bit), a 52-bit uniform;
    ``(float32 value, accepted)``."""
    layer = hi & 127
    u = uniform52(hi >> 12, lo)
    value = torch.where((hi >> 7) & 1 == 1, -u * widths[layer], u * widths[layer]).float()
    return value, (u < ratios[layer]) & (value.abs() <= bound)


def ziggurat_first_pass(start: int, k0: int, k1: int, widths, ratios):
    """Two elements per Philox call, each with its acceptance at +-2 sigma."""
    w0, w1, w2, w3 = words(start, k0, k1)
    return (
        *ziggurat_element(w0, w1, widths, ratios, 2.0),
        *ziggurat_element(w2, w3, widths, ratios, 2.0),
    )


CPP_SOURCE = r"""
#include <torch/extension.h>
#include <cmath>
#include <cstdint>

// Philox4x32-10 at pair indices start .. start + numel / 2 - 1 (attempt 0); with words_only the
// four words are XOR-folded into out[pair - start], else out[2 pair + h] is the ziggurat's
// first-pass value of element h of the pair, or NaN where a later pass must redo it. Returns the
// number of NaNs.
int64_t philox_ziggurat(torch::Tensor out, int64_t start, int64_t k0, int64_t k1,
                        torch::Tensor widths, torch::Tensor ratios, double bound,
                        bool words_only) {
  float* o = out.data_ptr<float>();
  const double* X = widths.data_ptr<double>();
  const double* R = ratios.data_ptr<double>();
  const int64_t n_pairs = out.numel() / 2, B = 256;
  uint32_t w0[B], w1[B], w2[B], w3[B];
  int64_t redo = 0;
  for (int64_t b = 0; b < n_pairs; b += B) {
    const int64_t m = std::min(B, n_pairs - b);
    #pragma omp simd
    for (int64_t j = 0; j < m; ++j) {
      const uint64_t pair = (uint64_t)(start + b + j);
      uint32_t c0 = (uint32_t)pair, c1 = (uint32_t)(pair >> 32), c2 = 0, c3 = 0;
      uint32_t a = (uint32_t)k0, c = (uint32_t)k1;
      for (int r = 0; r < 10; ++r) {
        const uint64_t p0 = (uint64_t)c0 * 0xD2511F53u, p1 = (uint64_t)c2 * 0xCD9E8D57u;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ a, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ c;
        c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2; a += 0x9E3779B9u; c += 0xBB67AE85u;
      }
      w0[j] = c0; w1[j] = c1; w2[j] = c2; w3[j] = c3;
    }
    if (words_only) {
      for (int64_t j = 0; j < m; ++j) o[b + j] = (float)(int32_t)(w0[j] ^ w1[j] ^ w2[j] ^ w3[j]);
      continue;
    }
    #pragma omp simd reduction(+:redo)
    // no const locals in this loop: with them GCC 12 vectorizes 2x slower code
    for (int64_t j = 0; j < 2 * m; ++j) {
      uint32_t hi = (j & 1) ? w2[j >> 1] : w0[j >> 1], lo = (j & 1) ? w3[j >> 1] : w1[j >> 1];
      uint32_t layer = hi & 127;
      double u = ((double)(int64_t)(((uint64_t)(hi >> 12) << 32) | lo) + 0.5) * 0x1p-52;
      double x = u * X[layer];
      float z = (float)(((hi >> 7) & 1) ? -x : x);
      bool ok = (u < R[layer]) & (std::fabs(z) <= (float)bound);
      o[2 * b + j] = ok ? z : NAN;
      redo += !ok;
    }
  }
  return redo;
}
"""


def cpp_kernel(width: int):
    """:data:`CPP_SOURCE` built with ``width``-bit vectors preferred (the build is cached under a
    name per width)."""
    from torch.utils.cpp_extension import load_inline

    flags = ["-O3", "-march=native", "-fopenmp-simd", f"-mprefer-vector-width={width}"]
    return load_inline(
        f"bench_counter_rng_{width}",
        cpp_sources=CPP_SOURCE,
        functions=["philox_ziggurat"],
        extra_cflags=flags,
    ).philox_ziggurat


def words_only(start: int, k0: int, k1: int):
    """The words XOR-folded into one int32 per pair: the generator's cost without storing 16 bytes
    per pair."""
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
        (
            "Philox4x32-10 (N/2 counters), folded",
            torch.compile(words_only, dynamic=False),
            (0, 1, 2),
        ),
        ("+ two 52-bit float64 uniforms", torch.compile(uniforms_only, dynamic=False), (0, 1, 2)),
        ("Box-Muller in float64 alone", torch.compile(box_muller, dynamic=False), (u1, u2)),
        ("Philox + uniforms + Box-Muller", torch.compile(normals, dynamic=False), (0, 1, 2)),
        (
            "ziggurat first pass, +-2 sigma",
            torch.compile(ziggurat_first_pass, dynamic=False),
            (0, 1, 2, *ziggurat_tables()),
        ),
    ]
    print(
        f"{N:,} float32 elements per call, {args.threads} thread(s); ratios: medians over "
        f"{args.reps} back-to-back pairs with normal_"
    )
    print(f"{'part (compiled)':<38} {'compile s':>9} {'ms':>7} {'ns/elem':>8} {'x normal_':>10}")
    for label, fn, fn_args in cases:
        begin = time.perf_counter()
        fn(*fn_args)
        compile_s = time.perf_counter() - begin
        t, ratio = median_ratio(lambda fn=fn, fn_args=fn_args: fn(*fn_args), base, args.reps)
        print(f"{label:<38} {compile_s:>9.1f} {t * 1e3:>7.2f} {t / N * 1e9:>8.2f} {ratio:>10.2f}")
    t, ratio = median_ratio(lambda: normals(0, 1, 2), base, max(1, args.reps // 5))
    print(f"{'the whole, eager':<38} {'':>9} {t * 1e3:>7.2f} {t / N * 1e9:>8.2f} {ratio:>10.2f}")
    widths, ratios = ziggurat_tables()
    value_a, accept_a, value_b, accept_b = ziggurat_first_pass(0, 1, 2, widths, ratios)
    print(
        f"ziggurat: {1 - torch.cat([accept_a, accept_b]).float().mean():.4f} of the elements left "
        "to a later pass at +-2 sigma"
    )
    out = torch.empty(N)
    torch.set_num_threads(1)
    for width in (256, 512):
        begin = time.perf_counter()
        kernel = cpp_kernel(width)
        build_s = time.perf_counter() - begin
        kernel(out, 0, 1, 2, widths, ratios, 2.0, False)
        same = torch.equal(out[0::2][accept_a], value_a[accept_a]) and torch.equal(
            out[1::2][accept_b], value_b[accept_b]
        )
        same = (
            same
            and torch.equal(out[0::2].isnan(), ~accept_a)
            and torch.equal(out[1::2].isnan(), ~accept_b)
        )
        for label, words in (
            (f"C++ {width}-bit: Philox words, folded", True),
            (f"C++ {width}-bit: ziggurat, +-2", False),
        ):
            t, ratio = median_ratio(
                lambda kernel=kernel, words=words: kernel(out, 0, 1, 2, widths, ratios, 2.0, words),
                base,
                args.reps,
            )
            print(f"{label:<38} {build_s:>9.1f} {t * 1e3:>7.2f} {t / N * 1e9:>8.2f} {ratio:>10.2f}")
        print(f"C++ {width}-bit ziggurat equals the torch ops' first pass: {same}")
    torch.set_num_threads(args.threads)
    a, b = torch.compile(normals, dynamic=False)(0, 1, 2)
    c, d = normals(0, 1, 2)
    print(
        f"compiled == eager bitwise: {torch.equal(a, c) and torch.equal(b, d)}; "
        f"mean {torch.cat([a, b]).mean():.4f}, std {torch.cat([a, b]).std():.4f}"
    )


if __name__ == "__main__":
    with reported_load():
        main()
