"""How a Qwen3 model is split over the devices (``ModelSpec.parallelize``, contract in ``models/__init__.py``).

Tensor parallelism (torchtitan's qwen3 plan, Megatron layout; see the notes in
``torchtitan_lite/distributed/tensor_parallel.py``): column-wise ``wq``/``wk``/``wv`` (whole query and key/value
heads per rank: GQA's kv heads split with their query groups), QK-norm whole on every rank over the rank's heads,
row-wise ``wo``; SwiGLU column-wise ``w1``/``w3``, row-wise ``w2``; sequence-parallel norms.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from models.common.parallelize import parallelize_decoder
from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.parallel_options import ParallelOptions
from torchtitan_lite.distributed.tensor_parallel import (
    head_norm,
    input_gathered,
    norm_plan,
    residual_layout,
    swiglu_plan,
)


def attention_plan(sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The plan of a block's Qwen3 ``attention`` (``models/qwen3/model.py``; also Qwen3-MoE's) and its norm:
    input gathered (``cos``/``sin`` plain), q/k/v column-wise, QK-norm over the local heads, ``wo`` row-wise."""
    return {
        **norm_plan("attention_norm", sequence_parallel),
        "attention": input_gathered(sequence_parallel, n_extra=2),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.q_norm": head_norm(),
        "attention.k_norm": head_norm(),
        "attention.wo": RowwiseParallel(output_layouts=residual_layout(sequence_parallel)),
    }


def block_plan(block: nn.Module, mesh: DeviceMesh, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan of one dense Qwen3 block: :func:`attention_plan`, ``ffn_norm``, the SwiGLU."""
    return {**attention_plan(sequence_parallel), **norm_plan("ffn_norm", sequence_parallel),
            **swiglu_plan("feed_forward", sequence_parallel)}


def parallelize_qwen3(model: nn.Module, parallel_dims: ParallelDims, options: ParallelOptions) -> nn.Module:
    """Tensor parallelism (:func:`block_plan`), activation checkpointing, compile and FSDP2
    (:func:`models.common.parallelize.parallelize_decoder`)."""
    return parallelize_decoder(model, parallel_dims, options, block_plan)
