"""Benchmark (not a test): the per-step expert loads of an MoE run, per layer, and how
token-independent each router's input is; the measurement of docs/models.md, "Idle experts in the
MoE debug runs".

Trains in this process (``torchtitan_lite.train.main``, one rank) with the given config and
overrides and, after every optimizer step, prints per MoE layer the step's least and most loaded
expert (relative to the balanced share, as the expert-load line) and the share of the router
input's energy in the batch-mean direction, ``|mean_t x|^2 / mean_t |x|^2`` ("common": 1 = every
token the same vector), of the step's last micro-batch. ``--bias-speed`` sets every router's
``bias_update_speed`` (DeepSeek-V3's expert-bias update, on routers that have an ``expert_bias``).
Prints the machine (``model name`` of /proc/cpuinfo) and the load before and after.

    python benchmarks/bench_moe_balance.py train_configs/qwen3_moe_debug.toml -- --training.steps=30
    python benchmarks/bench_moe_balance.py train_configs/qwen3_moe_debug.toml --bias-speed 0.01 \\
        -- --training.steps=30

Arguments after ``--`` are config overrides."""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import platform
import sys

import torch
from machine_load import cpu_model, reported_load

from torchtitan_lite import train
from torchtitan_lite.models.common import moe_hooks
from torchtitan_lite.models.common.moe import moe_layers


def common_share(x: torch.Tensor) -> float:
    """``|mean_t x|^2 / mean_t |x|^2`` of ``x`` ``(T, dim)``."""
    x = x.detach().float()
    return (x.mean(0).pow(2).sum() / x.pow(2).sum(1).mean()).item()


def instrument(bias_speed: float | None) -> None:
    """Patch :class:`moe_hooks.MoETrainingHooks`: record each router's input, print every step."""
    shares: dict[str, float] = {}
    init, after = (
        moe_hooks.MoETrainingHooks.__init__,
        moe_hooks.MoETrainingHooks.after_optimizer_step,
    )

    def patched_init(self, model, parallel_dims, micro_batches):
        init(self, model, parallel_dims, micro_batches)
        for name, layer in moe_layers(model).items():
            if bias_speed is not None:
                layer.router.bias_update_speed = bias_speed
            layer.router.register_forward_hook(
                lambda m, args, out, name=name: (
                    shares.__setitem__(name, common_share(args[0])) if m.training else None
                )
            )

    def patched_after(self, step):
        after(self, step)
        parts = []
        for name, counts in self.loads.items():
            relative = counts * counts.numel() / counts.sum().clamp_min(1)
            parts.append(
                f"{name} {relative.min().item():.2f}/{relative.max().item():.2f} "
                f"common {shares.get(name, float('nan')):.2f}"
            )
        print(f"balance step {step:>3}  " + "  ".join(parts), flush=True)

    moe_hooks.MoETrainingHooks.__init__ = patched_init
    moe_hooks.MoETrainingHooks.after_optimizer_step = patched_after


def main() -> int:
    argv = sys.argv[1:]
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "config", help="an MoE train config, e.g. train_configs/qwen3_moe_debug.toml"
    )
    parser.add_argument("--bias-speed", type=float, default=None, help="every router's gamma")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    instrument(args.bias_speed)
    model = cpu_model()
    print(f"machine: {platform.machine() if model == 'unknown' else model}", flush=True)
    with reported_load():
        return train.main(
            [
                f"--job.config_file={args.config}",
                "--validation.enable=false",
                "--metrics.enable_tensorboard=false",
                *overrides,
            ]
        )


if __name__ == "__main__":
    sys.exit(main())
