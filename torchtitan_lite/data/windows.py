"""Random access to the packed windows of a token stream: :class:`PackedWindows` over a tensor in
memory or a prepared folder's :class:`TokenFile`, their document ids, and the validation part held
out of a local stream.

Window ``i`` is ``tokens[i * seq_len : (i + 1) * seq_len + 1]``; ``input_ids = window[:-1]`` and
``labels = window[1:]``, int64; ``(n_tokens - 1) // seq_len`` windows, the tail dropped.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from torchtitan_lite.errors import InputError

MAX_HELD_OUT_SHARE = 0.1
"""The largest share of a local dataset's tokens held out to give validation its minimum
(:func:`held_out_tokens`)."""


def held_out_tokens(
    n_tokens: int, val_fraction: float, *, seq_len: int, min_windows: int = 0
) -> int:
    """Tokens at the end of a local dataset's stream of ``n_tokens`` held out for validation:
    ``max(1, round(val_fraction * n_tokens))``, raised to ``min_windows * seq_len + 1``
    (``min_windows`` whole windows, the trainer's one global batch) when it holds fewer and that is
    at most :data:`MAX_HELD_OUT_SHARE` of the tokens (else left as it is: too little data for
    validation)."""
    held = max(1, round(val_fraction * n_tokens))
    need = min_windows * seq_len + 1
    return need if held < need <= MAX_HELD_OUT_SHARE * n_tokens else held


class TokenFile:
    """Items ``offset .. offset + count - 1`` of a raw token file, read on demand with ``os.pread``:
    slicing gives another :class:`TokenFile` (nothing read), :meth:`long` reads the ids as an int64
    tensor. A window is read into a buffer of its own, so the process holds no page of the file: a
    memory map counts every page it touched (and the kernel maps whole page-cache folios, hundreds
    of KB, per touch) in the resident memory, which then grows towards the file's size as training
    visits windows."""

    def __init__(self, path: Path, dtype: np.dtype, offset: int, count: int, fd: int | None = None):
        self.path, self.np_dtype, self.offset, self.count = path, dtype, offset, count
        self._fd = os.open(path, os.O_RDONLY) if fd is None else fd

    def numel(self) -> int:
        return self.count

    @property
    def dtype(self) -> torch.dtype:
        return {"uint16": torch.uint16, "uint32": torch.uint32}[self.np_dtype.name]

    def __getitem__(self, items: slice) -> TokenFile:
        begin, end, _ = items.indices(self.count)
        return TokenFile(
            self.path, self.np_dtype, self.offset + begin, max(end - begin, 0), self._fd
        )

    def numpy(self) -> np.ndarray:
        """The items as a ``dtype`` array ``(count,)``."""
        size = self.np_dtype.itemsize
        return np.frombuffer(
            os.pread(self._fd, self.count * size, self.offset * size), dtype=self.np_dtype
        )

    def long(self) -> torch.Tensor:
        """The items as an int64 tensor ``(count,)``."""
        return torch.from_numpy(self.numpy().astype(np.int64))

    def tolist(self) -> list[int]:
        return self.numpy().tolist()


class TokenFiles:
    """Several :class:`TokenFile` of one dtype read as one stream, one after another (the shards of
    a prepared set, ``data/shards.py``): slicing gives a :class:`TokenFile` when the slice lies in
    one part (a window, mostly), else another :class:`TokenFiles`; :meth:`long` reads the ids as an
    int64 tensor.

    Raises:
        ValueError: no parts, or parts of different dtypes.
    """

    def __init__(self, parts: list[TokenFile]):
        if not parts or len({p.np_dtype for p in parts}) > 1:
            raise ValueError(
                f"TokenFiles: need parts of one dtype, got {[p.np_dtype.name for p in parts]}"
            )
        self.parts, self.np_dtype = parts, parts[0].np_dtype
        self._ends = np.cumsum([p.count for p in parts])

    def numel(self) -> int:
        return int(self._ends[-1])

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    def __getitem__(self, items: slice) -> TokenFile | TokenFiles:
        begin, end, _ = items.indices(self.numel())
        if end <= begin:
            return self.parts[0][0:0]
        first, last = np.searchsorted(self._ends, [begin, end - 1], side="right")
        parts = []
        for k in range(int(first), int(last) + 1):
            offset = int(self._ends[k]) - self.parts[k].count
            parts.append(self.parts[k][max(begin - offset, 0) : end - offset])
        return parts[0] if len(parts) == 1 else TokenFiles(parts)

    def numpy(self) -> np.ndarray:
        """The items as a ``dtype`` array ``(numel,)``."""
        return np.concatenate([p.numpy() for p in self.parts])

    def long(self) -> torch.Tensor:
        """The items as an int64 tensor ``(numel,)``."""
        return torch.from_numpy(self.numpy().astype(np.int64))

    def tolist(self) -> list[int]:
        return self.numpy().tolist()


class PackedWindows:
    """Random access to the windows of an int token stream ``(n_tokens,)`` (module docstring; a
    tensor in memory or a prepared folder's ``TokenFile``); ``starts`` are the int64 positions in
    ``tokens`` where documents start (``None``: unknown); ``name`` is the source, for messages;
    ``documents``: each window also carries its :func:`document_ids` (document masking).

    Raises:
        InputError: fewer than ``seq_len + 1`` tokens (not one window).
        ValueError: ``documents`` without ``starts``.
    """

    def __init__(
        self,
        tokens: torch.Tensor,
        seq_len: int,
        name: str,
        starts: np.ndarray | None = None,
        documents: bool = False,
    ):
        if tokens.numel() < seq_len + 1:
            raise InputError(
                f"{name} has {tokens.numel()} tokens, fewer than one window of seq_len + 1 = "
                f"{seq_len + 1}; use more data or a smaller seq_len"
            )
        if documents and starts is None:
            raise ValueError(f"{name}: document ids asked for, but the document starts are unknown")
        self.tokens, self.seq_len, self.name, self.starts, self.documents = (
            tokens,
            seq_len,
            name,
            starts,
            documents,
        )

    def __len__(self) -> int:
        return (self.tokens.numel() - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        """``(input_ids, labels)`` of window ``i``: two int64 tensors ``(seq_len,)``; with
        ``documents`` also its int32 :func:`document_ids` ``(seq_len,)``."""
        window = self.tokens[i * self.seq_len : (i + 1) * self.seq_len + 1].long()
        if self.documents:
            return window[:-1], window[1:], document_ids(self.document_starts(i), self.seq_len)
        return window[:-1], window[1:]

    def document_starts(self, i: int) -> torch.Tensor:
        """Positions in window ``i``'s ``input_ids`` where a document starts: int64 ``(n,)``,
        ascending, in ``[0, seq_len)`` (a document ends with its EOS; the next starts right after
        it).

        Raises:
            ValueError: the document starts are unknown (``starts`` is ``None``).
        """
        if self.starts is None:
            raise ValueError(f"{self.name}: document starts are unknown for this source")
        begin = i * self.seq_len
        lo, hi = np.searchsorted(self.starts, [begin, begin + self.seq_len])
        return torch.from_numpy(np.asarray(self.starts[lo:hi], dtype=np.int64) - begin)


def document_ids(starts: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The document of each position of a window: int32 ``(seq_len,)``, counted from the window's
    start (0 up to its first document start after position 0, then 1, ...), from ``starts`` of
    :meth:`PackedWindows.document_starts`; positions with equal ids may attend to each other."""
    ids = torch.zeros(seq_len, dtype=torch.int32)
    ids[starts[starts > 0]] = 1
    return ids.cumsum(0, dtype=torch.int32)


def slice_windows(windows: PackedWindows, begin: int, end: int, name: str) -> PackedWindows:
    """The windows of tokens ``begin .. end - 1`` of ``windows``' stream (document starts shifted to
    match)."""
    starts = None
    if windows.starts is not None:
        lo, hi = np.searchsorted(windows.starts, [begin, end])
        starts = np.asarray(windows.starts[lo:hi], dtype=np.int64) - begin
    return PackedWindows(
        windows.tokens[begin:end], windows.seq_len, name, starts, windows.documents
    )


class ConcatWindows:
    """The windows of several :class:`PackedWindows` one after another (the validation windows of
    mixed sources)."""

    def __init__(self, parts: list[PackedWindows], name: str):
        self.parts, self.name, self.seq_len = parts, name, parts[0].seq_len
        self._ends = np.cumsum([len(p) for p in parts])

    def __len__(self) -> int:
        return int(self._ends[-1])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        k = int(np.searchsorted(self._ends, i, side="right"))
        return self.parts[k][i - (int(self._ends[k - 1]) if k else 0)]
