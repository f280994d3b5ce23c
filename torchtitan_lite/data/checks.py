"""The data checks of a run, done before any work (called by the config's preflight): every local source exists
and can be read, a prepared folder is whole and was made with the run's tokenizer, its ids fit the model, and the
mixture's weights are usable."""

from __future__ import annotations

import os

from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.schema import Training
from torchtitan_lite.data.loader import local_data_files
from torchtitan_lite.data.mixing import quotas
from torchtitan_lite.data.prepared import check_files, check_tokenizer, is_prepared
from torchtitan_lite.data.tokenizer import Tokenizer
from torchtitan_lite.errors import InputError


def check_training_data(training: Training, tokenizer: Tokenizer, vocab_size: int) -> None:
    """``training.dataset_path`` or each of ``training.dataset_paths`` is a whole prepared folder made with
    ``tokenizer`` whose largest id is below ``vocab_size``, or raw files of one known format; a mixture's
    ``dataset_weights`` has one positive weight per path. Reads manifests and file sizes only.

    Raises:
        ConfigError: the first problem, one line naming the key, the file and the fix.
    """
    paths = list(training.dataset_paths)
    key = "training.dataset_paths"
    if paths and training.dataset_path is not None:
        raise ConfigError(f"{key}: set either training.dataset_path or training.dataset_paths, not both")
    if paths and (training.streaming or training.dataset == "hf"):
        raise ConfigError(f"{key}: mixing is for local data; unset training.streaming and training.dataset = \"hf\"")
    if training.dataset_weights and len(training.dataset_weights) != len(paths):
        raise ConfigError(f"training.dataset_weights: {len(training.dataset_weights)} weights for {len(paths)} "
                          "dataset_paths; give one weight per path (or none for equal weights)")
    if not paths and training.dataset_path is not None:
        paths, key = [training.dataset_path], "training.dataset_path"
    try:
        if len(paths) > 1:
            quotas(list(training.dataset_weights) or [1.0] * len(paths))
        for path in paths:
            if not os.path.exists(path):
                raise InputError(f"no such file or folder {path!r}")
            if is_prepared(path):
                check_tokenizer(path, check_files(path), tokenizer, vocab_size)
            else:
                local_data_files(path)
    except InputError as err:
        raise ConfigError(f"{key}: {err}") from None
