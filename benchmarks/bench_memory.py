"""Benchmark (not a test): tokens/s and activation memory of each activation-checkpointing mode,
compile off/on.

For a config (default ``train_configs/qwen3_debug.toml``), in ONE process, each variant
``activation_checkpoint`` none / full / selective "2" / selective "op" x ``compile`` off / on
(backend ``inductor``, or eager after the one warning line when inductor cannot run here) builds its
model with the trainer's :func:`~torchtitan_lite.train.build_model` (FSDP2 on a 1-rank mesh) and
:func:`~torchtitan_lite.components.loss.build_loss_fn`, initializes it from the init plan, and runs
the trainer's batches: forward, loss, backward per micro-batch, then the trainer's AdamW
(``build_optimizer``).

Reported per variant:
  * tokens/s: median step time over ``--steps`` steps after ``--warmup`` steps (compile happens
    there);
  * kept: bytes kept for backward at the end of the first micro-batch's forward; eager: live tensor
    storages created by the forward (:class:`~torchtitan_lite.activation_memory.ActivationMemory`);
    compiled (marked ``*``): unique storages packed by ``saved_tensors_hooks`` and still alive (in a
    compiled block, checkpointing is part of the graph and its saved tensors go through the hooks);
  * peak: eager only, the most live bytes at any op of one step's forward and backward (recomputes
    and gradients included; optimizer excluded); RSS is no measure on CPU (it only grows in a
    process).

    python benchmarks/bench_memory.py                           # qwen3_debug.toml, 3 timed steps
    python benchmarks/bench_memory.py --steps 5 -- --job.config_file
    train_configs/gpt_oss_debug.toml
"""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
import weakref

import torch
from machine_load import reported_load

from torchtitan_lite.builder import build_model, init_model
from torchtitan_lite.components.activation_memory import ActivationMemory
from torchtitan_lite.components.loss import build_loss_fn
from torchtitan_lite.components.optimizer import build_optimizer
from torchtitan_lite.distributed.compile import compile_available
from torchtitan_lite.preflight.checks import parse_run
from torchtitan_lite.train import Trainer

AC_VARIANTS = [("none", "op"), ("full", "op"), ("selective", "2"), ("selective", "op")]


def saved_bytes(forward) -> int:
    """Bytes of the unique storages that ``forward()`` saves for backward through autograd and that
    are still alive when it returns (the result is kept alive meanwhile)."""
    seen: weakref.WeakSet = weakref.WeakSet()

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen.add(t.untyped_storage())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = forward()
    total = sum(s.nbytes() for s in seen)
    del result
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant")
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed steps first (compile happens here)"
    )
    parser.add_argument(
        "--backend", default="inductor", help="torch.compile backend of the compile-on rows"
    )
    parser.add_argument("overrides", nargs="*", help="config overrides after --")
    cli = parser.parse_args()
    with tempfile.TemporaryDirectory() as dump:
        argv = [
            "--job.config_file",
            "train_configs/qwen3_debug.toml",
            *cli.overrides,
            f"--job.dump_folder={dump}",
            "--checkpoint.enable=false",
            "--validation.enable=false",
            "--metrics.enable_tensorboard=false",
            "--training.steps=1000",
            "--lr_scheduler.warmup_steps=1",
        ]
        trainer = Trainer(parse_run(argv))
        base, info = trainer.config, trainer.info
        batches = iter(trainer.train_loader)
        tokens = trainer.global_batch * base.training.seq_len
        rows = []
        for compiled in (False, True):
            for mode, option in AC_VARIANTS:
                config = dataclasses.replace(
                    base,
                    activation_checkpoint=dataclasses.replace(
                        base.activation_checkpoint, mode=mode, selective_ac_option=option
                    ),
                    compile=dataclasses.replace(base.compile, enable=compiled, backend=cli.backend),
                )
                variant = dataclasses.replace(trainer.run, config=config)
                model = build_model(variant, info)
                init_model(model, variant, info.device)
                loss_fn = build_loss_fn(config, info.device)
                opt = base.optimizer
                optimizer = build_optimizer(
                    model,
                    lr=opt.lr,
                    betas=(opt.beta1, opt.beta2),
                    eps=opt.eps,
                    weight_decay=opt.weight_decay,
                    decay_embeddings=opt.decay_embeddings,
                    decay_norms_and_biases=opt.decay_norms_and_biases,
                    implementation=opt.implementation,
                )
                micro = [next(batches) for _ in range(trainer.accum)]

                def forward(inputs, labels, model=model, loss_fn=loss_fn):
                    return loss_fn(model(inputs), labels) / tokens

                def step(micro=micro, optimizer=optimizer) -> None:
                    for inputs, labels in micro:
                        forward(inputs, labels).backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)

                times = []
                for i in range(cli.warmup + cli.steps):
                    start = time.perf_counter()
                    step()
                    if i >= cli.warmup:
                        times.append(time.perf_counter() - start)
                is_compiled = compiled and compile_available(cli.backend, info.device.type)
                if is_compiled:
                    kept, peak = saved_bytes(lambda micro=micro: forward(*micro[0])), None
                else:
                    with ActivationMemory() as memory:
                        loss = forward(*micro[0])
                        memory.mark()
                        loss.backward()
                    kept, peak = memory.at_mark, memory.peak
                    optimizer.zero_grad(set_to_none=True)
                name = f"{mode}" + (f" {option}" if mode == "selective" else "")
                rows.append(
                    (
                        name,
                        "on" if is_compiled else "off",
                        tokens / statistics.median(times),
                        kept,
                        peak,
                    )
                )
                model = optimizer = loss_fn = None  # free them before the next variant is built
        ref_speed, ref_kept, ref_peak = rows[0][2], rows[0][3], rows[0][4]
        print(f"command: python {' '.join(sys.argv)}")
        print(
            f"config {argv[1]} {' '.join(cli.overrides)}: {tokens:,} tokens/step ({trainer.accum} "
            "micro-batches), "
            f"{torch.get_num_threads()} threads, median of {cli.steps} steps after {cli.warmup} "
            f"warmup; compile backend {cli.backend}; ratios to none/eager; * = saved-tensor hooks "
            "(compiled)"
        )
        print(
            f"{'activation ckpt':<16}{'compile':>8}{'tokens/s':>10}{'ratio':>7}"
            f"{'kept MiB':>10}{'ratio':>7}{'peak MiB':>10}{'ratio':>7}"
        )
        for name, comp, speed, kept, peak in rows:
            mark = "*" if comp == "on" else " "
            peak_cells = (
                f"{peak / 2**20:>10.1f}{peak / ref_peak:>7.2f}"
                if peak is not None
                else f"{'n/a':>10}{'':>7}"
            )
            print(
                f"{name:<16}{comp:>8}{speed:>10,.0f}{speed / ref_speed:>7.2f}"
                f"{kept / 2**20:>9.1f}{mark}{kept / ref_kept:>7.2f}{peak_cells}"
            )
        trainer.metrics.close()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    with reported_load():
        main()
