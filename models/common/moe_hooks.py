"""The training hooks of the MoE families (``ModelSpec.training_hooks``, contract in
``torchtitan_lite/protocols/model_spec.py``): the auxiliary-loss gradient scale, the per-step expert-load sum and
expert-bias update, expert-load metrics."""

from __future__ import annotations

import torch
from torch import nn

from models.common.expert_bias import update_expert_bias
from models.common.moe import collect_expert_load, moe_layers
from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.pipeline import gather_stages
from torchtitan_lite.protocols.model_spec import HookReport, TrainingHooks


def expert_load_report(step: int, loads: dict[str, torch.Tensor]) -> HookReport:
    """Each layer's least and most loaded expert, relative to the balanced share (1.0 = perfectly balanced).

    Args:
        step: 1-based step.
        loads: layer name -> fp32 ``(num_experts,)`` (token, expert) counts (:func:`collect_expert_load`).

    Returns:
        Scalars ``moe/<layer>/min_load`` and ``moe/<layer>/max_load`` (the expert's share of the assignments
        times ``num_experts``), and the line ``step  12  expert load min/max  layers.1.moe 0.52/1.80  ...``.
        Reads the counts on the host.
    """
    scalars, parts = {}, []
    for layer, counts in loads.items():
        relative = counts * counts.numel() / counts.sum().clamp_min(1)
        low, high = relative.min().item(), relative.max().item()
        scalars[f"moe/{layer}/min_load"], scalars[f"moe/{layer}/max_load"] = low, high
        parts.append(f"{layer} {low:.2f}/{high:.2f}")
    return HookReport(scalars, f"step {step:>3}  expert load min/max  " + "  ".join(parts))


class MoETrainingHooks(TrainingHooks):
    """Hooks of a model with :class:`models.common.moe.MoE` layers.

    At construction every MoE layer's ``aux_loss_scale`` becomes ``1 / (dp_degree * micro_batches)``: gradients
    are summed over ranks and micro-batches, so each auxiliary loss then adds its mean (see the note in
    ``models/common/moe.py``). After each optimizer step the counts of every layer are summed over
    ``parallel_dims.dp_group`` (one all-reduce, :func:`collect_expert_load`) and move the expert biases
    (:func:`models.common.expert_bias.update_expert_bias`; layers without a bias are left alone); both stay on
    the device. :meth:`report` reads the last step's counts (:func:`expert_load_report`); under pipeline
    parallelism each stage counts its own layers and the report gathers them from every stage.

    Args:
        model: the parallelized model.
        parallel_dims: the run's layout.
        micro_batches: model forwards per rank per optimizer step (gradient-accumulation micro-batches times
            pipeline micro-batches).
    """

    def __init__(self, model: nn.Module, parallel_dims: ParallelDims, micro_batches: int):
        self.model = model
        self.group = parallel_dims.dp_group
        self.pp_group = parallel_dims.pp_mesh.get_group() if parallel_dims.pp > 1 else None
        self.loads: dict[str, torch.Tensor] = {}
        for moe in moe_layers(model).values():
            moe.aux_loss_scale = 1.0 / (parallel_dims.dp_degree * micro_batches)

    def after_optimizer_step(self, step: int) -> None:
        """Sum the step's expert loads over the data-parallel ranks and move DeepSeek-V3's expert biases."""
        self.loads = collect_expert_load(self.model, self.group)
        update_expert_bias(self.model, self.loads)

    def report(self, step: int) -> HookReport:
        """The step's expert-load scalars (min/max vs balanced per layer) and summary line, gathered over stages."""
        loads = self.loads
        if self.pp_group is not None:
            local = {name: counts.cpu() for name, counts in loads.items()}
            loads = {name: counts for stage in gather_stages(local, self.pp_group) for name, counts in stage.items()}
        return expert_load_report(step, loads)
