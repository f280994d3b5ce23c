"""Progress bars for long phases outside the training loop (tokenizing a corpus, loading a checkpoint).

A thin wrapper over ``tqdm`` (the progress library that ``datasets`` and ``huggingface_hub`` already use):
a bar on standard error when it is a terminal, nothing otherwise (under ``run_train.sh`` the workers'
output goes through torchrun's pipes, so bars show only in interactive single-process tools), and
only on rank 0 so several processes never draw over each other.
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm


def progress(total: int | None, desc: str, unit: str = "it") -> tqdm:
    """A progress bar over ``total`` units (``None``: unknown), e.g. ``with progress(n, "tokenizing", "doc") as bar:
    ... bar.update(k)``; disabled (all methods no-ops) when standard error is not a terminal or
    ``RANK`` (set by torchrun) is not 0."""
    enabled = sys.stderr.isatty() and os.environ.get("RANK", "0") == "0"
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False, dynamic_ncols=True)
