"""How a Qwen3-MoE model is split over the devices (``ModelSpec.parallelize``, contract in
``torchtitan_lite/protocols/model_spec.py``).

Tensor parallelism: the attention with QK-norm
(:func:`torchtitan_lite.models.common.parallelize.attention_plan`) and the MoE layer whole on every
rank on the gathered sequence, router and experts not split (see the note on MoE layers under tensor
parallelism in ``torchtitan_lite/distributed/tensor_parallel.py``).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ParallelStyle

from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.parallel_options import ParallelOptions
from torchtitan_lite.distributed.tensor_parallel import norm_plan, replicated_module_plan
from torchtitan_lite.models.common.parallelize import attention_plan, parallelize_decoder


def block_plan(
    block: nn.Module, mesh: DeviceMesh, sequence_parallel: bool
) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan of one Qwen3-MoE block: the Qwen3 attention, ``ffn_norm``, the MoE
    replicated."""
    return {
        **attention_plan(sequence_parallel, qk_norm=True),
        **norm_plan("ffn_norm", sequence_parallel),
        **replicated_module_plan("moe", sequence_parallel),
    }


def parallelize_qwen3_moe(
    model: nn.Module, parallel_dims: ParallelDims, options: ParallelOptions
) -> nn.Module:
    """Tensor parallelism (:func:`block_plan`), activation checkpointing, compile and FSDP2
    (:func:`torchtitan_lite.models.common.parallelize.parallelize_decoder`)."""
    return parallelize_decoder(model, parallel_dims, options, block_plan)
