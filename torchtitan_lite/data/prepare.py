"""Tokenize a corpus once into a prepared folder (:mod:`torchtitan_lite.data.prepared`)::

    python -m torchtitan_lite.data.prepare --input /data/corpus --output /data/corpus.prepared
    ./run_train.sh --training.dataset_path=/data/corpus.prepared

``--input``: a ``.txt``/``.jsonl``/``.json``/``.parquet`` file or a folder of one format (read as
training reads raw files: a ``.txt`` file is one document, other rows are documents from
``--text_column``), or the name of a Hugging Face hub dataset, streamed. A bad input prints one line
and exits 2 before anything is written.

On many machines, each runs one shard of a set (``data/shards.py``), and training reads the set as
one corpus::

    python -m torchtitan_lite.data.prepare --input /data/corpus --output /data/corpus.set
    --num_shards 3 --shard_index 0
    python -m torchtitan_lite.data.prepare --verify /data/corpus.set
    ./run_train.sh --training.dataset_path=/data/corpus.set
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import datasets

from torchtitan_lite.data.files import local_data_files
from torchtitan_lite.data.prepared import file_sources, is_prepared, write_prepared
from torchtitan_lite.data.shards import (
    check_shard_args,
    checked_folders,
    contiguous_range,
    input_hash,
    is_prepared_set,
    shard_name,
)
from torchtitan_lite.data.sources import local_dataset
from torchtitan_lite.data.tokenizer import build_tokenizer
from torchtitan_lite.errors import InputError

BYTES_PER_WORKER = 16 * 2**20
"""Input bytes per default encoding worker: each spawned worker pays its start-up (imports, its own
tokenizer) before it encodes, so a small input is faster in this process
(``benchmarks/bench_prepare_workers.py``; the measurements behind this value:
``docs/benchmarks.md``, "Prepare workers")."""


def _texts(rows: Iterable[dict], text_column: str, where: str) -> Iterator[str]:
    for row in rows:
        if text_column not in row:
            raise InputError(
                f"{where} has no text column '{text_column}' (columns: {', '.join(row)}); set "
                "--text_column"
            )
        yield row[text_column]


@dataclass
class InputPart:
    """What one prepare reads: its ``documents`` in order, the ``sources`` recorded in the manifest
    (``[{"path", "size"}]``), ``total_bytes`` (an estimate of the documents' UTF-8 bytes for the
    progress and the worker count, ``None``: unknown) and, for a shard of a set, its ``shard``
    record (``data/shards.py``)."""

    documents: Iterator[str]
    sources: list[dict]
    total_bytes: int | None
    shard: dict | None = None


def input_bytes(files: list[str]) -> int:
    """The bytes of ``files`` on disk; for ``.parquet`` files the uncompressed size of their row
    groups (read from the footer), since compressed text would count a fraction of the text prepare
    encodes."""
    import pyarrow.parquet as pq

    total = 0
    for f in files:
        if f.endswith(".parquet"):
            meta = pq.ParquetFile(f).metadata
            total += sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
        else:
            total += Path(f).stat().st_size
    return total


def input_documents(
    source: str,
    text_column: str,
    hf_config: str | None = None,
    split: str = "train",
    num_shards: int = 1,
    shard_index: int = 0,
) -> InputPart:
    """The documents of ``source`` (a local file or folder when it exists, else a hub dataset name,
    streamed, whose ``sources`` are ``[{"path": name, "size": 0}]``), or of its shard
    ``shard_index`` of ``num_shards`` (``data/shards.py``: by file, by document, or a hub dataset's
    files).

    Raises:
        InputError: an unknown extension, a folder without data files, a missing text column (see
            ``files.local_data_files``), a hub dataset of fewer files than shards.
    """
    if not Path(source).exists():
        stream = datasets.load_dataset(source, hf_config, split=split, streaming=True)
        shard = None
        if num_shards > 1:
            if stream.num_shards < num_shards:
                raise InputError(
                    f"hub dataset {source} has {stream.num_shards} files, fewer than --num_shards "
                    f"{num_shards}; use at most {stream.num_shards} shards"
                )
            stream = stream.shard(num_shards, shard_index, contiguous=True)
            shard = {
                "index": shard_index,
                "count": num_shards,
                "by": "hub files",
                "input": input_hash([source, hf_config, split]),
            }
        return InputPart(
            _texts(stream, text_column, f"hub dataset {source}"),
            [{"path": source, "size": 0}],
            None,
            shard,
        )
    _, files = local_data_files(source)
    if num_shards == 1:
        stream, column, _ = local_dataset(source, text_column, streaming=True)
        return InputPart(_texts(stream, column, source), file_sources(files), input_bytes(files))
    shard = {"index": shard_index, "count": num_shards, "input": input_hash(file_sources(files))}
    if len(files) >= num_shards:
        begin, end = contiguous_range(len(files), num_shards, shard_index)
        mine = files[begin:end]
        stream, column, _ = local_dataset(source, text_column, streaming=True, files=mine)
        return InputPart(
            _texts(stream, column, source),
            file_sources(mine),
            input_bytes(mine),
            {**shard, "by": "file", "files": [begin, end]},
        )
    print(
        f"prepare: {source} has {len(files)} file{'s' * (len(files) > 1)} for {num_shards} shards: "
        "counting its documents to split them (one pass, no tokenizing)",
        flush=True,
    )
    stream, column, _ = local_dataset(source, text_column, streaming=True)
    n_documents = sum(1 for _ in stream)
    if n_documents < num_shards:
        raise InputError(
            f"{source} holds {n_documents} documents, fewer than --num_shards {num_shards}; use at "
            f"most {max(n_documents, 1)} shards"
        )
    begin, end = contiguous_range(n_documents, num_shards, shard_index)
    print(
        f"prepare: {n_documents:,} documents; shard {shard_index} takes documents {begin:,} .. "
        f"{end - 1:,}",
        flush=True,
    )
    stream, column, _ = local_dataset(source, text_column, streaming=True)
    share = input_bytes(files) * (end - begin) // max(n_documents, 1)
    return InputPart(
        islice(_texts(stream, column, source), begin, end),
        file_sources(files),
        share,
        {**shard, "by": "document", "documents": [begin, end]},
    )


def default_workers(total_bytes: int | None, cpus: int) -> int:
    """Encoding processes for an input of ``total_bytes`` (``None``: unknown, a hub stream) on
    ``cpus`` CPUs: one per :data:`BYTES_PER_WORKER` of input, at most ``cpus``; 0 (this process,
    with the tokenizer library's threads) when that is fewer than 2 (one worker encodes no faster
    than this process) or there is one CPU; ``cpus`` for an unknown size."""
    n = cpus if total_bytes is None else min(cpus, total_bytes // BYTES_PER_WORKER)
    return n if n >= 2 else 0


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, as ``os.process_cpu_count`` of Python
    3.13)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _workers_line(workers: int, total_bytes: int | None, cpus: int) -> str:
    size = "unknown size" if total_bytes is None else f"{total_bytes / 2**20:,.1f} MiB"
    what = "encoding in this process" if workers == 0 else f"{workers} encoding workers"
    return (
        f"prepare: {what} (default for {size} on {cpus} CPU{'s' * (cpus > 1)}: one worker per "
        f"{BYTES_PER_WORKER // 2**20} MiB, none below 2; --workers N to choose)"
    )


def verify(path: str) -> str:
    """One line describing the prepared folder or set at ``path`` after checking it
    (``shards.checked_folders``).

    Raises:
        InputError: the first problem found.
    """
    if not Path(path).exists():
        raise InputError(f"--verify {path}: no such folder")
    if not (is_prepared(path) or is_prepared_set(path)):
        raise InputError(
            f"--verify {path} is neither a prepared folder nor a set of shard-*-of-* folders"
        )
    shards = checked_folders(path)
    tok = shards[0][1].tokenizer
    docs, tokens = sum(m.n_documents for _, m in shards), sum(m.n_tokens for _, m in shards)
    what = f"{len(shards)} shards, each whole, " if len(shards) > 1 else ""
    return (
        f"{path}: {what}{docs:,} documents, {tokens:,} tokens ({shards[0][1].dtype}), tokenizer "
        f"{tok['path']} (sha256 {tok['sha256'][:12]}, eos {tok['eos_id']})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchtitan_lite.data.prepare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--input", help="file, folder or hub dataset name")
    parser.add_argument(
        "--output",
        help="the prepared folder to create (must not exist); with --num_shards, the "
        "set's folder, shared by the shards",
    )
    parser.add_argument(
        "--tokenizer", default=None, help="a tokenizer.json (default: the bundled one)"
    )
    parser.add_argument(
        "--eos_token", default=None, help="the end-of-text token (default: found in the vocab)"
    )
    parser.add_argument(
        "--text_column", default="text", help="column of the text in .jsonl/.parquet/hub rows"
    )
    parser.add_argument("--hf_config", default=None, help="hub dataset configuration, e.g. en")
    parser.add_argument("--split", default="train", help="hub dataset split")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"encoding processes (0 = this process; default: one per {BYTES_PER_WORKER // 2**20} "
        "MiB of input up to the CPU count, 0 below 2)",
    )
    parser.add_argument(
        "--num_shards", type=int, default=1, help="split the input into this many shards of a set"
    )
    parser.add_argument(
        "--shard_index", type=int, default=None, help="the shard this command prepares, 0-based"
    )
    parser.add_argument(
        "--verify",
        default=None,
        metavar="PATH",
        help="check a prepared folder or set (every shard present and whole, one tokenizer)",
    )
    args = parser.parse_args(argv)
    try:
        if args.verify is not None:
            print(verify(args.verify))
            return 0
        if args.input is None or args.output is None:
            raise InputError("--input and --output are required (or --verify PATH)")
        if args.workers is not None and args.workers < 0:
            raise InputError(f"--workers must be >= 0, got {args.workers}")
        check_shard_args(args.num_shards, args.shard_index)
        output = Path(args.output)
        if args.num_shards > 1:
            if is_prepared(output):
                raise InputError(
                    f"--output {output} is a prepared folder, not a set; choose a new folder"
                )
            output = output / shard_name(args.shard_index, args.num_shards)
        if output.exists():
            raise InputError(f"--output {output} exists; choose a new folder or delete it")
        tokenizer = build_tokenizer(args.tokenizer, args.eos_token)
        part = input_documents(
            args.input,
            args.text_column,
            args.hf_config,
            args.split,
            args.num_shards,
            args.shard_index or 0,
        )
        cpus = available_cpus()
        workers = args.workers
        if workers is None:
            workers = default_workers(part.total_bytes, cpus)
            print(_workers_line(workers, part.total_bytes, cpus), flush=True)
        m = write_prepared(
            part.documents,
            output,
            tokenizer,
            sources=part.sources,
            workers=workers,
            total_bytes=part.total_bytes,
            shard=part.shard,
        )
    except InputError as err:
        print(f"prepare error: {err}", file=sys.stderr)
        return 2
    print(f"{output}: {m.n_documents:,} documents, {m.n_tokens:,} tokens ({m.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
