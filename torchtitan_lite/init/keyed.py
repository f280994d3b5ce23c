"""Sharding-invariant random streams: :class:`InitKey`, keyed tiles, and filling any shard of a tensor from them.

The value of every element of a keyed tensor depends only on (seed, canonical name, the element's global
index, the distribution), whatever the device, world size or parallel layout.

Note: on keyed tiles. A tensor of global shape ``(..., R, C)`` is cut into tiles over its last two dimensions:
``tile_rows`` x ``tile_cols`` (:func:`tile_shape`, a function of the global shape only), one tile grid per
index of the leading dimensions (a 1-D tensor is one row, a 0-D tensor one element). Tile ``t`` (numbered
row-major over leading index, tile row, tile column) draws its elements in row-major order from its own
generator state, keyed by (seed, name digest, t). A rank holding a shard draws only the tiles its shard
overlaps and copies their intersection. The local shard of every DTensor placement this project uses
(``Shard`` and ``_StridedShard`` on any dimension, ``Replicate``, on 1-D to 3-D meshes: FSDP2, tensor,
expert and pipeline parallelism) is a box in global index space (``compute_local_shape_and_global_offset``),
so the work of a rank is its local elements grown to the tile boundaries: at most ``tile_rows - 1`` rows and
``tile_cols - 1`` columns more on each side of its box. Tiles are short (32 rows: FSDP2 cuts dimension 0
finely) and wide (``C / 4``: tensor parallelism cuts columns into a few power-of-two parts; a cut into 8
makes a rank draw up to twice its columns).

Note: on why the whole generator state is written. PyTorch's CPU generator keeps only the low 32 bits of a
``manual_seed``, so per-tile seeds hashed from (seed, name, tile) would collide (two identical tiles of
weights) in a large model. Instead the tile's entire MT19937 state (624 words) is written from the key: the
key itself (64-bit seed, 128-bit name digest, 64-bit tile index) verbatim in state words 1..8, and the
other words from splitmix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators",
OOPSLA 2014) of a blake2b hash of (seed, digest) and the word's position. Distinct keys give distinct
states by construction, and MT19937's twist is a bijection of its 19937 effective state bits (words 1..623
and the top bit of word 0, which is why the key avoids word 0), so distinct states give distinct streams.

Note: on drawing on the host. Tiles are drawn on the host CPU and copied to the shard's device: the values
are identical on CPU, CUDA and NPU, and no float64 tensor is created on an accelerator.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard

TILE_ROWS = 32
"""Rows of a keyed tile (fewer when the tensor has fewer rows)."""
TILE_COLS_RANGE = (64, 4096)
"""A tile is ``C / 4`` columns wide, rounded down to a power of two and clipped to this range (and to ``C``)."""

_STATE_BYTES = 5056
_STATE_WORDS_OFFSET = 24
"""Layout of torch's CPU generator state (aten/src/ATen/CPUGeneratorImpl.cpp, CPUGeneratorImplState):
the_initial_seed u64 @0, left i32 @8, seeded i32 @12, next u64 @16, state[624] u64 @24,
normal_x/y/rho f64 @5016, normal_is_valid i32 @5040, next_float_normal_sample f32 @5048,
is_next_float_normal_sample_valid bool @5052; 5056 bytes with padding."""
_MT_WORDS = 624


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
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**64:
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


def mt_state_from_words(words: np.ndarray, initial_seed: int) -> torch.Tensor:
    """A ``(5056,)`` uint8 CPU-generator state holding the 624 MT19937 ``words`` (values < 2**32)."""
    return torch.from_numpy(_states_from_words(np.asarray(words, dtype="<u8")[None], initial_seed)[0])


def _states_from_words(words: np.ndarray, initial_seed: int) -> np.ndarray:
    """``(n, 5056)`` uint8 generator states from ``(n, 624)`` uint64 MT words: ``left = 1`` and ``next = 0``
    make the first draw twist the state, as after ``manual_seed``; no cached normal."""
    states = np.zeros((words.shape[0], _STATE_BYTES), dtype=np.uint8)
    states[:, 0:8] = np.frombuffer(initial_seed.to_bytes(8, "little"), dtype=np.uint8)
    states[:, 8:16] = np.array([1, 1], dtype="<i4").view(np.uint8)  # left = 1, seeded = 1
    states[:, _STATE_WORDS_OFFSET : _STATE_WORDS_OFFSET + _MT_WORDS * 8] = words.astype("<u8").view(np.uint8)
    return states


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 output function of the uint64 array ``z`` (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def keyed_states(seed: int, digest: bytes, tiles: np.ndarray) -> np.ndarray:
    """The generator states of tiles ``tiles`` (int64 ``(n,)``) of the stream ``(seed, digest)``: ``(n, 5056)``
    uint8, one ``torch.Generator.set_state`` argument per row (see the note on the whole generator state)."""
    tiles = np.asarray(tiles, dtype=np.uint64)
    base = np.frombuffer(hashlib.blake2b(seed.to_bytes(8, "little") + digest, digest_size=8).digest(), dtype="<u8")[0]
    counters = tiles[:, None] * np.uint64(_MT_WORDS // 2) + np.arange(_MT_WORDS // 2, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = _splitmix64(base + counters * np.uint64(0x9E3779B97F4A7C15))  # (n, 312) uint64
    words = mixed.view("<u4").astype(np.uint64)  # (n, 624)
    key_words = np.frombuffer(seed.to_bytes(8, "little") + digest, dtype="<u4").astype(np.uint64)  # 6 words
    words[:, 1:7] = key_words
    words[:, 7] = tiles & np.uint64(0xFFFFFFFF)
    words[:, 8] = tiles >> np.uint64(32)
    return _states_from_words(words, seed)


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(L, R, C)``: leading elements, rows and columns of the tile grid of a tensor of ``shape``
    (a 1-D tensor is ``(1, 1, n)``, a 0-D tensor ``(1, 1, 1)``)."""
    if len(shape) < 2:
        return 1, 1, (shape[0] if shape else 1)
    return math.prod(shape[:-2]), shape[-2], shape[-1]


