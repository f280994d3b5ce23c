"""The model fingerprint: one 64-bit hash of every parameter and persistent buffer, computed from
local shards.

Each element contributes ``h = mix(mix(key + index * GOLDEN) ^ bits)``: ``key`` is a 64-bit blake2b
digest of the tensor's canonical names (each tied tensor once, under all its names), dtype and
global shape; ``index`` its row-major index in the global tensor; ``bits`` its value's bit pattern
as an integer; ``mix`` the splitmix64 finalizer (Steele, Lea & Flood, "Fast splittable pseudorandom
number generators", OOPSLA 2014; constants from Vigna's ``splitmix64.c``). The fingerprint is the
sum of all ``h`` mod 2**64, each element counted once (see the note below), computed with int64
tensor ops (multiplication and addition wrap mod 2**64). The sum does not depend on the order of
elements, tensors or ranks, so it is bitwise the same for every world size, layout and wrapper; no
tensor is gathered.

Note: docs/design.md, "on who counts an element".
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from torchtitan_lite.init.apply import tensor_groups
from torchtitan_lite.init.keyed import local_box

_GOLDEN = 0x9E3779B97F4A7C15 - 2**64
"""2**64 / golden ratio (odd), as a signed int64: splitmix64's increment."""
_M1, _M2 = 0xBF58476D1CE4E5B9 - 2**64, 0x94D049BB133111EB - 2**64
"""splitmix64's multipliers, as signed int64."""
_CHUNK = 1 << 16
"""Elements hashed per batch of tensor ops: two int64 work buffers of 512 KiB, small enough to stay
in a CPU core's cache, each op writing into them in place (a fresh tensor per op costs more in page
faults than the op itself)."""
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""Element size in bytes -> the integer dtype its bit pattern is read as."""


def _mix_(z: torch.Tensor, work: torch.Tensor) -> None:
    """splitmix64's finalizer on int64 ``z``, elementwise and in place (a bijection of the 64-bit
    words); ``work`` is scratch space of ``z``'s shape."""
    for shift, multiplier in ((30, _M1), (27, _M2), (31, None)):
        torch.bitwise_right_shift(z, shift, out=work)
        z ^= work.bitwise_and_(
            (1 << (64 - shift)) - 1
        )  # logical right shift (``>>`` on int64 is arithmetic)
        if multiplier is not None:
            z *= multiplier


