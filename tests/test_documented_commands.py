"""Every ``./run_train.sh`` and ``python -m torchtitan_lite...`` / ``python -m scripts...`` command
that README.md and docs/ show runs as written, and ``./run_train.sh --training.steps=N`` runs for N
in {1, 5, 20} with every debug config.

:data:`HOW` says how each documented command is tried, and the first test fails when a page shows a
command it does not list (or it lists one no page shows):

* ``run``: in a shell, as written, in a scratch folder that links the repository's files (its
  ``outputs/`` and files it writes stay there); a command that trains gets :data:`SHORT` appended (1
  step, or its own steps when it sets 20 or fewer; 32-token windows; no validation);
* ``check``: for commands that need GPUs or nodes this machine lacks (or that only change a value of
  a run made here), the checks ``run_train.sh`` makes before
  torchrun (``parse_args``, the parallel degrees against the command's ``NGPU`` x nodes world size,
  the
  files it reads), but the memory estimate, which is of this machine's memory; with the reader's own
  files (``/data/...``) not the files;
* ``other``: not a whole command (a program named in prose, a placeholder such as ``<run>`` or
  ``N``) or one whose run another test makes, named in the note.

The N in {1, 5, 20} matrix: the config check for every debug config and N (what refused N = 20
before the warmup was clipped), and real runs: N = 1 of every debug config (for the qwen3, gpt_oss
and deepseek_v3 configs their documented commands, shortened, are those runs) and N = 5 of
qwen3_debug (running.md's example), whose step lines must show the LRs of :func:`wsd_lr_factor` with
the warmup clipped. A 20-step run would add only steps: the schedule of every N is checked by
tests/test_optim.py, and CI's time is better spent elsewhere.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from dist_helpers import REPO, env

from torchtitan_lite.components.lr_schedule import wsd_lr_factor
from torchtitan_lite.config.schema import LRScheduler
from torchtitan_lite.distributed.checks import check_world_size
from torchtitan_lite.preflight.checks import check_paths, load_run, parse_run

PAGES = [
    REPO / "README.md",
    *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "configuration.md"),
]
COMMAND = re.compile(
    r"^(?:[A-Z_]+=(?:\"[^\"]*\"|\S+)\s+)*(?:\./run_train\.sh|python3? -m "
    r"(?:torchtitan_lite|scripts)\b)"
)
SHORT = ["--training.seq_len=32", "--validation.enable=false"]
"""Appended to a documented command that trains, with ``--training.steps=1`` unless it sets 20 steps
or fewer."""
DEBUG_CONFIGS = sorted(
    p.relative_to(REPO).as_posix() for p in (REPO / "train_configs").glob("*debug*.toml")
)
USER_FILES = ("/data/",)
"""Paths in documented commands that stand for the reader's own files."""

