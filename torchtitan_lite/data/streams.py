"""Each rank's iterable datasets: its share of the seeded global window stream (training), of the
validation windows in order, or of a streamed dataset packed on the fly; and the collate function of
their batches.

The global stream's state is a global position, so it resumes exactly on any world size
(``docs/design.md``, "Data: the global window stream"); a streamed dataset resumes on the same world
size only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset

from torchtitan_lite.data.documents import document_ids_from_eos
from torchtitan_lite.data.mixing import Mixture
from torchtitan_lite.data.tokenizer import Tokenizer
from torchtitan_lite.data.windows import PackedWindows
from torchtitan_lite.errors import InputError

if TYPE_CHECKING:
    import datasets


def rank_chunk(local_chunk: int, dp_rank: int, dp_world_size: int, rank_block: int = 1) -> int:
    """Global index of rank ``dp_rank``'s ``local_chunk``-th chunk (micro-batch) when each of the
    ``dp_world_size`` ranks takes the aligned block of ``rank_block`` consecutive chunks of every
    ``rank_block * dp_world_size`` (``rank_block = 1``: chunks interleave over the ranks;
    ``training.deterministic = "layout"`` uses the micro-batches per rank, see
    ``distributed/deterministic.py``)."""
    block, within = divmod(local_chunk, rank_block)
    return (block * dp_world_size + dp_rank) * rank_block + within


class GlobalWindowStream(IterableDataset):
    """Rank ``dp_rank``'s share of the infinite, seeded global window stream (training, map-style).

    Epoch ``e`` of a source is ``randperm(n_windows)`` seeded with ``seed + e`` (source ``k > 0`` of
    a mixture: ``seed + e + k * 2**32``); from the start position (0, or the one loaded) rank ``r``
    of ``W`` takes the chunks ``c % W == r`` of ``local_batch_size`` windows, or with
    ``rank_block = m`` > 1 the aligned blocks of ``m`` consecutive chunks (:func:`rank_chunk`). With
    several sources (``windows`` a list, ``weights`` given), global position ``g`` is window
    ``Mixture.locate(g)`` of its source's own stream (``data/mixing.py``). The state is the global
    position ``windows_consumed`` (``k * G`` after ``k`` steps of global batch ``G``), valid for any
    world size and batch size.
    """

    world_size_invariant = True
    """The state is a global position: it loads with any ``dp_world_size`` (read by the
    checkpointer)."""

    def __init__(
        self,
        windows: PackedWindows | list[PackedWindows],
        *,
        local_batch_size: int,
        dp_rank: int,
        dp_world_size: int,
        seed: int,
        weights: list[float] | None = None,
        rank_block: int = 1,
    ):
        self.windows, self._rank_block = windows, rank_block
        self.sources = windows if isinstance(windows, list) else [windows]
        self.mixture = Mixture(weights) if weights is not None else None
        sizes = [len(w) for w in self.sources]
        self._settings = {
            "n_windows": sizes[0] if self.mixture is None else sizes,
            "seq_len": self.sources[0].seq_len,
            "seed": seed,
        }
        if self.mixture is not None:
            self._settings["quotas"] = self.mixture.quotas
        self._local_batch_size, self._dp_rank, self._dp_world_size = (
            local_batch_size,
            dp_rank,
            dp_world_size,
        )
        self._start = 0  # global position of this stream's first window
        self._consumed = 0  # windows this rank has yielded since start
        self._perms: dict[int, tuple[int, torch.Tensor]] = {}  # source -> (epoch, its permutation)

    def _global_index(self, local_index: int) -> int:
        """Index in the global stream of this rank's ``local_index``-th window since ``start``."""
        chunk = rank_chunk(
            local_index // self._local_batch_size,
            self._dp_rank,
            self._dp_world_size,
            self._rank_block,
        )
        return self._start + chunk * self._local_batch_size + local_index % self._local_batch_size

    def _permutation(self, source: int, epoch: int) -> torch.Tensor:
        if self._perms.get(source, (None,))[0] != epoch:
            gen = torch.Generator().manual_seed(self._settings["seed"] + epoch + (source << 32))
            self._perms[source] = epoch, torch.randperm(len(self.sources[source]), generator=gen)
        return self._perms[source][1]

    def locate(self, position: int) -> tuple[int, int]:
        """``(source, window)``: the window at global ``position`` (source 0 without a mixture)."""
        source, index = (0, position) if self.mixture is None else self.mixture.locate(position)
        epoch, i = divmod(index, len(self.sources[source]))
        return source, int(self._permutation(source, epoch)[i])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            source, window = self.locate(self._global_index(self._consumed))
            self._consumed += 1
            yield self.sources[source][window]

    def repeated_targets(self, positions: int) -> float:
        """Share of the targets equal to their input token (``labels == input_ids``) in the
        ``positions`` windows from the start position on (the first step's whole global batch when
        ``positions`` is its size in windows, whatever this rank's share): reads
        ``positions * (seq_len + 1)`` tokens, moves no position."""
        same = total = 0
        for position in range(self._start, self._start + positions):
            source, window = self.locate(position)
            inputs, labels = self.sources[source][window][:2]
            same += int((inputs == labels).sum())
            total += labels.numel()
        return same / total

    def windows_per_source(self, positions: int) -> list[int]:
        """Windows each source fills among the first ``positions`` of the global stream."""
        return [positions] if self.mixture is None else self.mixture.counts(positions)

    def state_dict(self) -> dict[str, Any]:
        """``{"windows_consumed", "n_windows", "seq_len", "seed"}`` (and ``"quotas"`` of a mixture,
        whose ``n_windows`` is a list per source): the global position (epoch
        ``windows_consumed // n_windows``, index ``windows_consumed % n_windows`` into its
        permutation)."""
        return {
            "windows_consumed": self._start + self._consumed * self._dp_world_size,
            **self._settings,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from the global position of ``state`` (from :meth:`state_dict`, saved with any
        world size).

        Raises:
            InputError: ``state`` was saved with other data, seq_len, seed or weights.
        """
        diff = [
            f"{k}={state.get(k)} (now {v})" for k, v in self._settings.items() if state.get(k) != v
        ]
        if diff:
            name = ", ".join(w.name for w in self.sources)
            raise InputError(
                f"data loader state of {name} was saved with {', '.join(diff)}; "
                "resume with the data, seq_len, seed and weights of the saved run"
            )
        self._start, self._consumed = state["windows_consumed"], 0


class OrderedWindows(IterableDataset):
    """Rank ``dp_rank``'s share of the validation windows, in order, ending (see the module
    docstring).

    The windows are read in whole batches of ``batch_windows`` (default
    ``local_batch_size * dp_world_size``; the trainer passes its global batch, so the windows read
    do not depend on the layout), as chunks of ``local_batch_size``; rank ``r`` takes the chunks
    ``c % dp_world_size == r``: its ``i``-th batch is global chunk ``i * dp_world_size + dp_rank``
    (:func:`rank_chunk`).

    Raises:
        InputError: fewer than ``batch_windows`` windows (not one batch per rank).
        ValueError: ``batch_windows`` is not a multiple of ``local_batch_size * dp_world_size``.
    """

    def __init__(
        self,
        windows: PackedWindows,
        *,
        local_batch_size: int,
        dp_rank: int,
        dp_world_size: int,
        batch_windows: int | None = None,
    ):
        batch_windows = batch_windows or local_batch_size * dp_world_size
        if batch_windows % (local_batch_size * dp_world_size):
            raise ValueError(
                f"OrderedWindows: batch_windows {batch_windows} is not a multiple of "
                f"local_batch_size {local_batch_size} * dp_world_size {dp_world_size}"
            )
        if len(windows) < batch_windows:
            raise InputError(
                f"{windows.name} has {len(windows)} windows of seq_len {windows.seq_len}, fewer "
                f"than one global batch = {batch_windows}; "
                "use more validation data, a smaller seq_len or a smaller global batch"
            )
        n_chunks = len(windows) // batch_windows * (batch_windows // local_batch_size)
        self.windows = windows
        self._chunks = range(dp_rank, n_chunks, dp_world_size)
        self._local_batch_size = local_batch_size

    def __len__(self) -> int:
        return len(self._chunks) * self._local_batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for chunk in self._chunks:
            for i in range(chunk * self._local_batch_size, (chunk + 1) * self._local_batch_size):
                yield self.windows[i]


class StreamingWindows(IterableDataset):
    """Windows packed on the fly from this rank's part of a streaming ``datasets.IterableDataset``.

    Documents in stream order, each followed by the EOS, forever; the state (epoch, stream state,
    unused tokens) resumes exactly with the same ``dp_rank`` and ``dp_world_size``. ``restart=True``
    (validation) starts every new iterator from the beginning. ``documents``: each window also
    carries its document ids, from the EOS this loader puts after each document
    (:func:`~torchtitan_lite.data.documents.document_ids_from_eos`).

    Raises (while iterating):
        InputError: a document without ``text_column``, or no document in this rank's share.
    """

    world_size_invariant = False
    """The state is this rank's position in its own part of the stream (read by the
    checkpointer)."""

    def __init__(
        self,
        stream: datasets.IterableDataset,
        *,
        tokenizer: Tokenizer,
        text_column: str,
        seq_len: int,
        dp_rank: int,
        dp_world_size: int,
        name: str,
        restart: bool = False,
        documents: bool = False,
    ):
        from datasets.distributed import split_dataset_by_node

        self._stream = split_dataset_by_node(stream, rank=dp_rank, world_size=dp_world_size)
        self._tokenizer, self._text_column, self._seq_len, self.name = (
            tokenizer,
            text_column,
            seq_len,
            name,
        )
        self._restart, self._documents = restart, documents
        self._epoch, self._buffer, self._stream_state = 0, [], None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        if self._restart:
            self._epoch, self._buffer, self._stream_state = 0, [], None
        while True:
            self._stream.set_epoch(self._epoch)
            from_start, documents = self._stream_state is None, 0
            if not from_start:
                self._stream.load_state_dict(self._stream_state)
            for document in self._stream:
                documents += 1
                if self._text_column not in document:
                    raise InputError(
                        f"{self.name} has no text column '{self._text_column}' "
                        f"(columns: {', '.join(document)}); set text_column"
                    )
                self._buffer += self._tokenizer.encode(document[self._text_column]) + [
                    self._tokenizer.eos_id
                ]
                self._stream_state = self._stream.state_dict()
                while len(self._buffer) > self._seq_len:
                    window = torch.tensor(self._buffer[: self._seq_len + 1], dtype=torch.long)
                    del self._buffer[: self._seq_len]
                    if self._documents:
                        ids = document_ids_from_eos(window[None, :-1], self._tokenizer.eos_id)[0]
                        yield window[:-1], window[1:], ids
                    else:
                        yield window[:-1], window[1:]
            if from_start and documents == 0:
                raise InputError(
                    f"{self.name}: this rank's share of the stream holds no document (a stream is "
                    "split between ranks by position); use more data or fewer ranks"
                )
            self._epoch, self._stream_state = self._epoch + 1, None

    def state_dict(self) -> dict[str, Any]:
        """The epoch, the stream's state after the last document read, and the unused tokens."""
        return {"epoch": self._epoch, "stream": self._stream_state, "buffer": list(self._buffer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`)."""
        self._epoch, self._stream_state, self._buffer = (
            state["epoch"],
            state["stream"],
            list(state["buffer"]),
        )


def collate_windows(batch: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    """Stack windows into ``(input_ids, labels)``, each int64 ``(batch, seq_len)`` (and their int32
    document ids ``(batch, seq_len)`` when the windows carry them)."""
    return tuple(torch.stack(column) for column in zip(*batch, strict=True))
