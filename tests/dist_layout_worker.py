"""torchrun worker of test_parallel_layouts.py: the real Trainer of tiny models on one parallel
layout.

    TORCHTITAN_LITE_TEST_RESULTS=DIR torchrun --nproc_per_node=N tests/dist_layout_worker.py OUT
    DATA \
        [--cases=qwen3,...] [--section.key=value ...]

For each model of :data:`CASES` (or those ``--cases`` names) it builds the Trainer with the layout
given (so the init, TP plan, FSDP2, loss parallelism, clipping and optimizer are the trainer's own;
its runs go to ``OUT/runs``), counts the elements every rank draws per tensor (a spy on
``keyed.keyed_fill``), trains :data:`STEPS` steps, then two more as the trainer runs steps between
log steps (``sync=False``) while counting host reads. Rank 0 returns (``dist_helpers.write_result``)
per case: the gathered initial parameters, the gradients of step 1 before clipping (gathered) and
the number of distinct meshes they live on, the global loss and gradient norm of every step, the
init fingerprint, the host reads of the two quiet steps, per rank
``{tensor: [local elements, drawn]}``, the expert choices of every sequence of step 1
(``{token ids: {MoE layer: (seqlen, k) expert ids}}``, from all ranks) the MoE layers' expert loads
of step 1 as the training hooks summed them (``{layer: (num_experts,)}``) and the routers' expert
biases after the last step.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from dist_helpers import leave_together, write_result
from sync_helpers import HostReads
from torch.distributed.tensor import DTensor

import torchtitan_lite.train as train_module
from torchtitan_lite.init import keyed
from torchtitan_lite.init.apply import canonical_name
from torchtitan_lite.models import model_names
from torchtitan_lite.models.common.moe import moe_layers
from torchtitan_lite.preflight.checks import parse_run

STEPS = 10
CASES = {
    **{name: ["--job.config_file", f"train_configs/{name}_debug.toml"] for name in model_names()},
    "qwen3_untied": [
        "--job.config_file",
        "train_configs/qwen3_debug.toml",
        "--model.flavor=debug_untied",
    ],
}
"""Every registered family's debug job (``train_configs/<family>_debug.toml``), and Qwen3 untied."""
RUN = [
    "--model.overrides.n_layers=2",
    "--training.seq_len=32",
    "--training.local_batch_size=2",
    "--training.global_batch_size=8",
    f"--training.steps={STEPS + 2}",
    "--lr_scheduler.warmup_steps=2",
    "--validation.enable=false",
    "--training.num_threads=1",
    "--metrics.enable_tensorboard=false",
    "--checkpoint.enable=false",
    "--training.compute_dtype=float32",
]
"""Eight sequences of 32 tokens per step in micro-batches of 2 (the same micro-batches on every
layout, so MoE auxiliary losses and expert loads are those of one process), fp32, one thread per
rank."""


def count_draws() -> dict[str, list[int]]:
    """Patch ``keyed.keyed_fill``: name -> [local elements, elements drawn]."""
    counts: dict[str, list[int]] = {}
    real = keyed.keyed_fill

    def spy(tensor, key, law, cast, compiled):
        drawn = real(tensor, key, law, cast, compiled)
        entry = counts.setdefault(key.name, [0, 0])
        entry[0] += keyed.local_box(tensor)[0].numel()
        entry[1] += drawn
        return drawn

    keyed.keyed_fill = spy
    return counts


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor (a collective for a DTensor)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def record_routes(model: torch.nn.Module) -> tuple[dict, list]:
    """Hooks that record, in training forwards, each sequence's token ids and each MoE layer's
    expert choices ``(seqlen, k)`` of it: returns the dict ``{token ids: {layer: choices}}`` they
    fill and the hook handles."""
    routes, current = {}, []
    handles = [
        model.register_forward_pre_hook(
            lambda module, args: current.__setitem__(slice(None), [args[0]])
        )
    ]
    for layer, moe in moe_layers(model).items():

        def hook(module, args, out, layer=layer):
            tokens = current[0]
            for seq, choice in zip(tokens, out.indices.view(*tokens.shape, -1), strict=True):
                routes.setdefault(tuple(seq.tolist()), {})[layer] = choice.clone()

        handles.append(moe.router.register_forward_hook(hook))
    return routes, handles


