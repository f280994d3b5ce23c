"""The training hooks of the MoE families (``ModelSpec.training_hooks``, contract in
``torchtitan_lite/protocols/model_spec.py``): the auxiliary-loss gradient scale, the per-step
expert-load sum and expert-bias update, expert-load metrics."""

from __future__ import annotations

import torch
from torch import nn

from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.distributed.pipeline import gather_stages
from torchtitan_lite.models.common.expert_bias import update_expert_bias
from torchtitan_lite.models.common.moe import collect_expert_load, moe_layers
from torchtitan_lite.protocols.model_spec import HookReport, TrainingHooks


def expert_load_report(
    step: int,
    loads: dict[str, torch.Tensor],
    window: dict[str, torch.Tensor] | None = None,
    previous: dict[str, torch.Tensor] | None = None,
    aux: dict[str, float] | None = None,
) -> HookReport:
    """Each layer's least and most loaded expert, relative to the balanced share (1.0 = perfectly
    balanced), and, when given, what happened since the last report.

    Args:
        step: 1-based step.
        loads: layer name -> fp32 ``(num_experts,)`` (token, expert) counts of the step
            (:func:`collect_expert_load`).
        window: layer name -> the counts summed over the steps since the last report.
        previous: layer name -> the previous report's ``window`` (absent: no change is shown).
        aux: layer name -> the layer's weighted balance loss of the last forward.

    Returns:
        Scalars ``moe/<layer>/min_load``, ``moe/<layer>/max_load`` (the expert's share of the
        assignments times ``num_experts``); with ``window``: ``moe/<layer>/idle_experts`` (experts
        with no token in the window), ``moe/<layer>/load/<e>`` (each expert's relative load over
        the window) and, with ``previous``, ``moe/<layer>/routing_moved`` (half the L1 distance of
        the two windows' load shares: the share of assignments that changed expert); with ``aux``,
        ``moe/<layer>/aux_loss``. The line ``step  12  expert load min/max  layers.1.moe
        0.52/1.80 idle 0 moved 0.12 aux 0.0021  ...`` (the extras when given). Reads the counts on
        the host. See docs/debugging.md, "Reading the expert-load line".
    """
    scalars, parts = {}, []
    for layer, counts in loads.items():
        relative = counts * counts.numel() / counts.sum().clamp_min(1)
        low, high = relative.min().item(), relative.max().item()
        scalars[f"moe/{layer}/min_load"], scalars[f"moe/{layer}/max_load"] = low, high
        part = f"{layer} {low:.2f}/{high:.2f}"
        if window is not None:
            seen = window[layer].cpu().float()
            share = seen / seen.sum().clamp_min(1)
            idle = int((seen == 0).sum())
            scalars[f"moe/{layer}/idle_experts"] = idle
            for e, value in enumerate((share * seen.numel()).tolist()):
                scalars[f"moe/{layer}/load/{e}"] = value
            part += f" idle {idle}"
            if previous is not None and layer in previous:
                before = previous[layer].cpu().float()
                moved = 0.5 * (share - before / before.sum().clamp_min(1)).abs().sum().item()
                scalars[f"moe/{layer}/routing_moved"] = moved
                part += f" moved {moved:.2f}"
        if aux is not None and layer in aux:
            scalars[f"moe/{layer}/aux_loss"] = aux[layer]
            part += f" aux {aux[layer]:.4f}"
        parts.append(part)
    return HookReport(scalars, f"step {step:>3}  expert load min/max  " + "  ".join(parts))


DEAD_EXPERT_STEPS = 50
"""An expert that has received no token for this many consecutive optimizer steps is named in the
log: with the debug configs' batches (4,096 tokens, top-2 of 8 experts: about 1,000 assignments per
expert and step when balanced) that is no passing fluctuation. A router that flips between steps
leaves experts idle a step or a few at a time; the ``idle`` count of the expert-load line shows
that instead."""


