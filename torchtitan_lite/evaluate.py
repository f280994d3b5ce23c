"""Score text with a trained model: ``python -m torchtitan_lite.evaluate [--max_batches N]
[--section.key=value ...]``.

The model and its weights come from the job's config as for ``generate`` (``inference.py``). The
text is every window of ``training.dataset_path`` (a file or folder, all of it: nothing is held out)
or, without one, the validation split of ``training.dataset`` (the held-out play of ``shakespeare``,
a hub dataset's ``validation``), cut into windows of ``training.seq_len + 1`` tokens as in training
and run ``training.local_batch_size`` at a time, with a progress bar. Prints one line: the tokens
scored, the mean next-token cross-entropy (nats/token) and its ``exp``, the perplexity. Exit status
0; 2 with one ``config error:`` or ``input error:`` line on bad input.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator

import torch

from torchtitan_lite.components.loss import cross_entropy_sum
from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.data.loader import build_dataloader
from torchtitan_lite.data.progress import progress
from torchtitan_lite.data.sources import load_documents, tokenize_documents
from torchtitan_lite.data.windows import PackedWindows
from torchtitan_lite.errors import InputError
from torchtitan_lite.inference import LoadedModel, load_model, parse_tool_args, run_tool


def tool_parser() -> argparse.ArgumentParser:
    """The options of this tool (the job's config options follow them)."""
    parser = argparse.ArgumentParser(
        prog="python -m torchtitan_lite.evaluate",
        description=__doc__.split("\n\n")[0],
        epilog="Other options are the job's config options, e.g. --job.config_file, "
        "--checkpoint.load_path, --checkpoint.initial_load_hf, "
        "--training.dataset_path, --training.seq_len.",
    )
    parser.add_argument(
        "--max_batches",
        type=int,
        default=None,
        help="score at most this many batches (default all)",
    )
    return parser


def batches(
    config: JobConfig, loaded: LoadedModel
) -> tuple[Iterator[tuple[torch.Tensor, torch.Tensor]], int, str]:
    """``(batches of (input_ids, labels), number of batches, name of the text)`` (module
    docstring)."""
    t = config.training
    if t.dataset_path is not None:
        documents, name = load_documents(
            dataset="shakespeare",
            dataset_path=t.dataset_path,
            hf_dataset_name=None,
            hf_dataset_config=None,
            text_column=t.text_column,
            split="train",
        )
        windows = PackedWindows(tokenize_documents(loaded.tokenizer, documents), t.seq_len, name)
        starts = range(0, len(windows), t.local_batch_size)

        def stream():
            for start in starts:
                pairs = [
                    windows[i] for i in range(start, min(start + t.local_batch_size, len(windows)))
                ]
                yield torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])

        return stream(), len(starts), name
    loader = build_dataloader(
        dataset=t.dataset,
        hf_dataset_name=t.hf_dataset_name,
        hf_dataset_config=t.hf_dataset_config,
        streaming=t.streaming,
        text_column=t.text_column,
        tokenizer=loaded.tokenizer,
        seq_len=t.seq_len,
        local_batch_size=t.local_batch_size,
        split="validation",
    )
    count = config.validation.steps if t.streaming else len(loader)
    return iter(loader), count, f"{t.hf_dataset_name or t.dataset} (validation)"


def main(argv: list[str] | None = None) -> int:
    """Score and print (module docstring); the exit status."""
    return run_tool(_evaluate, argv)


@torch.no_grad()
def _evaluate(argv: list[str]) -> int:
    options, run = parse_tool_args(tool_parser(), argv)
    if options.max_batches is not None and options.max_batches < 1:
        raise InputError(f"--max_batches must be >= 1, got {options.max_batches}")
    config, loaded = run.config, load_model(run)
    if config.training.seq_len > loaded.args.max_seq_len:
        raise InputError(
            f"training.seq_len {config.training.seq_len} exceeds the model's max_seq_len "
            f"{loaded.args.max_seq_len}; lower it"
        )
    stream, count, name = batches(config, loaded)
    count = count if options.max_batches is None else min(count, options.max_batches)
    loss_sum, tokens = 0.0, 0
    with progress(count, "evaluating", unit="batch") as bar:
        for _, (inputs, labels) in zip(range(count), stream, strict=False):
            logits = loaded.model(inputs.to(loaded.device))
            loss_sum += cross_entropy_sum(logits, labels.to(loaded.device)).item()
            tokens += labels.numel()
            bar.update(1)
    loss = loss_sum / tokens
    print(
        f"{loaded.source} on {name}: {tokens:,} tokens, mean loss {loss:.4f} nats/token, "
        f"perplexity {math.exp(loss):.2f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
