"""The checks of the data settings (``[training]`` dataset keys, ``[validation]``), of the training
data (prepared folders whole and made with the run's tokenizer, raw files readable, a mixture's
weights) and of the tokenizer against the model, run before any work starts (``preflight/checks.py``
calls them; one :class:`ConfigError` line naming the key)."""

from __future__ import annotations

import os
from typing import Any

from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.load import Sources, where
from torchtitan_lite.config.schema import JobConfig, Training
from torchtitan_lite.data import prepared, shards
from torchtitan_lite.data.files import local_data_files
from torchtitan_lite.data.mixing import quotas
from torchtitan_lite.data.tokenizer import Tokenizer, build_tokenizer
from torchtitan_lite.errors import InputError


def check_data_settings(config: JobConfig, sources: Sources) -> None:
    """The dataset keys agree: ``dataset = "hf"`` with a hub name and no local path, streaming only
    where it applies, a sample prompt only with validation, and no validation of a streamed local
    dataset."""
    training = config.training
    if training.dataset == "hf" and not training.hf_dataset_name:
        raise ConfigError(
            f'{where(sources, "training.hf_dataset_name")}: dataset = "hf" needs a hub dataset '
            "name, e.g. allenai/c4"
        )
    if training.dataset != "hf" and training.hf_dataset_name is not None:
        raise ConfigError(
            f"{where(sources, 'training.hf_dataset_name')}: is set but training.dataset is "
            f'{training.dataset!r}; set training.dataset = "hf" to use a hub dataset'
        )
    if training.dataset == "hf" and training.dataset_path is not None:
        raise ConfigError(
            f'{where(sources, "training.dataset_path")}: local files and dataset = "hf" exclude '
            "each other; unset one of them"
        )
    if training.streaming and training.dataset == "shakespeare" and training.dataset_path is None:
        raise ConfigError(
            f"{where(sources, 'training.streaming')}: the shakespeare plays are read in memory; "
            'streaming is for training.dataset_path or dataset = "hf"'
        )
    if config.validation.sample_prompt is not None and not config.validation.enable:
        raise ConfigError(
            f"{where(sources, 'validation.sample_prompt')}: samples are written at each "
            "validation, and validation.enable is false; enable validation or unset the prompt"
        )
    if training.streaming and training.dataset_path is not None and config.validation.enable:
        raise ConfigError(
            f"{where(sources, 'validation.enable')}: a streamed local dataset "
            "(training.dataset_path "
            "with training.streaming) has no validation split; set --validation.enable=false, or "
            "training.streaming=false to hold out the end of the data"
        )


def check_training_data(training: Training, tokenizer: Tokenizer, vocab_size: int) -> None:
    """``training.dataset_path`` or each of ``training.dataset_paths`` is a whole prepared folder or
    set (``data/shards.py``: every shard present, one tokenizer) made with ``tokenizer`` whose
    largest id is below ``vocab_size``, or raw files of one known format; a mixture's
    ``dataset_weights`` has one positive weight per path. Reads manifests and file sizes only.

    Raises:
        ConfigError: the first problem, one line naming the key, the file and the fix.
    """
    paths = list(training.dataset_paths)
    key = "training.dataset_paths"
    if paths and training.dataset_path is not None:
        raise ConfigError(
            f"{key}: set either training.dataset_path or training.dataset_paths, not both"
        )
    if paths and (training.streaming or training.dataset == "hf"):
        raise ConfigError(
            f'{key}: mixing is for local data; unset training.streaming and training.dataset = "hf"'
        )
    if training.dataset_weights and len(training.dataset_weights) != len(paths):
        raise ConfigError(
            f"training.dataset_weights: {len(training.dataset_weights)} weights for {len(paths)} "
            "dataset_paths; give one weight per path (or none for equal weights)"
        )
    if not paths and training.dataset_path is not None:
        paths, key = [training.dataset_path], "training.dataset_path"
    try:
        if len(paths) > 1:
            quotas(list(training.dataset_weights) or [1.0] * len(paths))
        for path in paths:
            if not os.path.exists(path):
                raise InputError(f"no such file or folder {path!r}")
            if prepared.is_prepared(path) or shards.is_prepared_set(path):
                for folder, manifest in shards.checked_folders(path):
                    prepared.check_tokenizer(folder, manifest, tokenizer, vocab_size)
            else:
                local_data_files(path)
    except InputError as err:
        raise ConfigError(f"{key}: {err}") from None


def check_tokenizer(config: JobConfig, path: str | None, args: Any) -> Tokenizer:
    """The tokenizer at ``path`` (``None``: the bundled one) reads, its vocab fits the model
    ``args``'s embedding rows, and ``validation.sample_prompt`` (if set) has tokens and fits
    ``max_seq_len`` with ``validation.sample_tokens``; the tokenizer."""
    try:
        tokenizer = build_tokenizer(path)
    except InputError as err:
        raise ConfigError(f"model.tokenizer_path: {err}") from None
    if tokenizer.vocab_size > args.vocab_size:
        raise ConfigError(
            f"model.tokenizer_path: tokenizer {tokenizer.path} has vocab_size "
            f"{tokenizer.vocab_size} "
            f"but the model has {args.vocab_size} embedding rows; set --model.overrides.vocab_size="
            f"{tokenizer.vocab_size} (or more) or use a smaller tokenizer"
        )
    prompt = config.validation.sample_prompt
    if prompt is not None:
        n = len(tokenizer.encode(prompt))
        if n == 0 or n + config.validation.sample_tokens > args.max_seq_len:
            raise ConfigError(
                f"validation.sample_prompt: {n} tokens + validation.sample_tokens "
                f"{config.validation.sample_tokens} must be between 1 and the model's max_seq_len "
                f"{args.max_seq_len}; shorten the prompt or the sample"
            )
    return tokenizer
