"""Prepared corpora: token ids written once to memory-mapped files, as Megatron-LM's
``.bin``/``.idx`` and nanoGPT's ``train.bin`` are (see ``docs/data.md``, "Prepared data").

A prepared folder holds three files:

- ``tokens.bin``: every document's ids followed by the EOS, concatenated (the stream of
  ``windows.py``), raw little-endian ``uint16`` when the tokenizer's ids fit (vocab <= 65,536), else
  ``uint32``;
- ``documents.bin``: int64, the position in ``tokens.bin`` where each document starts (the first is
  0);
- ``manifest.json``: format, tokenizer (path, sha256 of its file, vocab size, EOS id), dtype,
  counts, the largest id, the source files with their sizes, and for a shard of a set its place in
  the set (``data/shards.py``).

Writing goes to a ``.partial-*`` folder beside the output, renamed to the output when complete, so a
folder with a manifest at the output path is always whole. Documents are encoded by ``workers``
spawned processes (each with the tokenizer library's own threads off), or in this process with its
threads for ``workers=0``. The worker code lives in ``encoding.py``, which imports neither torch nor
``datasets``.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import multiprocessing
import os
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from torchtitan_lite.data.encoding import encode, encode_in_worker, init_worker
from torchtitan_lite.data.progress import progress
from torchtitan_lite.data.tokenizer import Tokenizer
from torchtitan_lite.errors import InputError

FORMAT = "torchtitan_lite.prepared/1"
MANIFEST, TOKENS, DOCUMENTS = "manifest.json", "tokens.bin", "documents.bin"
CACHE_ENV = "TORCHTITAN_LITE_DATA_CACHE"
"""Environment variable naming the cache of raw text prepared on first use (default
``~/.cache/torchtitan_lite/data``)."""

CHUNK_DOCUMENTS = (
    1024  # documents per task sent to a worker: bounds its memory and the results in flight
)
CHUNK_CHARACTERS = 2**22  # and characters (a longer document alone)
MIN_CHUNKS = (
    40  # and at most 1/40 of the input's bytes, so each 10% of the progress takes several chunks,
)
MIN_CHUNK_CHARACTERS = (
    2**18
)  # but not below 256 Ki characters: the library's threads share a chunk's documents


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id of a ``vocab_size`` vocabulary fits (<= 65,536 ids), else
    ``uint32``."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def tokenizer_identity(tokenizer: Tokenizer) -> dict:
    """``{"path", "sha256", "vocab_size", "eos_id"}`` of ``tokenizer``: the sha256 of its
    ``tokenizer.json`` file and the EOS id decide the token stream (the path is for messages
    only)."""
    digest = hashlib.sha256(Path(tokenizer.path).read_bytes()).hexdigest()
    return {
        "path": tokenizer.path,
        "sha256": digest,
        "vocab_size": tokenizer.vocab_size,
        "eos_id": tokenizer.eos_id,
    }


@dataclass(frozen=True)
class Manifest:
    """The contents of ``manifest.json`` (module docstring)."""

    format: str
    tokenizer: dict
    dtype: str
    n_tokens: int
    n_documents: int
    max_token_id: int
    sources: list
    shard: dict | None = (
        None  # {"index", "count", "by", "input"} of a shard of a set (data/shards.py), else None
    )

    @staticmethod
    def read(folder: str | Path) -> Manifest:
        """The manifest of the prepared ``folder``.

        Raises:
            InputError: no ``manifest.json``, not JSON, another format, or missing keys.
        """
        path = Path(folder) / MANIFEST
        try:
            data = json.loads(path.read_text())
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, not {FORMAT!r}")
            return Manifest(
                **{k: data[k] for k in Manifest.__dataclass_fields__ if k != "shard"},
                shard=data.get("shard"),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise InputError(
                f"{path} is not a prepared-data manifest ({err}); prepare the folder again with "
                "python -m torchtitan_lite.data.prepare"
            ) from None


def is_prepared(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a ``manifest.json`` (a prepared corpus, whole or
    not)."""
    return (Path(path) / MANIFEST).is_file()


