"""Config: TOML + command line into typed sections; bad input is one line, exit 2, and nothing
created."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Literal

import pytest
import tomli
from dist_helpers import REPO, env, launcher_copy, run_train

from torchtitan_lite.config import schema
from torchtitan_lite.config.cli import BadValue, coerce, field_docs, toml_line
from torchtitan_lite.preflight import checks as cfg
from torchtitan_lite.preflight.model_args import build_model_args
from torchtitan_lite.preflight.resolved import read_resolved, write_resolved
from torchtitan_lite.threads import thread_env


def write_toml(tmp_path: Path, body: str) -> Path:
    """A config file whose [job] dump_folder lies in tmp_path (so a test can check it is never
    created)."""
    path = tmp_path / "job.toml"
    path.write_text(f'[job]\ndump_folder = "{tmp_path / "outputs"}"\n' + textwrap.dedent(body))
    return path


def run(args: list[str], tmp_path: Path, **extra_env: str) -> subprocess.CompletedProcess:
    """Run a command from the repo root (:func:`dist_helpers.env` with ``TMPDIR`` in
    ``tmp_path``)."""
    return subprocess.run(
        args,
        cwd=REPO,
        env=env(TMPDIR=str(tmp_path), **extra_env),
        capture_output=True,
        text=True,
        timeout=300,
    )


BAD_INPUTS = {
    "unknown key": (
        "[training]\nstepz = 3\n",
        [],
        "training.stepz",
        "job.toml line 4",
        "did you mean training.steps",
    ),
    "unknown section": (
        "[trainng]\nsteps = 3\n",
        [],
        "trainng.steps",
        "job.toml line 4",
        "unknown section [trainng]",
    ),
    "wrong type": (
        '[training]\nseq_len = "long"\n',
        [],
        "training.seq_len",
        "job.toml line 4",
        "expected int",
    ),
    "out of range": (
        "[optimizer]\nbeta2 = 1.5\n",
        [],
        "optimizer.beta2",
        "job.toml line 4",
        "must be < 1, got 1.5",
    ),
    "wrong type on the command line": (
        "",
        ["--training.steps=many"],
        "training.steps",
        "command line",
        "expected int, got 'many'",
    ),
    "bad choice": (
        "",
        ["--lr_scheduler.decay_type", "exp"],
        "lr_scheduler.decay_type",
        "command line",
        'must be one of "linear", "cosine", "sqrt"',
    ),
    "selective k beyond the layers": (
        "",
        ["--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=9"],
        "activation_checkpoint.selective_ac_option",
        "command line",
        "'9' checkpoints no block of the 4-layer model; use a value <= 4",
    ),
    "moved key": (
        '[parallelism]\nactivation_checkpoint = "full"\n',
        [],
        "parallelism.activation_checkpoint",
        "job.toml line 4",
        "unknown key (moved: use activation_checkpoint.mode)",
    ),
}


def check_in_process(
    argv: list[str], capsys, world_size: int | None = None
) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of the check ``python -m torchtitan_lite.preflight`` runs
    (:func:`load_run_or_exit`), called in this process (the subprocess tests cover the entry
    points)."""
    with pytest.raises(SystemExit) as stop:
        cfg.load_run_or_exit(argv, world_size)
        sys.exit(0)
    out = capsys.readouterr()
    return stop.value.code, out.out, out.err


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line_naming_the_key_and_creates_no_folder(
    tmp_path, capsys, case
):
    body, extra, key, where, detail = BAD_INPUTS[case]
    toml = write_toml(tmp_path, body)
    code, out, err = check_in_process(["--job.config_file", str(toml), *extra], capsys)
    assert code == 2
    assert out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(f"config error: {key} (")
    assert where in line and detail in line
    assert not (tmp_path / "outputs").exists()


def test_the_config_module_exits_2_with_the_line_on_stderr(tmp_path):
    body, extra, key, where, detail = BAD_INPUTS["unknown key"]
    toml = write_toml(tmp_path, body)
    result = run(
        [sys.executable, "-m", "torchtitan_lite.preflight", "--job.config_file", str(toml), *extra],
        tmp_path,
    )
    assert (result.returncode, result.stdout) == (2, "")
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"config error: {key} (") and where in line and detail in line


