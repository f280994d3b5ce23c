"""Sharding-invariant keyed values: :class:`InitKey`, a rank's local box, and filling it from the
counter-based stream.

The value of every element of a keyed tensor is a function of (seed, canonical name, the element's
global row-major index, the distribution) only (:mod:`torchtitan_lite.init.counter`,
:mod:`torchtitan_lite.init.draw`), whatever the device, host CPU, world size or parallel layout.

Note: docs/design.md, "on local boxes".
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard

from torchtitan_lite.init import counter, draw


@dataclass(frozen=True)
class InitKey:
    """The key of a sharding-invariant stream: a seed and a parameter's canonical name.

    Attributes:
        seed: integer in ``[0, 2**64)``.
        name: canonical parameter name, e.g. ``layers.0.attention.wq.weight``.

    Raises:
        ValueError: ``seed`` is not an int in ``[0, 2**64)`` or ``name`` is empty.
    """

    seed: int
    name: str

    def __post_init__(self) -> None:
        if (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not 0 <= self.seed < 2**64
        ):
            raise ValueError(f"InitKey: seed must be an int in [0, 2**64), got {self.seed!r}")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"InitKey: name must be a non-empty string, got {self.name!r}")

    @property
    def digest(self) -> bytes:
        """16-byte blake2b digest of ``name`` (what the stream is keyed by)."""
        return name_digest(self.name)


def name_digest(name: str) -> bytes:
    """128-bit blake2b digest of a canonical name: 16 bytes."""
    return hashlib.blake2b(name.encode("utf-8"), digest_size=16).digest()


def local_box(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """``(local tensor, local shape, global offset)`` of a plain tensor or a DTensor shard.

    Raises:
        ValueError: a DTensor placement other than ``Shard`` (incl. ``_StridedShard``) or
            ``Replicate``.
    """
    if not isinstance(tensor, DTensor):
        return tensor, tuple(tensor.shape), (0,) * tensor.dim()
    for placement in tensor.placements:
        if not isinstance(placement, (Shard, _StridedShard, Replicate)):
            raise ValueError(
                f"unsupported DTensor placement {placement}; only Shard, _StridedShard and "
                "Replicate are supported (initialize before making it Partial)"
            )
    shape, offset = compute_local_shape_and_global_offset(
        tensor.shape, tensor.device_mesh, tensor.placements
    )
    return tensor.to_local(), tuple(shape), tuple(offset)


def element_runs(
    shape: tuple[int, ...], local_shape: tuple[int, ...], offset: tuple[int, ...]
) -> tuple[list[int], int]:
    """The local box ``(local_shape, offset)`` of a tensor of global ``shape`` as runs of
    consecutive global row-major indices: ``(starts, length)``, the runs ``range(s, s + length)`` in
    local row-major order (a 0-d tensor: one run of 1). Dimensions after the last one that the box
    cuts are whole, so each run spans them."""
    if not shape:
        return [0], 1
    d = len(shape) - 1
    while d > 0 and local_shape[d] == shape[d]:
        d -= 1
    strides = [math.prod(shape[j + 1 :]) for j in range(len(shape))]
    length = local_shape[d] * strides[d]
    starts = torch.tensor([offset[d] * strides[d]], dtype=torch.int64)
    for j in range(d - 1, -1, -1):
        starts = ((offset[j] + torch.arange(local_shape[j])) * strides[j])[:, None] + starts[
            None, :
        ]
        starts = starts.view(-1)
    return starts.tolist(), length


def keyed_fill(
    tensor: torch.Tensor, key: InitKey, law: draw.Law, cast, compiled: bool | None
) -> int:
    """Fill this rank's part of ``tensor`` (plain or DTensor) with the keyed values of ``law`` under
    ``key``.

    Args:
        tensor: the tensor to fill, global shape ``tensor.shape``.
        key: the stream.
        law: the distribution (:class:`torchtitan_lite.init.draw.Law`).
        cast: rounds ``law.dtype`` values to the tensor's dtype, keeping them in bounds.
        compiled: draw with compiled kernels (the same values); ``None``: when the local elements
            number at least :data:`~torchtitan_lite.init.draw.COMPILE_MIN_ELEMENTS`. Fewer than
            :data:`~torchtitan_lite.init.draw.COMPILED_MIN_LOCAL` are always drawn eagerly.

    Returns:
        The number of elements drawn: the local element count.

    Raises:
        ValueError: see :func:`local_box` (the message names the key).
    """
    shape = tuple(tensor.shape)
    try:
        local, shape_local, offset = local_box(tensor)
    except ValueError as err:
        raise ValueError(f"trunc_normal_: key={key.name!r}: {err}") from None
    if local.numel() == 0:
        return 0
    if compiled is None and local.numel() >= draw.COMPILE_MIN_ELEMENTS:
        compiled = True
    if compiled and local.numel() < draw.COMPILED_MIN_LOCAL:
        compiled = None
    starts, length = element_runs(shape, shape_local, offset)
    words = counter.stream_words(key.seed, key.digest)
    if local.is_contiguous():
        return draw.fill_local(local.view(-1), starts, length, words, law, cast, compiled)
    values = torch.empty(shape_local, dtype=local.dtype, device=local.device)
    drawn = draw.fill_local(values.view(-1), starts, length, words, law, cast, compiled)
    local.copy_(values)
    return drawn