def tile_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """``(tile_rows, tile_cols)`` of a tensor of global ``shape`` (see the note on keyed tiles)."""
    _, rows, cols = matrix_shape(shape)
    lo, hi = TILE_COLS_RANGE
    width = 1 << max(0, (cols // 4).bit_length() - 1)
    return min(rows, TILE_ROWS), min(cols, max(lo, min(hi, width)))


def local_box(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """``(local tensor, local shape, global offset)`` of a plain tensor or a DTensor shard.

    Raises:
        ValueError: a DTensor placement other than ``Shard`` (incl. ``_StridedShard``) or ``Replicate``.
    """
    if not isinstance(tensor, DTensor):
        return tensor, tuple(tensor.shape), (0,) * tensor.dim()
    for placement in tensor.placements:
        if not isinstance(placement, (Shard, _StridedShard, Replicate)):
            raise ValueError(f"unsupported DTensor placement {placement}; only Shard, _StridedShard and Replicate are supported "
                             "(initialize before making it Partial)")
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    return tensor.to_local(), tuple(shape), tuple(offset)


class TileDrawer(Protocol):
    """Draws one keyed tile: ``draw(buffer, n, generator)`` fills ``buffer[:n]`` (1-D contiguous CPU tensor of at
    least ``n + spare(n)`` elements) from ``generator``; the values depend only on its state and ``n``."""

    def spare(self, n: int) -> int: ...

    def draw(self, buffer: torch.Tensor, n: int, generator: torch.Generator) -> None: ...


def keyed_fill(tensor: torch.Tensor, key: InitKey, work_dtype: torch.dtype, sampler: TileDrawer,
               write: Callable[[torch.Tensor, torch.Tensor], None]) -> None:
    """Fill this rank's part of ``tensor`` (plain or DTensor) from the keyed tiles of ``key``.

    Args:
        tensor: the tensor to fill, global shape ``tensor.shape``.
        key: the stream.
        work_dtype: dtype the tiles are drawn in (float32, or float64 for float64 tensors).
        sampler: draws one tile from a generator state (the distribution; a :class:`TileDrawer`).
        write: ``write(target, values)`` copies ``values`` (same shape, ``work_dtype``) into the local
            ``target`` (rounding and clamping to the target dtype).

    Raises:
        ValueError: see :func:`local_box` (the message names the key).
    """
    shape = tuple(tensor.shape)
    try:
        local, shape_local, offset = local_box(tensor)
    except ValueError as err:
        raise ValueError(f"trunc_normal_: key={key.name!r}: {err}") from None
    if local.numel() == 0:
        return
    if not local.is_contiguous():
        values = torch.empty(shape_local, dtype=local.dtype, device=local.device)
        keyed_fill_local(values, shape, offset, key, work_dtype, sampler, write)
        local.copy_(values)
        return
    keyed_fill_local(local, shape, offset, key, work_dtype, sampler, write)


def keyed_fill_local(local: torch.Tensor, shape: tuple[int, ...], offset: tuple[int, ...], key: InitKey,
                     work_dtype: torch.dtype, sampler: TileDrawer,
                     write: Callable[[torch.Tensor, torch.Tensor], None]) -> None:
    """Fill the contiguous ``local`` box (global ``offset``) of a tensor of global ``shape`` from its keyed
    tiles; the arguments are those of :func:`keyed_fill`."""
    shape_local = tuple(local.shape)
    _, rows, cols = matrix_shape(shape)
    tile_r, tile_c = tile_shape(shape)
    n_rt, n_ct = -(-rows // tile_r), -(-cols // tile_c)
    lead_shape = shape[:-2] if len(shape) >= 2 else ()
    lead_local = shape_local[:-2] if len(shape) >= 2 else ()
    lead_offset = offset[:-2] if len(shape) >= 2 else ()
    (r0, rs), (c0, cs) = ((offset[-2], shape_local[-2]), (offset[-1], shape_local[-1])) if len(shape) >= 2 else (
        (0, 1), ((offset[0], shape_local[0]) if shape else (0, 1)))
    rt0, rt1 = r0 // tile_r, (r0 + rs - 1) // tile_r
    ct0, ct1 = c0 // tile_c, (c0 + cs - 1) // tile_c
    target = local.view(-1, rs, cs)  # (leading elements of the box, rows, cols)
    tile_n = tile_r * tile_c
    buffer = torch.empty(tile_n + sampler.spare(tile_n), dtype=work_dtype)
    generator, digest = torch.Generator(), key.digest
    for i, lead in enumerate(np.ndindex(*lead_local) if lead_local else [()]):
        lead_index = int(np.ravel_multi_index(tuple(o + x for o, x in zip(lead_offset, lead)), lead_shape)) \
            if lead_shape else 0
        tiles = ((lead_index * n_rt + np.arange(rt0, rt1 + 1))[:, None] * n_ct + np.arange(ct0, ct1 + 1)).ravel()
        states = keyed_states(key.seed, digest, tiles)
        box = target[i]
        for k in range(tiles.size):
            rt, ct = rt0 + k // (ct1 - ct0 + 1), ct0 + k % (ct1 - ct0 + 1)
            tr, tc = min(tile_r, rows - rt * tile_r), min(tile_c, cols - ct * tile_c)
            generator.set_state(torch.from_numpy(states[k]))
            sampler.draw(buffer, tr * tc, generator)
            # the tile's rows and columns inside the box
            a0, a1 = max(r0, rt * tile_r), min(r0 + rs, rt * tile_r + tr)
            b0, b1 = max(c0, ct * tile_c), min(c0 + cs, ct * tile_c + tc)
            tile = buffer[: tr * tc].view(tr, tc)
            write(box[a0 - r0 : a1 - r0, b0 - c0 : b1 - c0],
                  tile[a0 - rt * tile_r : a1 - rt * tile_r, b0 - ct * tile_c : b1 - ct * tile_c])
