"""Data: text documents -> token ids -> packed windows -> a torchdata ``StatefulDataLoader``.

Sources: ``dataset="shakespeare"``, the plays of :mod:`~torchtitan_lite.data.corpus` (one document per
play; ``validation`` is ``the-tempest``, ``train`` the other 37); local files (``dataset_path``: a
``.txt``/``.jsonl``/``.json``/``.parquet`` file or a folder of one format, read by ``datasets.load_dataset``;
a ``.txt`` file is one document, other rows are documents from ``text_column``; the end of the token stream is
the validation split, 1% or one global batch, see :func:`held_out_tokens`); ``dataset="hf"``, a hub dataset.

Packing: every document's ids and the EOS, concatenated into one stream of ``n_tokens`` ids: memory-mapped from a
prepared folder (``data/prepared.py``; raw local files and the plays are prepared on first use into a cache), or
int32 in memory for a downloaded hub dataset. Window ``i`` is ``tokens[i * seq_len : (i + 1) * seq_len + 1]``;
``input_ids = window[:-1]`` and ``labels = window[1:]``, int64; ``(n_tokens - 1) // seq_len`` windows, the tail
dropped.

Map-style training data is one infinite, seeded global window stream that ranks take in chunks of
``local_batch_size``; its state is the global position, so it resumes exactly on any world size (see
``docs/design.md``, "Data: the global window stream"). Validation reads its windows in order and ends, with
the same number of batches on every rank. Several local sources (``dataset_paths``) are mixed by weight over the
global stream (``data/mixing.py``). Streaming data is read per rank (``split_dataset_by_node``), in
stream order, forever; it resumes on the same world size only. The loader runs in the main process.

``datasets`` is imported where raw files, a hub dataset or a stream are read, not with this module: it takes about
2 s per process (pandas, pyarrow, httpx), which every rank would pay at start-up while a run on prepared or cached
data never calls it.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from torchtitan_lite.data.corpus import play_files, shakespeare_plays
from torchtitan_lite.data.documents import document_ids_from_eos
from torchtitan_lite.data.files import local_data_files
from torchtitan_lite.data.mixing import Mixture
from torchtitan_lite.data.prepared import PreparedCorpus, cached_corpus, check_tokenizer, file_sources, is_prepared
from torchtitan_lite.data.progress import progress
from torchtitan_lite.data.tokenizer import Tokenizer
from torchtitan_lite.errors import InputError

if TYPE_CHECKING:
    import datasets

DATASETS = ("shakespeare", "hf")
SPLITS = ("train", "validation")
_ENCODE_DOCUMENTS = 1024  # documents per batch-encode call: bounds the memory of the library's Encoding objects
_ENCODE_CHARACTERS = 2**20  # and characters (past its first document): a progress line can come every few seconds


def local_dataset(
    path: str, text_column: str, *, streaming: bool
) -> tuple[datasets.Dataset | datasets.IterableDataset, str, list[str]]:
    """The local dataset at ``path``, its text column (always ``"text"`` for ``.txt`` files) and its files. HF
    datasets' progress bar for converting the files is off while they load: its carriage-return updates garble the
    rank logs, and the run prints its own data and tokenizing lines."""
    import datasets

    builder, files = local_data_files(path)
    if all(Path(f).stat().st_size == 0 for f in files):
        raise InputError(f"dataset_path {path} holds no documents (its files are empty); point it at non-empty data")
    options = {"sample_by": "document"} if builder == "text" else {}
    bars_were_off = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(builder, data_files=files, split="train", streaming=streaming, **options)
    finally:
        if not bars_were_off:
            datasets.enable_progress_bars()
    return ds, "text" if builder == "text" else text_column, files


def _column(ds: datasets.Dataset, text_column: str, where: str) -> list[str]:
    if text_column not in ds.column_names:
        raise InputError(
            f"{where} has no text column '{text_column}' (columns: {', '.join(ds.column_names)}); set text_column"
        )
    return list(ds[text_column])


def load_documents(
    *,
    dataset: str,
    dataset_path: str | None,
    hf_dataset_name: str | None,
    hf_dataset_config: str | None,
    text_column: str,
    split: str,
) -> tuple[list[str], str]:
    """The documents of a map-style source's split, and a short name of the source for messages.

    For local files (``dataset_path`` set) these are all the documents (training splits them by tokens).

    Raises:
        InputError: a missing text column, no documents, or see :func:`local_data_files`.
    """
    if dataset_path is not None:
        where = f"dataset_path {dataset_path}"
        docs = _column(*local_dataset(dataset_path, text_column, streaming=False)[:2], where)
    elif dataset == "hf":
        import datasets

        where = f"hub dataset {hf_dataset_name} ({hf_dataset_config or 'default'}, {split})"
        docs = _column(datasets.load_dataset(hf_dataset_name, hf_dataset_config, split=split), text_column, where)
    else:
        return [text for _, text in shakespeare_plays(split)], f"shakespeare ({split})"
    if not docs:
        raise InputError(f"{where} holds no documents; point the dataset at non-empty data")
    return docs, where


def tokenize_documents(tokenizer: Tokenizer, documents: Sequence[str]) -> torch.Tensor:
    """All documents' token ids, each followed by ``tokenizer.eos_id``, as one int32 tensor ``(n_tokens,)``."""
    eos = np.array([tokenizer.eos_id], dtype=np.int32)
    parts = []
    with progress(len(documents), "tokenizing", unit="document") as bar:
        for chunk in _encode_chunks(documents):
            for ids in tokenizer.encode_batch(chunk):
                parts += [np.asarray(ids, dtype=np.int32), eos]
            bar.update(len(chunk))
    return torch.from_numpy(np.concatenate(parts))


