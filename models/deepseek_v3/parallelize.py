"""How a DeepSeek-V3 model is split over the devices (``ModelSpec.parallelize``, contract in ``models/__init__.py``)."""

from __future__ import annotations

from torch import nn

from models.common.parallelize import apply_ac_compile_fsdp
from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.parallel_options import ParallelOptions


def parallelize_deepseek_v3(model: nn.Module, parallel_dims: ParallelDims, options: ParallelOptions) -> nn.Module:
    """Activation checkpointing, compile and FSDP2 per block (:func:`models.common.parallelize.apply_ac_compile_fsdp`)."""
    return apply_ac_compile_fsdp(model, parallel_dims, options)
