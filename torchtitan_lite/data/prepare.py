"""Tokenize a corpus once into a prepared folder (:mod:`torchtitan_lite.data.prepared`)::

    python -m torchtitan_lite.data.prepare --input /data/corpus --output /data/corpus.prepared [--workers 8]
    ./run_train.sh --training.dataset_path=/data/corpus.prepared

``--input``: a ``.txt``/``.jsonl``/``.json``/``.parquet`` file or a folder of one format (read as training reads
raw files: a ``.txt`` file is one document, other rows are documents from ``--text_column``), or the name of a
Hugging Face hub dataset, streamed. A bad input prints one line and exits 2 before anything is written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Iterable, Iterator

import datasets

from torchtitan_lite.data.prepared import file_sources, write_prepared
from torchtitan_lite.data.sources import local_dataset
from torchtitan_lite.data.tokenizer import build_tokenizer
from torchtitan_lite.errors import InputError


def _texts(rows: Iterable[dict], text_column: str, where: str) -> Iterator[str]:
    for row in rows:
        if text_column not in row:
            raise InputError(f"{where} has no text column '{text_column}' (columns: {', '.join(row)}); set "
                             "--text_column")
        yield row[text_column]


def input_documents(source: str, text_column: str, hf_config: str | None = None,
                    split: str = "train") -> tuple[Iterator[str], list[dict]]:
    """``(documents, sources)`` of ``source``: a local file or folder when it exists, else a hub dataset name
    (streamed; its ``sources`` are ``[{"path": name, "size": 0}]``).

    Raises:
        InputError: an unknown extension, a folder without data files, a missing text column (see
            ``files.local_data_files``).
    """
    if Path(source).exists():
        stream, text_column, files = local_dataset(source, text_column, streaming=True)
        return _texts(stream, text_column, source), file_sources(files)
    stream = datasets.load_dataset(source, hf_config, split=split, streaming=True)
    return _texts(stream, text_column, f"hub dataset {source}"), [{"path": source, "size": 0}]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchtitan_lite.data.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="file, folder or hub dataset name")
    parser.add_argument("--output", required=True, help="the prepared folder to create (must not exist)")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer.json (default: the bundled one)")
    parser.add_argument("--eos_token", default=None, help="the end-of-text token (default: found in the vocab)")
    parser.add_argument("--text_column", default="text", help="column of the text in .jsonl/.parquet/hub rows")
    parser.add_argument("--hf_config", default=None, help="hub dataset configuration, e.g. en")
    parser.add_argument("--split", default="train", help="hub dataset split")
    parser.add_argument("--workers", type=int, default=os.cpu_count(),
                        help="encoding processes (default: the CPU count; 0 = this process)")
    args = parser.parse_args(argv)
    try:
        if args.workers < 0:
            raise InputError(f"--workers must be >= 0, got {args.workers}")
        if Path(args.output).exists():
            raise InputError(f"--output {args.output} exists; choose a new folder or delete it")
        tokenizer = build_tokenizer(args.tokenizer, args.eos_token)
        documents, sources = input_documents(args.input, args.text_column, args.hf_config, args.split)
        m = write_prepared(documents, args.output, tokenizer, sources=sources, workers=args.workers,
                           total_bytes=sum(s["size"] for s in sources) or None)
    except InputError as err:
        print(f"prepare error: {err}", file=sys.stderr)
        return 2
    print(f"{args.output}: {m.n_documents:,} documents, {m.n_tokens:,} tokens ({m.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
