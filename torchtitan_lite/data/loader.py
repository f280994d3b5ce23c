"""Data: text documents -> token ids -> packed windows -> a torchdata ``StatefulDataLoader``.

Sources: ``dataset="shakespeare"``, the plays of :mod:`~torchtitan_lite.data.corpus` (one document per
play; ``validation`` is ``the-tempest``, ``train`` the other 37); local files (``dataset_path``: a
``.txt``/``.jsonl``/``.json``/``.parquet`` file or a folder of one format, read by ``datasets.load_dataset``;
a ``.txt`` file is one document, other rows are documents from ``text_column``; the end of the token stream is
the validation split, 1% or one global batch, see :func:`held_out_tokens`); ``dataset="hf"``, a hub dataset.

Packing: every document's ids and the EOS, concatenated into one int32 stream of ``n_tokens`` ids held in
memory. Window ``i`` is ``tokens[i * seq_len : (i + 1) * seq_len + 1]``; ``input_ids = window[:-1]`` and
``labels = window[1:]``, int64; ``(n_tokens - 1) // seq_len`` windows, the tail dropped.

Map-style training data is one infinite, seeded global window stream that ranks take in chunks of
``local_batch_size``; its state is the global position, so it resumes exactly on any world size (see
``docs/design.md``, "Data: the global window stream"). Validation reads its windows in order and ends, with
the same number of batches on every rank. Streaming data is read per rank (``split_dataset_by_node``), in
stream order, forever; it resumes on the same world size only. The loader runs in the main process.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import datasets
import numpy as np
import torch
from datasets.distributed import split_dataset_by_node
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from torchtitan_lite.data.corpus import shakespeare_plays
from torchtitan_lite.data.files import local_data_files
from torchtitan_lite.data.progress import progress
from torchtitan_lite.data.tokenizer import Tokenizer
from torchtitan_lite.errors import InputError

DATASETS = ("shakespeare", "hf")
SPLITS = ("train", "validation")
_ENCODE_DOCUMENTS = 1024  # documents per batch-encode call: bounds the memory of the library's Encoding objects
_ENCODE_CHARACTERS = 2**20  # and characters (past its first document): a progress line can come every few seconds


def _load_local(
    path: str, text_column: str, *, streaming: bool
) -> tuple[datasets.Dataset | datasets.IterableDataset, str]:
    """The local dataset at ``path`` and its text column (always ``"text"`` for ``.txt`` files). HF datasets'
    progress bar for converting the files is off while they load: its carriage-return updates garble the rank logs,
    and the run prints its own data and tokenizing lines."""
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
    return ds, "text" if builder == "text" else text_column


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

    For local files (``dataset_path`` set) these are all the documents: :func:`split_tokens` makes the splits.

    Raises:
        InputError: a missing text column, no documents, or see :func:`local_data_files`.
    """
    if dataset_path is not None:
        where = f"dataset_path {dataset_path}"
        docs = _column(*_load_local(dataset_path, text_column, streaming=False), where)
    elif dataset == "hf":
        where = f"hub dataset {hf_dataset_name} ({hf_dataset_config or 'default'}, {split})"
        docs = _column(datasets.load_dataset(hf_dataset_name, hf_dataset_config, split=split), text_column, where)
    else:
        plays = shakespeare_plays(split)
        ds = datasets.Dataset.from_dict({"name": [n for n, _ in plays], "text": [t for _, t in plays]})
        return list(ds["text"]), f"shakespeare ({split})"
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


def split_tokens(tokens: torch.Tensor, split: str, held_out: int) -> torch.Tensor:
    """The ``split`` part of a local dataset's token stream ``(n_tokens,)``: validation is the last ``held_out``
    tokens, train the others."""
    cut = tokens.numel() - held_out
    return tokens[cut:] if split == "validation" else tokens[:cut]


