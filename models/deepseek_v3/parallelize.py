"""How a DeepSeek-V3 model is split over the devices (``ModelSpec.parallelize``, contract in
``torchtitan_lite/protocols/model_spec.py``).

Tensor parallelism of multi-head latent attention (torchtitan's deepseek_v3 plan): the attention
runs on DTensors (its input gathered, ``cos``/``sin`` taken as replicated), the low-rank projections
``wq_a``/``wkv_a`` and their norms ``q_norm``/``kv_norm`` whole on every rank (``Replicate``), the
up-projections ``wq``/``wq_b``/``wkv_b`` column-wise (whole heads per rank; the shared RoPE key
``k_pe`` is expanded to the rank's heads), the attention kernel on the rank's heads as plain
tensors, row-wise ``wo``. Dense blocks: the SwiGLU column-/row-wise; MoE blocks: the MoE layer
(shared experts included) whole on every rank on the gathered sequence (see the notes in
``torchtitan_lite/distributed/tensor_parallel.py``).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
)

from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.parallel_options import ParallelOptions
from torchtitan_lite.distributed.tensor_parallel import (
    ReplicateParallel,
    input_gathered,
    norm_plan,
    replicated_module_plan,
    residual_layout,
    swiglu_plan,
)
from torchtitan_lite.models.common.parallelize import parallelize_decoder


def mla_plan(attention: nn.Module, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The plan of a block's ``attention`` (:class:`torchtitan_lite.models.deepseek_v3.model.MLA`),
    keyed from the block."""
    heads = ColwiseParallel(
        use_local_output=False
    )  # (bs, seqlen, n_heads * x) DTensors, Shard(-1) on the heads
    query = (
        {"attention.wq": heads}
        if attention.q_lora_rank == 0
        else {
            "attention.wq_a": ReplicateParallel(),
            "attention.q_norm": ReplicateParallel(),
            "attention.wq_b": heads,
        }
    )
    return {
        "attention": input_gathered(sequence_parallel, n_extra=2, extra=Replicate()),
        **query,
        "attention.wkv_a": ReplicateParallel(),
        "attention.kv_norm": ReplicateParallel(),
        "attention.wkv_b": heads,
        # q, k, v (bs, seqlen, n_heads, x): the rank's heads
        "attention.inner_attention": PrepareModuleInput(
            input_layouts=(Shard(2),) * 3,
            desired_input_layouts=(Shard(2),) * 3,
            use_local_output=True,
        ),
        "attention.wo": RowwiseParallel(output_layouts=residual_layout(sequence_parallel)),
    }


def block_plan(
    block: nn.Module, mesh: DeviceMesh, sequence_parallel: bool
) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan of one DeepSeek-V3 block: MLA, then the dense SwiGLU or the MoE
    replicated."""
    ffn = (
        replicated_module_plan("moe", sequence_parallel)
        if block.is_moe
        else swiglu_plan("feed_forward", sequence_parallel)
    )
    return {
        **norm_plan("attention_norm", sequence_parallel),
        **mla_plan(block.attention, sequence_parallel),
        **norm_plan("ffn_norm", sequence_parallel),
        **ffn,
    }


def parallelize_deepseek_v3(
    model: nn.Module, parallel_dims: ParallelDims, options: ParallelOptions
) -> nn.Module:
    """Tensor parallelism (:func:`block_plan`), activation checkpointing, compile and FSDP2
    (:func:`torchtitan_lite.models.common.parallelize.parallelize_decoder`)."""
    return parallelize_decoder(model, parallel_dims, options, block_plan)
