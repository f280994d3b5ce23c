"""Data: text documents -> token ids -> packed windows -> a torchdata ``StatefulDataLoader``.

Sources: ``dataset="shakespeare"``, the plays of :mod:`~torchtitan_lite.data.corpus` (one document per
play; ``validation`` is ``the-tempest``, ``train`` the other 37); local files (``dataset_path``: a
``.txt``/``.jsonl``/``.json``/``.parquet`` file or a folder of one format, read by ``datasets.load_dataset``;
a ``.txt`` file is one document, other rows are documents from ``text_column``; the last
``max(1, round(val_fraction * n_tokens))`` tokens are the validation split); ``dataset="hf"``, a hub dataset.

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
from pathlib import Path
from typing import Any, Iterator, Sequence

import datasets
import numpy as np
import torch
from datasets.distributed import split_dataset_by_node
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from torchtitan_lite.data.corpus import shakespeare_plays
from torchtitan_lite.data.progress import progress
from torchtitan_lite.data.tokenizer import Tokenizer
from torchtitan_lite.errors import InputError

DATASETS = ("shakespeare", "hf")
SPLITS = ("train", "validation")
LOCAL_FORMATS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
"""File extension -> ``datasets`` builder name."""

_ENCODE_CHUNK = 1024  # documents per batch-encode call: bounds the memory of the library's Encoding objects


def local_data_files(path: str | Path) -> tuple[str, list[str]]:
    """``(builder, sorted files)`` of a data file or a folder of them (searched recursively, other files
    ignored), e.g. ``("json", ["/data/a.jsonl", "/data/b.jsonl"])``.

    Raises:
        InputError: nothing at ``path``, an unknown file extension, a folder with no data file, or with
            several formats.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"dataset_path not found: {path}; pass an existing file or folder")
    known = ", ".join(LOCAL_FORMATS)
    if p.is_file():
        if p.suffix not in LOCAL_FORMATS:
            raise InputError(f"dataset_path {path} has unknown extension '{p.suffix}'; use one of {known}")
        return LOCAL_FORMATS[p.suffix], [str(p)]
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in LOCAL_FORMATS)
    if not files:
        raise InputError(f"dataset_path folder {path} holds no data file; expected files ending in {known}")
    builders = sorted({LOCAL_FORMATS[f.suffix] for f in files})
    if len(builders) > 1:
        raise InputError(
            f"dataset_path folder {path} mixes formats ({', '.join(builders)}); keep one format per folder"
        )
    return builders[0], [str(f) for f in files]


def _load_local(
    path: str, text_column: str, *, streaming: bool
) -> tuple[datasets.Dataset | datasets.IterableDataset, str]:
    """The local dataset at ``path`` and its text column (always ``"text"`` for ``.txt`` files)."""
    builder, files = local_data_files(path)
    if all(Path(f).stat().st_size == 0 for f in files):
        raise InputError(f"dataset_path {path} holds no documents (its files are empty); point it at non-empty data")
    if builder == "text":
        return datasets.load_dataset("text", data_files=files, split="train", streaming=streaming,
                                     sample_by="document"), "text"
    return datasets.load_dataset(builder, data_files=files, split="train", streaming=streaming), text_column


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
    with progress(len(documents), "tokenizing", unit="doc") as bar:
        for start in range(0, len(documents), _ENCODE_CHUNK):
            chunk = list(documents[start : start + _ENCODE_CHUNK])
            for ids in tokenizer.encode_batch(chunk):
                parts += [np.asarray(ids, dtype=np.int32), eos]
            bar.update(len(chunk))
    return torch.from_numpy(np.concatenate(parts))


def split_tokens(tokens: torch.Tensor, split: str, val_fraction: float) -> torch.Tensor:
    """The ``split`` part of a local dataset's token stream ``(n_tokens,)``: validation is the last
    ``max(1, round(val_fraction * n_tokens))`` tokens, train the others."""
    cut = tokens.numel() - max(1, round(val_fraction * tokens.numel()))
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


class GlobalWindowStream(IterableDataset):
    """Rank ``dp_rank``'s share of the infinite, seeded global window stream (training, map-style).

    Epoch ``e`` is ``randperm(n_windows)`` seeded with ``seed + e``; from the start position (0, or the one
    loaded) rank ``r`` of ``W`` takes the chunks ``c % W == r`` of ``local_batch_size`` windows. The state is
    the global position ``windows_consumed`` (``k * G`` after ``k`` steps of global batch ``G``), valid for
    any world size and batch size.
    """

    world_size_invariant = True
    """The state is a global position: it loads with any ``dp_world_size`` (read by the checkpointer)."""

    def __init__(self, windows: PackedWindows, *, local_batch_size: int, dp_rank: int, dp_world_size: int, seed: int):
        self.windows = windows
        self._settings = {"n_windows": len(windows), "seq_len": windows.seq_len, "seed": seed}
        self._local_batch_size, self._dp_rank, self._dp_world_size = local_batch_size, dp_rank, dp_world_size
        self._start = 0  # global position of this stream's first window
        self._consumed = 0  # windows this rank has yielded since start
        self._perm_epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def _global_index(self, local_index: int) -> int:
        """Index in the global stream of this rank's ``local_index``-th window since ``start``."""
        chunk = (local_index // self._local_batch_size) * self._dp_world_size + self._dp_rank
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
        val_fraction: local files: the fraction of the token stream (its end) held out for validation.
        pin_memory: batches in page-locked memory, for ``non_blocking`` copies to an accelerator.

    Raises:
        ValueError: arguments outside the contract (named with their value), e.g. a validation split of a
            streamed local dataset.
        InputError: a missing ``dataset_path``, an unknown file extension, a missing text column, no
            documents, fewer tokens than one window, or too few validation windows for one batch per rank.
    """
    _check_args(dataset, dataset_path, streaming, seq_len, local_batch_size, dp_rank, dp_world_size, split,
                val_fraction)
    ranks = {"local_batch_size": local_batch_size, "dp_rank": dp_rank, "dp_world_size": dp_world_size}
    if streaming:
        if dataset_path is not None:
            stream, text_column = _load_local(dataset_path, text_column, streaming=True)
            name = f"dataset_path {dataset_path}"
        else:
            stream = datasets.load_dataset(hf_dataset_name, hf_dataset_config, split=split, streaming=True)
            name = f"hub dataset {hf_dataset_name} ({hf_dataset_config or 'default'}, {split})"
        ds = StreamingWindows(stream, tokenizer=tokenizer, text_column=text_column, seq_len=seq_len,
                              dp_rank=dp_rank, dp_world_size=dp_world_size, name=name, restart=split == "validation")
    else:
        documents, name = load_documents(dataset=dataset, dataset_path=dataset_path, hf_dataset_name=hf_dataset_name,
                                         hf_dataset_config=hf_dataset_config, text_column=text_column, split=split)
        tokens = tokenize_documents(tokenizer, documents)
        if dataset_path is not None:
            tokens, name = split_tokens(tokens, split, val_fraction), f"{name} ({split})"
        windows = PackedWindows(tokens, seq_len, name)
        if split == "train":
            ds = GlobalWindowStream(windows, seed=seed, **ranks)
        else:
            ds = OrderedWindows(windows, **ranks)
    with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in recent torch
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return StatefulDataLoader(ds, batch_size=local_batch_size, collate_fn=collate_windows, num_workers=0,
                                  pin_memory=pin_memory)
