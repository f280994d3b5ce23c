"""torchrun worker of tests/test_pipeline_parallel.py: the real Trainer on any layout, its state
returned per rank.

    TORCHTITAN_LITE_TEST_RESULTS=DIR torchrun --nproc_per_node=N tests/dist_pipeline_worker.py
    [--section.key=value ...]

Each rank trains as ``main`` does and returns (``dist_helpers.write_result``): ``weights``
(canonical name -> the full initial tensor of every tensor it holds, gathered within its stage),
``grads`` (the same for the gradients of step 1, before clipping), ``fingerprint`` (the one the
trainer printed), ``losses`` (step -> the logged loss, exact), ``validation`` (the last validation
loss, or ``None``), ``has_last`` (whether it holds the last pipeline stage; ``True`` without one)
and ``error`` (the message of a ``NonFiniteError`` that stopped the run, or ``None``). With
``POISON_STEP=N`` in the environment the loss of step ``N`` is NaN (on the last stage only under
pipeline parallelism).
"""

from __future__ import annotations

import os
import sys

import torch
from dist_helpers import leave_together, write_result
from torch.distributed.tensor import DTensor

from torchtitan_lite.init.apply import tensor_groups
from torchtitan_lite.lifecycle.faults import NonFiniteError, StopRequest
from torchtitan_lite.preflight.checks import load_run_or_exit
from torchtitan_lite.train import Trainer


def full_tensors(trainer: Trainer, of_grad: bool) -> dict[str, torch.Tensor]:
    """First canonical name -> full tensor (or its gradient) of every tensor this rank holds (a
    collective)."""
    out = {}
    for names, tensor in tensor_groups(trainer.model):
        value = tensor.grad if of_grad else tensor
        if value is None:
            continue
        out[names[0]] = (
            (value.full_tensor() if isinstance(value, DTensor) else value).detach().clone()
        )
    return out


def main() -> None:
    trainer = Trainer(load_run_or_exit(sys.argv[1:]))
    weights = full_tensors(trainer, of_grad=False)
    grads: dict[str, torch.Tensor] = {}
    losses: dict[int, float] = {}
    validation: list[float] = []
    forward_backward, train_step, validate = (
        trainer.forward_backward,
        trainer.train_step,
        trainer.validate,
    )
    step_now = [0]
    poison_step = int(os.environ.get("POISON_STEP", "0"))
    owner = trainer.pipeline.loss if trainer.pipeline is not None else trainer
    loss_fn = owner.loss_fn

    def poisoned_loss(logits, labels):
        loss = loss_fn(logits, labels)
        return loss * float("nan") if step_now[0] == poison_step else loss

    owner.loss_fn = poisoned_loss

    def recording_forward_backward(batches):
        result = forward_backward(batches)
        if not grads:
            grads.update(full_tensors(trainer, of_grad=True))
        return result

    def recording_step(batches, step, sync=True):
        step_now[0] = step
        stats = train_step(batches, step, sync=sync)
        losses[step] = (
            stats  # log_freq 1: the loop sums stats.loss_sum in place over the ranks on every step
        )
        return stats

    def recording_validate():
        loss, tokens = validate()
        validation.append(loss)
        return loss, tokens

    trainer.forward_backward, trainer.train_step, trainer.validate = (
        recording_forward_backward,
        recording_step,
        recording_validate,
    )
    stop = StopRequest()
    error = None
    try:
        trainer.train(stop)
    except NonFiniteError as err:
        error = str(err)
    stop.restore()
    tokens = trainer.global_batch * trainer.config.training.seq_len
    write_result(
        {
            "weights": weights,
            "grads": grads,
            "fingerprint": trainer.fingerprint,
            "losses": {step: stats.loss_sum.item() / tokens for step, stats in losses.items()},
            "validation": validation[-1] if validation else None,
            "error": error,
            "has_last": trainer.pipeline is None or trainer.pipeline.has_last,
        }
    )
    leave_together()


if __name__ == "__main__":
    main()
