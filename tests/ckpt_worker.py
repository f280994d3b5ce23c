"""Worker for the checkpoint tests: runs the real Trainer (under torchrun or as one plain process).

    python tests/ckpt_worker.py MODE OUT [--section.key=value ...]

Modes (rank 0 returns its result with ``dist_helpers.write_result``):
  * ``train``: train as ``main`` does; rank 0 returns
    ``{"losses": {"<step>": float.hex}, "steps": [complete checkpoint steps], "load_lines": [...]}``
    and saves the gathered full model and optimizer state (``torch.save``) to ``OUT``.
  * ``gather``: build the Trainer (which loads the checkpoint), gather the full model and optimizer
    state and, on rank 0, return
    ``{"model_equal": bool, "optim_equal": bool, "n_model": int, "n_optim": int, "loaded_step":
    int}`` comparing it bitwise with the state saved in ``OUT``.
  * ``resume``: ``gather`` (the state the Trainer loaded against ``OUT``), then ``train``; the
    result holds both.
  * ``kill_before_rename``: train; at the first save after step 2 SIGKILL this process right after
    DCP wrote ``step-N.tmp`` and before it is renamed (a crash in the middle of a save).
"""

from __future__ import annotations

import os
import signal
import sys

import torch
from dist_helpers import leave_together, write_result
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from torchtitan_lite.components.checkpoint import storage
from torchtitan_lite.distributed.pipeline import gather_stages
from torchtitan_lite.lifecycle.faults import StopRequest
from torchtitan_lite.preflight.checks import load_run_or_exit
from torchtitan_lite.train import Trainer


def full_state(trainer: Trainer) -> dict:
    """``{"model": {fqn: tensor}, "optim": {fqn.key: tensor}}`` of the whole model, on the CPU of
    every rank (gathered within each pipeline stage, then over the stages)."""
    options = StateDictOptions(full_state_dict=True)
    model = get_model_state_dict(trainer.model, options=options)
    optim = get_optimizer_state_dict(trainer.model, trainer.optimizer, options=options)
    flat = {
        f"{fqn}.{key}": value
        for fqn, state in optim.get("state", {}).items()
        for key, value in state.items()
    }
    state = {
        "model": {k: v.cpu() for k, v in model.items()},
        "optim": {k: v.cpu() for k, v in flat.items()},
    }
    if trainer.pipeline is None:
        return state
    stages = gather_stages(state, trainer.pipeline.group)
    return {part: {k: v for stage in stages for k, v in stage[part].items()} for part in state}


def equal(a: dict, b: dict) -> bool:
    """Same keys and bitwise equal tensors."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main() -> None:
    mode, out, *argv = sys.argv[1:]
    config = (run := load_run_or_exit(argv)).config
    stop = StopRequest()
    trainer = Trainer(run)
    rank = trainer.info.rank
    loaded = {}
    if mode in ("gather", "resume"):
        state = full_state(trainer)
        if rank == 0:
            saved = torch.load(out)
            loaded = {
                "model_equal": equal(state["model"], saved["model"]),
                "optim_equal": equal(state["optim"], saved["optim"]),
                "n_model": len(state["model"]),
                "n_optim": len(state["optim"]),
                "loaded_step": trainer.train_state.step,
            }
    if mode == "gather":
        if rank == 0:
            write_result(loaded)
    else:
        losses = {}
        step_fn = trainer.train_step

        def recording_step(batches, step, sync=True):
            stats = step_fn(batches, step, sync=sync)
            losses[step] = (
                stats  # log_freq 1: the loop all-reduces stats.loss_sum in place on every step
            )
            return stats

        trainer.train_step = recording_step
        if mode == "kill_before_rename":
            finish = trainer.checkpointer.finish

            def killing_finish():
                pending = trainer.checkpointer._pending
                if pending is not None and pending[2] > 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                return finish()

            trainer.checkpointer.finish = killing_finish
        trainer.train(stop)
        state = full_state(trainer)
        if rank == 0:
            torch.save(state, out)
            tokens = trainer.global_batch * trainer.config.training.seq_len
            losses = {
                str(step): (stats.loss_sum.item() / tokens).hex() for step, stats in losses.items()
            }
            write_result(
                {
                    "losses": losses,
                    "steps": storage.complete_steps(
                        storage.checkpoint_folder(config.job.dump_folder, config.checkpoint.folder)
                    ),
                    **loaded,
                    "load_lines": trainer.load_lines,
                }
            )
    stop.restore()
    leave_together()


if __name__ == "__main__":
    main()
