"""The run folder: ``<job.dump_folder>/<model>-<flavor>-<time>/`` with the resolved config and how
the run was launched, named and created on rank 0."""

from __future__ import annotations

import dataclasses
import json
import sys

import torch.distributed as dist

from torchtitan_lite.components.lr_schedule import fitted_warmup_steps
from torchtitan_lite.components.metrics import make_run_folder
from torchtitan_lite.config.cli import config_dict, format_toml
from torchtitan_lite.config.schema import JobConfig


def create_run_folder(config: JobConfig, rank: int, world_size: int, local_world_size: int) -> str:
    """The run folder (:func:`~torchtitan_lite.components.metrics.make_run_folder`), created on rank
    0 with ``config.toml`` (the resolved config, with the warmup the schedule ran: a warmup clipped
    to a short run is written clipped, so that ``CONFIG_FILE=<run>/config.toml`` passes the check
    and repeats the run) and ``run.json`` (world size, ranks per node, the command line, the config)
    and broadcast to the other ranks; its path."""
    holder = [None]
    if rank == 0:
        sched = config.lr_scheduler
        fitted = fitted_warmup_steps(
            warmup_steps=sched.warmup_steps,
            steps=config.training.steps,
            decay_ratio=sched.decay_ratio,
        )
        config = dataclasses.replace(
            config, lr_scheduler=dataclasses.replace(sched, warmup_steps=fitted)
        )
        folder = make_run_folder(config.job.dump_folder, config.model.name, config.model.flavor)
        (folder / "config.toml").write_text(format_toml(config), encoding="utf-8")
        run = {
            "world_size": world_size,
            "local_world_size": local_world_size,
            "argv": sys.argv[1:],
            "config": config_dict(config),
        }
        (folder / "run.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
        holder[0] = str(folder)
    dist.broadcast_object_list(holder, src=0)
    return holder[0]
