"""Benchmark (not a test): training throughput of a config on this machine, in one process.

Runs the real :class:`torchtitan_lite.train.Trainer` step (FSDP2 on a 1-rank mesh, global-batch loss,
clipping, AdamW, LR schedule) and, side by side on the same batches, a bare step of the same model
without FSDP (forward, ``cross_entropy``, backward, ``AdamW.step``), and reports the median tokens/s
of each and their ratio (the framework's overhead on one process).

    python benchmarks/bench_train.py                                   # qwen3_debug.toml, 20 timed steps
    python benchmarks/bench_train.py --steps 10 -- --job.config_file train_configs/gpt_oss_debug.toml

Arguments after ``--`` are config overrides, as for ``run_train.sh``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from torchtitan_lite.config import parse_args
from torchtitan_lite.init import init_weights, materialize
from torchtitan_lite.train import Trainer, cross_entropy_sum


def bare_model(trainer: Trainer) -> torch.nn.Module:
    """The same model family and args, materialized without FSDP and initialized from the same plan."""
    with torch.device("meta"):
        model = trainer.spec.model_cls(trainer.args)
    materialize(model, trainer.info.device)
    init_weights(model, trainer.spec.init_plan(trainer.args), trainer.config.training.seed,
                 buffer_device=trainer.info.device)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each kind")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("overrides", nargs="*", help="config overrides after --")
    cli = parser.parse_args()
    with tempfile.TemporaryDirectory() as dump:
        argv = ["--job.config_file", "train_configs/qwen3_debug.toml", *cli.overrides,
                f"--job.dump_folder={dump}", "--checkpoint.enable=false", "--validation.enable=false",
                "--metrics.enable_tensorboard=false", f"--training.steps={cli.warmup + cli.steps}",
                "--lr_scheduler.warmup_steps=1"]
        trainer = Trainer(parse_args(argv))
        bare = bare_model(trainer)
        bare_opt = torch.optim.AdamW(bare.parameters(), lr=trainer.config.optimizer.lr, foreach=True)
        batches = iter(trainer.train_loader)
        tokens = trainer.global_batch * trainer.config.training.seq_len

        def bare_step() -> None:
            for _ in range(trainer.accum):
                inputs, labels = next(batches)
                (cross_entropy_sum(bare(inputs), labels) / tokens).backward()
            bare_opt.step()
            bare_opt.zero_grad(set_to_none=True)

        times: dict[str, list[float]] = {"trainer": [], "bare": []}
        for i in range(cli.warmup + cli.steps):
            for name, run in (("trainer", lambda: trainer.train_step(batches, i + 1)), ("bare", bare_step)):
                start = time.perf_counter()
                run()
                if i >= cli.warmup:
                    times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(ts) for name, ts in times.items()}
        print(f"config {argv[1]} {' '.join(cli.overrides)}: {tokens:,} tokens/step, "
              f"{torch.get_num_threads()} threads, {cli.steps} timed steps (median)")
        for name, seconds in medians.items():
            print(f"  {name:<8} {seconds:7.3f} s/step  {tokens / seconds:10,.0f} tokens/s")
        print(f"  ratio trainer/bare step time: {medians['trainer'] / medians['bare']:.3f}")
        trainer.metrics.close()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
