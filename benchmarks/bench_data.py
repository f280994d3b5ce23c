"""Benchmark (not a test): preparing a corpus, and the start-up and memory of a rank's loader on
prepared data vs the in-memory path (every rank tokenizes the whole corpus and holds it as int32).

Two deterministic synthetic corpora (numpy seed 0):

  * text (``--text_mb``): JSON lines of documents made of sentences drawn from the bundled plays,
    for prepare throughput (tokens/s with 1 and 2 worker processes) and for the in-memory path,
    which must hold it all;
  * tokens (``--gb``, the size of ``tokens.bin``): a prepared folder written directly (uint16 ids
    below the bundled vocab, documents of 50-5000 tokens), the size a real corpus reaches, to
    measure what the loader costs at scale.

Per path and data-parallel size (1, 2: the ranks run as separate processes at the same time, as
torchrun starts them; the loader needs no process group), each rank reports: ``start`` seconds from
building the loaders
(training + validation, the trainer's call) to its first batch; ``rss`` the growth of its peak
resident memory (``ru_maxrss``) over that and the steps; ``data_wait`` the mean seconds per
``next()`` over ``--steps`` batches.

    python benchmarks/bench_data.py                   # 2 GB of tokens, 40 MB of text: a few minutes
    python benchmarks/bench_data.py --gb 0.1 --text_mb 4  # quick
"""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine_load import reported_load  # noqa: E402

SEQ_LEN, LOCAL_BATCH = 2048, 4


def write_text(path: Path, megabytes: float) -> None:
    """JSON lines of documents of 5-200 sentences drawn (seed 0) from the plays' lines,
    ``megabytes`` in all."""
    from torchtitan_lite.data.corpus import shakespeare_plays

    lines = [
        line for _, text in shakespeare_plays("train") for line in text.split("\n") if line.strip()
    ]
    rng = np.random.default_rng(0)
    written, limit = 0, int(megabytes * 2**20)
    with open(path, "w") as f:
        while written < limit:
            doc = "\n".join(lines[i] for i in rng.integers(0, len(lines), rng.integers(5, 200)))
            row = json.dumps({"text": doc}) + "\n"
            f.write(row)
            written += len(row)


def write_tokens(folder: Path, gigabytes: float, tokenizer) -> None:
    """A prepared folder of ``gigabytes`` of uint16 ids (seed 0), written in blocks, then renamed
    (the format of ``data/prepared.py``)."""
    from torchtitan_lite.data import prepared

    n_tokens = int(gigabytes * 2**30) // 2
    rng = np.random.default_rng(0)
    partial = folder.with_name(folder.name + ".partial")
    partial.mkdir(parents=True)
    starts, position, block = [], 0, 2**26
    with open(partial / prepared.TOKENS, "wb") as f:
        while position < n_tokens:
            n = min(block, n_tokens - position)
            ids = rng.integers(1, tokenizer.vocab_size, n, dtype=np.uint16)
            lengths = rng.integers(50, 5000, n // 50 + 1)
            ends = np.cumsum(lengths)
            ends = ends[ends < n]
            ids[ends - 1] = tokenizer.eos_id
            starts.append(position + np.concatenate([[0], ends]))
            ids.tofile(f)
            position += n
    starts = np.concatenate(starts).astype(np.int64)
    starts.tofile(partial / prepared.DOCUMENTS)
    manifest = prepared.Manifest(
        prepared.FORMAT,
        prepared.tokenizer_identity(tokenizer),
        "uint16",
        n_tokens,
        len(starts),
        tokenizer.vocab_size - 1,
        [{"path": "synthetic", "size": 0}],
    )
    (partial / prepared.MANIFEST).write_text(json.dumps(dataclasses.asdict(manifest)))
    os.rename(partial, folder)


def rank(args) -> None:
    """One rank's loader: prints a JSON line of start, rss growth and data_wait."""
    from torchtitan_lite.data.loader import build_dataloaders
    from torchtitan_lite.data.sources import load_documents, tokenize_documents
    from torchtitan_lite.data.tokenizer import build_tokenizer
    from torchtitan_lite.data.windows import PackedWindows

    warnings.filterwarnings(
        "ignore", message="'set_vital' is deprecated"
    )  # torchdata 0.11 on recent torch
    tok = build_tokenizer()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    begin = time.perf_counter()
    ranks = dict(
        local_batch_size=LOCAL_BATCH, dp_rank=args.rank, dp_world_size=args.world_size, seed=0
    )
    if (
        args.mode == "in_memory"
    ):  # the path before prepared data: tokenize everything here, hold int32 ids
        from torchdata.stateful_dataloader import StatefulDataLoader

        from torchtitan_lite.data.streams import GlobalWindowStream, collate_windows

        docs, name = load_documents(
            dataset="shakespeare",
            dataset_path=args.path,
            hf_dataset_name=None,
            hf_dataset_config=None,
            text_column="text",
            split="train",
        )
        windows = PackedWindows(tokenize_documents(tok, docs), SEQ_LEN, name)
        del docs
        train = StatefulDataLoader(
            GlobalWindowStream(windows, **ranks), batch_size=LOCAL_BATCH, collate_fn=collate_windows
        )
    else:
        train = build_dataloaders(
            validation=True,
            min_val_windows=LOCAL_BATCH * args.world_size,
            dataset_path=args.path,
            tokenizer=tok,
            seq_len=SEQ_LEN,
            **ranks,
        ).train
    it = iter(train)
    next(it)
    start = time.perf_counter() - begin
    waits = []
    for _ in range(args.steps):
        t = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t)
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024
    print(
        json.dumps(
            {"start_s": start, "rss_mb": rss / 2**20, "data_wait_ms": 1e3 * float(np.mean(waits))}
        )
    )


