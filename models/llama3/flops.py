"""Parameter counts and training FLOPs of Llama 3 (a dense decoder without QK-norm,
``models/common/flops.py``)."""

from __future__ import annotations

from torchtitan_lite.models.common.flops import dense_flops_per_token, dense_num_params
from torchtitan_lite.models.llama3.args import Llama3ModelArgs


def llama3_num_params(args: Llama3ModelArgs, include_embedding: bool = True) -> int:
    """Number of distinct parameters of ``Llama3Model(args)``
    (:func:`~torchtitan_lite.models.common.flops.dense_num_params`): 8,030,261,248 for 8b,
    70,553,706,496 for 70b."""
    return dense_num_params(args, qk_norm=False, include_embedding=include_embedding)


def num_flops_per_token(args: Llama3ModelArgs, seq_len: int) -> float:
    """Training FLOPs per token
    (:func:`~torchtitan_lite.models.common.flops.dense_flops_per_token`).

    Raises:
        ValueError: ``seq_len`` is not positive.
    """
    return dense_flops_per_token(args, seq_len, qk_norm=False)
