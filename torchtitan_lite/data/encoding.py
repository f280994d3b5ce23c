"""Encoding documents into token ids with their lengths, in this process or in a worker process of
``prepared.write_prepared`` (this module imports only numpy and the tokenizer, so a spawned worker
starts fast).
"""

from __future__ import annotations

import os

import numpy as np

from torchtitan_lite.data.tokenizer import Tokenizer

_WORKER_TOKENIZER: Tokenizer | None = None


def init_worker(tokenizer_path: str, eos_token: str | None) -> None:
    """A worker process's set-up: its own tokenizer, with the library's thread pool off."""
    os.environ["TOKENIZERS_PARALLELISM"] = (
        "false"  # one thread per worker: the workers are the parallelism
    )
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = Tokenizer(tokenizer_path, eos_token=eos_token)


def encode(tokenizer: Tokenizer, documents: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, lengths)``: the documents' ids each followed by the EOS (int64 ``(n,)``), and each
    one's length with its EOS (int64 ``(len(documents),)``)."""
    encoded = tokenizer.encode_batch(documents)
    lengths = np.array([len(ids) + 1 for ids in encoded], dtype=np.int64)
    ids = np.full(int(lengths.sum()), tokenizer.eos_id, dtype=np.int64)
    ends = np.cumsum(lengths)
    for e, end, n in zip(encoded, ends, lengths, strict=True):
        ids[end - n : end - 1] = e
    return ids, lengths


def encode_in_worker(documents: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`encode` with the worker's tokenizer (:func:`init_worker`)."""
    return encode(_WORKER_TOKENIZER, documents)
