"""What a run prints while it starts, saves, resumes and loads: the start-up phase lines, the data
line (tokens, windows, epochs), the checkpoint save and load lines, and a small folder of one's own
text that validates."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ckpt_helpers import TINY_MODEL, text_file, tiny_job
from model_helpers import train_to_the_end

from torchtitan_lite.components.metrics import folder_bytes, format_bytes
from torchtitan_lite.config.cli import config_dict, format_toml
from torchtitan_lite.data.corpus import shakespeare_plays
from torchtitan_lite.preflight.checks import parse_run
from torchtitan_lite.train import Trainer

PHASE = re.compile(r"^([a-z][a-z ]*) \((\d+\.\d) s\): ")
KERNELS = re.compile(r"init kernels built/compiled in \d+\.\d s; ")
"""The init line's note when this process built or compiled the init kernels (the first run on a
machine)."""


def train(argv: list[str], capsys) -> tuple[Trainer, list[str]]:
    """Train ``argv`` in this process; the trainer and its printed lines."""
    trainer = train_to_the_end(parse_run(argv))
    return trainer, capsys.readouterr().out.splitlines()


def run(tmp: Path, capsys, *extra: str) -> tuple[Trainer, list[str]]:
    """Train ``TINY_MODEL``/``TINY_RUN`` on ``tmp/data.txt`` (:func:`train`)."""
    return train(tiny_job(tmp, "--checkpoint.interval=2", *extra), capsys)


def test_start_up_prints_each_phase_with_its_seconds_then_the_run_folder(tmp_path, capsys):
    text_file(tmp_path, n_plays=1)
    trainer, lines = run(tmp_path, capsys, "--checkpoint.enable=false")
    start = lines[: next(i for i, line in enumerate(lines) if line.startswith("run folder")) + 1]
    phases = [m.group(1) for m in map(PHASE.match, start) if m]
    assert phases == ["process group", "data", "model", "parallelize", "init"]
    by_phase = {m.group(1): line for line in start if (m := PHASE.match(line))}
    data = tmp_path / "data.txt"
    # one play: 35,094 tokens; the last 1% (351 tokens) is held out; train windows (34,743 - 1) //
    # 32
    assert by_phase["data"].endswith(
        f"dataset_path {data}: 1 document, 35,094 tokens; train 34,743 tokens = 1,085 windows of "
        "32, 4 steps x 2 windows = 0.00737 epochs; no validation"
    )
    res = trainer.init_result
    assert KERNELS.sub("", by_phase["init"]).endswith(
        f"{res.initialized_tensors} tensors ({res.initialized_elements:,} elements) "
        f"initialized, 0 loaded; fingerprint {trainer.fingerprint}"
    )
    assert start[start.index(by_phase["init"]) + 1].startswith("expected step-1 loss ")
    assert re.fullmatch(
        rf"run folder {re.escape(trainer.run_folder)}: config.toml, run.json; start-up took "
        r"\d+\.\d s",
        start[-1],
    )
    folder = Path(trainer.run_folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.toml", "run.json"]
    assert (folder / "config.toml").read_text() == format_toml(
        trainer.config
    )  # loads back: test_config_output
    run_json = json.loads((folder / "run.json").read_text())
    assert (run_json["world_size"], run_json["local_world_size"]) == (1, 1)
    assert run_json["config"] == json.loads(json.dumps(config_dict(trainer.config)))


def test_saves_print_step_folder_size_and_seconds_and_a_resume_says_where_it_resumed(
    tmp_path, capsys
):
    text_file(tmp_path, n_plays=1)
    _, lines = run(tmp_path, capsys)
    folder = tmp_path / "out" / "checkpoint"
    saved = [line for line in lines if line.startswith("checkpoint saved: ")]
    assert [line.split(" (")[0] for line in saved] == [
        f"checkpoint saved: {folder / 'step-2'}",
        f"checkpoint saved: {folder / 'step-4'}",
    ]
    assert re.fullmatch(
        r"checkpoint saved: \S+step-4 "
        rf"\({re.escape(format_bytes(folder_bytes(folder / 'step-4')))}\) in \d+\.\d s",
        saved[1],
    )
    trainer, lines = run(tmp_path, capsys, "--training.steps=6", "--lr_scheduler.warmup_steps=0")
    loaded = trainer.init_result.skipped_tensors
    (load,) = [line for line in lines if line.startswith("load (")]
    size = format_bytes(folder_bytes(folder / "step-4"))
    assert PHASE.match(load) and load.endswith(
        f"resumed at step 4 from {folder / 'step-4'} ({size}): {loaded} model tensors loaded"
    )
    init = next(line for line in lines if line.startswith("init ("))
    assert KERNELS.sub("", init).endswith(
        f": 0 tensors (0 elements) initialized, {loaded} loaded; fingerprint {trainer.fingerprint}"
    )
    assert not any(
        line.startswith(("expected step-1 loss", "step-1 check")) for line in lines
    )  # not a fresh init
    assert re.match(r"step +5 ", next(line for line in lines if line.startswith("step ")))


def test_a_140_kb_folder_of_text_trains_with_validation_at_the_debug_batch(tmp_path, capsys):
    # The debug config's batch (16 windows of 256 per step, 8 per micro-batch): the last 1% of 140
    # KB of text is
    # 3 windows, fewer than one batch; validation holds out one global batch instead (16 * 256 + 1
    # tokens).
    folder = tmp_path / "mine"
    folder.mkdir()
    text = "\n\n".join(t for _, t in shakespeare_plays("train"))[:140_000]
    for i in range(4):
        (folder / f"part{i}.txt").write_text(text[i * 35_000 : (i + 1) * 35_000], encoding="utf-8")
    args = [
        *TINY_MODEL,
        "--model.overrides.max_seq_len=256",
        f"--training.dataset_path={folder}",
        f"--job.dump_folder={tmp_path / 'out'}",
        "--training.seq_len=256",
        "--training.local_batch_size=8",
        "--training.global_batch_size=16",
        "--training.steps=2",
        "--lr_scheduler.warmup_steps=1",
        "--validation.freq=2",
        "--validation.enable=true",
        "--training.num_threads=1",
        "--checkpoint.enable=false",
        "--metrics.enable_tensorboard=false",
    ]
    trainer, lines = train(args, capsys)
    data = next(line for line in lines if line.startswith("data ("))
    total = trainer.data.total.tokens
    assert (
        trainer.data.validation_size.tokens == 16 * 256 + 1
        and trainer.data.validation_size.windows == 16
    )
    assert data.endswith("validation the last 4,097 tokens = 16 windows of 256")
    assert f"dataset_path {folder}: 4 documents, {total:,} tokens; train " in data
    assert not any(line.startswith("warning: validation off") for line in lines)
    validation = next(x for x in lines if "validation loss" in x)
    # one global batch of 16 windows of 256 (validation.steps = 4 asks more than the split holds)
    assert re.fullmatch(r"step +2  validation loss +\d+\.\d{4}  \(4,096 tokens\)", validation)


def test_too_little_data_for_validation_trains_without_it_and_says_why(tmp_path, capsys):
    # 35,094 tokens: one global batch of 128 windows of 32 (4,097 tokens) would be 11.7% of them,
    # over 10%
    text_file(tmp_path, n_plays=1)
    trainer, lines = run(
        tmp_path,
        capsys,
        "--validation.enable=true",
        "--training.global_batch_size=128",
        "--training.local_batch_size=128",
        "--training.steps=1",
        "--lr_scheduler.warmup_steps=0",
    )
    (warning,) = [line for line in lines if line.startswith("warning: validation off: ")]
    assert warning == (
        f"warning: validation off: dataset_path {tmp_path / 'data.txt'} (validation) has 351 "
        "tokens = 10 windows of "
        "32, fewer than one global batch (128 windows) (at most 10% of the data "
        "is held out); use more data, a smaller seq_len or global batch, or "
        "--validation.enable=false"
    )
    assert trainer.val_loader is None
    assert next(line for line in lines if line.startswith("data (")).endswith(
        "; validation off (see the warning)"
    )
    assert any(line.startswith("done: step 1 of 1") for line in lines)


def test_a_finished_job_run_again_trains_nothing_and_leaves_no_run_folder(tmp_path, capsys):
    text_file(tmp_path, n_plays=1)
    run(tmp_path, capsys)
    folders = sorted((tmp_path / "out").glob("*/run.json"))
    _, lines = run(tmp_path, capsys)
    assert "step 4 reached training.steps = 4: nothing to train; the run folder is removed" in lines
    assert sorted((tmp_path / "out").glob("*/run.json")) == folders and len(folders) == 1
