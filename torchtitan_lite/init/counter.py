"""Counter-based random values: Philox4x32-10 words and standard normals as pure functions of (key,
counter).

Every function here maps integer tensors to values elementwise, with no generator state: the value
at a counter is the same whichever elements are computed with it, in which order, in what chunks, on
which device.

Philox4x32-10: Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011
(the multipliers and Weyl constants below are theirs, as in Random123 and cuRAND). Box-Muller: Box &
Muller, "A note on the generation of random normal deviates", Ann. Math. Stat. 29 (1958).

Notes in docs/design.md: "on counters", "on the same bits everywhere".
"""

from __future__ import annotations

import hashlib
import math

import torch

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
"""Philox4x32 round multipliers (Salmon et al. 2011, table 2)."""
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
"""Philox4x32 key increments per round: the golden ratio and sqrt(3) - 1 as 32-bit fractions (Salmon
et al. 2011)."""
PHILOX_ROUNDS = 10
MASK32 = 0xFFFFFFFF

EXACT_COMPILE_OPTIONS = {
    "cpp.enable_floating_point_contract_flag": "off",
    "cpp.enable_unsafe_math_opt_flag": False,
    "emulate_precision_casts": True,
}
"""Inductor options under which compiled kernels round every float operation as eager does (no FMA
contraction in C++ or Triton, no reassociation)."""

_LN2 = math.log(2.0)
_SQRT2 = math.sqrt(2.0)
_LOG_TERMS = tuple(1.0 / (2 * k + 1) for k in range(8))
"""``atanh(s) / s = sum s^(2k) / (2k + 1)``; 8 terms: the first omitted one is below 2**-42 for
``|s| <= 0.172``."""
_SQRT2_F32, _LN2_F32, _HALF_PI_F32 = 1.4142135381698608, 0.6931471824645996, 1.5707963705062866
"""``sqrt(2)``, ``ln 2``, ``pi / 2`` rounded to float32."""
_LN_POLY = (
    1.0,
    -0.49999988079071045,
    0.33333325386047363,
    -0.25001585483551025,
    0.2000207155942917,
    -0.16609126329421997,
    0.14180079102516174,
    -0.13240842521190643,
    0.129141703248024,
    -0.07638592272996902,
)
"""``ln(1 + f) / f`` on ``f`` in ``[sqrt(1/2) - 1, sqrt(2) - 1]``: a least-squares fit of degree 9
on 4,000 Chebyshev nodes, rounded to float32 (relative error 7e-9 before float32 evaluation;
docs/design.md, the float32 transform)."""
_SIN_POLY = (
    1.0,
    -0.1666666716337204,
    0.008333333767950535,
    -0.00019841270113829523,
    2.7557318844628753e-06,
)
_COS_POLY = (
    1.0,
    -0.5,
    0.0416666679084301,
    -0.0013888889225199819,
    2.4801587642286904e-05,
    -2.755731998149713e-07,
)
"""Taylor coefficients of ``sin(x) / x`` and ``cos(x)`` in ``x^2``, rounded to float32: the first
omitted terms are below 3e-9 for ``0 <= x <= pi / 4``."""
_RSQRT_STEPS = 3
"""Newton steps of :func:`sqrt32`: the relative error goes 0.035 -> 1.8e-3 -> 5e-6 -> float32
rounding."""


def stream_words(seed: int, digest: bytes) -> tuple[int, int, int]:
    """``(k0, k1, salt)``: the Philox key words and the counter's salt word of the stream
    ``(seed, name digest)``, each in ``[0, 2**32)``, from a 96-bit blake2b digest of the 64-bit
    little-endian seed and the 16-byte digest."""
    words = hashlib.blake2b(
        seed.to_bytes(8, "little") + digest, digest_size=12, person=b"tt-lite-philox"
    ).digest()
    return tuple(int.from_bytes(words[4 * j : 4 * j + 4], "little") for j in range(3))


def as_word32(value: int) -> int:
    """The int32 that holds the 32-bit word ``value`` (in ``[0, 2**32)``) as two's complement."""
    return value - (1 << 32) if value >= 1 << 31 else value


def _hi16(x: torch.Tensor) -> torch.Tensor:
    """The top 16 bits of int32 words (a logical shift: torch's ``>>`` on int32 is arithmetic)."""
    return (x >> 16) & 0xFFFF


def mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)`` words of the 64-bit product of the int32 words ``a`` and the 32-bit constant
    ``m``.

    Only int32 lanes (no 64-bit multiply, which AVX2 lacks): ``lo`` is the wrapping int32 product;
    ``hi`` sums the four 16 x 16-bit partial products, each below ``2**32`` (held wrapped), with
    masks and shifts for the carries.
    """
    m_hi, m_lo = m >> 16, m & 0xFFFF
    a_hi, a_lo = _hi16(a), a & 0xFFFF
    low, mid1, mid2 = a_lo * m_lo, a_hi * m_lo, a_lo * m_hi
    carry = (_hi16(low) + (mid1 & 0xFFFF) + (mid2 & 0xFFFF)) >> 16
    return a_hi * m_hi + _hi16(mid1) + _hi16(mid2) + carry, a * as_word32(m)


def philox4x32(
    c0: torch.Tensor,
    c1: torch.Tensor,
    c2: torch.Tensor,
    c3: torch.Tensor,
    k0: torch.Tensor,
    k1: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 of the counters ``(c0, c1, c2, c3)`` under the key ``(k0, k1)``.

    Args:
        c0, c1, c2, c3: int32 tensors (broadcastable), 32-bit words as two's complement
        (:func:`as_word32`). k0, k1: int32 0-d tensors, the same.

    Returns:
        The four output words, int32 tensors (two's complement).
    """
    for _ in range(PHILOX_ROUNDS):
        hi0, lo0 = mulhilo(c0, PHILOX_M[0])
        hi1, lo1 = mulhilo(c2, PHILOX_M[1])
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = k0 + as_word32(PHILOX_W[0]), k1 + as_word32(PHILOX_W[1])  # wrapping int32 adds
    return c0, c1, c2, c3


def unit_uniform(word: torch.Tensor) -> torch.Tensor:
    """float64 ``(w + 0.5) * 2**-32`` of 32-bit words ``w`` (int64): uniforms in ``(0, 1)``, exact
    (33 bits)."""
    return (word.to(torch.float64) + 0.5) * 2.0**-32


def _horner(x: torch.Tensor, coefficients: tuple[float, ...]) -> torch.Tensor:
    """``sum c_k x^k`` by Horner's rule, one multiply and one add per coefficient (never fused)."""
    out = x * coefficients[-1] + coefficients[-2]
    for c in reversed(coefficients[:-2]):
        out = out * x + c
    return out


def log_word_uniform(word: torch.Tensor) -> torch.Tensor:
    """float64 ``ln u`` of the uniform ``u = (w + 0.5) 2^-32`` (:func:`unit_uniform`) of 32-bit
    words ``w`` (int64), from IEEE-rounded ``+ - * /`` only (the proposals' float64 stage):
    ``ln u = ln(2 w + 1) - 33 ln 2``.

    ``x = 2 w + 1 = m 2^e`` with ``m`` in ``[sqrt(1/2), sqrt(2))``, ``e`` and ``m`` read from the
    float64 bits of ``x`` (exact), then ``ln m = 2 atanh(s)``, ``s = (m - 1) / (m + 1)``, by its
    series (:data:`_LOG_TERMS`): relative error below 1e-12.
    """
    x = (word + word + 1).to(torch.float64)  # odd integers below 2**33: exact
    e = (x.view(torch.int64) >> 52) - 1023
    m = ((x.view(torch.int64) & ((1 << 52) - 1)) | (1023 << 52)).view(
        torch.float64
    )  # x 2^-e in [1, 2), exact
    high = m > _SQRT2
    m, e = torch.where(high, m * 0.5, m), torch.where(high, e + 1, e)
    s = (m - 1.0) / (m + 1.0)
    return (e - 33).to(torch.float64) * _LN2 + (s + s) * _horner(s * s, _LOG_TERMS)


def log_uniform32(word: torch.Tensor) -> torch.Tensor:
    """float32 ``ln u`` of the uniform ``u`` of int32 words ``w`` (32-bit words, two's complement),
    in
    ``[-23.2, 0]``: ``u = (w + 0.5) 2^-32`` for ``w < 2**31`` (``w`` rounded to float32 first: exact
    below ``2**24``, so the smallest ``u`` is ``2**-33``), else ``1 + (w - 2**32 + 0.5) 2^-32``
    rounded to float32.

    ``u = m 2^e`` with ``m`` in ``[sqrt(1/2), sqrt(2))`` from its bits, ``ln u = e ln 2 + f P(f)``,
    ``f = m - 1`` (exact), ``P`` :data:`_LN_POLY`: relative error below 1e-6
    (``tests/test_counter.py``).
    """
    scaled = (word.to(torch.float32) + 0.5) * 2.0**-32  # exact scaling of a rounded value
    u = torch.where(word < 0, scaled + 1.0, scaled)
    bits = u.view(torch.int32)
    m = ((bits & 0x007FFFFF) | 0x3F800000).view(torch.float32)  # u 2^-e in [1, 2), exact
    e = (bits >> 23) - 127
    high = m > _SQRT2_F32
    f = torch.where(high, m * 0.5, m) - 1.0  # exact (Sterbenz)
    e = torch.where(high, e + 1, e)
    return e.to(torch.float32) * _LN2_F32 + f * _horner(f, _LN_POLY)


def sqrt32(x: torch.Tensor) -> torch.Tensor:
    """float32 ``sqrt`` of non-negative float32 ``x`` below ``2**64`` from multiplies and adds only:
    ``x * rsqrt(x)``, ``rsqrt`` from a bit-level guess (within 3.5%) and :data:`_RSQRT_STEPS` Newton
    steps ``y (1.5 - x/2 y^2)``; relative error below 1e-6 (``0`` gives ``0``)."""
    x_safe = torch.clamp_min(x, 2.0**-60)  # keeps y^2 finite; x * y is 0 for x = 0
    y = (0x5F3759DF - (x_safe.view(torch.int32) >> 1)).view(torch.float32)
    half = x_safe * 0.5
    for _ in range(_RSQRT_STEPS):
        y = y * (1.5 - half * y * y)
    return x * y


