"""How a Llama 3 model is split over the devices (``ModelSpec.parallelize``, contract in
``torchtitan_lite/protocols/model_spec.py``).

Tensor parallelism (torchtitan's llama3 plan, Megatron layout; see the notes in
``torchtitan_lite/distributed/tensor_parallel.py``): the GQA attention
(:func:`torchtitan_lite.models.common.parallelize. attention_plan`, no QK-norm), the SwiGLU
column-wise ``w1``/``w3`` and row-wise ``w2``, sequence-parallel norms.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ParallelStyle

from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.parallel_options import ParallelOptions
from torchtitan_lite.distributed.tensor_parallel import norm_plan, swiglu_plan
from torchtitan_lite.models.common.parallelize import attention_plan, parallelize_decoder


def block_plan(
    block: nn.Module, mesh: DeviceMesh, sequence_parallel: bool
) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan of one Llama 3 block: the attention, ``ffn_norm``, the SwiGLU."""
    return {
        **attention_plan(sequence_parallel, qk_norm=False),
        **norm_plan("ffn_norm", sequence_parallel),
        **swiglu_plan("feed_forward", sequence_parallel),
    }


def parallelize_llama3(
    model: nn.Module, parallel_dims: ParallelDims, options: ParallelOptions
) -> nn.Module:
    """Tensor parallelism (:func:`block_plan`), activation checkpointing, compile and FSDP2
    (:func:`torchtitan_lite.models.common.parallelize.parallelize_decoder`)."""
    return parallelize_decoder(model, parallel_dims, options, block_plan)
