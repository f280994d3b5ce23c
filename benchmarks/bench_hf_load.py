"""Benchmark (not a test): host memory of an HF import per rank, reading boxes vs reading whole
tensors.

The checkpoint is a tied Qwen3 whose bf16 embedding (``--vocab`` x ``--dim``, default 65536 x 1024 =
128 MiB) is nearly all of its bytes, so on 2 ranks the embedding is twice a rank's share. Each run
launches ``torchrun`` with 1 or 2 ranks (gloo, 1 thread); every rank builds the model on meta,
shards it with FSDP2 (``Shard(0)``, the trainer's cut), materializes it, then imports the folder and
reports:

  * ``rss``: growth of the process's peak resident memory (``ru_maxrss``) over the import: the
    parameters' pages written for the first time, the box copies, and the file pages the reads touch
    (the files are memory-mapped);
  * ``read``: bytes copied out of the files (``SafetensorsFolder.bytes_read``).

Modes: ``boxes`` = the loader (each rank reads its shard's box); ``whole`` = each rank reads every
tensor whole, converts it to the parameters' dtype and copies its shard out of it (the import before
it read boxes: ``get_tensor``, ``.to(dtype)``, ``distribute_tensor``). Printed per mode and world
size, and the ratios.

    python benchmarks/bench_hf_load.py                 # about a minute on 2 cores
    python benchmarks/bench_hf_load.py --vocab 32768
"""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_folder(folder: Path, vocab: int, dim: int) -> None:
    """A tied 2-layer Qwen3 HF folder with random bf16 weights (names and config from our
    adapter)."""
    import dataclasses

    import torch
    from safetensors.torch import save_file

    from torchtitan_lite.models import get_model_spec

    spec = get_model_spec("qwen3")
    args = dataclasses.replace(
        spec.flavors["debug"], vocab_size=vocab, dim=dim, n_layers=2, tie_embeddings=True
    )
    adapter = spec.state_dict_adapter(args)
    with torch.device("meta"):
        model = spec.model_cls(args)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    tensors = {
        hf: torch.randn(shape, generator=gen).to(torch.bfloat16)
        for name, kind in adapter.tensors.items()
        for hf, shape in kind.hf_shapes(shapes[name]).items()
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(
        json.dumps({**adapter.to_hf_config(), "torch_dtype": "bfloat16"})
    )


def worker(folder: str, mode: str) -> None:
    """One rank: FSDP2 model on meta, materialized, then the import; prints ``RESULT {...}``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from torchtitan_lite.components.hf.args import HF_FLAVOR, model_args_from_hf, state_dict_adapter
    from torchtitan_lite.components.hf.folder import SafetensorsFolder
    from torchtitan_lite.components.hf.load import import_hf
    from torchtitan_lite.init.apply import materialize
    from torchtitan_lite.models import get_model_spec

    class WholeTensors(SafetensorsFolder):
        """Reads each tensor whole in fp32, then cuts the box out of it."""

        def read(self, name, box):
            full = super().read(name, tuple((0, n) for n in self.names()[name])).float()
            return full[tuple(slice(a, b) for a, b in box)]

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    args = model_args_from_hf(folder, "qwen3", HF_FLAVOR, {})
    with torch.device("meta"):
        model = get_model_spec("qwen3").model_cls(args)
    fully_shard(model)
    materialize(model, "cpu")
    reader = (SafetensorsFolder if mode == "boxes" else WholeTensors)(folder)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    imported = import_hf(model, reader, state_dict_adapter("qwen3", args))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        "RESULT "
        + json.dumps(
            {"rank": dist.get_rank(), "rss_kib": after - before, "read": imported.bytes_read}
        ),
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()


def launch(folder: Path, mode: str, ranks: int) -> list[dict]:
    """The RESULT of every rank of one torchrun launch."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={ranks}",
        __file__,
        "--worker",
        str(folder),
        mode,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    lines = [
        json.loads(line.split("RESULT ", 1)[1])
        for line in proc.stdout.splitlines()
        if "RESULT " in line
    ]
    if proc.returncode or len(lines) != ranks:
        raise RuntimeError(
            f"launch failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return sorted(lines, key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=65536)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--worker", nargs=2, metavar=("FOLDER", "MODE"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        worker(*options.worker)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "hf"
        write_folder(folder, options.vocab, options.dim)
        size = (folder / "model.safetensors").stat().st_size
        print(
            f"checkpoint {size / 2**20:.1f} MiB (bf16), embedding {options.vocab} x {options.dim}; "
            f"params materialized in fp32"
        )
        rss = {}
        for mode in ("boxes", "whole"):
            for ranks in (1, 2):
                results = launch(folder, mode, ranks)
                rss[mode, ranks] = max(r["rss_kib"] for r in results) / 1024
                per_rank = ", ".join(
                    f"rank {r['rank']}: rss +{r['rss_kib'] / 1024:.1f} MiB, read "
                    f"{r['read'] / 2**20:.1f} MiB"
                    for r in results
                )
                print(f"{mode:>5} {ranks} rank(s): {per_rank}")
        print(
            f"peak rss growth per rank, boxes / whole: {rss['boxes', 1] / rss['whole', 1]:.2f} on "
            f"1 rank, {rss['boxes', 2] / rss['whole', 2]:.2f} on 2 ranks; boxes 2 ranks / 1 rank: "
            f"{rss['boxes', 2] / rss['boxes', 1]:.2f}, whole 2 ranks / 1 rank: "
            f"{rss['whole', 2] / rss['whole', 1]:.2f}"
        )


if __name__ == "__main__":
    main()