class PreparedCorpus:
    """A prepared folder opened for reading: its checked ``manifest``, ``tokens_path`` (read a
    window at a time by ``windows.TokenFile``) and ``starts`` (int64 array mapped from
    ``documents.bin``, ``(n_documents,)``).

    Raises:
        InputError: see :func:`check_files`.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.manifest = check_files(folder)
        m = self.manifest
        self.tokens_path = self.folder / TOKENS
        self.starts = _map(self.folder / DOCUMENTS, np.dtype(np.int64), m.n_documents)


def _map(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    """The first ``count`` items of ``path`` as a copy-on-write map, advised random access (a search
    touches a few pages anywhere in the file; the kernel's default read-around would map megabytes
    around each)."""
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    if hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(mapped, dtype=dtype, count=count)


def check_files(folder: str | Path) -> Manifest:
    """The manifest of ``folder`` after checking that its files are whole: ``tokens.bin`` and
    ``documents.bin`` hold the manifest's counts, the dtype holds the largest id, and there is at
    least one token.

    Raises:
        InputError: the first problem, naming the file and the fix.
    """
    folder = Path(folder)
    m = Manifest.read(folder)
    again = "prepare it again with python -m torchtitan_lite.data.prepare"
    if m.n_tokens == 0:
        raise InputError(
            f"{folder / MANIFEST}: the prepared corpus holds no tokens (empty input); prepare "
            "non-empty data"
        )
    if m.dtype not in ("uint16", "uint32") or m.max_token_id >= np.iinfo(m.dtype).max + 1:
        raise InputError(
            f"{folder / MANIFEST}: token ids up to {m.max_token_id} do not fit dtype {m.dtype}; "
            f"{again}"
        )
    for name, itemsize, count in (
        (TOKENS, np.dtype(m.dtype).itemsize, m.n_tokens),
        (DOCUMENTS, 8, m.n_documents),
    ):
        path = folder / name
        if not path.is_file():
            raise InputError(f"{path} is missing; {again}")
        if path.stat().st_size != itemsize * count:
            raise InputError(
                f"{path} has {path.stat().st_size:,} bytes, the manifest says {itemsize * count:,} "
                f"(truncated or replaced); {again}"
            )
    return m


def check_tokenizer(
    folder: str | Path, manifest: Manifest, tokenizer: Tokenizer, vocab_size: int
) -> None:
    """The prepared ``folder`` was made with ``tokenizer`` (same file hash and EOS id) and its ids
    fit a model of ``vocab_size`` embedding rows.

    Raises:
        InputError: naming the manifest and the fix.
    """
    made, now = manifest.tokenizer, tokenizer_identity(tokenizer)
    path = Path(folder) / MANIFEST
    if (made.get("sha256"), made.get("eos_id")) != (now["sha256"], now["eos_id"]):
        raise InputError(
            f"{path}: prepared with tokenizer {made.get('path')} (sha256 "
            f"{str(made.get('sha256'))[:12]}, "
            f"eos {made.get('eos_id')}), but this run uses {now['path']} (sha256 "
            f"{now['sha256'][:12]}, "
            f"eos {now['eos_id']}); prepare the data with this run's tokenizer or set "
            "model.tokenizer_path to the one it was prepared with"
        )
    if manifest.max_token_id >= vocab_size:
        raise InputError(
            f"{path}: token id {manifest.max_token_id} exceeds the model's vocab_size "
            f"{vocab_size}; set "
            f"--model.overrides.vocab_size={manifest.max_token_id + 1} (or more) or prepare with "
            "the model's tokenizer"
        )


def _chunks(documents: Iterable[str], max_characters: int) -> Iterator[tuple[list[str], int]]:
    """``(documents, utf-8 bytes)`` in runs of at most :data:`CHUNK_DOCUMENTS` documents and
    ``max_characters`` characters (a longer document alone)."""
    chunk, characters, size = [], 0, 0
    for doc in documents:
        if chunk and (len(chunk) >= CHUNK_DOCUMENTS or characters + len(doc) > max_characters):
            yield chunk, size
            chunk, characters, size = [], 0, 0
        chunk.append(doc)
        characters += len(doc)
        size += len(doc.encode("utf-8"))
    if chunk:
        yield chunk, size


def _encoded(
    documents: Iterable[str], tokenizer: Tokenizer, workers: int, total_bytes: int | None
) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """``(ids, lengths, bytes)`` of each chunk of ``documents`` (at most ``1 / MIN_CHUNKS`` of
    ``total_bytes`` when known, but at least ``MIN_CHUNK_CHARACTERS``), in order; at most
    ``2 * workers`` chunks in flight (``multiprocessing.Pool.imap`` would read the whole input
    ahead)."""
    max_characters = min(
        CHUNK_CHARACTERS, max(MIN_CHUNK_CHARACTERS, (total_bytes or 2**62) // MIN_CHUNKS)
    )
    if workers == 0:
        for chunk, size in _chunks(documents, max_characters):
            yield *encode(tokenizer, chunk), size
        return
    ctx = multiprocessing.get_context(
        "spawn"
    )  # fork after the library's threads ran can deadlock it
    with ctx.Pool(
        workers, initializer=init_worker, initargs=(tokenizer.path, tokenizer.eos_token)
    ) as pool:
        pending: deque = deque()
        for chunk, size in _chunks(documents, max_characters):
            pending.append((pool.apply_async(encode_in_worker, (chunk,)), size))
            if len(pending) >= 2 * workers:
                result, size = pending.popleft()
                yield *result.get(), size
        while pending:
            result, size = pending.popleft()
            yield *result.get(), size


def write_prepared(
    documents: Iterable[str],
    output: str | Path,
    tokenizer: Tokenizer,
    *,
    sources: list[dict],
    workers: int = 0,
    total_bytes: int | None = None,
    shard: dict | None = None,
) -> Manifest:
    """Tokenize ``documents`` into the prepared folder ``output`` (module docstring) and return its
    manifest.

    Args:
        sources: ``[{"path", "size"}, ...]`` recorded in the manifest.
        workers: encoding processes; 0 encodes here with the tokenizer library's threads.
        total_bytes: the input's size for the progress bar's ETA (``None``: unknown).
        shard: recorded in the manifest for a shard of a set (``data/shards.py``).

    Raises:
        InputError: ``output`` exists (nothing is touched), or no documents.
    """
    output = Path(output)
    if output.exists():
        raise InputError(f"prepare output {output} exists; choose a new folder or delete it")
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    try:
        manifest = _write(documents, partial, tokenizer, sources, workers, total_bytes, shard)
        os.chmod(
            partial, 0o777 & ~_umask()
        )  # mkdtemp makes it private (0o700); a corpus is shared like any folder
        os.rename(partial, output)  # atomic: the output appears whole or not at all
    finally:
        if partial.exists():
            shutil.rmtree(partial)
    return manifest


def _umask() -> int:
    """This process's file-creation mask (read by setting it and setting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write(
    documents, folder: Path, tokenizer: Tokenizer, sources, workers, total_bytes, shard
) -> Manifest:
    dtype = token_dtype(tokenizer.vocab_size)
    n_tokens, n_documents, max_id, start = 0, 0, 0, time.perf_counter()
    with (
        open(folder / TOKENS, "wb") as tokens_file,
        open(folder / DOCUMENTS, "wb") as documents_file,
        progress(total_bytes or 0, "preparing", unit="byte") as bar,
    ):
        for ids, lengths, size in _encoded(documents, tokenizer, workers, total_bytes):
            max_id = max(max_id, int(ids.max()))
            if max_id > np.iinfo(dtype).max:
                raise InputError(
                    f"tokenizer {tokenizer.path} gave id {max_id}, beyond {dtype.name}; its "
                    f"vocab_size {tokenizer.vocab_size} is wrong (ids must be below it)"
                )
            ids.astype(dtype).tofile(tokens_file)
            (n_tokens + np.cumsum(lengths) - lengths).tofile(documents_file)
            n_tokens, n_documents = n_tokens + len(ids), n_documents + len(lengths)
            bar.set_postfix_str(
                f"{n_tokens / (time.perf_counter() - start):,.0f} tokens/s", refresh=False
            )
            bar.update(size)
    if n_documents == 0:
        raise InputError(
            f"no documents to prepare from {', '.join(s['path'] for s in sources) or 'the input'}; "
            "point it at non-empty data"
        )
    manifest = Manifest(
        FORMAT,
        tokenizer_identity(tokenizer),
        dtype.name,
        n_tokens,
        n_documents,
        max_id,
        sources,
        shard,
    )
    (folder / MANIFEST).write_text(json.dumps(asdict(manifest), indent=1) + "\n")
    return manifest


