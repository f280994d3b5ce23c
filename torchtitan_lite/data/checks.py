"""The checks of the data settings (``[training]`` dataset keys, ``[validation]``) and of the tokenizer against
the model, run before any work starts (``config/checks.py`` calls them; one :class:`ConfigError` line naming the
key)."""

from __future__ import annotations

from typing import Any

from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.load import Sources, where
from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.data.files import local_data_files
from torchtitan_lite.data.tokenizer import Tokenizer, build_tokenizer
from torchtitan_lite.errors import InputError


def check_data_settings(config: JobConfig, sources: Sources) -> None:
    """The dataset keys agree: ``dataset = "hf"`` with a hub name and no local path, streaming only where it
    applies, a sample prompt only with validation, and no validation of a streamed local dataset."""
    training = config.training
    if training.dataset == "hf" and not training.hf_dataset_name:
        raise ConfigError(f"{where(sources, 'training.hf_dataset_name')}: dataset = \"hf\" needs a hub dataset "
                          "name, e.g. allenai/c4")
    if training.dataset != "hf" and training.hf_dataset_name is not None:
        raise ConfigError(f"{where(sources, 'training.hf_dataset_name')}: is set but training.dataset is "
                          f"{training.dataset!r}; set training.dataset = \"hf\" to use a hub dataset")
    if training.dataset == "hf" and training.dataset_path is not None:
        raise ConfigError(f"{where(sources, 'training.dataset_path')}: local files and dataset = \"hf\" exclude "
                          "each other; unset one of them")
    if training.streaming and training.dataset == "shakespeare" and training.dataset_path is None:
        raise ConfigError(f"{where(sources, 'training.streaming')}: the shakespeare plays are read in memory; "
                          "streaming is for training.dataset_path or dataset = \"hf\"")
    if config.validation.sample_prompt is not None and not config.validation.enable:
        raise ConfigError(f"{where(sources, 'validation.sample_prompt')}: samples are written at each validation, "
                          "and validation.enable is false; enable validation or unset the prompt")
    if training.streaming and training.dataset_path is not None and config.validation.enable:
        raise ConfigError(f"{where(sources, 'validation.enable')}: a streamed local dataset (training.dataset_path "
                          "with training.streaming) has no validation split; set --validation.enable=false, or "
                          "training.streaming=false to hold out the end of the data")


def check_data_files(config: JobConfig) -> None:
    """``training.dataset_path`` (if set) holds data files (reads the folder listing only)."""
    if config.training.dataset_path is not None:
        try:
            local_data_files(config.training.dataset_path)
        except InputError as err:
            raise ConfigError(f"training.dataset_path: {err}") from None


def check_tokenizer(config: JobConfig, path: str | None, args: Any) -> Tokenizer:
    """The tokenizer at ``path`` (``None``: the bundled one) reads, its vocab fits the model ``args``'s embedding
    rows, and ``validation.sample_prompt`` (if set) has tokens and fits ``max_seq_len`` with
    ``validation.sample_tokens``; the tokenizer."""
    try:
        tokenizer = build_tokenizer(path)
    except InputError as err:
        raise ConfigError(f"model.tokenizer_path: {err}") from None
    if tokenizer.vocab_size > args.vocab_size:
        raise ConfigError(f"model.tokenizer_path: tokenizer {tokenizer.path} has vocab_size {tokenizer.vocab_size} "
                          f"but the model has {args.vocab_size} embedding rows; set --model.overrides.vocab_size="
                          f"{tokenizer.vocab_size} (or more) or use a smaller tokenizer")
    prompt = config.validation.sample_prompt
    if prompt is not None:
        n = len(tokenizer.encode(prompt))
        if n == 0 or n + config.validation.sample_tokens > args.max_seq_len:
            raise ConfigError(f"validation.sample_prompt: {n} tokens + validation.sample_tokens "
                              f"{config.validation.sample_tokens} must be between 1 and the model's max_seq_len "
                              f"{args.max_seq_len}; shorten the prompt or the sample")
    return tokenizer
