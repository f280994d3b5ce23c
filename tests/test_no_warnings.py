"""A run prints no warning on any parallel layout: two steps through ``./run_train.sh`` of a 2-rank
FSDP2 run, a tensor x expert parallel run (4 ranks: dp_shard 2 x tp 2, EP borrowing the
tensor-parallel ranks), a 2-stage pipeline run and a 2-rank float8 run (torchao, float8 all-gather)
leave no line saying "warning", and no warning line of torch's C++ logging
(``W1202 06:00:00.123 ...``), on the console or in any rank's ``logs/rank<N>.log``."""

from __future__ import annotations

import re

import pytest
from ckpt_helpers import text_file
from dist_helpers import run_train

pytestmark = pytest.mark.multiprocess

SHORT_RUN = [
    "--training.steps=2",
    "--lr_scheduler.warmup_steps=0",
    "--lr_scheduler.decay_ratio=0",
    "--validation.enable=false",
    "--checkpoint.enable=false",
    "--training.seq_len=32",
    "--training.local_batch_size=2",
    "--training.global_batch_size=-1",
    "--training.num_threads=1",
    "--model.overrides.n_layers=2",
]
"""Two steps of one 2 x 32-token micro-batch per data-parallel rank, on a 2-block debug model."""
CPP_WARNING = re.compile(r"^(\[rank\d+\]:)?W\d{4} \d\d:\d\d:\d\d")
"""A warning of torch's C++ logging (glog format: ``W``, month and day, time), as torchrun prefixes
it or not."""
LAYOUTS = {  # name: (processes, config file, options)
    "fsdp2": (2, "train_configs/qwen3_debug.toml", []),
    "tp2_ep2": (
        4,
        "train_configs/qwen3_moe_debug.toml",
        ["--parallelism.tensor_parallel_degree=2", "--parallelism.expert_parallel_degree=2"],
    ),
    "pp2": (
        2,
        "train_configs/qwen3_debug.toml",
        ["--parallelism.pipeline_parallel_degree=2", "--model.tie_embeddings=false"],
    ),
    "fsdp2_float8": (
        2,
        "train_configs/qwen3_debug.toml",  # torchao's import warnings are silenced at their source
        [
            "--float8.enable=true",
            "--float8.enable_fsdp_float8_all_gather=true",
            "--float8.precompute_float8_dynamic_scale_for_fsdp=true",
            "--model.overrides.dim=64",
            "--model.overrides.hidden_dim=128",
        ],
    ),  # CPU's float8 matmul is a slow reference kernel
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_short_run_prints_no_warning_on_any_rank(tmp_path, layout):
    processes, config_file, options = LAYOUTS[layout]
    data = text_file(tmp_path, n_plays=1)
    proc = run_train(
        [
            *SHORT_RUN,
            *options,
            f"--training.dataset_path={data}",
            f"--job.dump_folder={tmp_path / 'out'}",
        ],
        nproc=processes,
        timeout=600,
        CONFIG_FILE=config_file,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = (tmp_path / "out").iterdir()
    logs = {path.name: path.read_text() for path in sorted((run / "logs").iterdir())}
    assert list(logs) == [f"rank{rank}.log" for rank in range(processes)]
    assert all("done: step 2 of 2" in text for text in logs.values())
    outputs = {"console": proc.stdout + proc.stderr, **logs}
    warnings = {
        name: [
            line
            for line in text.splitlines()
            if "warning" in line.lower() or CPP_WARNING.match(line)
        ]
        for name, text in outputs.items()
    }
    assert warnings == {name: [] for name in outputs}
