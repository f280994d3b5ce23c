"""inspect_init: a cut model gets the full model's values; large flavors fall back to a meta
report."""

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from dist_helpers import REPO
from model_helpers import train_to_the_end

from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.lifecycle.startup import STEP1_TERMS
from torchtitan_lite.models import get_model_spec
from torchtitan_lite.models.qwen3 import Qwen3Model, qwen3_flavors, qwen3_init_plan
from torchtitan_lite.preflight.checks import parse_run
from torchtitan_lite.tools.inspect_init import GIB, choose_layers, main

DEBUG = ["--job.config_file", "train_configs/qwen3_debug.toml"]


def test_two_blocks_report_with_the_full_models_values(tmp_path, capsys):
    assert main(DEBUG + ["--layers", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "initialized on CPU: blocks 0..1 of 4 (--layers; plan of the full model" in out
    assert (
        "expected step-1 loss 7.5937..7.6913 = ln V 7.6246 -0.0309..+0.0667 (a range: tied output; "
        "init plan and the step-1 batch; every term: the next line)\n"
        "terms of the expected step-1 loss: logit std 0.316, tied self-logit"
    ) in out
    # the trainer's range (docs/running.md), once
    assert out.count("expected step-1 loss 7.5937..7.6913") == 1
    assert "init report: 24 tensors, none flagged" in out  # 11 per block, tied output, final norm
    rows = {r["name"]: r for r in json.loads((tmp_path / "init_report.json").read_text())}
    assert rows["layers.1.attention.wo.weight"]["expected_std"] == pytest.approx(
        0.02 / 8**0.5 * 0.9865784
    )

    def initialized(n_layers):
        args = dataclasses.replace(qwen3_flavors["debug"], n_layers=n_layers, max_seq_len=16)
        with torch.device("meta"):
            model = Qwen3Model(args)
        init_weights(materialize(model, "cpu"), qwen3_init_plan(qwen3_flavors["debug"]), 42)
        return dict(model.named_parameters())

    cut, full = initialized(2), initialized(4)
    for name, value in cut.items():
        assert torch.equal(value, full[name]), name


def test_inspect_init_prints_the_trainers_expected_step1_loss_and_the_debug_loss_lies_in_it(
    tmp_path, capsys
):
    argv = DEBUG + [
        "--training.steps=1",
        "--lr_scheduler.warmup_steps=0",
        "--validation.enable=false",
        "--metrics.enable_tensorboard=false",
        f"--job.dump_folder={tmp_path}",
    ]
    assert main(argv + ["--meta"]) == 0
    inspected = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("expected step-1")
    )
    train_to_the_end(parse_run(argv))
    lines = capsys.readouterr().out.splitlines()
    trained = next(line for line in lines if line.startswith("expected step-1"))
    assert inspected == trained.replace(STEP1_TERMS, "every term: the next line")
    assert trained.startswith("expected step-1 loss 7.5937..7.6913 ")
    (check,) = [line for line in lines if line.startswith("step-1 check")]
    loss = float(
        re.match(
            r"step-1 check: loss (\S+) is inside the expected 7\.5937\.\.7\.6913$", check
        ).group(1)
    )
    assert 7.5937 <= loss <= 7.6913


def test_published_moe_flavor_is_reported_on_meta_and_says_so(capsys):
    assert main(["--job.config_file", "train_configs/gpt_oss_120b.toml"]) == 0
    out = capsys.readouterr().out
    assert "on meta, nothing sampled: even one block needs" in out
    assert "layers.35.moe.experts.mlp1_weight" in out
    assert (
        "expected step-1 loss 12.7875 = ln V 12.2115 +0.5760 (one value: untied output; init plan; "
        "every term: the next line)\nterms of the expected step-1 loss: logit std"
    ) in out


def test_a_budget_cuts_the_block_count_to_what_fits():
    spec, args = get_model_spec("qwen3"), qwen3_flavors["0.6b"]
    # 5 bytes per element held (embedding, final norm, the two 40960 x 128 RoPE tables) plus 64 MiB
    # of work chunks
    # for the report and the fingerprint; a block has 15,730,944 elements
    fixed = 5 * (args.vocab_size * args.dim + args.dim + 2 * 40960 * 128) + 64 * 2**20
    layers, line = choose_layers(spec, args, None, fixed + 5 * 15_730_944 * 3)
    assert layers == 3 and line.startswith(
        "initialized on CPU: blocks 0..2 of 28 (the full model needs more"
    )
    assert (
        choose_layers(spec, args, None, fixed + 5 * 15_730_944 * 3, in_use=5 * 15_730_944)[0] == 2
    )
    assert choose_layers(spec, args, None, fixed + 5 * 15_730_944 * 28 - 1)[0] == 27
    # README's example: the whole 0.6B model in --max-gib 8 beside the 0.39 GiB the process holds
    # before it
    assert choose_layers(spec, args, None, 8 * GIB, in_use=int(0.39 * GIB)) == (
        28,
        "initialized on CPU: blocks 0..27 of 28",
    )


_PEAK_SCRIPT = """
import json, sys, torch
from torchtitan_lite.preflight.checks import load_run_or_exit
from torchtitan_lite.distributed.devices import peak_memory_bytes
from torchtitan_lite.tools.inspect_init import GIB, main
argv = ["--job.config_file", "train_configs/qwen3_debug.toml", "--model.overrides.n_layers=48"]
load_run_or_exit(argv)  # its imports and data checks first: the budget is what the model may add
budget = peak_memory_bytes(torch.device("cpu")) / GIB + 0.15
code = main([*argv, "--max-gib", str(budget)])
peak = peak_memory_bytes(torch.device("cpu")) / GIB
json.dump({"code": code, "budget": budget, "peak": peak}, open(sys.argv[1], "w"))
"""


def test_max_gib_bounds_the_peak_memory_of_the_whole_process(tmp_path):
    # a 48-block debug model (38M parameters: 0.18 GiB of fp32 values and init's work space, plus
    # the report's and
    # the fingerprint's 64 MiB) does not fit in 0.15 GiB above what the process holds once its
    # configuration is
    # loaded: it is cut to the blocks that fit, and the process's peak RSS (the OS's ru_maxrss)
    #     stays in budget
    result_file = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(result_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(result_file.read_text())
    cut = re.search(
        r"^initialized on CPU: blocks 0\.\.(\d+) of 48 \(the full model needs more than --max-gib",
        proc.stdout,
        re.M,
    )
    assert result["code"] == 0 and cut and int(cut[1]) >= 1, proc.stdout[:1500]
    assert result["peak"] <= result["budget"], proc.stdout[-1500:]
    assert f"peak memory of this process: {result['peak']:.2f} GiB (--max-gib " in proc.stdout


def test_each_phase_prints_a_line_when_it_starts_and_its_seconds_when_it_ends(capsys):
    assert main(DEBUG + ["--layers", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # embedding (tied output), final norm, 11 tensors of one block
    count = "13 tensors (1,311,616 elements)"
    starts = [
        f"init: materializing and sampling {count} on CPU ...",
        f"report: statistics of {count} in float64 ...",
        f"fingerprint: hashing {count} ...",
    ]
    at = [lines.index(line) for line in starts]
    for i, name in zip(at, ["init", "report", "fingerprint"], strict=True):
        assert re.fullmatch(
            name + r": done in \d+\.\d s", lines[i + 1]
        )  # a short phase prints no progress
    assert at == sorted(at) and at[-1] < lines.index("init report: 13 tensors, none flagged")
    assert re.fullmatch(
        r"peak memory of this process: \d+\.\d\d GiB", lines[-1]
    )  # --layers: no budget applies


def test_bad_layer_count_exits_2(capsys):
    assert main(DEBUG + ["--layers", "9"]) == 2
    assert "--layers 9: the model has 4 blocks; pass 1..4" in capsys.readouterr().err


def _table(out: str, first_header: str) -> list[str]:
    """The lines of the aligned table whose header starts with ``first_header``, up to the next
    empty line."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_header))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def test_summary_per_pattern_comes_first_with_aligned_columns(capsys):
    assert main(DEBUG + ["--layers", "2"]) == 0
    out = capsys.readouterr().out
    summary = _table(out, "pattern ")
    assert out.index(summary[0]) < out.index("\nname ")  # before the per-tensor rows
    assert len(summary) == 1 + 13  # one line per plan entry
    header = summary[0]
    spec_at, std_end = header.index("spec"), header.index("std (measured)") + len("std (measured)")
    wo = next(line for line in summary if line.startswith("layers.*.attention.wo.weight "))
    assert wo.split()[1:4] == [
        "2",
        "131,072",
        "trunc_normal(std=0.007071,",
    ]  # 2 blocks of 256 x 256
    for line in summary[1:]:
        assert (
            line[spec_at - 2 : spec_at] == "  " and line[spec_at] != " "
        )  # every spec starts in the spec column
        assert (
            line[std_end - 1] != " " and line[std_end] == " "
        )  # the measured stds end where their header does
    assert re.search(
        r"^layers\.\*\.attention\.wo\.weight +2 +131,072 .* init +0\.00\d+\.\.0\.00\d+ +0\.006976$",
        wo,
    )
    rows = _table(out, "name ")
    rows = rows[: next(i for i, line in enumerate(rows) if line.startswith("init report:"))]
    spec_at = rows[0].index("spec")
    assert len(rows) == 1 + 24 and all(
        line[spec_at - 2 : spec_at] == "  " and line[spec_at:].startswith(("trunc_normal", "ones"))
        for line in rows[1:]
    )


def test_pattern_summary_counts_tensors_elements_and_each_flag():
    from torchtitan_lite.init.report import pattern_summary

    text = pattern_summary(
        [
            ("layers.*.w", "normal(std=0.02)", 100, "init", 0.0199, 0.02, ["std off"]),
            (
                "layers.*.w",
                "normal(std=0.02)",
                100,
                "loaded",
                0.0301,
                0.02,
                ["std off", "kurtosis off"],
            ),
            ("norm.weight", "ones", 8, "init", None, 0.0, []),
        ]
    )
    lines = text.splitlines()
    assert lines[1].split("  ")[0] == "layers.*.w"
    assert re.fullmatch(
        r"layers\.\*\.w +2 +200 +normal\(std=0\.02\) +init,loaded +0\.0199\.\.0\.0301 +0\.02 +"
        r"std off x2, kurtosis off",
        lines[1],
    )
    assert re.fullmatch(r"norm\.weight +1 +8 +ones +init +- +0", lines[2])


def test_statistics_in_tiny_chunks_equal_those_in_one_chunk_and_the_float64_formulas():
    from torchtitan_lite.init.report import tensor_stats

    drawn = torch.empty(37, 11).normal_(0.0, 0.02, generator=torch.Generator().manual_seed(0))
    x = drawn.clamp(-0.04, 0.04)  # the values beyond +-2 std land exactly on the bounds
    x[3, 4], x[20, 0] = float("nan"), float("inf")
    finite = x[torch.isfinite(x)].double()
    at_bounds = int(
        (drawn.abs() > 0.04).sum()
        - (drawn[3, 4].abs() > 0.04).int()
        - (drawn[20, 0].abs() > 0.04).int()
    )
    done = []
    chunked = tensor_stats(x, (-0.04, 0.04), 2e-8, chunk=5, progress=done.append)
    whole = tensor_stats(x, (-0.04, 0.04), 2e-8, chunk=x.numel())
    assert chunked.finite == whole.finite == 405 and sum(done) == 407 and max(done) == 5
    assert (chunked.min, chunked.max, chunked.at_bounds) == (
        whole.min,
        whole.max,
        whole.at_bounds,
    ) == (finite.min().item(), finite.max().item(), at_bounds) and at_bounds == 14
    centered = finite - finite.mean()
    var = centered.square().mean().item()
    reference = (finite.mean().item(), var**0.5, centered.pow(4).mean().item() / var**2 - 3.0)
    for stats in (chunked, whole):
        assert (stats.mean, stats.std, stats.excess_kurtosis) == pytest.approx(
            reference, rel=1e-12, abs=1e-18
        )
    x64 = drawn.double()
    tensor_stats(x64, chunk=5)
    assert torch.equal(x64, drawn.double())  # a float64 tensor is measured, not centered in place