@pytest.mark.parametrize("case", ["unknown key", "wrong type", "out of range"])
def test_run_train_sh_exits_2_before_torchrun_with_the_key_as_last_line(tmp_path, case):
    body, extra, key, where, detail = BAD_INPUTS[case]
    toml = write_toml(tmp_path, body)
    result = run(["./run_train.sh", *extra], tmp_path, CONFIG_FILE=str(toml))
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"config error: {key} ({toml} line 4)") and detail in last
    assert not (tmp_path / "outputs").exists()
    assert "torch.distributed" not in result.stdout + result.stderr


IMPOSSIBLE_LAYOUTS = {
    "degrees beyond the world size": (
        "2",
        "",
        ["--parallelism.tensor_parallel_degree=2", "--parallelism.data_parallel_shard_degree=2"],
        "config error: [parallelism] for world size 2 (NGPU x nodes): "
        "data_parallel_replicate_degree 1 * "
        "data_parallel_shard_degree 2 * tensor_parallel_degree 2 * pipeline_parallel_degree 1 = 4, "
        "not the world "
        "size 2; set data_parallel_shard_degree = -1 or degrees that multiply to the world size",
    ),
    "a world size that the other degrees do not divide, on two nodes": (
        "1",
        "--nnodes=2 --rdzv-backend=c10d",
        ["--parallelism.data_parallel_replicate_degree=4"],
        "config error: [parallelism] for world size 2 (NGPU x nodes): the world size 2 is not a "
        "multiple of "
        "data_parallel_replicate_degree 4 * tensor_parallel_degree 1 * pipeline_parallel_degree 1 "
        "= 4; pick degrees that divide it",
    ),
    "tp not dividing the kv heads": (
        "4",
        "",
        ["--parallelism.tensor_parallel_degree=4"],
        "config error: parallelism.tensor_parallel_degree (command line): 4 does not divide the "
        "model's n_kv_heads 2 "
        "(tensor parallelism splits it into 4 equal parts); pick a tensor_parallel_degree that "
        "divides it",
    ),
    "tp not dividing the sequence under sequence parallelism": (
        "2",
        "",
        ["--parallelism.tensor_parallel_degree=2", "--training.seq_len=255"],
        "config error: parallelism.tensor_parallel_degree (command line): 2 does not divide "
        "training.seq_len 255 (sequence parallelism splits the sequence); pick a multiple of 2 or "
        "--parallelism.enable_sequence_parallel=false",
    ),
    "expert parallelism on a dense model": (
        "2",
        "",
        ["--parallelism.expert_parallel_degree=2"],
        "config error: parallelism.expert_parallel_degree (command line): 2 needs a "
        "mixture-of-experts model, but qwen3 has no experts; set it to 1",
    ),
    "ep not dividing the experts": (
        "3",
        "",
        ["--parallelism.expert_parallel_degree=3", "--model.name=gpt_oss"],
        "config error: parallelism.expert_parallel_degree (command line): 3 does not divide the "
        "model's num_experts 8 "
        "(each rank holds whole experts); pick an expert_parallel_degree that divides it",
    ),
    "ep beyond the ranks it borrows": (
        "2",
        "",
        ["--parallelism.expert_parallel_degree=4", "--model.name=gpt_oss"],
        "config error: [parallelism] for world size 2 (NGPU x nodes): expert_parallel_degree 4 "
        "must divide "
        "data_parallel_shard_degree 2 * tensor_parallel_degree 1 = 2 (expert parallelism borrows "
        "those ranks)",
    ),
    "more stages than layers": (
        "8",
        "",
        ["--parallelism.pipeline_parallel_degree=8", "--model.tie_embeddings=false"],
        "config error: parallelism.pipeline_parallel_degree (command line) with "
        "pipeline_parallel_schedule 1F1B: 8 "
        "pipeline stages (8 ranks x 1) but the model has 4 layers; use at most 4 stages",
    ),
    "pipeline stages of a tied model": (
        "2",
        "",
        ["--parallelism.pipeline_parallel_degree=2"],
        "config error: parallelism.pipeline_parallel_degree (command line): 2 pipeline stages need "
        "untied embeddings "
        "(the first stage owns tok_embeddings, the last the output), but qwen3 flavor debug ties "
        "them; use an untied flavor or --model.tie_embeddings=false",
    ),
    "fewer micro-batches than stages under 1F1B": (
        "2",
        "",
        [
            "--parallelism.pipeline_parallel_degree=2",
            "--model.flavor=debug_untied",
            "--parallelism.pipeline_parallel_microbatch_size=8",
        ],
        "config error: parallelism.pipeline_parallel_degree (command line) with "
        "pipeline_parallel_schedule 1F1B: 1F1B "
        "needs at least as many micro-batches as stages: 1 micro-batches (local_batch_size / "
        "pipeline_parallel_microbatch_size) for 2 stages; use GPipe or smaller micro-batches",
    ),
    "stages a single-stage schedule cannot run": (
        "2",
        "",
        [
            "--parallelism.pipeline_parallel_degree=2",
            "--model.flavor=debug_untied",
            "--parallelism.pipeline_parallel_layers_per_stage=1",
        ],
        "config error: parallelism.pipeline_parallel_layers_per_stage (command line) with "
        "pipeline_parallel_schedule "
        "1F1B: 4 stages on 2 ranks are 2 per rank but 1F1B runs one per rank; use Interleaved1F1B "
        "or one stage per rank",
    ),
    "hf export from pipeline stages": (
        "2",
        "",
        [
            "--parallelism.pipeline_parallel_degree=2",
            "--model.flavor=debug_untied",
            "--checkpoint.export_hf=hf_out",
        ],
        "config error: checkpoint.export_hf (command line): the Hugging Face export writes the "
        "whole model from one "
        "rank, not from 2 pipeline stages; export from the run's DCP checkpoint with "
        "pipeline_parallel_degree 1 "
        "(--checkpoint.load_path=<step-N folder> --training.steps=N trains nothing and exports)",
    ),
    "a global batch the data-parallel ranks cannot split": (
        "4",
        "",
        ["--training.local_batch_size=8", "--training.global_batch_size=16"],
        "config error: training.global_batch_size = 16 is not a multiple of local_batch_size * "
        "data-parallel degree = 8 * 4; keep the global batch with --training.local_batch_size=4",
    ),
    "a global batch no local batch splits": (
        "3",
        "",
        ["--training.local_batch_size=8", "--training.global_batch_size=16"],
        "config error: training.global_batch_size = 16 is not a multiple of local_batch_size * "
        "data-parallel degree = 8 * 3; set --training.global_batch_size=24 (a multiple of 24)",
    ),
    "split points out of order": (
        "2",
        "",
        [
            "--parallelism.pipeline_parallel_degree=2",
            "--model.flavor=debug_untied",
            "--parallelism.pipeline_parallel_split_points=3,1",
        ],
        "config error: parallelism.pipeline_parallel_split_points (command line) with "
        "pipeline_parallel_schedule 1F1B: "
        "pipeline_parallel_split_points [3, 1] must be increasing layer ids within 1..3 (the first "
        "layer of each stage after the first)",
    ),
}


