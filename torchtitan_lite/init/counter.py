"""Counter-based random values: Philox4x32-10 words and standard normals as pure functions of (key, counter).

Every function here maps integer tensors to values elementwise, with no generator state: the value at a counter is
the same whichever elements are computed with it, in which order, in what chunks, on which device.

Note: on counters. A keyed stream has a 64-bit Philox key ``(k0, k1)`` and a 32-bit ``salt`` (both from a blake2b
hash of the seed and the tensor's canonical name, :func:`stream_words`). Element ``i`` (row-major global index) of a
tensor takes its ``k``-th candidate from the Philox block at counter ``(block_lo, block_hi, k, salt)``:
``block = i // 4`` for normal candidates (a block gives four normals: :func:`block_normals`), ``block = i`` where a
candidate needs two uniforms of its own (:func:`element_words`).

Note: on the same bits everywhere. Philox is integer arithmetic (exact on every device: 32-bit words held in int64,
``32 x 32 -> 64``-bit products that wrap as two's complement). The float stage uses only IEEE-754 operations that are
correctly rounded in float64 on every CPU ISA and accelerator: ``+ - * /``, comparisons, exact conversions
from integers below 2**53, selections and bit-casts. There is no vendor ``log``/``sin``/``cos`` (their last bit
differs between libm, SLEEF's AVX2/AVX-512 kernels and CUDA), and no ``sqrt`` (torch's eager CPU one is SLEEF's and
misrounds some float64 values): :func:`log_word_uniform` and :func:`sincos_2pi_turns` are Taylor series of fixed
length evaluated by Horner's rule, :func:`sqrt_positive` a fixed number of Newton steps. Each operation is its own torch op in eager
mode; compiled, inductor's C++ is built with ``-ffp-contract=off`` and without unsafe math (torch 2.13's defaults,
also forced by :data:`EXACT_COMPILE_OPTIONS`), and Triton's FMA fusion is turned off (``emulate_precision_casts``),
so no multiply-add is contracted and no operation is reassociated: eager, compiled, CPU and GPU give the same bits.

Philox4x32-10: Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011 (the
multipliers and Weyl constants below are theirs, as in Random123 and cuRAND). Box-Muller: Box & Muller, "A note on
the generation of random normal deviates", Ann. Math. Stat. 29 (1958).
"""

from __future__ import annotations

import hashlib
import math

import torch

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
"""Philox4x32 round multipliers (Salmon et al. 2011, table 2)."""
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
"""Philox4x32 key increments per round: the golden ratio and sqrt(3) - 1 as 32-bit fractions (Salmon et al. 2011)."""
PHILOX_ROUNDS = 10
MASK32 = 0xFFFFFFFF

EXACT_COMPILE_OPTIONS = {
    "cpp.enable_floating_point_contract_flag": "off",
    "cpp.enable_unsafe_math_opt_flag": False,
    "emulate_precision_casts": True,
}
"""Inductor options under which compiled kernels round every float operation as eager does (no FMA contraction in
C++ or Triton, no reassociation)."""

_LN2 = math.log(2.0)
_HALF_PI = math.pi / 2.0
_SQRT2 = math.sqrt(2.0)
_SQRT_STEPS = 5
"""Newton steps of :func:`sqrt_positive`: the relative error squares each step, 0.07 -> 2.4e-3 -> 3e-6 -> 5e-12."""
_LOG_TERMS = tuple(1.0 / (2 * k + 1) for k in range(8))
"""``atanh(s) / s = sum s^(2k) / (2k + 1)``; 8 terms: the first omitted one is below 2**-42 for ``|s| <= 0.172``."""
_SIN_TERMS = tuple((-1.0) ** k / math.factorial(2 * k + 1) for k in range(7))
_COS_TERMS = tuple((-1.0) ** k / math.factorial(2 * k) for k in range(7))
"""Taylor coefficients of ``sin(x) / x`` and ``cos(x)`` in ``x^2``; 7 terms: the first omitted one is below
2**-41 for ``0 <= x <= pi / 4``."""