class PackedWindows:
    """Random access to the windows of an int token stream ``(n_tokens,)`` (module docstring); ``name`` is the
    source, for messages.

    Raises:
        InputError: fewer than ``seq_len + 1`` tokens (not one window).
    """

    def __init__(self, tokens: torch.Tensor, seq_len: int, name: str):
        if tokens.numel() < seq_len + 1:
            raise InputError(
                f"{name} has {tokens.numel()} tokens, fewer than one window of seq_len + 1 = {seq_len + 1}; "
                "use more data or a smaller seq_len"
            )
        self.tokens, self.seq_len, self.name = tokens, seq_len, name

    def __len__(self) -> int:
        return (self.tokens.numel() - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, labels)`` of window ``i``: two int64 tensors ``(seq_len,)``."""
        window = self.tokens[i * self.seq_len : (i + 1) * self.seq_len + 1].long()
        return window[:-1], window[1:]


def rank_chunk(local_chunk: int, dp_rank: int, dp_world_size: int, rank_block: int = 1) -> int:
    """Global index of rank ``dp_rank``'s ``local_chunk``-th chunk (micro-batch) when each of the ``dp_world_size``
    ranks takes the aligned block of ``rank_block`` consecutive chunks of every ``rank_block * dp_world_size``
    (``rank_block = 1``: chunks interleave over the ranks; ``training.deterministic = "layout"`` uses the micro-batches
    per rank, see ``distributed/deterministic.py``)."""
    block, within = divmod(local_chunk, rank_block)
    return (block * dp_world_size + dp_rank) * rank_block + within


class GlobalWindowStream(IterableDataset):
    """Rank ``dp_rank``'s share of the infinite, seeded global window stream (training, map-style).

    Epoch ``e`` is ``randperm(n_windows)`` seeded with ``seed + e``; from the start position (0, or the one
    loaded) rank ``r`` of ``W`` takes the chunks ``c % W == r`` of ``local_batch_size`` windows, or with
    ``rank_block = m`` > 1 the aligned blocks of ``m`` consecutive chunks (:func:`rank_chunk`). The state is the
    global position ``windows_consumed`` (``k * G`` after ``k`` steps of global batch ``G``), valid for any world
    size and batch size.
    """

    world_size_invariant = True
    """The state is a global position: it loads with any ``dp_world_size`` (read by the checkpointer)."""

    def __init__(self, windows: PackedWindows, *, local_batch_size: int, dp_rank: int, dp_world_size: int, seed: int,
                 rank_block: int = 1):
        self.windows, self._rank_block = windows, rank_block
        self._settings = {"n_windows": len(windows), "seq_len": windows.seq_len, "seed": seed}
        self._local_batch_size, self._dp_rank, self._dp_world_size = local_batch_size, dp_rank, dp_world_size
        self._start = 0  # global position of this stream's first window
        self._consumed = 0  # windows this rank has yielded since start
        self._perm_epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def _global_index(self, local_index: int) -> int:
        """Index in the global stream of this rank's ``local_index``-th window since ``start``."""
        chunk = rank_chunk(local_index // self._local_batch_size, self._dp_rank, self._dp_world_size, self._rank_block)
        return self._start + chunk * self._local_batch_size + local_index % self._local_batch_size

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._perm_epoch:
            gen = torch.Generator().manual_seed(self._settings["seed"] + epoch)
            self._perm_epoch, self._perm = epoch, torch.randperm(len(self.windows), generator=gen)
        return self._perm

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            epoch, position = divmod(self._global_index(self._consumed), len(self.windows))
            window = int(self._permutation(epoch)[position])
            self._consumed += 1
            yield self.windows[window]

    def state_dict(self) -> dict[str, Any]:
        """``{"windows_consumed", "n_windows", "seq_len", "seed"}``: the global position (epoch
        ``windows_consumed // n_windows``, index ``windows_consumed % n_windows`` into its permutation)."""
        return {"windows_consumed": self._start + self._consumed * self._dp_world_size, **self._settings}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from the global position of ``state`` (from :meth:`state_dict`, saved with any world size).

        Raises:
            InputError: ``state`` was saved with other data, seq_len or seed.
        """
        diff = [f"{k}={state.get(k)} (now {v})" for k, v in self._settings.items() if state.get(k) != v]
        if diff:
            raise InputError(f"data loader state of {self.windows.name} was saved with {', '.join(diff)}; "
                             "resume with the data, seq_len and seed of the saved run")
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
    starts every new iterator from the beginning.

    Raises (while iterating):
        InputError: a document without ``text_column``, or no document in this rank's share.
    """

    world_size_invariant = False
    """The state is this rank's position in its own part of the stream (read by the checkpointer)."""

    def __init__(self, stream: datasets.IterableDataset, *, tokenizer: Tokenizer, text_column: str, seq_len: int,
                 dp_rank: int, dp_world_size: int, name: str, restart: bool = False):
        self._stream = split_dataset_by_node(stream, rank=dp_rank, world_size=dp_world_size)
        self._tokenizer, self._text_column, self._seq_len, self.name = tokenizer, text_column, seq_len, name
        self._restart = restart
        self._epoch, self._buffer, self._stream_state = 0, [], None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
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


def collate_windows(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack windows into ``(input_ids, labels)``, each int64 ``(batch, seq_len)``."""
    return torch.stack([x for x, _ in batch]), torch.stack([y for _, y in batch])


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
    """

    train: StatefulDataLoader
    validation: StatefulDataLoader | None
    name: str
    seq_len: int
    total: SplitSize | None = None
    train_size: SplitSize | None = None
    validation_size: SplitSize | None = None
    validation_off: str | None = None

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
                       seq_len, dp_rank, dp_world_size, **_) -> StreamingWindows:
    if dataset_path is not None:
        stream, text_column = _load_local(dataset_path, text_column, streaming=True)
        name = f"dataset_path {dataset_path}"
    else:
        stream = datasets.load_dataset(hf_dataset_name, hf_dataset_config, split=split, streaming=True)
        name = f"hub dataset {hf_dataset_name} ({hf_dataset_config or 'default'}, {split})"
    return StreamingWindows(stream, tokenizer=tokenizer, text_column=text_column, seq_len=seq_len, dp_rank=dp_rank,
                            dp_world_size=dp_world_size, name=name, restart=split == "validation")


def _split_tokens(split: str, *, dataset, dataset_path, hf_dataset_name, hf_dataset_config, text_column, tokenizer,
                  **_) -> tuple[torch.Tensor, int, str]:
    """``(tokens, documents, source name)`` of a map-style split (local files: the whole stream)."""
    documents, name = load_documents(dataset=dataset, dataset_path=dataset_path, hf_dataset_name=hf_dataset_name,
                                     hf_dataset_config=hf_dataset_config, text_column=text_column, split=split)
    return tokenize_documents(tokenizer, documents), len(documents), name


def _map_dataset(split: str, windows: PackedWindows, *, local_batch_size, dp_rank, dp_world_size, seed, rank_block=1,
                 **_) -> IterableDataset:
    ranks = {"local_batch_size": local_batch_size, "dp_rank": dp_rank, "dp_world_size": dp_world_size}
    if split == "train":
        return GlobalWindowStream(windows, seed=seed, rank_block=rank_block, **ranks)
    return OrderedWindows(windows, **ranks)


def build_dataloader(
    *,
    dataset: str = "shakespeare",
    dataset_path: str | None = None,
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
) -> StatefulDataLoader:
    """A loader of ``(input_ids, labels)`` batches, each int64 ``(local_batch_size, seq_len)`` (module docstring).

    Training loaders never end; map-style validation loaders end after ``len(loader)`` batches, the same on
    every rank, and restart on each ``iter()``. Map-style documents are tokenized once, here. After
    ``load_state_dict`` the next batch is the one the saved run would have produced.

    Args:
        dataset, dataset_path, hf_dataset_name, hf_dataset_config, streaming: the source (module docstring;
            ``dataset_path`` wins over ``dataset``; which combinations a run may use is the config's check).
        text_column: the text column of ``.jsonl``/``.parquet``/hub rows.
        seed: seeds the per-epoch shuffle (``seed + epoch``).
        split: ``"train"`` or ``"validation"``.
        val_fraction, min_val_windows: local files: the part of the token stream (its end) held out for
            validation (:func:`held_out_tokens`).
        pin_memory: batches in page-locked memory, for ``non_blocking`` copies to an accelerator.

    Raises:
        ValueError: arguments outside the contract (named with their value), e.g. a validation split of a
            streamed local dataset.
        InputError: a missing ``dataset_path``, an unknown file extension, a missing text column, no
            documents, fewer tokens than one window, or too few validation windows for one batch per rank.
    """
    kw = dict(dataset=dataset, dataset_path=dataset_path, hf_dataset_name=hf_dataset_name,
              hf_dataset_config=hf_dataset_config, text_column=text_column, tokenizer=tokenizer, seq_len=seq_len,
              local_batch_size=local_batch_size, dp_rank=dp_rank, dp_world_size=dp_world_size, seed=seed)
    _check_args(dataset, dataset_path, streaming, seq_len, local_batch_size, dp_rank, dp_world_size, split,
                val_fraction)
    if streaming:
        return _loader(_streaming_dataset(split, **kw), local_batch_size, pin_memory)
    tokens, _, name = _split_tokens(split, **kw)
    if dataset_path is not None:
        held = held_out_tokens(tokens.numel(), val_fraction, seq_len=seq_len, min_windows=min_val_windows)
        tokens, name = split_tokens(tokens, split, held), f"{name} ({split})"
    return _loader(_map_dataset(split, PackedWindows(tokens, seq_len, name), **kw), local_batch_size, pin_memory)


def build_dataloaders(*, validation: bool, min_val_windows: int, streaming: bool = False,
                      val_fraction: float = 0.01, pin_memory: bool = False, **kw: Any) -> DataLoaders:
    """The training loader and, with ``validation``, the validation loader of one run, with their sizes.

    Arguments as :func:`build_dataloader` (``split`` excepted). Map-style data is tokenized once per source
    (local files: once for both splits). A local dataset holds out :func:`held_out_tokens` with
    ``min_val_windows`` (the trainer's global batch, so validation gets at least one batch on every rank when
    the data allows); a validation split with fewer windows than ``local_batch_size * dp_world_size`` leaves
    validation off, saying why in ``validation_off``, instead of failing.

    Raises:
        ValueError, InputError: as :func:`build_dataloader` (the training split).
    """
    seq_len, local_batch_size, dp_world_size = kw["seq_len"], kw["local_batch_size"], kw.get("dp_world_size", 1)
    _check_args(kw.get("dataset", "shakespeare"), kw.get("dataset_path"), streaming, seq_len, local_batch_size,
                kw.get("dp_rank", 0), dp_world_size, "train", val_fraction)
    if streaming:
        train = _loader(_streaming_dataset("train", **kw), local_batch_size, pin_memory)
        val = _loader(_streaming_dataset("validation", **kw), local_batch_size, pin_memory) if validation else None
        return DataLoaders(train, val, train.dataset.name, seq_len)
    tokens, documents, name = _split_tokens("train", **kw)
    total, splits = None, {}
    if kw.get("dataset_path") is not None:
        total = SplitSize(documents, tokens.numel(), (tokens.numel() - 1) // seq_len)
        held = held_out_tokens(tokens.numel(), val_fraction, seq_len=seq_len, min_windows=min_val_windows)
        splits = {s: (split_tokens(tokens, s, held), None, f"{name} ({s})") for s in SPLITS}
    else:
        splits["train"] = (tokens, documents, name)
        if validation:
            splits["validation"] = _split_tokens("validation", **kw)
    source = name if total is not None else name.rsplit(" (", 1)[0]  # shakespeare (train) -> shakespeare
    train_tokens, train_documents, train_name = splits["train"]
    train_windows = PackedWindows(train_tokens, seq_len, train_name)
    result = DataLoaders(_loader(_map_dataset("train", train_windows, **kw), local_batch_size, pin_memory), None,
                         source, seq_len, total, SplitSize(train_documents, train_tokens.numel(), len(train_windows)))
    if not validation:
        return result
    val_tokens, val_documents, val_name = splits["validation"]
    n_windows, need = max(val_tokens.numel() - 1, 0) // seq_len, local_batch_size * dp_world_size
    if n_windows < need:
        share = f" (at most {MAX_HELD_OUT_SHARE:.0%} of the data is held out)" if total is not None else ""
        result.validation_off = (
            f"{val_name} has {val_tokens.numel():,} tokens = {n_windows} windows of {seq_len}, fewer than one "
            f"batch per rank (local_batch_size * data-parallel ranks = {need}){share}; use more data, a smaller "
            "seq_len or local_batch_size, or --validation.enable=false")
        return result
    val_windows = PackedWindows(val_tokens, seq_len, val_name)
    result.validation = _loader(_map_dataset("validation", val_windows, **kw), local_batch_size, pin_memory)
    result.validation_size = SplitSize(val_documents, val_tokens.numel(), len(val_windows))
    return result
