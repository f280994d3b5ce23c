"""Data: text documents -> token ids -> packed windows -> a torchdata ``StatefulDataLoader``: the
loaders of a run.

Sources (``data/sources.py``): ``dataset="shakespeare"``, the plays of
:mod:`~torchtitan_lite.data.corpus` (one document per play; ``validation`` is ``the-tempest``,
``train`` the other 37); local files (``dataset_path``: a ``.txt``/``.jsonl``/``.json``/``.parquet``
file or a folder of one format, read by ``datasets.load_dataset``; a ``.txt`` file is one document,
other rows are documents from ``text_column``; the end of the token stream is the validation split,
1% or one global batch, see :func:`~torchtitan_lite.data.windows.held_out_tokens`);
``dataset="hf"``, a hub dataset.

Packing (``data/windows.py``): every document's ids and the EOS, concatenated into one stream of
``n_tokens`` ids: read from a prepared folder (``data/prepared.py``; raw local files and the plays
are prepared on first use into a cache), or int32 in memory for a downloaded hub dataset, cut into
windows of ``seq_len + 1`` tokens.

Ranks (``data/streams.py``): map-style training data is one infinite, seeded global window stream
that ranks take in chunks of ``local_batch_size``; its state is the global position, so it resumes
exactly on any world size. Validation reads its windows in order and ends, with the same number of
batches on every rank. Several local sources (``dataset_paths``) are mixed by weight over the global
stream (``data/mixing.py``). Streaming data is read per rank (``split_dataset_by_node``), in stream
order, forever; it resumes on the same world size only. The loader runs in the main process.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from torchtitan_lite.data.corpus import play_files
from torchtitan_lite.data.files import local_data_files
from torchtitan_lite.data.prepared import (
    PreparedCorpus,
    cached_corpus,
    check_tokenizer,
    file_sources,
    is_prepared,
)
from torchtitan_lite.data.shards import is_prepared_set, prepared_folders
from torchtitan_lite.data.sources import (
    load_documents,
    local_dataset,
    local_texts,
    play_texts,
    tokenize_documents,
)
from torchtitan_lite.data.streams import (
    GlobalWindowStream,
    OrderedWindows,
    StreamingWindows,
    collate_windows,
)
from torchtitan_lite.data.tokenizer import Tokenizer
from torchtitan_lite.data.windows import (
    MAX_HELD_OUT_SHARE,
    ConcatWindows,
    PackedWindows,
    TokenFile,
    TokenFiles,
    held_out_tokens,
    slice_windows,
)

DATASETS = ("shakespeare", "hf")
SPLITS = ("train", "validation")


def _check_args(
    dataset,
    dataset_path,
    streaming,
    seq_len,
    local_batch_size,
    dp_rank,
    dp_world_size,
    split,
    val_fraction,
) -> None:
    """Raise ValueError naming the first argument of :func:`build_dataloader` outside its contract,
    with its value."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset '{dataset}'; use one of {', '.join(DATASETS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split '{split}'; use one of {', '.join(SPLITS)}")
    if streaming and dataset_path is not None and split == "validation":
        raise ValueError(
            "a streaming local dataset has no validation split; set streaming=False for validation"
        )
    for name, value, low in (
        ("seq_len", seq_len, 1),
        ("local_batch_size", local_batch_size, 1),
        ("dp_world_size", dp_world_size, 1),
    ):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    if not 0 <= dp_rank < dp_world_size:
        raise ValueError(f"dp_rank must be in [0, dp_world_size={dp_world_size}), got {dp_rank}")
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")


