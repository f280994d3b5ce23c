"""Raw text sources: documents from local files (``datasets.load_dataset``), a hub dataset or the
bundled plays, and their token ids.

``datasets`` is imported inside the functions that read raw files or a hub dataset, not with this
module: it takes about 2 s per process (pandas, pyarrow, httpx), which every rank would pay at
start-up while a run on prepared or cached data never calls it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from torchtitan_lite.data.corpus import shakespeare_plays
from torchtitan_lite.data.files import local_data_files
from torchtitan_lite.data.progress import progress
from torchtitan_lite.data.tokenizer import Tokenizer
from torchtitan_lite.errors import InputError

if TYPE_CHECKING:
    import datasets


_ENCODE_DOCUMENTS = (
    1024  # documents per batch-encode call: bounds the memory of the library's Encoding objects
)
_ENCODE_CHARACTERS = (
    2**20
)  # and characters (past its first document): a progress line can come every few seconds


def local_dataset(
    path: str, text_column: str, *, streaming: bool, files: list[str] | None = None
) -> tuple[datasets.Dataset | datasets.IterableDataset, str, list[str]]:
    """The local dataset at ``path`` (only its ``files``, in that order, when given: a shard of a
    prepared set), its text column (always ``"text"`` for ``.txt`` files) and its files. HF
    datasets' progress bar for converting the files is off while they load: its carriage-return
    updates garble the rank logs, and the run prints its own data and tokenizing lines."""
    import datasets

    builder, all_files = local_data_files(path)
    files = all_files if files is None else files
    if all(Path(f).stat().st_size == 0 for f in files):
        raise InputError(
            f"dataset_path {path} holds no documents (its files are empty); point it at non-empty "
            "data"
        )
    options = {"sample_by": "document"} if builder == "text" else {}
    bars_were_off = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(
            builder, data_files=files, split="train", streaming=streaming, **options
        )
    finally:
        if not bars_were_off:
            datasets.enable_progress_bars()
    return ds, "text" if builder == "text" else text_column, files


def _column(ds: datasets.Dataset, text_column: str, where: str) -> list[str]:
    if text_column not in ds.column_names:
        raise InputError(
            f"{where} has no text column '{text_column}' (columns: {', '.join(ds.column_names)}); "
            "set text_column"
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

    For local files (``dataset_path`` set) these are all the documents (training splits them by
    tokens).

    Raises:
        InputError: a missing text column, no documents, or see :func:`local_data_files`.
    """
    if dataset_path is not None:
        where = f"dataset_path {dataset_path}"
        docs = _column(*local_dataset(dataset_path, text_column, streaming=False)[:2], where)
    elif dataset == "hf":
        import datasets

        where = f"hub dataset {hf_dataset_name} ({hf_dataset_config or 'default'}, {split})"
        docs = _column(
            datasets.load_dataset(hf_dataset_name, hf_dataset_config, split=split),
            text_column,
            where,
        )
    else:
        return list(play_texts(split)), f"shakespeare ({split})"
    if not docs:
        raise InputError(f"{where} holds no documents; point the dataset at non-empty data")
    return docs, where


def tokenize_documents(tokenizer: Tokenizer, documents: Sequence[str]) -> torch.Tensor:
    """All documents' token ids, each followed by ``tokenizer.eos_id``, as one int32 tensor
    ``(n_tokens,)``."""
    eos = np.array([tokenizer.eos_id], dtype=np.int32)
    parts = []
    with progress(len(documents), "tokenizing", unit="document") as bar:
        for chunk in _encode_chunks(documents):
            for ids in tokenizer.encode_batch(chunk):
                parts += [np.asarray(ids, dtype=np.int32), eos]
            bar.update(len(chunk))
    return torch.from_numpy(np.concatenate(parts))


def _encode_chunks(documents: Sequence[str]) -> Iterator[list[str]]:
    """``documents`` in consecutive runs of at most ``_ENCODE_DOCUMENTS`` documents and
    ``_ENCODE_CHARACTERS`` characters (a longer document alone)."""
    start = 0
    while start < len(documents):
        end, characters = start + 1, len(documents[start])
        while (
            end < len(documents)
            and end - start < _ENCODE_DOCUMENTS
            and characters + len(documents[end]) <= _ENCODE_CHARACTERS
        ):
            characters += len(documents[end])
            end += 1
        yield list(documents[start:end])
        start = end


def play_texts(split: str) -> Iterator[str]:
    """The texts of the bundled plays of ``split`` (``"train"`` or ``"validation"``), one per
    play."""
    for _, text in shakespeare_plays(split):
        yield text


def local_texts(path: str, text_column: str) -> Iterator[str]:
    """The documents of the local dataset at ``path``, streamed (``text_column``; a ``.txt`` file is
    one document).

    Raises (while iterating):
        InputError: a row without ``text_column``.
    """
    ds, text_column, _ = local_dataset(path, text_column, streaming=True)
    for row in ds:
        if text_column not in row:
            raise InputError(
                f"dataset_path {path} has no text column '{text_column}' (columns: "
                f"{', '.join(row)}); set text_column"
            )
        yield row[text_column]
