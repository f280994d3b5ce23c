"""Mixing several sources by weight: which source, and which of its windows, fills each global
window position.

Positions come in blocks of :data:`BLOCK`; in each block source ``k`` takes ``quotas[k]`` positions
(the weights rounded to ``1 / BLOCK`` by largest remainder), spread evenly by smooth weighted
round-robin (nginx's upstream balancing): at each position the source furthest behind its share goes
next. The pattern is the same in every block, so position ``g`` maps to ``(source, index)`` in O(1)
and the count of any source's windows before ``g`` is exact: a run resumes at a global position on
any world size, and the proportions over ``n`` windows are within ``1 / BLOCK`` of the quotas plus
``len(weights) / n``.
"""

from __future__ import annotations

import numpy as np

from torchtitan_lite.errors import InputError

BLOCK = 1000
"""Positions per repetition of the pattern: weights are resolved to 0.1%."""


def quotas(weights: list[float]) -> list[int]:
    """Positions per block of each source: ``weights / sum(weights) * BLOCK`` rounded by largest
    remainder (ties to the first source), summing to :data:`BLOCK`.

    Raises:
        InputError: a weight that is not positive, or so small that its source gets no position in a
            block.
    """
    if not weights or any(not w > 0 for w in weights):
        raise InputError(
            f"training.dataset_weights {weights} must all be > 0; give each source a positive "
            "weight"
        )
    shares = np.array(weights, dtype=np.float64) / sum(weights) * BLOCK
    result = np.floor(shares).astype(np.int64)
    order = np.argsort(-(shares - result), kind="stable")
    result[order[: BLOCK - int(result.sum())]] += 1
    if (result == 0).any():
        raise InputError(
            f"training.dataset_weights {weights}: a weight below {1 / BLOCK:.1%} of the total gets "
            "no window; raise it or drop that source"
        )
    return result.tolist()


class Mixture:
    """The interleaving of sources with ``weights`` (module docstring).

    Attributes:
        quotas: positions per block of each source.
        source: int64 ``(BLOCK,)``, the source of each position in a block.
        index: int64 ``(BLOCK,)``, the position's rank among its source's positions in the block.
    """

    def __init__(self, weights: list[float]):
        self.quotas = quotas(weights)
        q = np.array(self.quotas, dtype=np.int64)
        taken = np.zeros_like(q)
        self.source = np.empty(BLOCK, dtype=np.int64)
        self.index = np.empty(BLOCK, dtype=np.int64)
        for j in range(BLOCK):
            k = int(
                np.argmax((j + 1) * q - BLOCK * taken)
            )  # furthest behind its share after j + 1 positions
            self.source[j], self.index[j] = k, taken[k]
            taken[k] += 1

    def locate(self, position: int) -> tuple[int, int]:
        """``(source, index)``: global window ``position`` is window ``index`` of source
        ``source``'s own stream."""
        block, j = divmod(position, BLOCK)
        k = int(self.source[j])
        return k, block * self.quotas[k] + int(self.index[j])

    def counts(self, positions: int) -> list[int]:
        """Windows each source fills among global positions ``0 .. positions - 1``."""
        block, j = divmod(positions, BLOCK)
        partial = np.bincount(self.source[:j], minlength=len(self.quotas))
        return [block * q + int(p) for q, p in zip(self.quotas, partial, strict=True)]
