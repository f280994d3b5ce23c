"""Tensor parallelism (Megatron-LM, arXiv 1909.08053) with sequence parallelism (arXiv 2205.05198):
the pieces a family's ``parallelize.py`` assembles into its plan, all of them PyTorch's
``torch.distributed.tensor.parallel`` styles applied by ``parallelize_module`` (torchtitan's
``apply_non_moe_tp`` / ``apply_moe_ep_tp`` layouts).

Notes in docs/design.md: "on the activations between blocks", "on MoE layers under tensor
parallelism", "on the embedding's output under compile".
"""

from __future__ import annotations

import contextlib
from typing import Any

from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Placement,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from torchtitan_lite.distributed.fsdp import is_tied


def residual_layout(sequence_parallel: bool) -> Placement:
    """The placement of the residual stream between sub-layers: ``Shard(1)`` (sequence) or
    ``Replicate()``."""
    return Shard(1) if sequence_parallel else Replicate()


class ReplicateParallel(ParallelStyle):
    """A module run whole on every tensor-parallel rank, inside a region of DTensor activations: its
    parameters become ``Replicate`` DTensors, its inputs ``Replicate`` DTensors (plain tensors are
    taken as replicated), its outputs stay DTensors unless ``use_local_output`` (torchtitan's
    ``NoParallel``; for MLA's low-rank projections and their norms).
    """

    def __init__(self, *, use_local_output: bool = False):
        super().__init__()
        self.use_local_output = use_local_output

    @staticmethod
    def _prepare_input(
        module: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh
    ) -> tuple[Any, ...]:
        def replicated(value: Any) -> Any:
            if isinstance(value, DTensor):
                return value.redistribute(placements=[Replicate()])
            return DTensor.from_local(value, mesh, [Replicate()], run_check=False)

        return tuple(replicated(value) for value in inputs)

    def _prepare_output(self, module: nn.Module, output: Any, mesh: DeviceMesh) -> Any:
        return output.to_local() if self.use_local_output else output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module, device_mesh, None, input_fn=self._prepare_input, output_fn=self._prepare_output
        )


def head_norm() -> ParallelStyle:
    """A norm over ``head_dim`` applied to head-sharded ``(bs, seqlen, heads, head_dim)``
    activations (Qwen3's QK-norm): one weight shared by all heads, kept whole (``Replicate``), input
    and output sharded on the heads (torchtitan's qwen3 plan: ``SequenceParallel(sequence_dim=2)``),
    plain tensors outside."""
    return SequenceParallel(sequence_dim=2, use_local_output=True)


def norm_plan(name: str, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The plan of the norm ``name`` between sub-layers: ``SequenceParallel`` (its weight
    ``Replicate``) with sequence parallelism, nothing (a plain module on the whole residual)
    without."""
    return {name: SequenceParallel()} if sequence_parallel else {}


def input_gathered(
    sequence_parallel: bool, n_extra: int = 0, extra: Placement | None = None
) -> ParallelStyle:
    """``PrepareModuleInput`` of a sub-layer: its first input (the normed residual) gathered to a
    ``Replicate`` DTensor, and ``n_extra`` more inputs (e.g. RoPE ``cos, sin``) left alone
    (``extra = None``) or taken as ``extra`` DTensors."""
    layout = residual_layout(sequence_parallel)
    return PrepareModuleInput(
        input_layouts=(layout, *[extra] * n_extra),
        desired_input_layouts=(Replicate(), *[extra] * n_extra),
    )


def swiglu_plan(name: str, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """A SwiGLU ``name`` (``models/common/ffn.py``): input gathered, ``w1``/``w3`` column-wise,
    ``w2`` row-wise back to the residual layout (Megatron MLP)."""
    return {
        name: input_gathered(sequence_parallel),
        f"{name}.w1": ColwiseParallel(),
        f"{name}.w3": ColwiseParallel(),
        f"{name}.w2": RowwiseParallel(output_layouts=residual_layout(sequence_parallel)),
    }


def replicated_module_plan(name: str, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """Module ``name`` run whole on every tensor-parallel rank on plain tensors: its input gathered
    to the whole sequence, its output cut back to the residual layout; its parameters are not split
    (see the note on MoE layers under tensor parallelism)."""
    layout = residual_layout(sequence_parallel)
    return {
        name: PrepareModuleInputOutput(
            input_layouts=(layout,),
            desired_input_layouts=(Replicate(),),
            use_local_input=True,
            output_layouts=(Replicate(),),
            desired_output_layouts=(layout,),
            use_local_output=True,
        )
    }


def shard_parameter(module: nn.Module, name: str, mesh: DeviceMesh, placement: Placement) -> None:
    """Replace parameter ``name`` of ``module`` by a DTensor with ``placement`` on ``mesh`` (e.g.
    GPT-OSS's per-head sinks, ``Shard(0)`` with the heads); works on meta. The module must then see
    its local shard, e.g. through a ``PrepareModuleInput`` of the submodule it is passed to."""
    param = getattr(module, name)
    module.register_parameter(
        name,
        nn.Parameter(
            distribute_tensor(param, mesh, [placement]), requires_grad=param.requires_grad
        ),
    )


def apply_embedding_and_output_tp(
    model: nn.Module, mesh: DeviceMesh, *, sequence_parallel: bool, loss_parallel: bool
) -> None:
    """Vocab-parallel ``tok_embeddings`` (row-wise: ``Shard(0)`` on the vocabulary; output to the
    residual layout), ``norm`` (sequence parallel) and ``output`` (column-wise: ``Shard(0)`` on the
    vocabulary; logits ``Shard(-1)`` DTensors for :func:`loss_parallel_context`, or gathered plain
    ``(bs, seqlen, vocab)`` tensors), in place. A tied pair stays one tensor: both are ``Shard(0)``
    on the vocabulary, so the output reuses the embedding's DTensor.

    Args:
        model: the model contract of ``torchtitan_lite/protocols/model_spec.py``, on meta.
        mesh: the tensor-parallel mesh.
    """
    tied = is_tied(model)
    layout = residual_layout(sequence_parallel)
    plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=layout),
        **norm_plan("norm", sequence_parallel),
        "output": ColwiseParallel(
            input_layouts=layout,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
    }
    parallelize_module(
        model,
        mesh,
        {name: style for name, style in plan.items() if getattr(model, name) is not None},
    )  # a pipeline stage lacks some
    if tied:
        model.output.weight = model.tok_embeddings.weight
    if model.tok_embeddings is not None:
        model.tok_embeddings.register_forward_hook(_plain_output)


def _plain_output(module: nn.Module, inputs: Any, output: Any) -> Any:
    """``output`` as a plain tensor (see the note on the embedding's output under compile)."""
    return output.clone() if isinstance(output, AsyncCollectiveTensor) else output


def loss_parallel_context(enabled: bool) -> contextlib.AbstractContextManager:
    """``torch.distributed.tensor.parallel.loss_parallel()`` when ``enabled`` (the cross-entropy of
    ``Shard(-1)`` logits, forward and backward, without gathering them), else a no-op context."""
    return loss_parallel() if enabled else contextlib.nullcontext()