def _encode_chunks(documents: Sequence[str]) -> Iterator[list[str]]:
    """``documents`` in consecutive runs of at most ``_ENCODE_DOCUMENTS`` documents and ``_ENCODE_CHARACTERS``
    characters (a longer document alone)."""
    start = 0
    while start < len(documents):
        end, characters = start + 1, len(documents[start])
        while (end < len(documents) and end - start < _ENCODE_DOCUMENTS
               and characters + len(documents[end]) <= _ENCODE_CHARACTERS):
            characters += len(documents[end])
            end += 1
        yield list(documents[start:end])
        start = end


MAX_HELD_OUT_SHARE = 0.1
"""The largest share of a local dataset's tokens held out to give validation its minimum (:func:`held_out_tokens`)."""


def held_out_tokens(n_tokens: int, val_fraction: float, *, seq_len: int, min_windows: int = 0) -> int:
    """Tokens at the end of a local dataset's stream of ``n_tokens`` held out for validation:
    ``max(1, round(val_fraction * n_tokens))``, raised to ``min_windows * seq_len + 1`` (``min_windows`` whole
    windows, the trainer's one global batch) when it holds fewer and that is at most :data:`MAX_HELD_OUT_SHARE`
    of the tokens (else left as it is: too little data for validation)."""
    held = max(1, round(val_fraction * n_tokens))
    need = min_windows * seq_len + 1
    return need if held < need <= MAX_HELD_OUT_SHARE * n_tokens else held


class TokenFile:
    """Items ``offset .. offset + count - 1`` of a raw token file, read on demand with ``os.pread``: slicing gives
    another :class:`TokenFile` (nothing read), :meth:`long` reads the ids as an int64 tensor. A window is read
    into a buffer of its own, so the process holds no page of the file: a memory map counts every page it touched
    (and the kernel maps whole page-cache folios, hundreds of KB, per touch) in the resident memory, which then
    grows towards the file's size as training visits windows."""

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
        return TokenFile(self.path, self.np_dtype, self.offset + begin, max(end - begin, 0), self._fd)

    def numpy(self) -> np.ndarray:
        """The items as a ``dtype`` array ``(count,)``."""
        size = self.np_dtype.itemsize
        return np.frombuffer(os.pread(self._fd, self.count * size, self.offset * size), dtype=self.np_dtype)

    def long(self) -> torch.Tensor:
        """The items as an int64 tensor ``(count,)``."""
        return torch.from_numpy(self.numpy().astype(np.int64))

    def tolist(self) -> list[int]:
        return self.numpy().tolist()