@dataclass(frozen=True)
class SplitSize:
    """The size of a map-style split: ``documents`` (``None`` for a part of a local stream, cut by
    tokens), ``tokens`` and ``windows`` (:class:`PackedWindows`)."""

    documents: int | None
    tokens: int
    windows: int

    def describe(self, seq_len: int) -> str:
        """``37 documents, 1,759,944 tokens = 6,874 windows of 256``."""
        docs = (
            ""
            if self.documents is None
            else f"{self.documents:,} document{'s' * (self.documents != 1)}, "
        )
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
        """Training tokens each mixed source gave in the first ``tokens_seen`` global tokens (whole
        windows of ``seq_len``), e.g. ``{"/data/web": 71680, "/data/code": 30720}``; empty for one
        source."""
        if not self.sources:
            return {}
        counts = self.train.dataset.windows_per_source(tokens_seen // self.seq_len)
        return {name: n * self.seq_len for name, n in zip(self.sources, counts, strict=True)}

    def describe(self, steps: int, global_batch: int) -> str:
        """One line: tokens, windows and the epochs ``steps`` of ``global_batch`` windows cover,
        e.g. ``shakespeare: train 37 documents, 1,759,944 tokens = 6,874 windows of 256, 400 steps x
        16 windows = 0.93 epochs; validation 1 document, 36,778 tokens = 143 windows of 256``."""
        if self.train_size is None:
            return f"{self.name}: streamed, size unknown (epochs not counted)"
        epochs = steps * global_batch / self.train_size.windows
        text = (
            f"{self.name}: "
            + (f"{self.total.describe(self.seq_len).split(' = ')[0]}; " if self.total else "")
            + f"train {self.train_size.describe(self.seq_len)}, "
            f"{steps:,} step{'s' * (steps != 1)} x "
            f"{global_batch:,} window{'s' * (global_batch != 1)} = {epochs:.3g} epochs"
        )
        if self.validation_size is not None:
            where = "the last " if self.total else ""
            return text + f"; validation {where}{self.validation_size.describe(self.seq_len)}"
        return text + (
            "; validation off (see the warning)" if self.validation_off else "; no validation"
        )


def _loader(ds: IterableDataset, local_batch_size: int, pin_memory: bool) -> StatefulDataLoader:
    with (
        warnings.catch_warnings()
    ):  # torchdata 0.11 calls torch.set_vital, deprecated in recent torch
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return StatefulDataLoader(
            ds,
            batch_size=local_batch_size,
            collate_fn=collate_windows,
            num_workers=0,
            pin_memory=pin_memory,
        )


def _streaming_dataset(
    split: str,
    *,
    dataset_path,
    hf_dataset_name,
    hf_dataset_config,
    text_column,
    tokenizer,
    seq_len,
    dp_rank,
    dp_world_size,
    documents=False,
    **_,
) -> StreamingWindows:
    if dataset_path is not None:
        stream, text_column, _ = local_dataset(dataset_path, text_column, streaming=True)
        name = f"dataset_path {dataset_path}"
    else:
        import datasets

        stream = datasets.load_dataset(
            hf_dataset_name, hf_dataset_config, split=split, streaming=True
        )
        name = f"hub dataset {hf_dataset_name} ({hf_dataset_config or 'default'}, {split})"
    return StreamingWindows(
        stream,
        tokenizer=tokenizer,
        text_column=text_column,
        seq_len=seq_len,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        name=name,
        restart=split == "validation",
        documents=documents,
    )


def _source(
    split: str,
    path: str | None,
    *,
    dataset,
    hf_dataset_name,
    hf_dataset_config,
    text_column,
    tokenizer,
    seq_len,
    documents=False,
    **_,
) -> tuple[PackedWindows, int, str]:
    """``(windows, documents, source name)`` of a map-style split (local data: the whole stream). A
    prepared folder is mapped; raw local files and the plays are prepared on first use into the
    cache (``data/prepared.py``); a hub dataset is tokenized here, in memory."""
    if path is not None and (is_prepared(path) or is_prepared_set(path)):
        corpora = [PreparedCorpus(folder) for folder in prepared_folders(path)]
        for corpus in corpora:
            check_tokenizer(corpus.folder, corpus.manifest, tokenizer, tokenizer.vocab_size)
        tokens, starts = _joined(corpora)
        windows = PackedWindows(tokens, seq_len, f"dataset_path {path}", starts, documents)
        return windows, sum(c.manifest.n_documents for c in corpora), f"dataset_path {path}"
    if path is not None:
        builder, files = local_data_files(path)
        column = "text" if builder == "text" else text_column
        corpus = cached_corpus(
            f"{builder}:{column}", file_sources(files), tokenizer, local_texts(path, text_column)
        )
        name = f"dataset_path {path}"
    elif dataset == "shakespeare":
        corpus = cached_corpus(
            f"shakespeare/{split}", file_sources(play_files(split)), tokenizer, play_texts(split)
        )
        name = f"shakespeare ({split})"
    else:
        texts, name = load_documents(
            dataset=dataset,
            dataset_path=None,
            hf_dataset_name=hf_dataset_name,
            hf_dataset_config=hf_dataset_config,
            text_column=text_column,
            split=split,
        )
        tokens = tokenize_documents(tokenizer, texts)
        after_eos = np.flatnonzero(tokens.numpy() == tokenizer.eos_id)[:-1] + 1
        starts = np.concatenate([np.zeros(1, dtype=np.int64), after_eos.astype(np.int64)])
        return PackedWindows(tokens, seq_len, name, starts, documents), len(texts), name
    tokens, starts = _joined([corpus])
    return (
        PackedWindows(tokens, seq_len, name, starts, documents),
        corpus.manifest.n_documents,
        name,
    )


def _joined(corpora: list[PreparedCorpus]) -> tuple[TokenFile | TokenFiles, np.ndarray]:
    """The token stream and document starts of prepared ``corpora`` one after another (a set's
    shards): one folder's file and mapped starts as they are; several as :class:`TokenFiles` and the
    starts shifted by the tokens before each (int64 in memory, 8 bytes per document)."""
    files = [
        TokenFile(c.tokens_path, np.dtype(c.manifest.dtype), 0, c.manifest.n_tokens)
        for c in corpora
    ]
    if len(corpora) == 1:
        return files[0], corpora[0].starts
    offsets = np.cumsum([0] + [c.manifest.n_tokens for c in corpora[:-1]])
    return TokenFiles(files), np.concatenate(
        [c.starts + off for c, off in zip(corpora, offsets, strict=True)]
    )


def _local_splits(windows: PackedWindows, held: int) -> dict[str, tuple[PackedWindows | None, int]]:
    """``{split: (windows, tokens)}`` of a local stream: validation is its last ``held`` tokens
    (``windows`` is ``None`` for a validation part shorter than one window).

    Raises:
        InputError: the training part is shorter than one window."""
    n, seq_len = windows.tokens.numel(), windows.seq_len
    bounds = {"train": (0, n - held), "validation": (n - held, n)}
    return {
        s: (
            slice_windows(windows, b, e, f"{windows.name} ({s})")
            if s == "train" or e - b > seq_len
            else None,
            e - b,
        )
        for s, (b, e) in bounds.items()
    }


def _map_dataset(
    split: str,
    windows,
    *,
    local_batch_size,
    dp_rank,
    dp_world_size,
    seed,
    weights=None,
    rank_block=1,
    batch_windows=None,
    **_,
) -> IterableDataset:
    ranks = {
        "local_batch_size": local_batch_size,
        "dp_rank": dp_rank,
        "dp_world_size": dp_world_size,
    }
    if split == "train":
        return GlobalWindowStream(
            windows, seed=seed, weights=weights, rank_block=rank_block, **ranks
        )
    return OrderedWindows(windows, batch_windows=batch_windows, **ranks)


def _map_splits(
    wanted: tuple[str, ...],
    *,
    dataset_path,
    dataset_paths,
    val_fraction,
    min_val_windows,
    seq_len,
    **kw,
) -> tuple[dict[str, tuple[Any, SplitSize]], SplitSize | None, str]:
    """``({split: (windows, size)}, total, source name)`` of the ``wanted`` map-style splits. Local
    data: each source's last :func:`held_out_tokens` are its validation part (a mixture's
    validation: the parts one after another), ``total`` sums the whole streams; the training windows
    of a mixture are a list, one per source."""
    paths = list(dataset_paths) or ([dataset_path] if dataset_path is not None else [])
    if not paths:
        splits = {}
        for s in wanted:
            windows, documents, name = _source(s, None, seq_len=seq_len, **kw)
            splits[s] = windows, SplitSize(documents, windows.tokens.numel(), len(windows))
        return splits, None, name.rsplit(" (", 1)[0]  # shakespeare (train) -> shakespeare
    sources = [_source("train", p, seq_len=seq_len, **kw) for p in paths]
    min_windows = -(-min_val_windows // len(paths))
    parts = [
        _local_splits(
            w,
            held_out_tokens(
                w.tokens.numel(), val_fraction, seq_len=seq_len, min_windows=min_windows
            ),
        )
        for w, _, _ in sources
    ]
    total = SplitSize(
        sum(d for _, d, _ in sources),
        sum(w.tokens.numel() for w, _, _ in sources),
        sum(len(w) for w, _, _ in sources),
    )
    splits = {}
    for s in wanted:
        chosen = [p[s][0] for p in parts if p[s][0] is not None]
        size = SplitSize(None, sum(p[s][1] for p in parts), sum(len(w) for w in chosen))
        if len(parts) == 1:
            windows = chosen[0] if chosen else None
        else:
            windows = (
                chosen
                if s == "train"
                else ConcatWindows(chosen, f"dataset_paths ({s})")
                if chosen
                else None
            )
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
    """A loader of ``(input_ids, labels)`` batches, each int64 ``(local_batch_size, seq_len)``
    (module docstring).

    Training loaders never end; map-style validation loaders end after ``len(loader)`` batches, the
    same on every rank, and restart on each ``iter()``. After ``load_state_dict`` the next batch is
    the one the saved run would have produced.

    Args:
        dataset, dataset_path, hf_dataset_name, hf_dataset_config, streaming: the source (module
        docstring;
            ``dataset_path`` wins over ``dataset``; which combinations a run may use is the config's
            check). ``dataset_path`` may be a prepared folder (``data/prepared.py``); raw files are
            prepared on first use.
        dataset_paths, dataset_weights: several local sources (prepared or raw) mixed by weight
        (equal when
            ``dataset_weights`` is empty; ``data/mixing.py``); they win over ``dataset_path``.
        text_column: the text column of ``.jsonl``/``.parquet``/hub rows.
        seed: seeds the per-epoch shuffle (``seed + epoch``).
        split: ``"train"`` or ``"validation"``.
        val_fraction, min_val_windows: local files: the part of the token stream (its end) held out
        for
            validation (:func:`held_out_tokens`).
        pin_memory: batches in page-locked memory, for ``non_blocking`` copies to an accelerator.
        documents: batches are ``(input_ids, labels, document_ids)``, the ids int32
            ``(local_batch_size, seq_len)`` (:func:`document_ids`) from the document starts of the
            source (streamed data: from the EOS the loader puts after each document).

    Raises:
        ValueError: arguments outside the contract (named with their value), e.g. a validation split
            of a streamed local dataset.
        InputError: a missing ``dataset_path``, an unknown file extension, a missing text column, no
            documents, fewer tokens than one window, too few validation windows for one batch per
            rank, or a prepared folder that is incomplete or made with another tokenizer.
    """
    kw = dict(
        dataset=dataset,
        dataset_path=dataset_path,
        hf_dataset_name=hf_dataset_name,
        hf_dataset_config=hf_dataset_config,
        text_column=text_column,
        tokenizer=tokenizer,
        seq_len=seq_len,
        local_batch_size=local_batch_size,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        seed=seed,
        documents=documents,
    )
    _check_args(
        dataset,
        dataset_path,
        streaming,
        seq_len,
        local_batch_size,
        dp_rank,
        dp_world_size,
        split,
        val_fraction,
    )
    if streaming:
        return _loader(_streaming_dataset(split, **kw), local_batch_size, pin_memory)
    splits, _, _ = _map_splits(
        (split,),
        dataset_paths=dataset_paths,
        val_fraction=val_fraction,
        min_val_windows=min_val_windows,
        **kw,
    )
    weights = _weights(dataset_paths, dataset_weights)
    return _loader(
        _map_dataset(split, splits[split][0], weights=weights, **kw), local_batch_size, pin_memory
    )


def _weights(dataset_paths: Sequence[str], dataset_weights: Sequence[float]) -> list[float] | None:
    """The mixture's weights (equal when none are given), or ``None`` for one source."""
    if len(dataset_paths) < 2:
        return None
    return list(dataset_weights) or [1.0] * len(dataset_paths)


def build_dataloaders(
    *,
    validation: bool,
    min_val_windows: int,
    streaming: bool = False,
    val_fraction: float = 0.01,
    pin_memory: bool = False,
    dataset_paths: Sequence[str] = (),
    dataset_weights: Sequence[float] = (),
    **kw: Any,
) -> DataLoaders:
    """The training loader and, with ``validation``, the validation loader of one run, with their
    sizes.

    Arguments as :func:`build_dataloader` (``split`` excepted). Map-style data is read once per
    source (local files: once for both splits). A local dataset holds out :func:`held_out_tokens`
    with ``min_val_windows`` (the trainer's global batch, so validation gets at least one batch on
    every rank when the data allows). Map-style validation reads whole batches of
    ``min_val_windows`` windows (:class:`OrderedWindows`: the same windows on every layout with that
    global batch); a validation split with fewer windows than that leaves validation off, saying why
    in ``validation_off``, instead of failing.

    Raises:
        ValueError, InputError: as :func:`build_dataloader` (the training split).
    """
    seq_len, local_batch_size, dp_world_size = (
        kw["seq_len"],
        kw["local_batch_size"],
        kw.get("dp_world_size", 1),
    )
    kw.setdefault("dataset", "shakespeare")
    kw.setdefault("dataset_path", None)
    for key in ("hf_dataset_name", "hf_dataset_config"):
        kw.setdefault(key, None)
    kw.setdefault("text_column", "text")
    for key, default in (("dp_rank", 0), ("dp_world_size", 1), ("seed", 0)):
        kw.setdefault(key, default)
    _check_args(
        kw["dataset"],
        kw["dataset_path"],
        streaming,
        seq_len,
        local_batch_size,
        kw.get("dp_rank", 0),
        dp_world_size,
        "train",
        val_fraction,
    )
    if streaming:
        train = _loader(_streaming_dataset("train", **kw), local_batch_size, pin_memory)
        val = (
            _loader(_streaming_dataset("validation", **kw), local_batch_size, pin_memory)
            if validation
            else None
        )
        return DataLoaders(train, val, train.dataset.name, seq_len)
    wanted = ("train", "validation") if validation else ("train",)
    splits, total, source = _map_splits(
        wanted,
        dataset_paths=dataset_paths,
        val_fraction=val_fraction,
        min_val_windows=min_val_windows,
        **kw,
    )
    weights = _weights(dataset_paths, dataset_weights)
    train_windows, train_size = splits["train"]
    train = _loader(
        _map_dataset("train", train_windows, weights=weights, **kw), local_batch_size, pin_memory
    )
    names = list(dataset_paths) if weights is not None else []
    result = DataLoaders(train, None, source, seq_len, total, train_size, sources=names)
    if not validation:
        return result
    val_windows, val_size = splits["validation"]
    need = max(min_val_windows, local_batch_size * dp_world_size)
    if val_size.windows < need:
        share = (
            f" (at most {MAX_HELD_OUT_SHARE:.0%} of the data is held out)"
            if total is not None
            else ""
        )
        result.validation_off = (
            f"{source} (validation) has {val_size.tokens:,} tokens = {val_size.windows} windows of "
            f"{seq_len}, fewer "
            f"than one global batch ({need} windows){share}; use more data, a smaller seq_len or "
            "global batch, or --validation.enable=false"
        )
        return result
    result.validation = _loader(
        _map_dataset("validation", val_windows, batch_windows=need, **kw),
        local_batch_size,
        pin_memory,
    )
    result.validation_size = val_size
    return result