def run_case(name: str, out: str, data: str, layout: list[str], counts: dict) -> dict | None:
    """Train case ``name``; what :func:`main` returns for it (on rank 0, ``None`` on the other
    ranks)."""
    counts.clear()
    run = parse_run(
        [
            *CASES[name],
            *RUN,
            f"--training.dataset_path={data}",
            f"--job.dump_folder={out}/runs",
            *layout,
        ]
    )
    trainer = train_module.Trainer(run)
    model = trainer.model
    init = {canonical_name(n): full(p) for n, p in model.named_parameters()}
    grads: dict[str, torch.Tensor] = {}
    meshes = set()
    real_clip = train_module.clip_grad_norm_

    def capturing_clip(parameters, max_norm, pp_mesh=None):
        if not grads:
            grads.update({canonical_name(n): full(p.grad) for n, p in model.named_parameters()})
            meshes.update(
                p.grad.device_mesh for p in model.parameters() if isinstance(p.grad, DTensor)
            )
        return real_clip(parameters, max_norm, pp_mesh=pp_mesh)

    train_module.clip_grad_norm_ = capturing_clip
    routes, handles = record_routes(model)
    tokens = trainer.global_batch * run.config.training.seq_len
    batches, losses, norms = iter(trainer.train_loader), [], []
    for step in range(1, STEPS + 1):
        stats = trainer.train_step(batches, step, sync=True)
        dist.all_reduce(stats.loss_sum, group=trainer.info.dims.loss_group)
        losses.append(stats.loss_sum.item() / tokens)
        norms.append(stats.grad_norm.item())
        if step == 1:
            loads = {
                layer: counts.clone()
                for layer, counts in getattr(trainer.hooks, "loads", {}).items()
            }
            for handle in handles:
                handle.remove()
    train_module.clip_grad_norm_ = real_clip
    host_batches = iter(
        [next(batches) for _ in range(2 * trainer.accum)]
    )  # the loader reads host tensors only
    with HostReads() as quiet:
        for step in (STEPS + 1, STEPS + 2):
            trainer.train_step(host_batches, step, sync=False)
    per_rank, all_routes = [None] * dist.get_world_size(), [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, dict(counts))
    dist.all_gather_object(all_routes, routes)
    bias = {
        layer: moe.router.expert_bias.clone()
        for layer, moe in moe_layers(model).items()
        if hasattr(moe.router, "expert_bias")
    }
    trainer.metrics.close()
    if trainer.info.rank != 0:
        return None
    return {
        "init": init,
        "grads": grads,
        "grad_meshes": len(meshes),
        "losses": losses,
        "grad_norms": norms,
        "fingerprint": trainer.fingerprint,
        "host_reads": quiet.count,
        "draws": per_rank,
        "routes": {seq: r for rank in all_routes for seq, r in rank.items()},
        "expert_bias": bias,
        "loads": loads,
    }


def run_worker(
    folder, nproc: int, models: tuple[str, ...], options: list[str], timeout: float = 900
) -> dict[str, dict]:
    """Launch this worker on ``nproc`` ranks for ``models`` with more ``options``, its runs under
    ``folder``, on one play of text; returns ``model -> what the worker returned``."""
    from ckpt_helpers import text_file
    from dist_helpers import REPO, launch

    data = text_file(folder, n_plays=1)
    return launch(
        REPO / "tests" / "dist_layout_worker.py",
        [str(folder), str(data), f"--cases={','.join(models)}", *options],
        nproc=nproc,
        timeout=timeout,
    ).result()


_ONE_PROCESS: dict[str, dict] = {}
"""Model -> what the worker returned for it on one process without options, kept for the session:
the single-process reference of test_parallel_layouts and test_expert_parallel_layouts, which share
models."""


def run_layouts(
    folder, layouts: dict[str, tuple[int, list[str], tuple[str, ...]]]
) -> dict[str, dict[str, dict]]:
    """:func:`run_worker` once per layout (``name: (processes, options, models)``) in
    ``folder / name``, except for single-process runs already made in this session; returns
    ``layout -> model -> what the worker returned`` (for the tests' module fixtures)."""
    results = {}
    for layout, (nproc, options, models) in layouts.items():
        (folder / layout).mkdir()
        if nproc > 1 or options:
            results[layout] = run_worker(folder / layout, nproc, models, options)
            continue
        if todo := tuple(model for model in models if model not in _ONE_PROCESS):
            _ONE_PROCESS.update(run_worker(folder / layout, 1, todo, []))
        results[layout] = {model: _ONE_PROCESS[model] for model in models}
    return results


def main() -> None:
    out, data, *layout = sys.argv[1:]
    names = list(CASES)
    if layout and layout[0].startswith("--cases="):
        names = layout.pop(0).removeprefix("--cases=").split(",")
    counts = count_draws()
    start = dist.init_process_group

    def start_once(
        *args, **kwargs
    ):  # one process group for all cases (re-creating it under torchrun can hang)
        if not dist.is_initialized():
            start(*args, **kwargs)

    dist.init_process_group = start_once
    results = {name: run_case(name, out, data, layout, counts) for name in names}
    if dist.get_rank() == 0:
        write_result(results)
    leave_together()


if __name__ == "__main__":
    main()
