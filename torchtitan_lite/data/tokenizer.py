"""Tokenizer: a thin wrapper around a Hugging Face ``tokenizers`` ``tokenizer.json`` (the bundled
byte-level BPE, vocab 2048, from ``scripts/train_tokenizer.py``, or a real model's). Text is encoded
without special tokens: the data pipeline places the EOS between documents itself.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from torchtitan_lite.errors import InputError

BUNDLED_TOKENIZER = Path(__file__).resolve().parent / "assets" / "tokenizer.json"

EOS_TOKEN_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
"""Known end-of-text tokens, tried in order: GPT-2/Qwen/ours, Llama 3, Llama 2/Mistral, Gemma."""


class Tokenizer:
    """Encode text to token ids and back with a ``tokenizer.json``.

    Args:
        path: a ``tokenizer.json`` file.
        eos_token: the end-of-text token; ``None`` takes the first of :data:`EOS_TOKEN_NAMES` in the
            vocab.

    Attributes:
        vocab_size: ids an embedding table must hold: the largest id (added tokens included) + 1.
        eos_token, eos_id: the end-of-text token and its id.

    Raises:
        InputError: no file at ``path``, not a readable ``tokenizer.json``, or no EOS token.
    """

    def __init__(self, path: str | Path, eos_token: str | None = None):
        self.path = str(path)
        if not Path(path).is_file():
            raise InputError(f"tokenizer file not found: {path}; pass the path of a tokenizer.json")
        try:
            self._tokenizer = HFTokenizer.from_file(self.path)
        except Exception as e:  # the Rust library raises its own exception type
            raise InputError(
                f"cannot read tokenizer file {path} as a Hugging Face tokenizer.json: {e}"
            ) from e
        vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1
        names = (eos_token,) if eos_token is not None else EOS_TOKEN_NAMES
        found = [name for name in names if name in vocab]
        if not found:
            raise InputError(
                f"tokenizer {path} has none of the EOS tokens {', '.join(names)}; use a "
                "tokenizer.json whose vocab "
                "has one (the data pipeline puts it between documents), or from Python name its "
                "end-of-text token with eos_token=..."
            )
        self.eos_token, self.eos_id = found[0], vocab[found[0]]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, encoded in parallel by the library's thread pool."""
        return [e.ids for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; special tokens (e.g. the EOS) are kept in the text."""
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"Tokenizer(path={self.path!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def build_tokenizer(path: str | None = None, eos_token: str | None = None) -> Tokenizer:
    """The tokenizer at ``path``, or the bundled one
    (``torchtitan_lite/data/assets/tokenizer.json``) when ``None``.

    Raises:
        InputError: see :class:`Tokenizer`.
    """
    return Tokenizer(BUNDLED_TOKENIZER if path is None else path, eos_token=eos_token)
