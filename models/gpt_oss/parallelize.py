"""How a GPT-OSS model is split over the devices (``ModelSpec.parallelize``, contract in
``torchtitan_lite/protocols/model_spec.py``).

Tensor parallelism (torchtitan's gpt_oss plan): column-wise ``wq``/``wk``/``wv`` with their biases
(whole query and key/value heads per rank), the per-head ``sinks`` sharded with the heads
(``Shard(0)``) and handed to the attention kernel as the rank's local sinks, row-wise ``wo`` (its
bias whole, added once after the reduction); sequence-parallel norms; the MoE layer whole on every
rank on the gathered sequence, router and experts not split (see the notes in
``torchtitan_lite/distributed/tensor_parallel.py``).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
)

from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.parallel_options import ParallelOptions
from torchtitan_lite.distributed.tensor_parallel import (
    input_gathered,
    norm_plan,
    replicated_module_plan,
    residual_layout,
    shard_parameter,
)
from torchtitan_lite.models.common.parallelize import parallelize_decoder


def block_plan(
    block: nn.Module, mesh: DeviceMesh, sequence_parallel: bool
) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan of one GPT-OSS block (and its ``attention.sinks`` sharded on
    ``mesh``)."""
    shard_parameter(block.attention, "sinks", mesh, Shard(0))
    return {
        **norm_plan("attention_norm", sequence_parallel),
        "attention": input_gathered(sequence_parallel, n_extra=2),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        # (q, k, v, sinks): the rank's sinks as a plain tensor
        "attention.inner_attention": PrepareModuleInput(
            input_layouts=(None, None, None, Shard(0)),
            desired_input_layouts=(None, None, None, Shard(0)),
            use_local_output=True,
        ),
        "attention.wo": RowwiseParallel(output_layouts=residual_layout(sequence_parallel)),
        **norm_plan("ffn_norm", sequence_parallel),
        **replicated_module_plan("moe", sequence_parallel),
    }


def parallelize_gpt_oss(
    model: nn.Module, parallel_dims: ParallelDims, options: ParallelOptions
) -> nn.Module:
    """Tensor parallelism (:func:`block_plan`), activation checkpointing, compile and FSDP2
    (:func:`torchtitan_lite.models.common.parallelize.parallelize_decoder`)."""
    return parallelize_decoder(model, parallel_dims, options, block_plan)
