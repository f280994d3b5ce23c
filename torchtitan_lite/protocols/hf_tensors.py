"""How one of our tensors is made of Hugging Face checkpoint tensors, both ways, read by boxes.

A state-dict adapter (:mod:`.state_dict_adapter`) maps each of our state names to one of the kinds
below. Import reads only the box of our tensor a rank holds (``box``: ``(start, stop)`` per
dimension of OUR tensor, e.g. an FSDP or TP shard) through a ``reader`` with
``reader.read(hf_name, hf_box) -> tensor`` (the checkpoint's values of that box, dequantized when
the file is quantized); each kind turns our box into the HF boxes it needs, so no rank reads a whole
tensor it only holds a slice of. Export turns our full tensor into the HF tensors (:meth:`to_hf`).

Kinds: :class:`Same` (one HF tensor, same layout), :class:`Transposed` (GPT-OSS experts: HF stores
``(E, in, out)``, we ``(E, out, in)``), :class:`Stacked` (MoE experts that published checkpoints
store one tensor per expert, ``mlp.experts.{e}.gate_proj.weight``), :class:`RowPermuted` (DeepSeek's
RoPE rows, ``models/deepseek_v3/state_dict_adapter.py``), :class:`WithCopies` (a tensor the
checkpoint also stores under other names: DeepSeek-V3's MTP ``embed_tokens`` and
``shared_head.head``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

Box = tuple[tuple[int, int], ...]
"""``(start, stop)`` per dimension."""


class TensorReader(Protocol):
    """What the kinds read through: the values of ``box`` of the HF tensor ``hf_name``."""

    def read(self, hf_name: str, box: Box) -> torch.Tensor: ...


@dataclass(frozen=True)
class _OneTensor:
    """A kind made of the one HF tensor ``hf_name``."""

    hf_name: str

    @property
    def hf_names(self) -> tuple[str, ...]:
        """The HF tensors it is made of."""
        return (self.hf_name,)


@dataclass(frozen=True)
class Same(_OneTensor):
    """Our tensor is the HF tensor ``hf_name`` as it is."""

    def hf_shapes(self, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """HF name -> the shape it must have for our tensor of ``shape``."""
        return {self.hf_name: shape}

    def read(self, reader: TensorReader, box: Box) -> torch.Tensor:
        """The values of ``box`` of our tensor."""
        return reader.read(self.hf_name, box)

    def to_hf(self, full: torch.Tensor) -> dict[str, torch.Tensor]:
        """HF name -> tensor, from our full tensor."""
        return {self.hf_name: full}


@dataclass(frozen=True)
class Transposed(_OneTensor):
    """Our tensor is the HF tensor ``hf_name`` with dimensions ``dims`` swapped."""

    dims: tuple[int, int]

    def _swap(self, items: tuple) -> tuple:
        a, b = self.dims
        out = list(items)
        out[a], out[b] = out[b], out[a]
        return tuple(out)

    def hf_shapes(self, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """See :meth:`Same.hf_shapes`."""
        return {self.hf_name: self._swap(shape)}

    def read(self, reader: TensorReader, box: Box) -> torch.Tensor:
        """See :meth:`Same.read`."""
        return reader.read(self.hf_name, self._swap(box)).transpose(*self.dims)

    def to_hf(self, full: torch.Tensor) -> dict[str, torch.Tensor]:
        """See :meth:`Same.to_hf`."""
        return {self.hf_name: full.transpose(*self.dims).contiguous()}


@dataclass(frozen=True)
class Stacked:
    """Our tensor ``(E, ...)`` stacks the HF tensors ``hf_names`` (one per expert ``e``, shape
    ``(...)``)."""

    hf_names: tuple[str, ...]

    def hf_shapes(self, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """See :meth:`Same.hf_shapes`."""
        return {name: shape[1:] for name in self.hf_names}

    def read(self, reader: TensorReader, box: Box) -> torch.Tensor:
        """See :meth:`Same.read`: only the experts in ``box[0]`` are read."""
        (first, stop), rest = box[0], box[1:]
        parts = [reader.read(name, rest) for name in self.hf_names[first:stop]]
        if not parts:
            return torch.empty((0, *(b - a for a, b in rest)))
        return torch.stack(parts)

    def to_hf(self, full: torch.Tensor) -> dict[str, torch.Tensor]:
        """See :meth:`Same.to_hf`."""
        return {name: full[e].contiguous() for e, name in enumerate(self.hf_names)}


@dataclass(frozen=True)
class RowPermuted(_OneTensor):
    """Our row ``i`` (dimension 0) is HF row ``perm[i]`` of ``hf_name``.

    Reading a box of rows reads the HF rows from ``min`` to ``max`` of their images: a permutation
    that moves rows only within small blocks (DeepSeek's RoPE rows, within one head) costs at most a
    block more.
    """

    perm: tuple[int, ...]

    def hf_shapes(self, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """See :meth:`Same.hf_shapes`."""
        return {self.hf_name: shape}

    def read(self, reader: TensorReader, box: Box) -> torch.Tensor:
        """See :meth:`Same.read`."""
        (first, stop), rest = box[0], box[1:]
        rows = torch.tensor(self.perm[first:stop], dtype=torch.long)
        if rows.numel() == 0:
            return reader.read(self.hf_name, box)
        low, high = int(rows.min()), int(rows.max()) + 1
        return reader.read(self.hf_name, ((low, high), *rest))[rows - low]

    def to_hf(self, full: torch.Tensor) -> dict[str, torch.Tensor]:
        """See :meth:`Same.to_hf`."""
        out = torch.empty_like(full)
        out[torch.tensor(self.perm, dtype=torch.long)] = full
        return {self.hf_name: out}


@dataclass(frozen=True)
class WithCopies(Same):
    """Our tensor is the HF tensor ``hf_name``, which export also writes as ``copies`` (the same
    values); import reads ``hf_name`` only (the adapter says why the copies are skipped)."""

    copies: tuple[str, ...] = ()

    def to_hf(self, full: torch.Tensor) -> dict[str, torch.Tensor]:
        """See :meth:`Same.to_hf`: ``hf_name`` and every copy (its own memory: safetensors refuses
        shared tensors)."""
        return {self.hf_name: full, **{name: full.clone() for name in self.copies}}


HFTensor = Same | Transposed | Stacked | RowPermuted | WithCopies
"""Any of the kinds."""
