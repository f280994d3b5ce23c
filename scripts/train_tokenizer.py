"""Train the bundled tokenizer: a byte-level BPE with 2048 ids on the Shakespeare training split.

Run from the repository root (writes ``torchtitan_lite/data/assets/tokenizer.json``)::

    python -m scripts.train_tokenizer [--output PATH] [--vocab_size 2048]

Design (GPT-2's byte-level BPE, Radford et al. 2019, as built by Hugging Face ``tokenizers``):
the GPT-2 pre-tokenization regex, the 256 byte symbols as the initial alphabet (so any UTF-8 text
encodes, with no unknown token), no normalizer (``decode(encode(x)) == x`` exactly), and the special
tokens ``<|endoftext|>`` (id 0: the EOS that joins documents, named as in GPT-2 and Qwen3) and
``<|pad|>`` (id 1). ``vocab_size`` counts them. The training text is the 37 training plays
(:func:`torchtitan_lite.corpus.shakespeare_plays`), never the validation play. The output is
deterministic: the same bytes on every run (checked by ``tests/test_tokenizer.py``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from torchtitan_lite.data.corpus import shakespeare_plays

DEFAULT_OUTPUT = (
    Path(__file__).resolve().parent.parent
    / "torchtitan_lite"
    / "data"
    / "assets"
    / "tokenizer.json"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>"]


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE trained on ``texts`` with ``vocab_size`` ids in total (special tokens
    included).

    Raises:
        ValueError: ``vocab_size`` leaves no room for merges (must exceed 256 bytes + special
            tokens).
    """
    min_size = len(pre_tokenizers.ByteLevel.alphabet()) + len(SPECIAL_TOKENS)
    if vocab_size <= min_size:
        raise ValueError(
            f"vocab_size={vocab_size} must be > {min_size} (256 byte symbols + special tokens)"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tokenizer


def main() -> None:
    """Command-line entry point: train on the Shakespeare training split and write the JSON file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--output", type=Path, default=DEFAULT_OUTPUT, help="where to write tokenizer.json"
    )
    parser.add_argument(
        "--vocab_size", type=int, default=2048, help="total ids, special tokens included"
    )
    args = parser.parse_args()
    texts = [text for _, text in shakespeare_plays("train")]
    tokenizer = train_tokenizer(texts, args.vocab_size)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    print(f"wrote {args.output} (vocab {tokenizer.get_vocab_size(with_added_tokens=True)})")


if __name__ == "__main__":
    main()