@pytest.mark.parametrize("case", [c for c in IMPOSSIBLE_LAYOUTS if not IMPOSSIBLE_LAYOUTS[c][1]])
def test_impossible_layout_exits_2_with_one_line(tmp_path, capsys, case):
    ngpu, _, extra, expected = IMPOSSIBLE_LAYOUTS[case]
    toml = write_toml(tmp_path, "")
    code, out, err = check_in_process(
        ["--job.config_file", str(toml), *extra], capsys, world_size=int(ngpu)
    )
    assert (code, out, err.strip().splitlines()) == (2, "", [expected])
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "case",
    [c for c in IMPOSSIBLE_LAYOUTS if IMPOSSIBLE_LAYOUTS[c][1]]
    + ["tp not dividing the kv heads", "a global batch the data-parallel ranks cannot split"],
)
def test_run_train_sh_checks_the_layout_for_ngpu_x_nodes_before_torchrun(tmp_path, case):
    ngpu, torchrun_args, extra, expected = IMPOSSIBLE_LAYOUTS[case]
    toml = write_toml(tmp_path, "")
    result = run(
        ["./run_train.sh", *extra],
        tmp_path,
        CONFIG_FILE=str(toml),
        NGPU=ngpu,
        TORCHRUN_ARGS=torchrun_args,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [expected]
    assert "torch.distributed" not in result.stdout + result.stderr
    assert not (tmp_path / "outputs").exists()


def test_config_check_without_a_world_size_skips_only_the_world_size_check(tmp_path, capsys):
    toml = write_toml(
        tmp_path, "[parallelism]\ntensor_parallel_degree = 2\ndata_parallel_shard_degree = 3\n"
    )
    check = ["--job.config_file", str(toml)]
    assert check_in_process(check, capsys)[0] == 0
    assert check_in_process(check, capsys, world_size=6)[0] == 0
    code, _, err = check_in_process(check, capsys, world_size=4)
    assert code == 2 and "= 6, not the world size 4" in err
    code, _, err = check_in_process([*check, "--parallelism.tensor_parallel_degree=3"], capsys)
    assert code == 2 and "3 does not divide the model's n_heads 4" in err
    wrong = run(
        [sys.executable, "-m", "torchtitan_lite.preflight", *check],
        tmp_path,
        TORCHTITAN_LITE_WORLD_SIZE="4",
    )
    assert wrong.returncode == 2 and "= 6, not the world size 4" in wrong.stderr


def test_missing_config_file_exits_2_naming_job_config_file(tmp_path):
    missing = tmp_path / "nope.toml"
    result = run(
        ["./run_train.sh", f"--job.dump_folder={tmp_path / 'outputs'}"],
        tmp_path,
        CONFIG_FILE=str(missing),
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"config error: job.config_file (CONFIG_FILE): no such file {str(missing)!r}; "
        "pass an existing TOML file, e.g. train_configs/qwen3_debug.toml"
    )
    assert not (tmp_path / "outputs").exists()


def test_valid_config_exits_0_silently_and_creates_nothing(tmp_path):
    toml = write_toml(tmp_path, "[training]\nsteps = 30\n")
    result = run(
        [sys.executable, "-m", "torchtitan_lite.preflight", "--job.config_file", str(toml)],
        tmp_path,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert not (tmp_path / "outputs").exists()


def test_cli_overrides_toml_which_overrides_defaults(tmp_path):
    toml = write_toml(
        tmp_path,
        """
        [training]
        steps = 50
        seq_len = 64
        [optimizer]
        lr = 1e-3
        [lr_scheduler]
        warmup_steps = 2
    """,
    )
    config = cfg.parse_args(
        [
            "--job.config_file",
            str(toml),
            "--training.steps=7",
            "--optimizer.lr",
            "0.02",
            "--debug.init_report",
            "--training.steps",
            "9",
            "--model.tie_embeddings",
            "false",
        ]
    )
    assert config.training.steps == 9  # the last of two command-line values
    assert config.training.seq_len == 64  # from the file
    assert config.optimizer.lr == 0.02 and isinstance(config.optimizer.lr, float)
    assert config.training.local_batch_size == 8  # default
    assert config.debug.init_report is True  # bare flag
    assert config.model.tie_embeddings is False
    assert config.job.config_file == str(toml)


def test_debug_and_0_6b_configs_load_with_their_values():
    debug = cfg.parse_args(["--job.config_file", str(REPO / "train_configs/qwen3_debug.toml")])
    assert (debug.model.flavor, debug.training.steps, debug.training.seq_len) == ("debug", 400, 256)
    big = cfg.parse_args(["--job.config_file", str(REPO / "train_configs/qwen3_0.6b.toml")])
    assert (big.model.flavor, big.training.seq_len, big.training.compute_dtype) == (
        "0.6b",
        4096,
        "bfloat16",
    )
    assert big.training.global_batch_size % big.training.local_batch_size == 0


def test_help_lists_every_key_with_type_default_and_doc(capsys):
    with pytest.raises(SystemExit) as stop:
        cfg.load_run_or_exit(["--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    defaults = schema.JobConfig()
    for section in dataclasses.fields(schema.JobConfig):
        docs = field_docs(type(getattr(defaults, section.name)))
        for name, doc in docs.items():
            assert doc, f"{section.name}.{name} has no documentation string under it"
            assert f"--{section.name}.{name}  " in text
            assert doc.splitlines()[0] in text
    assert '--training.device  "auto" | "cpu" | "cuda" | "npu" | "xpu" = "auto"' in text
    assert "--training.steps  int = 200  (>= 1, <= 1000000000000)" in text
    assert "--model.tokenizer_path  str | None = none" in text


def test_print_config_prints_the_resolved_config_as_toml_and_exits_0(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        cfg.load_run_or_exit(
            [
                "--job.print_config",
                "--training.steps=12",
                "--lr_scheduler.warmup_steps=3",
                f"--job.dump_folder={tmp_path / 'outputs'}",
                "--model.overrides.max_seq_len=512",
            ]
        )
    assert stop.value.code == 0
    printed = tomli.loads(capsys.readouterr().out)
    assert printed["training"]["steps"] == 12
    assert printed["lr_scheduler"]["warmup_steps"] == 3
    assert printed["model"]["overrides"] == {"max_seq_len": 512}
    assert printed["optimizer"] == dataclasses.asdict(schema.Optimizer())
    assert "tokenizer_path" not in printed["model"]  # unset keys are comments
    assert not (tmp_path / "outputs").exists()


def test_cross_field_rules(tmp_path):
    with pytest.raises(
        cfg.ConfigError,
        match=r"^training.global_batch_size \(command line\): 12 is not a positive "
        r"multiple of training.local_batch_size 8",
    ):
        cfg.parse_args(["--training.global_batch_size=12"])
    # a shorter run than the warmup was written for: the schedule clips the warmup
    # (tests/test_optim.py)
    assert cfg.parse_args(["--training.steps=10"]).lr_scheduler.warmup_steps == 20
    toml = "[training]\nsteps = 25\n[lr_scheduler]\nwarmup_steps = 20\ndecay_ratio = 0.3\n"
    (tmp_path / "sched.toml").write_text(toml)
    assert cfg.parse_args(["--job.config_file", str(tmp_path / "sched.toml"), "--training.steps=5"])
    # ... but a warmup set where the steps were set, or later, must fit: 20 + round(7.5) = 28 > 25,
    # refused here,
    # before torchrun starts, not later inside the trainer
    with pytest.raises(
        cfg.ConfigError,
        match=r"^lr_scheduler.warmup_steps \(.*sched.toml line 4\): 20 warmup steps \+ 8 "
        r"decay steps .* exceed training.steps \(.*sched.toml line 2\) 25; set "
        r"warmup_steps <= 17, lower decay_ratio, or train longer$",
    ):
        cfg.parse_args(["--job.config_file", str(tmp_path / "sched.toml")])
    with pytest.raises(
        cfg.ConfigError,
        match=r"^lr_scheduler.warmup_steps \(command line\): 199 warmup steps \+ 2 "
        r"decay steps .* exceed training.steps \(default\) 200; set warmup_steps <= 198,",
    ):
        cfg.parse_args(["--lr_scheduler.warmup_steps=199", "--lr_scheduler.decay_ratio=0.01"])
    with pytest.raises(
        cfg.ConfigError, match=r"^training.hf_dataset_name \(default\): dataset = \"hf\" needs"
    ):
        cfg.parse_args(["--training.dataset=hf"])
    with pytest.raises(
        cfg.ConfigError,
        match=r"^training.hf_dataset_name \(command line\): is set but "
        r"training.dataset is 'shakespeare'",
    ):
        cfg.parse_args(["--training.hf_dataset_name=allenai/c4"])
    with pytest.raises(
        cfg.ConfigError,
        match=r"^training.dataset_path \(command line\): local files and dataset = "
        r"\"hf\" exclude each other",
    ):
        cfg.parse_args(
            [
                "--training.dataset=hf",
                "--training.hf_dataset_name=allenai/c4",
                "--training.dataset_path=x",
            ]
        )
    with pytest.raises(
        cfg.ConfigError,
        match=r"^training.streaming \(command line\): the shakespeare plays are read "
        r"in memory",
    ):
        cfg.parse_args(["--training.streaming"])
    with pytest.raises(
        cfg.ConfigError,
        match=r"^validation.enable \(default\): a streamed local dataset .* has no "
        r"validation split; set --validation.enable=false",
    ):
        cfg.parse_args(["--training.streaming", "--training.dataset_path=x.jsonl"])
    with pytest.raises(
        cfg.ConfigError,
        match=r"^training.seq_len \(command line\): 300 exceeds the model's "
        r"max_seq_len 256; lower it or set --model.overrides.max_seq_len=300$",
    ):
        cfg.parse_args(["--training.seq_len=300", "--model.overrides.max_seq_len=256"])
    assert cfg.parse_args(["--training.global_batch_size=32"]).training.global_batch_size == 32


def test_model_overrides_reach_the_model_args(tmp_path):
    toml = write_toml(
        tmp_path, "[model]\ntie_embeddings = false\n[model.overrides]\nmax_seq_len = 512\n"
    )
    config = cfg.parse_args(["--job.config_file", str(toml), "--model.overrides.rope_theta=5e5"])
    args = build_model_args(config)
    assert (args.max_seq_len, args.rope_theta, args.tie_embeddings) == (512, 5e5, False)
    assert isinstance(args.rope_theta, float)


def test_bad_model_settings_name_the_key(tmp_path):
    with pytest.raises(
        cfg.ConfigError,
        match=r"^model.overrides.swiglu_limt \(command line\): Qwen3ModelArgs has "
        r"no field 'swiglu_limt'; fields: dim, ",
    ):
        cfg.parse_args(["--model.overrides.swiglu_limt=5"])
    toml = write_toml(tmp_path, '[model.overrides]\nn_layers = "four"\n')
    with pytest.raises(
        cfg.ConfigError, match=rf"^model.overrides.n_layers \({toml} line 4\): expected int"
    ):
        cfg.parse_args(["--job.config_file", str(toml)])
    with pytest.raises(
        cfg.ConfigError, match=r"^model.overrides.n_kv_heads: .*must be a multiple of n_kv_heads"
    ):
        cfg.parse_args(["--model.overrides.n_kv_heads=3"])
    with pytest.raises(
        cfg.ConfigError,
        match=r"^model.flavor \(command line\): qwen3 has no flavor 'huge'; "
        r"flavors: debug, ",
    ):
        cfg.parse_args(["--model.flavor=huge"])
    with pytest.raises(
        cfg.ConfigError,
        match=r"^model.name \(command line\): unknown model 'llama'; known models: ",
    ):
        cfg.parse_args(["--model.name=llama"])


def test_check_paths_reports_missing_inputs_and_unwritable_dump_folder(tmp_path):
    run = cfg.parse_run([f"--model.tokenizer_path={tmp_path / 'tok.json'}"])
    with pytest.raises(cfg.ConfigError, match=r"^model.tokenizer_path: no such file or folder"):
        cfg.check_paths(run)
    blocker = tmp_path / "file"
    blocker.write_text("")
    run = cfg.parse_run([f"--job.dump_folder={blocker / 'runs'}"])
    with pytest.raises(
        cfg.ConfigError, match=r"^job.dump_folder: cannot create .* is not a writable folder"
    ):
        cfg.check_paths(run)
    cfg.check_paths(cfg.parse_run([f"--job.dump_folder={tmp_path / 'a' / 'b'}"]))
    assert not (tmp_path / "a").exists()


def test_cli_values_parse_by_field_type():
    assert coerce("none", int | None, from_cli=True) is None
    assert coerce("4", int | None, from_cli=True) == 4
    assert coerce("[1, 2,3]", list[int], from_cli=True) == [1, 2, 3]
    assert coerce([1, 2], list[float], from_cli=False) == [1.0, 2.0]
    assert coerce("full", Literal["none", "full"], from_cli=True) == "full"
    assert coerce("TRUE", bool, from_cli=True) is True
    assert coerce(3, float, from_cli=False) == 3.0
    for value, tp, from_cli in (
        (True, int, False),
        (1, bool, False),
        ("3", int, False),
        ("1.5", int, True),
        ("yes", bool, True),
        (2, str, False),
    ):
        with pytest.raises(BadValue):
            coerce(value, tp, from_cli=from_cli)


def test_toml_line_finds_keys_in_tables_and_dotted_keys():
    text = (
        '# c\n[job]\ndump_folder = "x"\n\n[ model.overrides ]\nmax_seq_len = '
        '5\n[training]\n"steps" = 3\n'
    )
    assert toml_line(text, "job.dump_folder") == 3
    assert toml_line(text, "model.overrides.max_seq_len") == 6
    assert toml_line(text, "training.steps") == 8
    assert toml_line("optimizer.lr = 1\n", "optimizer.lr") == 1
    assert toml_line(text, "training.seed") is None


STUB_TRAINER = '''
"""Stand-in trainer for the launcher test: the real one's error convention, nothing else."""
import sys

import torch

from torchtitan_lite.preflight.checks import load_run_or_exit
from torchtitan_lite.distributed.process_group import init_distributed

config = load_run_or_exit(sys.argv[1:]).config
info = init_distributed(config)
mesh = tuple(info.dims.mesh.shape)
print(f"rank {info.rank} of {info.world_size} mesh {mesh} threads {torch.get_num_threads()}",
      flush=True)
if config.job.description == "fail":
    print(f"error: failed on rank {info.rank}", flush=True)
    sys.exit(1)
'''


@pytest.mark.multiprocess
def test_run_train_sh_shows_log_rank_and_ends_with_its_error_line(tmp_path):
    work = launcher_copy(tmp_path)
    (work / "torchtitan_lite" / "train.py").write_text(STUB_TRAINER)
    common = ["--training.num_threads=1", f"--job.dump_folder={tmp_path / 'outputs'}"]

    ok = run_train(common, nproc=2, cwd=work, timeout=120, TMPDIR=str(tmp_path))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "[rank0]:rank 0 of 2 mesh (2,) threads 1" in ok.stdout
    assert "[rank1]" not in ok.stdout

    failed = run_train(
        [*common, "--job.description=fail"],
        nproc=2,
        cwd=work,
        timeout=120,
        TMPDIR=str(tmp_path),
        LOG_RANK="1",
    )
    assert failed.returncode == 1
    assert "[rank1]:rank 1 of 2" in failed.stdout and "[rank0]" not in failed.stdout
    assert failed.stderr.strip().splitlines()[-1] == "error: failed on rank 1"


def test_the_tokenizer_vocab_must_fit_the_model_checked_once_before_launch(tmp_path):
    dump = f"--job.dump_folder={tmp_path / 'out'}"
    cfg.check_paths(
        cfg.parse_run([dump, "--model.overrides.vocab_size=2048"])
    )  # the bundled tokenizer: 2048 ids
    with pytest.raises(
        cfg.ConfigError,
        match=r"^model.tokenizer_path: tokenizer .* has vocab_size 2048 but the "
        r"model has 2047 embedding rows",
    ):
        cfg.check_paths(cfg.parse_run([dump, "--model.overrides.vocab_size=2047"]))
    (tmp_path / "bad.json").write_text("not json")
    with pytest.raises(
        cfg.ConfigError, match=r"^model.tokenizer_path: cannot read tokenizer file .*bad.json"
    ):
        cfg.check_paths(cfg.parse_run([dump, f"--model.tokenizer_path={tmp_path / 'bad.json'}"]))


def test_the_resolved_config_the_launcher_hands_the_workers_reads_back_equal(tmp_path):
    run = cfg.parse_run(
        [
            "--job.config_file",
            "train_configs/qwen3_debug.toml",
            "--model.overrides.n_layers=1",
            "--model.overrides.rope_theta=5e5",
            "--checkpoint.exclude_from_loading=optimizer",
            "--parallelism.pipeline_parallel_split_points=",
            "--optimizer.lr=3e-4",
        ]
    )
    config = run.config
    write_resolved(config, str(tmp_path / "config.json"))
    read_back = read_resolved(str(tmp_path / "config.json"))
    assert (
        read_back == run
    )  # the config, and the spec, model args and tokenizer the worker resolves from it
    resolved = read_back.config
    assert resolved == config
    assert resolved.model.overrides == {"n_layers": 1, "rope_theta": 5e5}
    assert type(resolved.model.overrides["rope_theta"]) is float


def test_the_launcher_lets_waiting_openmp_threads_sleep_unless_told_otherwise():
    cores = len(os.sched_getaffinity(0))
    unset, given = {"OMP_WAIT_POLICY": ""}, {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "3"}
    thread_env(unset, "1")
    thread_env(given, "2")
    assert unset == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(cores)}
    assert given == {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "3"}
