"""Progress bars (``tqdm``, as ``datasets`` uses) for long phases outside the training loop, e.g. tokenizing."""

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
