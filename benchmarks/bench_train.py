"""Benchmark (not a test): training throughput of a config on this machine, in one process.

Runs, interleaved step by step on the same batches:
  * ``trainer``: the real :class:`torchtitan_lite.train.Trainer` step (FSDP2 on a 1-rank mesh,
    global-batch loss, clipping, the non-finite guard, AdamW, LR schedule), syncing with the host
    every ``--log-freq``-th step as the training loop does on its log steps
    (``nonfinite_policy = stop``);
  * ``trainer_skip``: the same with ``nonfinite_policy = skip``, which syncs every step (the guard's
    cost);
  * ``bare``: a bare step of the same model class without FSDP (forward, ``cross_entropy``,
    backward, ``AdamW.step`` with the same AdamW kernels as the trainer's, fused or foreach);
and reports the median time per step, tokens/s and the ratios to ``bare`` (the framework's
overhead).

    python benchmarks/bench_train.py                              # qwen3_debug.toml, 20 timed steps
    python benchmarks/bench_train.py --steps 10 -- --job.config_file
    train_configs/gpt_oss_debug.toml

Arguments after ``--`` are config overrides, as for ``run_train.sh``.
"""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import statistics
import tempfile
import time

import torch
from machine_load import reported_load

from torchtitan_lite.builder import build_local_model
from torchtitan_lite.components.loss import cross_entropy_sum
from torchtitan_lite.preflight.checks import parse_run
from torchtitan_lite.train import Trainer


def bare_model(trainer: Trainer) -> torch.nn.Module:
    """The same model family and args, materialized without FSDP and initialized from the same
    plan."""
    return build_local_model(trainer.run, trainer.info.device).model


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each kind")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument(
        "--log-freq", type=int, default=10, help="the trainer syncs on every this-many-th step"
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
            f"--training.steps={cli.warmup + cli.steps}",
            "--lr_scheduler.warmup_steps=1",
        ]
        trainer = Trainer(parse_run(argv))
        bare = bare_model(trainer)
        fused = bool(trainer.optimizer.defaults["fused"])
        bare_opt = torch.optim.AdamW(
            bare.parameters(), lr=trainer.config.optimizer.lr, fused=fused, foreach=not fused
        )
        batches = iter(trainer.train_loader)
        tokens = trainer.global_batch * trainer.config.training.seq_len

        def bare_step(step: int) -> None:
            for _ in range(trainer.accum):
                inputs, labels = next(batches)
                (cross_entropy_sum(bare(inputs), labels) / tokens).backward()
            bare_opt.step()
            bare_opt.zero_grad(set_to_none=True)

        def trainer_step(step: int) -> None:
            trainer.guard.policy = "stop"
            trainer.train_step(batches, step, sync=step % cli.log_freq == 0)

        def trainer_skip_step(step: int) -> None:
            trainer.guard.policy = "skip"
            trainer.train_step(batches, step, sync=False)  # skip syncs every step regardless

        runs = {"trainer": trainer_step, "trainer_skip": trainer_skip_step, "bare": bare_step}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for i in range(cli.warmup + cli.steps):
            for name, run in runs.items():
                start = time.perf_counter()
                run(i + 1)
                if i >= cli.warmup:
                    times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(ts) for name, ts in times.items()}
        print(
            f"command: python benchmarks/bench_train.py --steps {cli.steps} --warmup {cli.warmup} "
            f"--log-freq {cli.log_freq}"
            + (f" -- {' '.join(cli.overrides)}" if cli.overrides else "")
        )
        print(
            f"config {argv[1]}: {tokens:,} tokens/step, {torch.get_num_threads()} threads, AdamW "
            f"{'fused' if fused else 'foreach'}, {cli.steps} timed steps of each kind interleaved "
            "(median)"
        )
        print(f"  {'step':<13} {'s/step':>8} {'tokens/s':>10} {'vs bare':>8}")
        for name, seconds in medians.items():
            print(
                f"  {name:<13} {seconds:8.3f} {tokens / seconds:10,.0f} "
                f"{seconds / medians['bare']:8.3f}"
            )
        trainer.metrics.close()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    with reported_load():
        main()