HOW: dict[str, tuple[str, str]] = {
    "./run_train.sh": ("other", "test_quick_start_and_its_config_files"),
    "NGPU=2 ./run_train.sh": (
        "other",
        "tests/test_no_warnings.py runs the debug config on 2 processes",
    ),
    "CONFIG_FILE=train_configs/gpt_oss_debug.toml ./run_train.sh": ("run", "an MoE debug config"),
    "./run_train.sh --training.steps=50 --optimizer.lr=1e-3": (
        "check",
        "the quick start's run, overridden",
    ),
    "./run_train.sh --help": ("run", "prints the keys"),
    "./run_train.sh --job.print_config > my.toml": (
        "other",
        "test_quick_start_and_its_config_files",
    ),
    "./run_train.sh --training.steps=5": ("other", "the N = 5 run of test_short_runs_train"),
    "./run_train.sh --optimizer.name=Muon": (
        "other",
        "tests/test_muon_layouts.py runs it (the model cut to 1 block)",
    ),
    "CONFIG_FILE=train_configs/deepseek_v3_debug.toml ./run_train.sh "
    "--model.overrides.mtp_num_layers=1": (
        "run",
        "multi-token prediction",
    ),
    "./run_train.sh --checkpoint.enable=true": (
        "other",
        "test_hf_export_then_train_generate_and_evaluate",
    ),
    "python -m torchtitan_lite.generate --job.config_file train_configs/qwen3_debug.toml "
    '--checkpoint.load_path=outputs/checkpoint/step-400 --prompt "ROMEO:"': (
        "other",
        "test_hf_export_then_train_generate_and_evaluate",
    ),
    "python -m torchtitan_lite.preflight": ("run", "the config check alone"),
    "NGPU=8 CONFIG_FILE=train_configs/qwen3_0.6b.toml ./run_train.sh": ("check", "8 GPUs"),
    "NGPU=8 NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 CONFIG_FILE=train_configs/qwen3_0.6b.toml "
    "./run_train.sh": (
        "check",
        "2 nodes; tests/test_multinode.py launches 2 nodes on 127.0.0.1 from these variables",
    ),
    "NGPU=8 NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 CONFIG_FILE=train_configs/qwen3_0.6b.toml "
    "./run_train.sh": (
        "check",
        "2 nodes; tests/test_multinode.py launches 2 nodes on 127.0.0.1 from these variables",
    ),
    "NGPU=8 NNODES=2 RDZV_ENDPOINT=node0:29500 CONFIG_FILE=train_configs/qwen3_0.6b.toml "
    "./run_train.sh": (
        "check",
        "2 nodes; tests/test_multinode.py launches 2 nodes on a c10d rendezvous on 127.0.0.1",
    ),
    "NGPU=8 CONFIG_FILE=train_configs/deepseek_v3_16b_muon.toml ./run_train.sh": (
        "check",
        "8 GPUs",
    ),
    'NGPU=8 CONFIG_FILE=train_configs/qwen3_0.6b.toml TORCHRUN_ARGS="--nnodes=2 '
    "--rdzv-backend=c10d "
    '--rdzv-endpoint=$HEAD_NODE:29500 --rdzv-id=qwen3-32b" ./run_train.sh --model.flavor=32b '
    "--parallelism.tensor_parallel_degree=8": ("check", "2 nodes"),
    'NGPU=8 CONFIG_FILE=train_configs/qwen3_0.6b.toml TORCHRUN_ARGS="--nnodes=4 '
    "--rdzv-backend=c10d "
    '--rdzv-endpoint=$HEAD_NODE:29500 --rdzv-id=qwen3-32b-pp" ./run_train.sh --model.flavor=32b '
    "--parallelism.tensor_parallel_degree=8 --parallelism.pipeline_parallel_degree=2 "
    "--training.local_batch_size=8": (
        "check",
        "4 nodes",
    ),
    'NGPU=8 CONFIG_FILE=train_configs/gpt_oss_120b.toml TORCHRUN_ARGS="--nnodes=2 '
    "--rdzv-backend=c10d "
    '--rdzv-endpoint=$HEAD_NODE:29500 --rdzv-id=gpt-oss-120b" ./run_train.sh '
    "--parallelism.expert_parallel_degree=8": (
        "check",
        "2 nodes",
    ),
    'NGPU=8 CONFIG_FILE=train_configs/deepseek_v3_671b.toml TORCHRUN_ARGS="--nnodes=32 '
    "--rdzv-backend=c10d "
    '--rdzv-endpoint=$HEAD_NODE:29500 --rdzv-id=deepseek-v3" ./run_train.sh '
    "--parallelism.expert_parallel_degree=64": (
        "check",
        "32 nodes",
    ),
    "NGPU=8 CONFIG_FILE=train_configs/llama3_debug.toml ./run_train.sh --model.flavor=8b "
    "--model.overrides.max_seq_len=131072 --training.seq_len=131072 --training.local_batch_size=1 "
    "--parallelism.context_parallel_degree=8 --activation_checkpoint.mode=full": (
        "check",
        "8 GPUs",
    ),
    "NGPU=4 CONFIG_FILE=train_configs/deepseek_v3_debug.toml ./run_train.sh "
    "--model.overrides.max_seq_len=16384 "
    "--training.seq_len=16384 --training.local_batch_size=1 --training.global_batch_size=1 "
    "--parallelism.context_parallel_degree=4": ("run", ""),
    "./run_train.sh --training.dataset_path=/data/corpus.prepared": (
        "check",
        "the reader's corpus",
    ),
    "./run_train.sh --checkpoint.initial_load_hf=/data/Qwen3-0.6B "
    "--training.dataset_path=my_corpus/ "
    "--training.seq_len=2048 --checkpoint.export_hf=outputs/qwen3-0.6b-tuned": (
        "other",
        "the reader's HF folder and corpus; test_hf_export_then_train_generate_and_evaluate on a "
        "debug export",
    ),
    "NGPU=1 ./run_train.sh --training.deterministic=layout --training.global_batch_size=16 "
    "--training.local_batch_size=4": (
        "other",
        "tests/test_deterministic.py runs NGPU=1 against NGPU=4",
    ),
    "NGPU=4 ./run_train.sh --training.deterministic=layout --training.global_batch_size=16 "
    "--training.local_batch_size=4": (
        "other",
        "tests/test_deterministic.py runs NGPU=4 against NGPU=1",
    ),
    "python -m torchtitan_lite.tools.compare_runs outputs/<run 1> outputs/<run 2> --assert-equal": (
        "other",
        "placeholders; tests/test_deterministic.py and tests/test_compare_runs.py run it",
    ),
    "./run_train.sh --checkpoint.initial_load_hf=outputs/qwen3-shakespeare --training.steps=2 "
    "--training.seq_len=64 "
    "--lr_scheduler.warmup_steps=0 --lr_scheduler.decay_ratio=0 --validation.enable=false": (
        "other",
        "test_hf_export_then_train_generate_and_evaluate",
    ),
    "python -m torchtitan_lite.generate --checkpoint.initial_load_hf=outputs/qwen3-shakespeare "
    '--prompt "ROMEO:" '
    "--max_new_tokens 24": ("other", "test_hf_export_then_train_generate_and_evaluate"),
    "python -m torchtitan_lite.generate --checkpoint.initial_load_hf=outputs/qwen3-shakespeare "
    '--prompt "ROMEO:" '
    "--max_new_tokens 24 --temperature 0.8 --top_k 50 --seed 1 2>/dev/null": (
        "other",
        "test_hf_export_then_train_generate_and_evaluate",
    ),
    "python -m torchtitan_lite.evaluate --checkpoint.initial_load_hf=outputs/qwen3-shakespeare "
    "--training.seq_len=64": (
        "other",
        "test_hf_export_then_train_generate_and_evaluate",
    ),
    "python -m torchtitan_lite.generate": ("other", "the program named in prose"),
    "python -m torchtitan_lite.evaluate": ("other", "the program named in prose"),
    "./run_train.sh &": (
        "other",
        "how to start it in the background; tests/test_faults.py signals such runs",
    ),
    "CONFIG_FILE=outputs/<run>/config.toml ./run_train.sh": (
        "other",
        "test_quick_start_and_its_config_files",
    ),
    "python -m torchtitan_lite.data.prepare --input /data/corpus --output /data/corpus.set "
    "--num_shards 3 "
    "--shard_index 0": (
        "other",
        "the reader's corpus; tests/test_data_shards.py prepares sets of 3 shards",
    ),
    "python -m torchtitan_lite.data.prepare --verify /data/corpus.set": (
        "other",
        "the reader's set; tests/test_data_shards.py verifies sets",
    ),
    "./run_train.sh --training.dataset_path=/data/corpus.set": (
        "check",
        "the reader's set of shards",
    ),
    "python -m torchtitan_lite.data.prepare --input /shared/corpus --output /shared/corpus.set "
    "--num_shards 16 "
    '--shard_index "$SLURM_ARRAY_TASK_ID"': (
        "other",
        "a Slurm array task; tests/test_data_shards.py prepares shards",
    ),
    "python -m torchtitan_lite.data.prepare --verify /shared/corpus.set": (
        "other",
        "the Slurm array's set; tests/test_data_shards.py verifies sets",
    ),
    "python -m torchtitan_lite.data.prepare --input /data/corpus --output /data/corpus.prepared "
    "[--tokenizer tokenizer.json] [--text_column text] [--workers N]": ("other", "a synopsis"),
    "python -m scripts.train_tokenizer": (
        "other",
        "writes the bundled tokenizer; tests/test_tokenizer.py runs it",
    ),
    "python -m torchtitan_lite.tools.inspect_init --job.config_file "
    "train_configs/qwen3_0.6b.toml": (
        "other",
        "tests/test_inspect_init.py runs inspect_init on published configs",
    ),
    "python -m torchtitan_lite.tools.inspect_init --layers N": ("other", "a placeholder N"),
    "python -m torchtitan_lite.tools.simulate": (
        "other",
        "tests/test_simulate.py runs the tool on the qwen3, llama3 and qwen3_moe debug configs",
    ),
    "python -m torchtitan_lite.tools.simulate --device cpu": (
        "other",
        "tests/test_simulate.py's FLOP test runs it (qwen3_debug is the default config)",
    ),
    "python -m torchtitan_lite.tools.simulate --device cpu --world-size 2": (
        "other",
        "tests/test_simulate.py's fsdp 2 case, beside the real run",
    ),
    "python -m torchtitan_lite.tools.simulate --job.config_file "
    "train_configs/qwen3_moe_debug.toml": (
        "other",
        "tests/test_simulate.py's FLOP test runs it",
    ),
    "python -m torchtitan_lite.tools.simulate --world-size 8 --job.config_file "
    "train_configs/qwen3_0.6b.toml --model.flavor=8b": (
        "other",
        "a published size: benchmarks/bench_simulate.py's row 'qwen3 8b'",
    ),
    "python -m torchtitan_lite.tools.compare_runs outputs/run-A outputs/run-B --plot curves.png "
    "[--assert-equal --atol 1e-6] [--names A B]": ("other", "a synopsis"),
}
"""Each documented command -> (how it is tried: ``run``, ``check`` or ``other``, a note)."""


