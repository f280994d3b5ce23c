"""Parameter counts and training FLOPs of Qwen3 (a dense decoder with QK-norm,
``models/common/flops.py``)."""

from __future__ import annotations

from torchtitan_lite.models.common.flops import dense_flops_per_token, dense_num_params
from torchtitan_lite.models.qwen3.args import Qwen3ModelArgs


def qwen3_num_params(args: Qwen3ModelArgs, include_embedding: bool = True) -> int:
    """Number of distinct parameters of ``Qwen3Model(args)``
    (:func:`~torchtitan_lite.models.common.flops.dense_num_params`)."""
    return dense_num_params(args, qk_norm=True, include_embedding=include_embedding)


def num_flops_per_token(args: Qwen3ModelArgs, seq_len: int) -> float:
    """Training FLOPs per token
    (:func:`~torchtitan_lite.models.common.flops.dense_flops_per_token`).

    Raises:
        ValueError: ``seq_len`` is not positive.
    """
    return dense_flops_per_token(args, seq_len, qk_norm=True)