def dead_expert_notes(
    step: int,
    idle: dict[str, torch.Tensor],
    named: dict[str, set[int]],
    steps: int = DEAD_EXPERT_STEPS,
) -> tuple[str, ...]:
    """A warning line per layer in which experts have just reached ``steps`` optimizer steps without
    a token, e.g.
    ``warning: step  20  layers.1.moe: 3 of 8 experts (1, 4, 6) received no tokens for 10 steps;
    raise the load balancing
    (model.overrides.aux_loss_coeff)``; experts already named in ``named`` (layer -> expert indices,
    updated here: an expert that gets tokens again leaves it) are not named again.

    Args:
        step: 1-based step.
        idle: layer name -> int ``(num_experts,)`` consecutive steps each expert has had no token
            (host or device).
    """
    notes = []
    for layer, counts in idle.items():
        dead = set(torch.nonzero(counts.cpu() >= steps).flatten().tolist())
        new = sorted(dead - named.get(layer, set()))
        named[layer] = dead
        if new:
            notes.append(
                f"warning: step {step:>3}  {layer}: {len(new)} of {counts.numel()} experts "
                f"({', '.join(map(str, new))}) received no tokens for {steps} steps; raise the "
                "load balancing (model.overrides.aux_loss_coeff)"
            )
    return tuple(notes)


class MoETrainingHooks(TrainingHooks):
    """Hooks of a model with :class:`torchtitan_lite.models.common.moe.MoE` layers.

    At construction every MoE layer's ``aux_loss_scale`` becomes
    ``1 / (dp_degree * cp * micro_batches)``: gradients are summed over ranks and micro-batches, so
    each auxiliary loss then adds its mean (see the note in ``models/common/moe.py``; the ``cp``
    ranks of a window each add the whole window's loss, computed from statistics summed over them).
    After each optimizer step the counts of every layer are summed over
    ``parallel_dims.loss_group`` (the data-parallel and context-parallel ranks: every token once;
    one all-reduce, :func:`collect_expert_load`) and move the expert biases
    (:func:`torchtitan_lite.models.common.expert_bias.update_expert_bias`; layers without a bias are
    left alone); both stay on the device, as does each expert's count of consecutive steps without a
    token (since this process started). :meth:`report` reads the last step's counts
    (:func:`expert_load_report`) and warns of experts without a token for :data:`DEAD_EXPERT_STEPS`
    steps (:func:`dead_expert_notes`); under pipeline parallelism each stage counts its own layers
    and the report gathers them from every stage.

    Args:
        model: the parallelized model.
        parallel_dims: the run's layout.
        micro_batches: model forwards per rank per optimizer step (gradient-accumulation
            micro-batches times pipeline micro-batches).
    """

    def __init__(self, model: nn.Module, parallel_dims: ParallelDims, micro_batches: int):
        self.model = model
        self.group = parallel_dims.loss_group
        self.pp_group = parallel_dims.pp_mesh.get_group() if parallel_dims.pp > 1 else None
        self.loads: dict[str, torch.Tensor] = {}
        self.idle: dict[str, torch.Tensor] = {}
        self.window: dict[str, torch.Tensor] = {}
        self.previous: dict[str, torch.Tensor] | None = None
        self._named_dead: dict[str, set[int]] = {}
        for moe in moe_layers(model).values():
            moe.aux_loss_scale = 1.0 / (parallel_dims.loss_degree * micro_batches)

    def after_optimizer_step(self, step: int) -> None:
        """Sum the step's expert loads over the data-parallel (and context-parallel) ranks and move
        DeepSeek-V3's expert biases."""
        self.loads = collect_expert_load(self.model, self.group)
        update_expert_bias(self.model, self.loads)
        for name, counts in self.loads.items():
            idle = self.idle.get(name, torch.zeros_like(counts, dtype=torch.int64))
            self.idle[name] = torch.where(counts == 0, idle + 1, 0)
            self.window[name] = self.window.get(name, torch.zeros_like(counts)) + counts

    def report(self, step: int) -> HookReport:
        """The step's expert-load scalars and summary line (:func:`expert_load_report`, with the
        counts since the last report, the previous report's and each layer's balance loss) and
        the dead-expert warnings, gathered over stages; starts the next window."""
        aux = {
            name: m.aux_loss.item()
            for name, m in moe_layers(self.model).items()
            if m.aux_loss is not None
        }
        loads, idle, window = self.loads, self.idle, self.window
        if self.pp_group is not None:
            local = {
                name: (counts.cpu(), idle[name].cpu(), window[name].cpu(), aux.get(name))
                for name, counts in loads.items()
            }
            stages = dict(
                item for stage in gather_stages(local, self.pp_group) for item in stage.items()
            )
            loads, idle, window = (
                {name: entry[i] for name, entry in stages.items()} for i in range(3)
            )
            aux = {name: entry[3] for name, entry in stages.items() if entry[3] is not None}
        window = {name: counts.cpu() for name, counts in window.items()}
        report = expert_load_report(step, loads, window, self.previous, aux)
        self.previous, self.window = window, {}
        return report._replace(notes=dead_expert_notes(step, idle, self._named_dead))