class PackedWindows:
    """Random access to the windows of an int token stream ``(n_tokens,)`` (module docstring; a tensor in memory or
    a prepared folder's ``TokenFile``); ``starts`` are the int64 positions in ``tokens`` where documents start (``None``:
    unknown); ``name`` is the source, for messages; ``documents``: each window also carries its
    :func:`document_ids` (document masking).

    Raises:
        InputError: fewer than ``seq_len + 1`` tokens (not one window).
        ValueError: ``documents`` without ``starts``.
    """

    def __init__(self, tokens: torch.Tensor, seq_len: int, name: str, starts: np.ndarray | None = None,
                 documents: bool = False):
        if tokens.numel() < seq_len + 1:
            raise InputError(
                f"{name} has {tokens.numel()} tokens, fewer than one window of seq_len + 1 = {seq_len + 1}; "
                "use more data or a smaller seq_len"
            )
        if documents and starts is None:
            raise ValueError(f"{name}: document ids asked for, but the document starts are unknown")
        self.tokens, self.seq_len, self.name, self.starts, self.documents = tokens, seq_len, name, starts, documents

    def __len__(self) -> int:
        return (self.tokens.numel() - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        """``(input_ids, labels)`` of window ``i``: two int64 tensors ``(seq_len,)``; with ``documents`` also its
        int32 :func:`document_ids` ``(seq_len,)``."""
        window = self.tokens[i * self.seq_len : (i + 1) * self.seq_len + 1].long()
        if self.documents:
            return window[:-1], window[1:], document_ids(self.document_starts(i), self.seq_len)
        return window[:-1], window[1:]

    def document_starts(self, i: int) -> torch.Tensor:
        """Positions in window ``i``'s ``input_ids`` where a document starts: int64 ``(n,)``, ascending, in
        ``[0, seq_len)`` (a document ends with its EOS; the next starts right after it).

        Raises:
            ValueError: the document starts are unknown (``starts`` is ``None``).
        """
        if self.starts is None:
            raise ValueError(f"{self.name}: document starts are unknown for this source")
        begin = i * self.seq_len
        lo, hi = np.searchsorted(self.starts, [begin, begin + self.seq_len])
        return torch.from_numpy(np.asarray(self.starts[lo:hi], dtype=np.int64) - begin)


def document_ids(starts: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The document of each position of a window: int32 ``(seq_len,)``, counted from the window's start (0 up to
    its first document start after position 0, then 1, ...), from ``starts`` of
    :meth:`PackedWindows.document_starts`; positions with equal ids may attend to each other."""
    ids = torch.zeros(seq_len, dtype=torch.int32)
    ids[starts[starts > 0]] = 1
    return ids.cumsum(0, dtype=torch.int32)


def _slice(windows: PackedWindows, begin: int, end: int, name: str) -> PackedWindows:
    """The windows of tokens ``begin .. end - 1`` of ``windows``' stream (document starts shifted to match)."""
    starts = None
    if windows.starts is not None:
        lo, hi = np.searchsorted(windows.starts, [begin, end])
        starts = np.asarray(windows.starts[lo:hi], dtype=np.int64) - begin
    return PackedWindows(windows.tokens[begin:end], windows.seq_len, name, starts, windows.documents)


class ConcatWindows:
    """The windows of several :class:`PackedWindows` one after another (the validation windows of mixed sources)."""

    def __init__(self, parts: list[PackedWindows], name: str):
        self.parts, self.name, self.seq_len = parts, name, parts[0].seq_len
        self._ends = np.cumsum([len(p) for p in parts])

    def __len__(self) -> int:
        return int(self._ends[-1])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        k = int(np.searchsorted(self._ends, i, side="right"))
        return self.parts[k][i - (int(self._ends[k - 1]) if k else 0)]


def rank_chunk(local_chunk: int, dp_rank: int, dp_world_size: int, rank_block: int = 1) -> int:
    """Global index of rank ``dp_rank``'s ``local_chunk``-th chunk (micro-batch) when each of the ``dp_world_size``
    ranks takes the aligned block of ``rank_block`` consecutive chunks of every ``rank_block * dp_world_size``
    (``rank_block = 1``: chunks interleave over the ranks; ``training.deterministic = "layout"`` uses the micro-batches
    per rank, see ``distributed/deterministic.py``)."""
    block, within = divmod(local_chunk, rank_block)
    return (block * dp_world_size + dp_rank) * rank_block + within


class GlobalWindowStream(IterableDataset):
    """Rank ``dp_rank``'s share of the infinite, seeded global window stream (training, map-style).

    Epoch ``e`` of a source is ``randperm(n_windows)`` seeded with ``seed + e`` (source ``k > 0`` of a mixture:
    ``seed + e + k * 2**32``); from the start position (0, or the one loaded) rank ``r`` of ``W`` takes the chunks
    ``c % W == r`` of ``local_batch_size`` windows, or with ``rank_block = m`` > 1 the aligned blocks of ``m``
    consecutive chunks (:func:`rank_chunk`). With several sources (``windows`` a list, ``weights`` given),
    global position ``g`` is window ``Mixture.locate(g)`` of its source's own stream (``data/mixing.py``). The state
    is the global position ``windows_consumed`` (``k * G`` after ``k`` steps of global batch ``G``), valid for any
    world size and batch size.
    """

    world_size_invariant = True
    """The state is a global position: it loads with any ``dp_world_size`` (read by the checkpointer)."""

    def __init__(self, windows: PackedWindows | list[PackedWindows], *, local_batch_size: int, dp_rank: int,
                 dp_world_size: int, seed: int, weights: list[float] | None = None, rank_block: int = 1):
        self.windows, self._rank_block = windows, rank_block
        self.sources = windows if isinstance(windows, list) else [windows]
        self.mixture = Mixture(weights) if weights is not None else None
        sizes = [len(w) for w in self.sources]
        self._settings = {"n_windows": sizes[0] if self.mixture is None else sizes,
                          "seq_len": self.sources[0].seq_len, "seed": seed}
        if self.mixture is not None:
            self._settings["quotas"] = self.mixture.quotas
        self._local_batch_size, self._dp_rank, self._dp_world_size = local_batch_size, dp_rank, dp_world_size
        self._start = 0  # global position of this stream's first window
        self._consumed = 0  # windows this rank has yielded since start
        self._perms: dict[int, tuple[int, torch.Tensor]] = {}  # source -> (epoch, its permutation)

    def _global_index(self, local_index: int) -> int:
        """Index in the global stream of this rank's ``local_index``-th window since ``start``."""
        chunk = rank_chunk(local_index // self._local_batch_size, self._dp_rank, self._dp_world_size, self._rank_block)
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

    def windows_per_source(self, positions: int) -> list[int]:
        """Windows each source fills among the first ``positions`` of the global stream."""
        return [positions] if self.mixture is None else self.mixture.counts(positions)

    def state_dict(self) -> dict[str, Any]:
        """``{"windows_consumed", "n_windows", "seq_len", "seed"}`` (and ``"quotas"`` of a mixture, whose
        ``n_windows`` is a list per source): the global position (epoch ``windows_consumed // n_windows``, index
        ``windows_consumed % n_windows`` into its permutation)."""
        return {"windows_consumed": self._start + self._consumed * self._dp_world_size, **self._settings}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from the global position of ``state`` (from :meth:`state_dict`, saved with any world size).

        Raises:
            InputError: ``state`` was saved with other data, seq_len, seed or weights.
        """
        diff = [f"{k}={state.get(k)} (now {v})" for k, v in self._settings.items() if state.get(k) != v]
        if diff:
            name = ", ".join(w.name for w in self.sources)
            raise InputError(f"data loader state of {name} was saved with {', '.join(diff)}; "
                             "resume with the data, seq_len, seed and weights of the saved run")
        self._start, self._consumed = state["windows_consumed"], 0


class OrderedWindows(IterableDataset):
    """Rank ``dp_rank``'s share of the validation windows, in order, ending (see the module docstring).

    Raises:
        InputError: fewer than ``local_batch_size * dp_world_size`` windows (not one batch per rank).
    """

    def __init__(self, windows: PackedWindows, *, local_batch_size: int, dp_rank: int, dp_world_size: int):
        n_chunks = (len(windows) // local_batch_size) // dp_world_size * dp_world_size
        if n_chunks == 0:
            raise InputError(
                f"{windows.name} has {len(windows)} windows of seq_len {windows.seq_len}, fewer than "
                f"local_batch_size * dp_world_size = {local_batch_size * dp_world_size}; "
                "use more validation data, a smaller seq_len or a smaller local_batch_size"
            )
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

    Documents in stream order, each followed by the EOS, forever; the state (epoch, stream state, unused
    tokens) resumes exactly with the same ``dp_rank`` and ``dp_world_size``. ``restart=True`` (validation)
    starts every new iterator from the beginning. ``documents``: each window also carries its document ids, from the
    EOS this loader puts after each document (:func:`~torchtitan_lite.data.documents.document_ids_from_eos`).

    Raises (while iterating):
        InputError: a document without ``text_column``, or no document in this rank's share.
    """

    world_size_invariant = False
    """The state is this rank's position in its own part of the stream (read by the checkpointer)."""

    def __init__(self, stream: datasets.IterableDataset, *, tokenizer: Tokenizer, text_column: str, seq_len: int,
                 dp_rank: int, dp_world_size: int, name: str, restart: bool = False, documents: bool = False):
        from datasets.distributed import split_dataset_by_node

        self._stream = split_dataset_by_node(stream, rank=dp_rank, world_size=dp_world_size)
        self._tokenizer, self._text_column, self._seq_len, self.name = tokenizer, text_column, seq_len, name
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
                    raise InputError(f"{self.name} has no text column '{self._text_column}' "
                                     f"(columns: {', '.join(document)}); set text_column")
                self._buffer += self._tokenizer.encode(document[self._text_column]) + [self._tokenizer.eos_id]
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
                raise InputError(f"{self.name}: this rank's share of the stream holds no document (a stream is "
                                 "split between ranks by position); use more data or fewer ranks")
            self._epoch, self._stream_state = self._epoch + 1, None

    def state_dict(self) -> dict[str, Any]:
        """The epoch, the stream's state after the last document read, and the unused tokens."""
        return {"epoch": self._epoch, "stream": self._stream_state, "buffer": list(self._buffer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`)."""
        self._epoch, self._stream_state, self._buffer = state["epoch"], state["stream"], list(state["buffer"])


def collate_windows(batch: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    """Stack windows into ``(input_ids, labels)``, each int64 ``(batch, seq_len)`` (and their int32 document ids
    ``(batch, seq_len)`` when the windows carry them)."""
    return tuple(torch.stack(column) for column in zip(*batch))


def _check_args(dataset, dataset_path, streaming, seq_len, local_batch_size, dp_rank, dp_world_size, split,
                val_fraction) -> None:
    """Raise ValueError naming the first argument of :func:`build_dataloader` outside its contract, with its value."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset '{dataset}'; use one of {', '.join(DATASETS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split '{split}'; use one of {', '.join(SPLITS)}")
    if streaming and dataset_path is not None and split == "validation":
        raise ValueError("a streaming local dataset has no validation split; set streaming=False for validation")
    for name, value, low in (("seq_len", seq_len, 1), ("local_batch_size", local_batch_size, 1),
                             ("dp_world_size", dp_world_size, 1)):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    if not 0 <= dp_rank < dp_world_size:
        raise ValueError(f"dp_rank must be in [0, dp_world_size={dp_world_size}), got {dp_rank}")
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")


@dataclass(frozen=True)
class SplitSize:
    """The size of a map-style split: ``documents`` (``None`` for a part of a local stream, cut by tokens),
    ``tokens`` and ``windows`` (:class:`PackedWindows`)."""

    documents: int | None
    tokens: int
    windows: int

    def describe(self, seq_len: int) -> str:
        """``37 documents, 1,759,944 tokens = 6,874 windows of 256``."""
        docs = "" if self.documents is None else f"{self.documents:,} document{'s' * (self.documents != 1)}, "
        return f"{docs}{self.tokens:,} tokens = {self.windows:,} windows of {seq_len}"


@dataclass
class DataLoaders:
    """What :func:`build_dataloaders` built.

    Attributes:
        train, validation: the loaders (``validation`` ``None`` when not asked for or not possible).
        name: the source, for messages.
        seq_len: tokens per window.
        total: the whole token stream of a local dataset (``None`` otherwise).
        train_size, validation_size: ``None`` when streamed (size unknown) or not built.
        validation_off: why validation is off although it was asked for, or ``None``.
        sources: the mixed sources' names (their paths), empty for one source.
    """

    train: StatefulDataLoader
    validation: StatefulDataLoader | None
    name: str
    seq_len: int
    total: SplitSize | None = None
    train_size: SplitSize | None = None
    validation_size: SplitSize | None = None
    validation_off: str | None = None
    sources: list[str] = field(default_factory=list)

    def tokens_per_source(self, tokens_seen: int) -> dict[str, int]:
        """Training tokens each mixed source gave in the first ``tokens_seen`` global tokens (whole windows of
        ``seq_len``), e.g. ``{"/data/web": 71680, "/data/code": 30720}``; empty for one source."""
        if not self.sources:
            return {}
        counts = self.train.dataset.windows_per_source(tokens_seen // self.seq_len)
        return {name: n * self.seq_len for name, n in zip(self.sources, counts)}

    def describe(self, steps: int, global_batch: int) -> str:
        """One line: tokens, windows and the epochs ``steps`` of ``global_batch`` windows cover, e.g.
        ``shakespeare: train 37 documents, 1,759,944 tokens = 6,874 windows of 256, 400 steps x 16 windows =
        0.93 epochs; validation 1 document, 36,778 tokens = 143 windows of 256``."""
        if self.train_size is None:
            return f"{self.name}: streamed, size unknown (epochs not counted)"
        epochs = steps * global_batch / self.train_size.windows
        text = (f"{self.name}: " + (f"{self.total.describe(self.seq_len).split(' = ')[0]}; " if self.total else "")
                + f"train {self.train_size.describe(self.seq_len)}, {steps:,} steps x {global_batch:,} windows = "
                f"{epochs:.3g} epochs")
        if self.validation_size is not None:
            where = "the last " if self.total else ""
            return text + f"; validation {where}{self.validation_size.describe(self.seq_len)}"
        return text + ("; validation off (see the warning)" if self.validation_off else "; no validation")


def _loader(ds: IterableDataset, local_batch_size: int, pin_memory: bool) -> StatefulDataLoader:
    with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in recent torch
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return StatefulDataLoader(ds, batch_size=local_batch_size, collate_fn=collate_windows, num_workers=0,
                                  pin_memory=pin_memory)


def _streaming_dataset(split: str, *, dataset_path, hf_dataset_name, hf_dataset_config, text_column, tokenizer,
                       seq_len, dp_rank, dp_world_size, documents=False, **_) -> StreamingWindows:
    if dataset_path is not None:
        stream, text_column, _ = local_dataset(dataset_path, text_column, streaming=True)
        name = f"dataset_path {dataset_path}"
    else:
        import datasets

        stream = datasets.load_dataset(hf_dataset_name, hf_dataset_config, split=split, streaming=True)
        name = f"hub dataset {hf_dataset_name} ({hf_dataset_config or 'default'}, {split})"
    return StreamingWindows(stream, tokenizer=tokenizer, text_column=text_column, seq_len=seq_len, dp_rank=dp_rank,
                            dp_world_size=dp_world_size, name=name, restart=split == "validation", documents=documents)


def _play_texts(split: str) -> Iterator[str]:
    for _, text in shakespeare_plays(split):
        yield text


def _local_texts(path: str, text_column: str) -> Iterator[str]:
    ds, text_column, _ = local_dataset(path, text_column, streaming=True)
    for row in ds:
        if text_column not in row:
            raise InputError(f"dataset_path {path} has no text column '{text_column}' (columns: {', '.join(row)}); "
                             "set text_column")
        yield row[text_column]


def _source(split: str, path: str | None, *, dataset, hf_dataset_name, hf_dataset_config, text_column, tokenizer,
            seq_len, documents=False, **_) -> tuple[PackedWindows, int, str]:
    """``(windows, documents, source name)`` of a map-style split (local data: the whole stream). A prepared folder
    is mapped; raw local files and the plays are prepared on first use into the cache (``data/prepared.py``); a hub
    dataset is tokenized here, in memory."""
    if path is not None and is_prepared(path):
        corpus, name = PreparedCorpus(path), f"dataset_path {path}"
        check_tokenizer(path, corpus.manifest, tokenizer, tokenizer.vocab_size)
    elif path is not None:
        builder, files = local_data_files(path)
        column = "text" if builder == "text" else text_column
        corpus = cached_corpus(f"{builder}:{column}", file_sources(files), tokenizer, _local_texts(path, text_column))
        name = f"dataset_path {path}"
    elif dataset == "shakespeare":
        corpus = cached_corpus(f"shakespeare/{split}", file_sources(play_files(split)), tokenizer, _play_texts(split))
        name = f"shakespeare ({split})"
    else:
        texts, name = load_documents(dataset=dataset, dataset_path=None, hf_dataset_name=hf_dataset_name,
                                         hf_dataset_config=hf_dataset_config, text_column=text_column, split=split)
        tokens = tokenize_documents(tokenizer, texts)
        after_eos = np.flatnonzero(tokens.numpy() == tokenizer.eos_id)[:-1] + 1
        starts = np.concatenate([np.zeros(1, dtype=np.int64), after_eos.astype(np.int64)])
        return PackedWindows(tokens, seq_len, name, starts, documents), len(texts), name
    m = corpus.manifest
    tokens = TokenFile(corpus.tokens_path, np.dtype(m.dtype), 0, m.n_tokens)
    return PackedWindows(tokens, seq_len, name, corpus.starts, documents), m.n_documents, name


def _local_splits(windows: PackedWindows, held: int) -> dict[str, tuple[PackedWindows | None, int]]:
    """``{split: (windows, tokens)}`` of a local stream: validation is its last ``held`` tokens (``windows`` is
    ``None`` for a validation part shorter than one window).

    Raises:
        InputError: the training part is shorter than one window."""
    n, seq_len = windows.tokens.numel(), windows.seq_len
    bounds = {"train": (0, n - held), "validation": (n - held, n)}
    return {s: (_slice(windows, b, e, f"{windows.name} ({s})") if s == "train" or e - b > seq_len else None, e - b)
            for s, (b, e) in bounds.items()}


def _map_dataset(split: str, windows, *, local_batch_size, dp_rank, dp_world_size, seed, weights=None,
                 rank_block=1, **_) -> IterableDataset:
    ranks = {"local_batch_size": local_batch_size, "dp_rank": dp_rank, "dp_world_size": dp_world_size}
    if split == "train":
        return GlobalWindowStream(windows, seed=seed, weights=weights, rank_block=rank_block, **ranks)
    return OrderedWindows(windows, **ranks)


def _map_splits(wanted: tuple[str, ...], *, dataset_path, dataset_paths, val_fraction, min_val_windows, seq_len,
                **kw) -> tuple[dict[str, tuple[Any, SplitSize]], SplitSize | None, str]:
    """``({split: (windows, size)}, total, source name)`` of the ``wanted`` map-style splits. Local data: each
    source's last :func:`held_out_tokens` are its validation part (a mixture's validation: the parts one after
    another), ``total`` sums the whole streams; the training windows of a mixture are a list, one per source."""
    paths = list(dataset_paths) or ([dataset_path] if dataset_path is not None else [])
    if not paths:
        splits = {}
        for s in wanted:
            windows, documents, name = _source(s, None, seq_len=seq_len, **kw)
            splits[s] = windows, SplitSize(documents, windows.tokens.numel(), len(windows))
        return splits, None, name.rsplit(" (", 1)[0]  # shakespeare (train) -> shakespeare
    sources = [_source("train", p, seq_len=seq_len, **kw) for p in paths]
    min_windows = -(-min_val_windows // len(paths))
    parts = [_local_splits(w, held_out_tokens(w.tokens.numel(), val_fraction, seq_len=seq_len,
                                              min_windows=min_windows)) for w, _, _ in sources]
    total = SplitSize(sum(d for _, d, _ in sources), sum(w.tokens.numel() for w, _, _ in sources),
                      sum(len(w) for w, _, _ in sources))
    splits = {}
    for s in wanted:
        chosen = [p[s][0] for p in parts if p[s][0] is not None]
        size = SplitSize(None, sum(p[s][1] for p in parts), sum(len(w) for w in chosen))
        if len(parts) == 1:
            windows = chosen[0] if chosen else None
        else:
            windows = chosen if s == "train" else ConcatWindows(chosen, f"dataset_paths ({s})") if chosen else None
        splits[s] = windows, size
    return splits, total, sources[0][2] if len(paths) == 1 else "dataset_paths " + ", ".join(paths)


def build_dataloader(
    *,
    dataset: str = "shakespeare",
    dataset_path: str | None = None,
    dataset_paths: Sequence[str] = (),
    dataset_weights: Sequence[float] = (),
    hf_dataset_name: str | None = None,
    hf_dataset_config: str | None = None,
    streaming: bool = False,
    text_column: str = "text",
    tokenizer: Tokenizer,
    seq_len: int,
    local_batch_size: int,
    dp_rank: int = 0,
    dp_world_size: int = 1,
    seed: int = 0,
    split: str = "train",
    val_fraction: float = 0.01,
    min_val_windows: int = 0,
    pin_memory: bool = False,
    documents: bool = False,
) -> StatefulDataLoader:
    """A loader of ``(input_ids, labels)`` batches, each int64 ``(local_batch_size, seq_len)`` (module docstring).

    Training loaders never end; map-style validation loaders end after ``len(loader)`` batches, the same on
    every rank, and restart on each ``iter()``. After ``load_state_dict`` the next batch is the one the saved run
    would have produced.

    Args:
        dataset, dataset_path, hf_dataset_name, hf_dataset_config, streaming: the source (module docstring;
            ``dataset_path`` wins over ``dataset``; which combinations a run may use is the config's check).
            ``dataset_path`` may be a prepared folder (``data/prepared.py``); raw files are prepared on first use.
        dataset_paths, dataset_weights: several local sources (prepared or raw) mixed by weight (equal when
            ``dataset_weights`` is empty; ``data/mixing.py``); they win over ``dataset_path``.
        text_column: the text column of ``.jsonl``/``.parquet``/hub rows.
        seed: seeds the per-epoch shuffle (``seed + epoch``).
        split: ``"train"`` or ``"validation"``.
        val_fraction, min_val_windows: local files: the part of the token stream (its end) held out for
            validation (:func:`held_out_tokens`).
        pin_memory: batches in page-locked memory, for ``non_blocking`` copies to an accelerator.
        documents: batches are ``(input_ids, labels, document_ids)``, the ids int32 ``(local_batch_size, seq_len)``
            (:func:`document_ids`) from the document starts of the source (streamed data: from the EOS the loader
            puts after each document).

    Raises:
        ValueError: arguments outside the contract (named with their value), e.g. a validation split of a
            streamed local dataset.
        InputError: a missing ``dataset_path``, an unknown file extension, a missing text column, no
            documents, fewer tokens than one window, too few validation windows for one batch per rank, or a
            prepared folder that is incomplete or made with another tokenizer.
    """
    kw = dict(dataset=dataset, dataset_path=dataset_path, hf_dataset_name=hf_dataset_name,
              hf_dataset_config=hf_dataset_config, text_column=text_column, tokenizer=tokenizer, seq_len=seq_len,
              local_batch_size=local_batch_size, dp_rank=dp_rank, dp_world_size=dp_world_size, seed=seed,
              documents=documents)
    _check_args(dataset, dataset_path, streaming, seq_len, local_batch_size, dp_rank, dp_world_size, split,
                val_fraction)
    if streaming:
        return _loader(_streaming_dataset(split, **kw), local_batch_size, pin_memory)
    splits, _, _ = _map_splits((split,), dataset_paths=dataset_paths, val_fraction=val_fraction,
                               min_val_windows=min_val_windows, **kw)
    weights = _weights(dataset_paths, dataset_weights)
    return _loader(_map_dataset(split, splits[split][0], weights=weights, **kw), local_batch_size, pin_memory)


def _weights(dataset_paths: Sequence[str], dataset_weights: Sequence[float]) -> list[float] | None:
    """The mixture's weights (equal when none are given), or ``None`` for one source."""
    if len(dataset_paths) < 2:
        return None
    return list(dataset_weights) or [1.0] * len(dataset_paths)


def build_dataloaders(*, validation: bool, min_val_windows: int, streaming: bool = False,
                      val_fraction: float = 0.01, pin_memory: bool = False, dataset_paths: Sequence[str] = (),
                      dataset_weights: Sequence[float] = (), **kw: Any) -> DataLoaders:
    """The training loader and, with ``validation``, the validation loader of one run, with their sizes.

    Arguments as :func:`build_dataloader` (``split`` excepted). Map-style data is read once per source (local
    files: once for both splits). A local dataset holds out :func:`held_out_tokens` with ``min_val_windows`` (the
    trainer's global batch, so validation gets at least one batch on every rank when the data allows); a
    validation split with fewer windows than ``local_batch_size * dp_world_size`` leaves validation off, saying
    why in ``validation_off``, instead of failing.

    Raises:
        ValueError, InputError: as :func:`build_dataloader` (the training split).
    """
    seq_len, local_batch_size, dp_world_size = kw["seq_len"], kw["local_batch_size"], kw.get("dp_world_size", 1)
    kw.setdefault("dataset", "shakespeare")
    kw.setdefault("dataset_path", None)
    for key in ("hf_dataset_name", "hf_dataset_config"):
        kw.setdefault(key, None)
    kw.setdefault("text_column", "text")
    for key, default in (("dp_rank", 0), ("dp_world_size", 1), ("seed", 0)):
        kw.setdefault(key, default)
    _check_args(kw["dataset"], kw["dataset_path"], streaming, seq_len, local_batch_size,
                kw.get("dp_rank", 0), dp_world_size, "train", val_fraction)
    if streaming:
        train = _loader(_streaming_dataset("train", **kw), local_batch_size, pin_memory)
        val = _loader(_streaming_dataset("validation", **kw), local_batch_size, pin_memory) if validation else None
        return DataLoaders(train, val, train.dataset.name, seq_len)
    wanted = ("train", "validation") if validation else ("train",)
    splits, total, source = _map_splits(wanted, dataset_paths=dataset_paths, val_fraction=val_fraction,
                                        min_val_windows=min_val_windows, **kw)
    weights = _weights(dataset_paths, dataset_weights)
    train_windows, train_size = splits["train"]
    train = _loader(_map_dataset("train", train_windows, weights=weights, **kw), local_batch_size, pin_memory)
    names = list(dataset_paths) if weights is not None else []
    result = DataLoaders(train, None, source, seq_len, total, train_size, sources=names)
    if not validation:
        return result
    val_windows, val_size = splits["validation"]
    need = local_batch_size * dp_world_size
    if val_size.windows < need:
        share = f" (at most {MAX_HELD_OUT_SHARE:.0%} of the data is held out)" if total is not None else ""
        result.validation_off = (
            f"{source} (validation) has {val_size.tokens:,} tokens = {val_size.windows} windows of {seq_len}, fewer "
            f"than one batch per rank (local_batch_size * data-parallel ranks = {need}){share}; use more data, a "
            "smaller seq_len or local_batch_size, or --validation.enable=false")
        return result
    result.validation = _loader(_map_dataset("validation", val_windows, **kw), local_batch_size, pin_memory)
    result.validation_size = val_size
    return result
