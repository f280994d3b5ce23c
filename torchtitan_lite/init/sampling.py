"""Exact, fast truncated-normal sampling: :func:`trunc_normal_`, one keyed sampler.

``trunc_normal_`` is a drop-in for ``torch.nn.init.trunc_normal_`` (same arguments, absolute bounds)
plus a keyword ``key``. With ``key=InitKey(seed, name)`` every element's value depends only on
(seed, name, the element's global index, distribution), whatever the sharding, device or world size
(:mod:`torchtitan_lite.init.keyed`). Without a key it draws a 64-bit seed from ``generator``
(torch's default CPU generator when ``None``) and uses the same keyed draw: one algorithm
(:mod:`torchtitan_lite.init.draw`: exact per-element rejection, a proposal where the in-bounds mass
is small) for both.

Note: docs/design.md, "on casting".
"""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

from torchtitan_lite.init import keyed
from torchtitan_lite.init.draw import Law
from torchtitan_lite.init.keyed import InitKey


def _phi(x: float) -> float:
    """Standard normal CDF in float64, accurate in the lower tail."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def normal_mass(alpha: float, beta: float) -> float:
    """``Phi(beta) - Phi(alpha)`` in float64 for standardized bounds, mirrored to the lower tail for
    accuracy."""
    if alpha + beta > 0:
        return _phi(-alpha) - _phi(-beta)
    return _phi(beta) - _phi(alpha)


def inner_bounds(a: float, b: float, dtype: torch.dtype) -> tuple[float, float]:
    """The smallest and largest values of ``dtype`` inside ``[a, b]`` (``a``/``b`` may be infinite).

    Raises:
        ValueError: ``dtype`` is not floating point or has no representable value in ``[a, b]``.
    """
    if not dtype.is_floating_point:
        raise ValueError(f"trunc_normal_: tensor dtype must be floating point, got {dtype}")
    lo = torch.tensor(a, dtype=torch.float64).to(dtype)
    if lo.item() < a:
        lo = torch.nextafter(lo, torch.tensor(math.inf, dtype=dtype))
    hi = torch.tensor(b, dtype=torch.float64).to(dtype)
    if hi.item() > b:
        hi = torch.nextafter(hi, torch.tensor(-math.inf, dtype=dtype))
    if not lo.item() <= hi.item():
        raise ValueError(
            f"trunc_normal_: dtype {dtype} has no representable value in [a, b] = [{a}, {b}]; "
            "widen the bounds or use a wider dtype"
        )
    return lo.item(), hi.item()


def _check_args(mean: float, std: float, a: float, b: float) -> None:
    for arg, value in (("mean", mean), ("std", std)):
        if not math.isfinite(value):
            raise ValueError(f"trunc_normal_: {arg} must be finite, got {value}")
    if not std > 0:
        raise ValueError(f"trunc_normal_: std must be > 0, got {std}")
    for arg, value in (("a", a), ("b", b)):
        if math.isnan(value):
            raise ValueError(f"trunc_normal_: bound {arg} is NaN")
    if not a < b:
        raise ValueError(f"trunc_normal_: need a < b, got a={a}, b={b}")


def _law(mean: float, std: float, a: float, b: float, dtype: torch.dtype) -> Law:
    """The :class:`~torchtitan_lite.init.draw.Law` of ``N(mean, std^2)`` truncated to ``[a, b]`` in
    ``dtype``."""
    alpha, beta = (a - mean) / std, (b - mean) / std
    return Law(mean, std, *inner_bounds(a, b, dtype), alpha, beta, normal_mass(alpha, beta), dtype)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _caster(dtype: torch.dtype, work_dtype: torch.dtype, a: float, b: float):
    """Rounds ``work_dtype`` values to ``dtype`` (nearest), clamped into ``[a, b]`` when they
    differ."""
    if dtype == work_dtype:
        return lambda values: values
    bounds = inner_bounds(a, b, dtype)
    return lambda values: values.to(dtype).clamp_(*bounds)


@torch.no_grad()
def trunc_normal_(
    tensor: torch.Tensor,
    mean: float = 0.0,
    std: float = 1.0,
    a: float = -2.0,
    b: float = 2.0,
    generator: torch.Generator | None = None,
    *,
    key: InitKey | None = None,
    compiled: bool | None = None,
) -> torch.Tensor:
    """Fill ``tensor`` in place with ``N(mean, std^2)`` truncated to ``[a, b]`` (absolute bounds).

    Drop-in for ``torch.nn.init.trunc_normal_``; no-grad by itself (works on a leaf Parameter that
    requires grad) and returns ``tensor`` itself. A meta tensor is left as is. Exact in float32
    (float64 for float64 tensors); bf16/fp16 results are the exact law rounded to nearest, with
    values that would round outside ``[a, b]`` clamped onto the nearest representable value inside.
    ``a = -inf, b = inf`` gives a plain normal.

    Args:
        tensor: any floating-point tensor, or a DTensor with ``Shard``/``Replicate`` placements
            (then ``key`` is required).
        mean, std: of the untruncated normal.
        a, b: absolute bounds.
        generator: without ``key``: the generator whose next 64-bit draw seeds the keyed stream
            (torch's default CPU generator when ``None``).
        key: draw from the counter-based stream of ``key`` (:mod:`torchtitan_lite.init.keyed`): the
            value of every element depends only on (``key``, the global shape, the element's global
            index, mean, std, a, b), the same bits on every device and host CPU.
        compiled: ``False``: eager torch ops; ``True``: native kernels (the same values; see
            :func:`torchtitan_lite.init.draw.fill_local`); ``None``: native on the CPU, and
            elsewhere when the local elements number at least
            :data:`torchtitan_lite.init.draw.COMPILE_MIN_ELEMENTS`.

    Raises:
        ValueError: non-finite mean or std, std <= 0, NaN bound, a >= b, a dtype that is not
            floating point or cannot hold a value in ``[a, b]``, a DTensor without ``key``, or a
            DTensor with a placement other than Shard/Replicate.
    """
    _check_args(mean, std, a, b)
    inner_bounds(a, b, tensor.dtype)
    if tensor.device.type == "meta":
        return tensor
    dtype = _work_dtype(tensor.dtype)
    law = _law(mean, std, a, b, dtype)
    if key is None:
        if isinstance(tensor, DTensor):
            raise ValueError(
                "trunc_normal_ on a DTensor needs key=InitKey(seed, name): a generator's seed "
                "would give every rank the same values (or depend on the world size)"
            )
        device = generator.device if generator is not None else "cpu"
        seed = torch.randint(
            -(2**63), 2**63 - 1, (), dtype=torch.int64, generator=generator, device=device
        )
        key = InitKey(int(seed) % 2**64, "trunc_normal_")
    keyed.keyed_fill(tensor, key, law, _caster(tensor.dtype, dtype, a, b), compiled)
    return tensor
