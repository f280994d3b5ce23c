"""The tools around a trained model: ``evaluate`` gives the mean token loss transformers gives on
the same windows, ``generate`` from a training checkpoint continues as the trained model does, a too
long prompt stops with one line, and ``validation.sample_prompt`` writes the greedy continuation to
the log and TensorBoard at each validation."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
import torch.nn.functional as F
from ckpt_helpers import text_file, tiny_job
from hf_published import scaled
from hf_reference import hf_model
from test_hf_io import close

from torchtitan_lite import evaluate, generate
from torchtitan_lite.components.generation import generate as continue_ids
from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.data.sources import tokenize_documents
from torchtitan_lite.data.tokenizer import Tokenizer
from torchtitan_lite.data.windows import PackedWindows
from torchtitan_lite.lifecycle.faults import StopRequest
from torchtitan_lite.preflight.checks import check_paths, parse_run
from torchtitan_lite.train import Trainer


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, tokenizer_file):
    """A scaled Qwen3-30B-A3B from transformers, saved with a fitting tokenizer, and the
    transformers model."""
    folder = tmp_path_factory.mktemp("qwen3_moe")
    model = hf_model(scaled("Qwen3-30B-A3B"))
    model.save_pretrained(folder)
    shutil.copy(tokenizer_file, folder / "tokenizer.json")
    return folder, model


def test_evaluate_prints_the_mean_token_loss_transformers_gives_on_the_same_windows(
    hf_folder, tmp_path, capsys
):
    folder, model = hf_folder
    data = text_file(tmp_path, n_plays=1)
    data.write_text(data.read_text()[:6000])
    code = evaluate.main(
        [
            f"--checkpoint.initial_load_hf={folder}",
            f"--training.dataset_path={data}",
            "--training.seq_len=32",
            "--training.local_batch_size=4",
            f"--job.dump_folder={tmp_path}",
        ]
    )
    line = capsys.readouterr().out.strip().splitlines()[-1]
    match = re.search(
        r": ([\d,]+) tokens, mean loss ([\d.]+) nats/token, perplexity ([\d.]+)$", line
    )
    windows = PackedWindows(
        tokenize_documents(Tokenizer(folder / "tokenizer.json"), [data.read_text()]), 32, "data"
    )
    inputs = torch.stack([windows[i][0] for i in range(len(windows))])
    labels = torch.stack([windows[i][1] for i in range(len(windows))])
    with torch.no_grad():
        reference = F.cross_entropy(model(inputs).logits.flatten(0, 1), labels.flatten()).item()
    assert code == 0 and match and int(match.group(1).replace(",", "")) == labels.numel()
    assert float(match.group(2)) == pytest.approx(reference, abs=1e-4)
    assert float(match.group(3)) == pytest.approx(torch.tensor(reference).exp().item(), rel=1e-3)


def test_generate_from_a_training_checkpoint_continues_as_the_trained_model(tmp_path, capsys):
    text_file(tmp_path, n_plays=1)
    job = tiny_job(tmp_path, "--training.steps=2", "--checkpoint.interval=2")
    trainer = Trainer(parse_run(job))
    stop = StopRequest()
    try:
        trainer.train(stop)
        trainer.model.eval()
        prompt = trainer.tokenizer.encode("ROMEO:")
        expected = continue_ids(
            trainer.model, prompt, 8, device="cpu", eos_id=trainer.tokenizer.eos_id
        )
    finally:
        stop.restore()
        close()
    capsys.readouterr()
    code = generate.main(
        [
            "--prompt",
            "ROMEO:",
            "--max_new_tokens",
            "8",
            *job,
            f"--checkpoint.load_path={tmp_path / 'out' / 'checkpoint' / 'step-2'}",
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and lines[-2] == f"prompt ids: {' '.join(map(str, prompt))}"
    assert lines[-1] == f"generated ids: {' '.join(map(str, expected))}"


@pytest.mark.parametrize("name, dtype", [("bfloat16", torch.bfloat16), ("auto", torch.float32)])
def test_generate_computes_in_the_run_s_compute_dtype_on_cpu(
    hf_folder, monkeypatch, capsys, name, dtype
):
    folder, _ = hf_folder
    seen = []

    def spy(model, *args, **kwargs):
        record = lambda module, inputs, out: seen.append(out.dtype)  # noqa: E731
        model.layers["0"].register_forward_hook(record)
        model.output.register_forward_hook(record)
        return continue_ids(model, *args, **kwargs)

    monkeypatch.setattr(generate, "generate", spy)
    code = generate.main(
        [
            "--prompt",
            "ROMEO:",
            "--max_new_tokens",
            "2",
            f"--checkpoint.initial_load_hf={folder}",
            f"--training.compute_dtype={name}",
        ]
    )
    capsys.readouterr()
    assert code == 0 and seen == [dtype] * 4  # block 0 and the logits, 2 forwards


def test_generate_refuses_a_prompt_and_new_tokens_beyond_max_seq_len_with_one_line(
    hf_folder, tmp_path, capsys
):
    folder, _ = hf_folder
    short = tmp_path / "short"
    shutil.copytree(folder, short)
    code = generate.main(
        [
            "--prompt",
            "KING HENRY: " * 4,
            "--max_new_tokens",
            "30",
            f"--checkpoint.initial_load_hf={short}",
            "--model.overrides.max_seq_len=32",
            "--training.seq_len=32",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and re.match(
        r"input error: --prompt has \d+ tokens and --max_new_tokens is 30: they must be at "
        r"least 1 and together at most the model's max_seq_len 32",
        err[-1],
    )


def test_sample_prompt_writes_the_greedy_continuation_to_the_log_and_tensorboard(tmp_path, capsys):
    text_file(tmp_path, n_plays=1)
    trainer = Trainer(
        parse_run(
            tiny_job(
                tmp_path,
                "--checkpoint.enable=false",
                "--training.steps=2",
                "--validation.enable=true",
                "--validation.freq=1",
                "--validation.steps=1",
                "--metrics.enable_tensorboard=true",
                "--validation.sample_prompt=ROMEO:",
                "--validation.sample_tokens=5",
            )
        )
    )
    texts = []
    trainer.metrics.writer.add_text = lambda tag, text, step=None: texts.append((tag, text, step))
    stop = StopRequest()
    try:
        trainer.train(stop)
        again = trainer.sample()
    finally:
        stop.restore()
        close()
    out = capsys.readouterr().out
    assert (
        f"step   2  sample: 'ROMEO:' -> {again!r}" in out
        and "step   1  sample: 'ROMEO:' -> " in out
    )
    samples = [(text, step) for tag, text, step in texts if tag == "validation/sample"]
    assert [step for _, step in samples] == [1, 2] and samples[-1][0] == f"**ROMEO:**{again}"
    assert len(trainer.tokenizer.encode(again)) >= 1


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--validation.enable=false"],
            r"^validation.sample_prompt \(command line\): samples are written at each "
            r"validation, and validation.enable is false",
        ),
        (
            ["--validation.sample_tokens=62"],
            r"^validation.sample_prompt: \d+ tokens \+ validation.sample_tokens 62 must be "
            r"between 1 and the model's max_seq_len 64",
        ),
    ],
)
def test_a_sample_prompt_that_cannot_be_sampled_is_a_config_error(tmp_path, extra, message):
    text_file(tmp_path, n_plays=1)
    with pytest.raises(ConfigError, match=message):
        check_paths(
            parse_run(
                tiny_job(
                    tmp_path,
                    "--validation.enable=true",
                    "--validation.sample_prompt=ROMEO: speak",
                    *extra,
                    dump=tmp_path,
                )
            )
        )