def run_ranks(mode: str, path: Path, world_size: int, steps: int) -> list[dict]:
    """Start ``world_size`` rank processes at once and collect their JSON lines."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--rank",
                str(r),
                "--world_size",
                str(world_size),
                "--mode",
                mode,
                "--path",
                str(path),
                "--steps",
                str(steps),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env={**env, "RANK": str(r)},
        )
        for r in range(world_size)
    ]
    results = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"rank process failed ({mode}, {world_size}): exit {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def prepare_rate(text: Path, out: Path, workers: int) -> tuple[float, int]:
    """``(tokens/s, tokens)`` of ``python -m torchtitan_lite.data.prepare`` on ``text`` with
    ``workers`` processes (the whole command, start-up of the workers included)."""
    begin = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torchtitan_lite.data.prepare",
            "--input",
            str(text),
            "--output",
            str(out),
            "--workers",
            str(workers),
        ],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    seconds = time.perf_counter() - begin
    n = json.loads((out / "manifest.json").read_text())["n_tokens"]
    return n / seconds, n


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--gb", type=float, default=2.0, help="size of the prepared token corpus (tokens.bin)"
    )
    parser.add_argument("--text_mb", type=float, default=40.0, help="size of the text corpus")
    parser.add_argument("--steps", type=int, default=200, help="batches per rank after the first")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world_size", type=int)
    parser.add_argument("--mode")
    parser.add_argument("--path")
    args = parser.parse_args()
    if args.rank is not None:
        return rank(args)
    from torchtitan_lite.data.tokenizer import build_tokenizer

    with tempfile.TemporaryDirectory() as tmp, reported_load():
        tmp = Path(tmp)
        os.environ["TORCHTITAN_LITE_DATA_CACHE"] = str(tmp / "cache")
        text = tmp / "text.jsonl"
        write_text(text, args.text_mb)
        print(f"text corpus: {text.stat().st_size / 2**20:.1f} MB of JSON lines", flush=True)
        for workers in (1, 2):
            rate, n = prepare_rate(text, tmp / f"prepared{workers}", workers)
            print(
                f"prepare, {workers} worker{'s' * (workers > 1)}: {rate:,.0f} tokens/s ({n:,} "
                "tokens)",
                flush=True,
            )
        begin = time.perf_counter()
        write_tokens(tmp / "tokens", args.gb, build_tokenizer())
        size = (tmp / "tokens" / "tokens.bin").stat().st_size
        print(
            f"token corpus: {size / 2**30:.2f} GB ({size // 2:,} tokens), written in "
            f"{time.perf_counter() - begin:.0f} s",
            flush=True,
        )
        cases = [
            ("prepared", tmp / "tokens", f"prepared {size / 2**30:.2f} GB"),
            ("prepared", tmp / "prepared2", f"prepared {args.text_mb:g} MB text"),
            ("in_memory", text, f"in-memory {args.text_mb:g} MB text"),
        ]
        print(f"per rank (seq_len {SEQ_LEN}, local batch {LOCAL_BATCH}, {args.steps} steps):")
        for mode, path, label in cases:
            for world_size in (1, 2):
                for r, res in enumerate(run_ranks(mode, path, world_size, args.steps)):
                    print(
                        f"  {label:<24} NGPU={world_size} rank {r}: start {res['start_s']:6.2f} s  "
                        "rss "
                        f"+{res['rss_mb']:7.1f} MB  data_wait {res['data_wait_ms']:.3f} ms/step",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
