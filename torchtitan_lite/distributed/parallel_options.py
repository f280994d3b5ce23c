"""What a model family's ``parallelize`` is told to apply besides the mesh: tensor-parallel,
activation checkpointing, compile and FSDP2 settings, resolved by the trainer from the config."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torchtitan_lite.distributed.float8 import Float8Settings


@dataclass(frozen=True)
class ParallelOptions:
    """Options of ``ModelSpec.parallelize(model, parallel_dims, options)``
    (``protocols/model_spec.py``).

    Attributes:
        sequence_parallel: under tensor parallelism, shard the residual stream along the sequence
            (``parallelism.enable_sequence_parallel``); ignored without it.
        loss_parallel: under tensor parallelism, the model returns ``Shard(-1)`` logits for
            ``loss_parallel`` (``parallelism.enable_loss_parallel``); ignored without it.
        ac_mode: ``activation_checkpoint.mode`` (``none``/``full``/``selective``).
        selective_ac_option: ``activation_checkpoint.selective_ac_option`` (``"op"`` or ``"k"``).
        compile: compile each block (already decided: enabled, ``"model"`` listed, backend available
            here).
        compile_backend: ``torch.compile`` backend.
        param_dtype: FSDP2 all-gather and compute dtype (``MixedPrecisionPolicy.param_dtype``).
        reduce_dtype: gradient reduce-scatter dtype (``MixedPrecisionPolicy.reduce_dtype``).
        reshard_after_forward: FSDP2 ``reshard_after_forward`` of the blocks and the root.
        float8: convert the chosen linear layers to torchao float8 first (``[float8]``); ``None`` =
            off.
    """

    sequence_parallel: bool = True
    loss_parallel: bool = True
    ac_mode: str = "none"
    selective_ac_option: str = "op"
    compile: bool = False
    compile_backend: str = "inductor"
    param_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype = torch.float32
    reshard_after_forward: bool = True
    float8: Float8Settings | None = None
