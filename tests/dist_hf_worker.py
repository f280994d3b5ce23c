"""Worker of tests/test_hf_sharded.py, launched by torchrun: import an HF folder into a sharded
model; every rank returns (``dist_helpers.write_result``) its rank, the sha256 of every full tensor,
the bytes it read, the number of init draws, the tensors missing from the folder and the
fingerprint.

``python tests/dist_hf_worker.py LAYOUT FOLDER DUMP [--section.key=value ...]``: ``fsdp`` = the
trainer's model (FSDP2 over all ranks, the folder imported by ``Trainer``), ``shard_last`` = every
parameter a DTensor sharded on its last dimension over all ranks (a tensor-parallel-like cut,
``Shard(1)`` of matrices), imported by ``load_hf_folder``, the rest (token counters) initialized by
the plan as the trainer does.
"""

from __future__ import annotations

import hashlib
import sys

import torch
import torch.distributed as dist
from dist_helpers import leave_together, write_result
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import torchtitan_lite.init.apply as init_module
from torchtitan_lite.components.hf.load import load_hf_folder
from torchtitan_lite.init.apply import init_weights, materialize, named_state_tensors
from torchtitan_lite.init.fingerprint import model_fingerprint
from torchtitan_lite.models import get_model_spec
from torchtitan_lite.preflight.checks import parse_run


def digests(model) -> dict[str, str]:
    """Canonical name -> sha256 of the full tensor's bytes (gathered: test only)."""
    out = {}
    for name, tensor in named_state_tensors(model):
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        out[name] = hashlib.sha256(full.detach().contiguous().numpy().tobytes()).hexdigest()
    return out


def main() -> None:
    layout, folder, dump, *extra = sys.argv[1:]
    draws = []
    real = init_module.trunc_normal_
    init_module.trunc_normal_ = lambda *a, **k: draws.append(k["key"]) or real(*a, **k)
    run = parse_run(
        [
            f"--checkpoint.initial_load_hf={folder}",
            "--checkpoint.enable=false",
            "--training.steps=1",
            "--validation.enable=false",
            "--metrics.enable_tensorboard=false",
            f"--job.dump_folder={dump}",
            "--training.seq_len=16",
            "--training.local_batch_size=1",
            "--lr_scheduler.warmup_steps=0",
            "--training.num_threads=1",
            *extra,
        ]
    )
    config = run.config
    if layout == "fsdp":
        from torchtitan_lite.train import Trainer

        trainer = Trainer(run)
        model, fingerprint = trainer.model, trainer.fingerprint
        imported = load_hf_folder(
            model, folder, config.model.name, trainer.args
        )  # again, to count the bytes read
    else:
        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        args = run.model_args
        with torch.device("meta"):
            model = get_model_spec(config.model.name).model_cls(args)
        materialize(model, "cpu")
        for module in model.modules():
            for name, param in list(module._parameters.items()):
                if param is not None and not isinstance(param, DTensor):
                    placed = distribute_tensor(
                        param.detach(), mesh, [Shard(param.dim() - 1)], src_data_rank=None
                    )
                    module._parameters[name] = torch.nn.Parameter(placed)
        if args.tie_embeddings:
            model.output.weight = model.tok_embeddings.weight
        imported = load_hf_folder(model, folder, config.model.name, args)
        spec = get_model_spec(config.model.name)
        init_weights(
            model,
            spec.init_plan(args),
            config.training.seed,
            skip=imported.loaded,
            buffer_device="cpu",
        )
        fingerprint = model_fingerprint(model)
    result = {
        "rank": dist.get_rank(),
        "bytes_read": imported.bytes_read,
        "draws": len(draws),
        "missing": imported.missing,
        "fingerprint": fingerprint,
        "digests": digests(model),
    }
    write_result(result)
    leave_together()


if __name__ == "__main__":
    main()
