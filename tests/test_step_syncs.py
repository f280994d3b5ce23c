"""The training step reads nothing from the device between log steps (issue 8: no hidden host-device
syncs), except the all-to-all split sizes under expert parallelism (issue 14: one per MoE layer and
micro-batch forward).

Counted on CPU with :class:`sync_helpers.HostReads` around the call ``Trainer.train`` makes on a
step that is neither a log nor a checkpoint step: ``train_step(sync=False)``, which for MoE models
includes the training hooks' per-step expert-load all-reduce and bias update. Left out, because they
read host tensors only: the data loader (batches are built on the host, then copied to the device)
and the stop-signal agreement (a CPU tensor over a gloo group).
"""

from __future__ import annotations

import pytest
import torch.distributed as dist
from ckpt_helpers import TINY_RUN, text_file
from dist_layout_worker import run_worker
from sync_helpers import HostReads

from torchtitan_lite.models.common.moe_hooks import MoETrainingHooks
from torchtitan_lite.preflight.checks import parse_run
from torchtitan_lite.train import Trainer

RUN = [a for a in TINY_RUN if not a.startswith(("--metrics.log_freq", "--checkpoint.enable"))] + [
    "--metrics.log_freq=10",
    "--checkpoint.enable=false",
    "--training.steps=20",
]


@pytest.mark.parametrize(
    "config", ["qwen3_debug", "gpt_oss_debug", "deepseek_v3_debug", "qwen3_moe_debug"]
)
def test_steps_between_log_steps_read_nothing_from_the_device(tmp_path, config):
    text_file(tmp_path, n_plays=1)
    trainer = Trainer(
        parse_run(
            [
                "--job.config_file",
                f"train_configs/{config}.toml",
                *RUN,
                "--model.overrides.n_layers=2",
                f"--training.dataset_path={tmp_path / 'data.txt'}",
                f"--job.dump_folder={tmp_path / 'out'}",
            ]
        )
    )
    try:
        batches = iter(trainer.train_loader)
        trainer.train_step(batches, 1, sync=True)
        trainer.metrics.log_step(
            1,
            loss=0.0,
            grad_norm=0.0,
            lr=0.0,
            tokens_per_step=1,
            elapsed_s=1.0,
            memory_bytes=None,
            data_wait_s=0.0,
        )
        host_batches = iter(
            [next(batches) for _ in range(4 * trainer.accum)]
        )  # the loader's reads are host-only
        with HostReads() as quiet:
            for step in (2, 3, 4):
                assert not trainer.metrics.due(step)
                trainer.train_step(host_batches, step, sync=False)
        with HostReads() as synced:
            trainer.train_step(host_batches, 5, sync=True)
        assert quiet.count == 0
        assert synced.count == 1  # the non-finite guard's agreement: the counter does see reads
        assert isinstance(trainer.hooks, MoETrainingHooks) == (config != "qwen3_debug")
        assert bool(getattr(trainer.hooks, "loads", None)) == (
            config != "qwen3_debug"
        )  # the hooks ran in the steps
    finally:
        trainer.metrics.close()
        dist.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.parametrize(("ac_mode", "per_layer_and_micro_batch"), [("none", 1), ("full", 2)])
def test_expert_parallel_steps_read_the_split_sizes_once_per_moe_layer_and_forward(
    tmp_path, ac_mode, per_layer_and_micro_batch
):
    """Under expert parallelism the all-to-all needs its split sizes on the host: one read per MoE
    layer and micro-batch forward (``torchtitan_lite/distributed/expert_parallel.py``), a second one
    where full activation checkpointing recomputes the layer in backward. Qwen3-MoE, 2 MoE blocks,
    ep2 on 2 ranks, 2 quiet steps of 2 micro-batches per rank (``tests/dist_layout_worker.py``)."""
    result = run_worker(
        tmp_path,
        2,
        ("qwen3_moe",),
        ["--parallelism.expert_parallel_degree=2", f"--activation_checkpoint.mode={ac_mode}"],
        timeout=600,
    )
    steps, micro_batches, moe_layers = 2, 2, 2
    assert (
        result["qwen3_moe"]["host_reads"]
        == steps * micro_batches * moe_layers * per_layer_and_micro_batch
    )