def stream_words(seed: int, digest: bytes) -> tuple[int, int, int]:
    """``(k0, k1, salt)``: the Philox key words and the counter's salt word of the stream ``(seed, name digest)``,
    each in ``[0, 2**32)``, from a 96-bit blake2b digest of the 64-bit little-endian seed and the 16-byte digest."""
    words = hashlib.blake2b(seed.to_bytes(8, "little") + digest, digest_size=12, person=b"tt-lite-philox").digest()
    return tuple(int.from_bytes(words[4 * j : 4 * j + 4], "little") for j in range(3))


def philox4x32(c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor, k0: torch.Tensor,
               k1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 of the counters ``(c0, c1, c2, c3)`` under the key ``(k0, k1)``.

    Args:
        c0, c1, c2, c3: int64 tensors (broadcastable) holding 32-bit words, values in ``[0, 2**32)``.
        k0, k1: int64 0-d tensors (or ints) in ``[0, 2**32)``.

    Returns:
        The four output words, int64 tensors with values in ``[0, 2**32)``.
    """
    for _ in range(PHILOX_ROUNDS):
        p0, p1 = c0 * PHILOX_M[0], c2 * PHILOX_M[1]  # exact 64-bit products, wrapping as signed int64
        c0, c1, c2, c3 = ((p1 >> 32) & MASK32) ^ c1 ^ k0, p1 & MASK32, ((p0 >> 32) & MASK32) ^ c3 ^ k1, p0 & MASK32
        k0, k1 = (k0 + PHILOX_W[0]) & MASK32, (k1 + PHILOX_W[1]) & MASK32
    return c0, c1, c2, c3


def unit_uniform(word: torch.Tensor) -> torch.Tensor:
    """float64 ``(w + 0.5) * 2**-32`` of 32-bit words ``w`` (int64): uniforms in ``(0, 1)``, exact (33 bits)."""
    return (word.to(torch.float64) + 0.5) * 2.0**-32


def _horner(x: torch.Tensor, coefficients: tuple[float, ...]) -> torch.Tensor:
    """``sum c_k x^k`` by Horner's rule, one multiply and one add per coefficient (never fused)."""
    out = torch.full_like(x, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        out = out * x + c
    return out


def log_word_uniform(word: torch.Tensor) -> torch.Tensor:
    """float64 ``ln u`` of the uniform ``u = (w + 0.5) 2^-32`` (:func:`unit_uniform`) of 32-bit words ``w`` (int64),
    from IEEE-rounded operations only: ``ln u = ln(2 w + 1) - 33 ln 2``.

    ``x = 2 w + 1 = m 2^e`` with ``m`` in ``[sqrt(1/2), sqrt(2))``, ``e`` and ``m`` read from the float64 bits of
    ``x`` (exact), then
    ``ln m = 2 atanh(s)``, ``s = (m - 1) / (m + 1)``, by its series (:data:`_LOG_TERMS`): relative error below 1e-12,
    the same bits on every device.
    """
    x = (word + word + 1).to(torch.float64)  # odd integers below 2**33: exact
    e = ((x.view(torch.int64) >> 52) - 1023)
    m = ((x.view(torch.int64) & ((1 << 52) - 1)) | (1023 << 52)).view(torch.float64)  # x 2^-e in [1, 2), exact
    high = m > _SQRT2
    m, e = torch.where(high, m * 0.5, m), torch.where(high, e + 1, e)
    s = (m - 1.0) / (m + 1.0)
    return (e - 33).to(torch.float64) * _LN2 + (s + s) * _horner(s * s, _LOG_TERMS)


def sincos_2pi_turns(word: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sin t, cos t)`` in float64 of the angles ``t = 2 pi (w + 0.5) / 2**32`` of 32-bit words ``w`` (int64).

    The top two bits pick the quadrant, the other 30 give ``f`` in ``(0, 1)`` within it (exact); ``f > 1/2`` is
    mirrored to ``1 - f`` (exact) so that the series (:data:`_SIN_TERMS`, :data:`_COS_TERMS`) run on
    ``x = f pi / 2`` in ``(0, pi / 4]``.
    """
    quadrant = word >> 30
    f = ((word & ((1 << 30) - 1)).to(torch.float64) + 0.5) * 2.0**-30
    mirror = f > 0.5
    x = torch.where(mirror, 1.0 - f, f) * _HALF_PI
    x2 = x * x
    sin_x, cos_x = x * _horner(x2, _SIN_TERMS), _horner(x2, _COS_TERMS)
    sin_f, cos_f = torch.where(mirror, cos_x, sin_x), torch.where(mirror, sin_x, cos_x)  # of f pi / 2
    odd = (quadrant & 1) == 1
    sin_t, cos_t = torch.where(odd, cos_f, sin_f), torch.where(odd, -sin_f, cos_f)  # rotate by pi / 2 if odd
    flip = (quadrant & 2) == 2  # rotate by pi
    return torch.where(flip, -sin_t, sin_t), torch.where(flip, -cos_t, cos_t)


def sqrt_positive(x: torch.Tensor) -> torch.Tensor:
    """``sqrt`` of positive normal float64 ``x`` from ``+ * /`` only: a bit-level first guess (within 7%), then
    :data:`_SQRT_STEPS` Newton steps ``y = (y + x / y) / 2``; relative error below 1e-15. (torch's eager CPU
    ``sqrt`` is SLEEF's, which misrounds about 0.7% of float64 values by one ulp, while compiled code rounds
    correctly: neither can be both fast and the same everywhere.)"""
    y = ((x.view(torch.int64) >> 1) + (1023 << 51)).view(torch.float64)
    for _ in range(_SQRT_STEPS):
        y = (y + x / y) * 0.5
    return y


def box_muller(u_word: torch.Tensor, t_word: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independent float64 standard normals ``(r cos t, r sin t)`` from two 32-bit words: ``r = sqrt(-2 ln u)``
    with ``u`` = :func:`unit_uniform` of ``u_word`` (so ``|z| <= 6.77``), ``t`` the angle of ``t_word``."""
    r = sqrt_positive(log_word_uniform(u_word) * -2.0)
    sin_t, cos_t = sincos_2pi_turns(t_word)
    return r * cos_t, r * sin_t


def _split(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Low and high 32-bit words of non-negative int64 ``index``."""
    return index & MASK32, index >> 32


def block_normals(block: torch.Tensor, attempt: torch.Tensor, k0: torch.Tensor, k1: torch.Tensor,
                  salt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four standard normals of each Philox block: four float64 ``(n,)`` for int64 ``block`` ``(n,)``.

    Normal ``j`` of block ``b`` is element ``4 b + j``'s candidate number ``attempt`` (int64 0-d): words 0 and 1 give
    normals 0 and 1 (:func:`box_muller`), words 2 and 3 normals 2 and 3.
    """
    lo, hi = _split(block)
    w0, w1, w2, w3 = philox4x32(lo, hi, attempt.expand_as(block), salt.expand_as(block), k0, k1)
    z0, z1 = box_muller(w0, w1)
    z2, z3 = box_muller(w2, w3)
    return z0, z1, z2, z3


def element_normals(index: torch.Tensor, attempt: torch.Tensor, k0: torch.Tensor, k1: torch.Tensor,
                    salt: torch.Tensor) -> torch.Tensor:
    """Candidate number ``attempt`` of the elements at global indices ``index`` (int64 ``(n,)``): float64 ``(n,)``,
    bitwise the values :func:`block_normals` gives them (each element computes its block and keeps its normal)."""
    lo, hi = _split(index >> 2)
    w0, w1, w2, w3 = philox4x32(lo, hi, attempt.expand_as(index), salt.expand_as(index), k0, k1)
    second = (index & 2) == 2
    z_cos, z_sin = box_muller(torch.where(second, w2, w0), torch.where(second, w3, w1))
    return torch.where((index & 1) == 1, z_sin, z_cos)


def element_words(index: torch.Tensor, attempt: torch.Tensor, k0: torch.Tensor, k1: torch.Tensor,
                  salt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 32-bit words (int64 ``(n,)``) of candidate number ``attempt`` of the elements at ``index`` (int64
    ``(n,)``): words 0 and 1 of the Philox block at counter ``(index, attempt, salt)``."""
    lo, hi = _split(index)
    w0, w1, _, _ = philox4x32(lo, hi, attempt.expand_as(index), salt.expand_as(index), k0, k1)
    return w0, w1
