"""Continue a prompt with a trained model: ``python -m torchtitan_lite.generate --prompt TEXT
[options] [--section.key=value ...]``.

The model and its weights come from the job's config (``inference.py``): a training checkpoint
(``--checkpoint.load_path=STEP_FOLDER`` with the job's ``--job.config_file``), or an HF folder
(``--checkpoint.initial_load_hf=DIR``, its ``config.json`` gives the model). The tokenizer is the HF
folder's ``tokenizer.json`` when it has one, else ``model.tokenizer_path``, else the bundled one.
One process, no KV cache (``components/generation.py``): prompt + new tokens must fit in the model's
``max_seq_len``.

Output: the continuation, then ``prompt ids: <ids>`` and ``generated ids: <ids>`` (space-separated)
on their own lines. Exit status 0; 2 with one ``config error:`` or ``input error:`` line on bad
options or input.
"""

from __future__ import annotations

import argparse
import sys

import torch

from torchtitan_lite.components.generation import generate
from torchtitan_lite.errors import InputError
from torchtitan_lite.inference import load_model, parse_tool_args, run_tool


def tool_parser() -> argparse.ArgumentParser:
    """The options of this tool (the job's config options follow them)."""
    parser = argparse.ArgumentParser(
        prog="python -m torchtitan_lite.generate",
        description=__doc__.split("\n\n")[0],
        epilog="Other options are the job's config options, e.g. --job.config_file, "
        "--checkpoint.load_path, --checkpoint.initial_load_hf.",
    )
    parser.add_argument("--prompt", required=True, help="text to continue")
    parser.add_argument(
        "--max_new_tokens", type=int, default=32, help="tokens to add (default 32; fewer at EOS)"
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="softmax temperature; 0 = greedy (default)"
    )
    parser.add_argument(
        "--top_k", type=int, default=None, help="sample among the k most likely tokens only"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the sampling draws (default 0)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Generate and print (module docstring); the exit status."""
    return run_tool(_generate, argv)


def _generate(argv: list[str]) -> int:
    options, run = parse_tool_args(tool_parser(), argv)
    if (
        options.max_new_tokens < 1
        or options.temperature < 0
        or (options.top_k is not None and options.top_k < 1)
    ):
        raise InputError(
            f"--max_new_tokens must be >= 1, --temperature >= 0 and --top_k >= 1; got "
            f"{options.max_new_tokens}, {options.temperature}, {options.top_k}"
        )
    loaded = load_model(run)
    print(f"{loaded.source}; tokenizer {loaded.tokenizer.path}", file=sys.stderr, flush=True)
    prompt_ids = loaded.tokenizer.encode(options.prompt)
    limit = loaded.args.max_seq_len
    if not prompt_ids or len(prompt_ids) + options.max_new_tokens > limit:
        raise InputError(
            f"--prompt has {len(prompt_ids)} tokens and --max_new_tokens is "
            f"{options.max_new_tokens}: "
            f"they must be at least 1 and together at most the model's max_seq_len {limit}"
        )
    if max(prompt_ids) >= loaded.args.vocab_size:
        raise InputError(
            f"tokenizer {loaded.tokenizer.path} gives id {max(prompt_ids)} but the model has "
            f"vocab_size {loaded.args.vocab_size}; use the model's tokenizer (model.tokenizer_path)"
        )
    ids = generate(
        loaded.model,
        prompt_ids,
        options.max_new_tokens,
        device=loaded.device,
        temperature=options.temperature,
        top_k=options.top_k,
        generator=torch.Generator().manual_seed(options.seed),
        eos_id=loaded.tokenizer.eos_id,
    )
    print(loaded.tokenizer.decode(ids))
    print(f"prompt ids: {' '.join(map(str, prompt_ids))}")
    print(f"generated ids: {' '.join(map(str, ids))}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