def sincos_turns32(word: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``(sin t, cos t)`` of the angles ``t = 2 pi (v + 0.5) / 2**25``, ``v`` the top 25
    bits of the int32 words (two's complement).

    The top two bits pick the quadrant, the next 23 give ``f = (g + 0.5) 2^-23`` in ``(0, 1)``
    within it (exact); ``f > 1/2`` is mirrored to ``1 - f`` (exact) so that the Taylor polynomials
    (:data:`_SIN_POLY`, :data:`_COS_POLY`) run on ``x = f pi / 2`` in ``(0, pi / 4]``: absolute
    error below 1e-7.
    """
    quadrant = (word >> 30) & 3
    f = (((word >> 7) & 0x7FFFFF).to(torch.float32) + 0.5) * 2.0**-23
    mirror = f > 0.5
    x = torch.where(mirror, 1.0 - f, f) * _HALF_PI_F32
    x2 = x * x
    sin_x, cos_x = x * _horner(x2, _SIN_POLY), _horner(x2, _COS_POLY)
    sin_f, cos_f = (
        torch.where(mirror, cos_x, sin_x),
        torch.where(mirror, sin_x, cos_x),
    )  # of f pi / 2
    odd = (quadrant & 1) == 1
    sin_t, cos_t = (
        torch.where(odd, cos_f, sin_f),
        torch.where(odd, -sin_f, cos_f),
    )  # rotate by pi / 2 if odd
    flip = quadrant >= 2  # rotate by pi
    return torch.where(flip, -sin_t, sin_t), torch.where(flip, -cos_t, cos_t)


def box_muller(u_word: torch.Tensor, t_word: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independent float32 standard normals ``(r cos t, r sin t)`` from two int32 words:
    ``r = sqrt(-2 ln u)`` (:func:`log_uniform32`, so ``|z| <= 6.8``), ``t`` the angle of ``t_word``
    (:func:`sincos_turns32`)."""
    r = sqrt32(log_uniform32(u_word) * -2.0)
    sin_t, cos_t = sincos_turns32(t_word)
    return r * cos_t, r * sin_t


def _split(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Low and high 32-bit words (int32, two's complement) of non-negative int64 ``index`` below
    ``2**63``."""
    lo = ((index & MASK32) ^ 0x80000000) - 0x80000000  # in [-2**31, 2**31): an exact conversion
    return lo.to(torch.int32), (index >> 32).to(torch.int32)


def block_normals(
    block: torch.Tensor,
    attempt: torch.Tensor,
    k0: torch.Tensor,
    k1: torch.Tensor,
    salt: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four standard normals of each Philox block: four float32 ``(n,)`` for int64 ``block``
    ``(n,)``.

    Normal ``j`` of block ``b`` is element ``4 b + j``'s candidate number ``attempt``; ``attempt``,
    ``k0``, ``k1``, ``salt`` are int32 0-d words (:func:`as_word32`). Words 0 and 1 give normals 0
    and 1 (:func:`box_muller`), words 2 and 3 normals 2 and 3.
    """
    lo, hi = _split(block)
    w0, w1, w2, w3 = philox4x32(lo, hi, attempt.expand_as(lo), salt.expand_as(lo), k0, k1)
    z0, z1 = box_muller(w0, w1)
    z2, z3 = box_muller(w2, w3)
    return z0, z1, z2, z3


def element_normals(
    index: torch.Tensor,
    attempt: torch.Tensor,
    k0: torch.Tensor,
    k1: torch.Tensor,
    salt: torch.Tensor,
) -> torch.Tensor:
    """Candidate number ``attempt`` of the elements at global indices ``index`` (int64 ``(n,)``):
    float32 ``(n,)``, bitwise the values :func:`block_normals` gives them (each element computes its
    block and keeps its normal)."""
    lo, hi = _split(index >> 2)
    w0, w1, w2, w3 = philox4x32(lo, hi, attempt.expand_as(lo), salt.expand_as(lo), k0, k1)
    second = (index & 2) == 2
    z_cos, z_sin = box_muller(torch.where(second, w2, w0), torch.where(second, w3, w1))
    return torch.where((index & 1) == 1, z_sin, z_cos)


def element_words(
    index: torch.Tensor,
    attempt: torch.Tensor,
    k0: torch.Tensor,
    k1: torch.Tensor,
    salt: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 32-bit words (int64 ``(n,)``, in ``[0, 2**32)``) of candidate number ``attempt`` of the
    elements at ``index`` (int64 ``(n,)``): words 0 and 1 of the Philox block at counter
    ``(index, attempt, salt)``."""
    lo, hi = _split(index)
    w0, w1, _, _ = philox4x32(lo, hi, attempt.expand_as(lo), salt.expand_as(lo), k0, k1)
    return w0.to(torch.int64) & MASK32, w1.to(torch.int64) & MASK32