def tensor_key(names: tuple[str, ...], dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    """The signed 64-bit key of a tensor: blake2b of ``"name1,name2|dtype|shape"``."""
    text = f"{','.join(names)}|{dtype}|{tuple(shape)}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)


def _global_indices(tensor: torch.Tensor) -> tuple[list[torch.Tensor], tuple[int, ...]] | None:
    """Per tensor dimension, the global index of each local position (int64 vectors, local lengths),
    and the global offset of the local box; ``None`` on a rank outside the DTensor's mesh.

    Raises:
        ValueError: a placement other than ``Shard``, ``_StridedShard`` and ``Replicate``, or a
            local shard whose shape is not the one its placements give.
    """
    if not isinstance(tensor, DTensor):
        return [torch.arange(n, device=tensor.device) for n in tensor.shape], (0,) * tensor.dim()
    if tensor.device_mesh.get_coordinate() is None:
        return None
    try:
        local, local_shape, offset = local_box(tensor)
    except ValueError as err:
        raise ValueError(
            f"model_fingerprint: {err}; extend _global_indices with its global indices"
        ) from None
    if tuple(local.shape) != tuple(local_shape):
        raise ValueError(
            f"model_fingerprint: local shard {tuple(local.shape)} is not the "
            f"{tuple(local_shape)} its placements {tensor.placements} give"
        )
    return [
        torch.arange(o, o + n, device=tensor.device)
        for o, n in zip(offset, local_shape, strict=True)
    ], tuple(offset)


def _local_sum(
    key: int, local: torch.Tensor, indices: list[torch.Tensor], shape: tuple[int, ...]
) -> torch.Tensor:
    """Sum mod 2**64 of the element hashes of ``local`` (a shard whose dim ``d`` sits at
    ``indices[d]`` of a global tensor of ``shape``): a 0-dim int64 tensor."""
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    if local.dim() == 0:
        local, indices, strides = (
            local.reshape(1),
            [torch.zeros(1, dtype=torch.int64, device=local.device)],
            [0],
        )
    bits = local.detach().view(_BITS[local.element_size()])
    # key + flat * GOLDEN with flat = sum_d indices[d] * strides[d]: int64 products and sums wrap
    # mod 2**64, so the
    # product distributes over the sum; the terms of dims 1.. are one pattern (n_1, ..., n_d) shared
    # by every row
    pattern = torch.zeros((), dtype=torch.int64, device=local.device)
    for d in range(1, local.dim()):
        pattern = pattern + (indices[d] * strides[d] * _GOLDEN).view(
            -1, *[1] * (local.dim() - 1 - d)
        )
    starts = (key + indices[0] * strides[0] * _GOLDEN).view(
        -1, *[1] * (local.dim() - 1)
    )  # (n_0, 1, ..., 1)
    total = torch.zeros((), dtype=torch.int64, device=local.device)
    row = max(1, local[0].numel()) if local.shape[0] else 1
    step = max(1, _CHUNK // row)
    for start in range(0, local.shape[0], step):
        rows = slice(start, start + step)
        h = torch.add(
            starts[rows],
            pattern,
            out=torch.empty(bits[rows].shape, dtype=torch.int64, device=local.device),
        )
        work = torch.empty_like(h)
        _mix_(h, work)
        h ^= work.copy_(bits[rows])  # the bit pattern, sign-extended to int64
        _mix_(h, work)
        total += h.sum()
    return total


def _box_key(key: int, offset: tuple[int, ...], local_shape: tuple[int, ...]) -> int:
    """The signed 64-bit key of one box of a tensor: blake2b of the tensor key, global offset and
    local shape."""
    text = f"{key}|{offset}|{local_shape}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)


def model_fingerprint(model: nn.Module) -> str:
    """16 hex digits: the sum mod 2**64 of every element's hash (see the module docstring).

    A collective when a process group of several ranks is initialized: call it on every rank. It
    reads only local shards; the ranks exchange one (box key, sum) pair of int64 per tensor on the
    model's device (the default group's backend must gather int64).

    Raises:
        ValueError: a tensor on meta, or a placement it cannot index (see :func:`_global_indices`).
    """
    pairs: list[torch.Tensor] = []
    device = None
    for names, tensor in tensor_groups(model):
        if tensor.device.type == "meta":
            raise ValueError(
                f"model_fingerprint: {' = '.join(names)} is on meta; materialize and initialize "
                "first"
            )
        device = (
            device or tensor.device
        )  # the first tensor's device, which the default group's backend reduces
        found = _global_indices(tensor)
        if found is None:
            continue
        indices, offset = found
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        key = tensor_key(names, tensor.dtype, tuple(tensor.shape))
        box = torch.tensor(
            _box_key(key, offset, tuple(local.shape)), dtype=torch.int64, device=device
        )
        pairs.append(
            torch.stack([box, _local_sum(key, local, indices, tuple(tensor.shape)).to(device)])
        )
    rows = torch.stack(pairs) if pairs else torch.zeros((0, 2), dtype=torch.int64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        count = torch.tensor(len(pairs), device=rows.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        padded = torch.zeros(
            (int(count.item()), 2), dtype=torch.int64, device=rows.device
        )  # (0, 0): adds nothing
        padded[: len(pairs)] = rows
        rows = torch.empty(
            (dist.get_world_size() * padded.shape[0], 2), dtype=torch.int64, device=rows.device
        )
        dist.all_gather_single(rows, padded)
    total = torch.unique(rows, dim=0)[:, 1].sum()
    return f"{int(total.item()) % 2**64:016x}"