def cache_root() -> Path:
    """The cache of raw text prepared on first use: ``$TORCHTITAN_LITE_DATA_CACHE`` or
    ``~/.cache/torchtitan_lite/data``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "torchtitan_lite" / "data")


def cached_corpus(
    kind: str, sources: list[dict], tokenizer: Tokenizer, documents: Iterable[str]
) -> PreparedCorpus:
    """The prepared corpus of ``documents`` from the cache, prepared (in this process) on first use.

    The key is a hash of ``kind`` (how documents are read from the files, e.g.
    ``"shakespeare/train"`` or ``"json:text"``), ``sources`` (``[{"path", "size"}]``) and the
    tokenizer's identity; ``documents`` is only iterated on a miss. Ranks that miss together each
    prepare and the first rename wins.
    """
    identity = tokenizer_identity(tokenizer)
    key = json.dumps(
        [FORMAT, kind, sources, identity["sha256"], identity["eos_id"]], sort_keys=True
    )
    folder = cache_root() / hashlib.sha256(key.encode()).hexdigest()[:20]
    if not is_prepared(folder):
        try:
            write_prepared(
                documents,
                folder,
                tokenizer,
                sources=sources,
                total_bytes=sum(s["size"] for s in sources),
            )
        except (InputError, OSError):
            if not is_prepared(folder):  # else another rank's rename won the race: use its folder
                raise
    return PreparedCorpus(folder)


def file_sources(files: list[str]) -> list[dict]:
    """``[{"path": absolute path, "size": bytes}]`` of ``files``, for a manifest or a cache key."""
    return [{"path": str(Path(f).resolve()), "size": Path(f).stat().st_size} for f in files]