def documented_commands() -> dict[str, list[str]]:
    """The commands in README.md and docs/*.md (not the generated configuration.md) -> where they
    are (``page:line``): lines of fenced blocks (``\\``-continued lines joined, a ``$ `` prompt and
    a trailing ``# comment`` dropped) and inline code spans of the prose that start like
    :data:`COMMAND`."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        name = page.relative_to(REPO).as_posix()
        in_code, pending, prose = False, "", []
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.strip().startswith("```"):
                in_code = not in_code
                continue
            if not in_code:
                prose.append((number, line))
                continue
            text = f"{pending} {line.strip()}".strip() if pending else line.strip()
            if text.endswith("\\"):
                pending = text[:-1].strip()
                continue
            pending = ""
            text = re.sub(r"\s+#\s.*$", "", text.removeprefix("$ "))
            if COMMAND.match(text):
                found.setdefault(text, []).append(f"{name}:{number}")
        joined = "\n".join(line for _, line in prose)
        starts = [0]
        for _, line in prose:
            starts.append(starts[-1] + len(line) + 1)
        for match in re.finditer(r"`([^`]+)`", joined):
            text = " ".join(match.group(1).split())
            if COMMAND.match(text):
                index = next(i for i, start in enumerate(starts) if start > match.start()) - 1
                found.setdefault(text, []).append(f"{name}:{prose[index][0]}")
    return found


def split(command: str) -> tuple[dict[str, str], list[str]]:
    """``NGPU=2 CONFIG_FILE=x ./run_train.sh --a=1`` -> ({"NGPU": "2", "CONFIG_FILE": "x"},
    ["--a=1"])."""
    words = shlex.split(command)
    assignments = {}
    while "=" in words[0] and not words[0].startswith(("-", ".")):
        key, _, value = words.pop(0).partition("=")
        assignments[key] = value
    return assignments, words[1:]


def world_size(assignments: dict[str, str]) -> int:
    """``NGPU`` x the node count (torchrun's ``--nnodes`` of ``TORCHRUN_ARGS``, else ``NNODES``), as
    ``run_train.sh`` computes it."""
    nodes = re.search(r"--nnodes[= ](\d+)", assignments.get("TORCHRUN_ARGS", ""))
    return int(assignments.get("NGPU", "1")) * int(
        nodes.group(1) if nodes else assignments.get("NNODES", "1")
    )


def trains(command: str) -> bool:
    """Whether ``command`` starts training (``run_train.sh`` without ``--help`` or
    ``--job.print_config``)."""
    return "./run_train.sh" in command and not re.search(r"--help|--job\.print_config", command)


def shortened(command: str) -> str:
    """``command`` with :data:`SHORT` appended when it trains, and ``--training.steps=1`` unless it
    sets 20 steps or fewer."""
    if not trains(command):
        return command
    steps = re.search(r"--training\.steps[= ](\d+)", command)
    extra = SHORT if steps and int(steps.group(1)) <= 20 else ["--training.steps=1", *SHORT]
    return f"{command} {' '.join(extra)}"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A folder that links every top-level entry of the repository (but its ``outputs/``), where a
    command writes ``outputs/`` and its other files without touching the repository."""
    folder = tmp_path_factory.mktemp("docs")
    for entry in REPO.iterdir():
        if entry.name not in ("outputs", ".git", "my.toml"):
            (folder / entry.name).symlink_to(entry)
    return folder


def shell(command: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``bash -c command`` in ``cwd`` with one thread per process and this interpreter as
    ``python``."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env(PATH=path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_ran(proc: subprocess.CompletedProcess, command: str) -> str:
    """The output of ``proc``, which must have exited 0."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{output[-4000:]}"
    return output


def test_every_documented_command_is_listed_with_how_it_is_tried():
    found = documented_commands()
    assert set(found) - set(HOW) == set(), "commands in the docs that HOW does not list (add them)"
    assert set(HOW) - set(found) == set(), "HOW lists commands no page shows (remove them)"
    assert {mode for mode, _ in HOW.values()} == {"run", "check", "other"}


CHECKED = [command for command, (mode, _) in HOW.items() if mode == "check"]


@pytest.mark.parametrize("command", CHECKED)
def test_documented_command_passes_the_check_before_torchrun(command, tmp_path, monkeypatch):
    monkeypatch.chdir(
        tmp_path
    )  # any folder the check would probe is the scratch folder's, not the repository's
    assignments, args = split(command)
    argv = [
        "--job.config_file",
        str(REPO / assignments.get("CONFIG_FILE", "train_configs/qwen3_debug.toml")),
        *args,
    ]
    run = parse_run(argv)
    dp_degree = check_world_size(run.config, world_size(assignments)).dp_degree
    if not any(marker in command for marker in USER_FILES):
        check_paths(run, dp_degree=dp_degree)


@pytest.mark.parametrize("config", DEBUG_CONFIGS)
@pytest.mark.parametrize("steps", [1, 5, 20])
def test_short_runs_of_every_debug_config_pass_the_config_check(
    config, steps, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    load_run(["--job.config_file", str(REPO / config), f"--training.steps={steps}"], world_size=1)


RUN = [command for command, (mode, _) in HOW.items() if mode == "run"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("command", RUN)
def test_documented_command_runs(command, scratch):
    output = assert_ran(shell(shortened(command), scratch), command)
    if trains(command):
        assert re.search(r"^\[rank0\]:step +1 +loss", output, re.M), output[-3000:]


STEP_LR = re.compile(r"^\[rank0\]:step +(\d+) +loss +\S+ +grad_norm +\S+ +lr +(\S+)", re.M)


def _lrs(config: str, steps: int) -> list[str]:
    """The LR of each step of ``config`` at ``training.steps = steps``, as the step line prints
    it."""
    toml = tomllib.loads((REPO / config).read_text())
    sched = {**dataclasses.asdict(LRScheduler()), **toml["lr_scheduler"]}
    return [
        f"{toml['optimizer']['lr'] * wsd_lr_factor(step, steps=steps, **sched):.1e}"
        for step in range(1, steps + 1)
    ]


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "config, steps",
    [
        ("train_configs/llama3_debug.toml", 1),
        ("train_configs/qwen3_moe_debug.toml", 1),
        ("train_configs/qwen3_debug.toml", 5),
    ],
)
def test_short_runs_train(config, steps, scratch):
    """``CONFIG_FILE=<config> ./run_train.sh --training.steps=<steps>`` (and :data:`SHORT`): the
    step lines show the clipped warmup's LRs, and one line says the warmup was clipped. (The N = 1
    runs of the other debug configs are their documented commands, and 20 steps add only steps to
    the 5 here.)"""
    command = f"CONFIG_FILE={config} ./run_train.sh --training.steps={steps} {' '.join(SHORT)}"
    output = assert_ran(shell(command, scratch), command)
    assert [lr for _, lr in STEP_LR.findall(output)] == _lrs(config, steps), output[-3000:]
    assert "[rank0]:lr schedule: warming up for " in output, output[-3000:]


@pytest.mark.multiprocess
def test_quick_start_and_its_config_files(scratch, monkeypatch):
    """README's ``./run_train.sh`` (shortened); ``./run_train.sh --job.print_config > my.toml``,
    whose output passes the check of ``CONFIG_FILE=my.toml ./run_train.sh``, as the run folder's
    ``config.toml`` does (running.md's ``CONFIG_FILE=outputs/<run>/config.toml ./run_train.sh``)."""
    output = assert_ran(shell(shortened("./run_train.sh"), scratch), "./run_train.sh")
    assert re.search(r"^\[rank0\]:step +1 +loss", output, re.M), output[-3000:]
    assert_ran(shell("./run_train.sh --job.print_config > my.toml", scratch), "print_config")
    monkeypatch.chdir(scratch)
    run = re.search(r"^\[rank0\]:done: .*; run folder (\S+)$", output, re.M).group(1)
    assert load_run(["--job.config_file", "my.toml"], world_size=1).config.training.steps == 400
    assert (
        load_run(["--job.config_file", f"{run}/config.toml"], world_size=1).config.training.steps
        == 1
    )


@pytest.mark.multiprocess
def test_hf_export_then_train_generate_and_evaluate(scratch):
    """hf.md's journey: the debug model trained with ``--checkpoint.enable=true`` and exported to
    ``outputs/qwen3-shakespeare`` (its prose's ``--checkpoint.export_hf``), training continued from
    that folder, its ``generate`` and ``evaluate`` commands, and ``generate`` from the checkpoint
    (shortened: it saved step 1, not the full run's step 400)."""
    export = shortened(
        "./run_train.sh --checkpoint.enable=true --checkpoint.export_hf=outputs/qwen3-shakespeare"
    )
    assert_ran(shell(export, scratch), export)
    for command, (_, note) in HOW.items():
        if (
            note == "test_hf_export_then_train_generate_and_evaluate"
            and command != "./run_train.sh --checkpoint.enable=true"
        ):
            written = command.replace("outputs/checkpoint/step-400", "outputs/checkpoint/step-1")
            output = assert_ran(shell(shortened(written), scratch), command)
            if "generate" in command:
                assert "generated ids:" in output, output[-3000:]
