"""Init diagnostics: expected step-1 loss vs measured, the strict check, report files, TB extras,
profiler."""

import csv
import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from dist_helpers import run_train
from tensorboard.backend.event_processing.event_accumulator import (
    HISTOGRAMS,
    SCALARS,
    EventAccumulator,
)

from torchtitan_lite.components.determinism import enable_deterministic
from torchtitan_lite.components.metrics import MetricsLogger
from torchtitan_lite.components.profiling import StepProfiler
from torchtitan_lite.components.tb_extras import (
    layer_grad_norms,
    log_layer_grad_norms,
    log_weight_histograms,
)
from torchtitan_lite.data.loader import build_dataloader
from torchtitan_lite.data.tokenizer import build_tokenizer
from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.init.report import init_report, init_report_summary, write_init_report
from torchtitan_lite.init.spec import InitPlan, trunc_normal
from torchtitan_lite.init.step1 import (
    InitCheckError,
    check_step1_loss,
    expected_step1_loss,
    mean_log_partition,
    silu_square_mean,
)
from torchtitan_lite.models.qwen3 import Qwen3Model, qwen3_flavors, qwen3_init_plan

LN_V = math.log(2048)
STD3 = 0.98657840  # std factor of a normal truncated at +-3 sigma


def build(flavor: str, plan_fn=qwen3_init_plan, seed: int = 0):
    args = dataclasses.replace(qwen3_flavors[flavor], max_seq_len=64)
    with torch.device("meta"):
        model = Qwen3Model(args)
    plan = plan_fn(args)
    materialize(model, "cpu")
    result = init_weights(model, plan, seed, buffer_device="cpu")
    return model, plan, result


def step1_loss(model) -> float:
    tokens = torch.randint(0, 2048, (4, 65), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        return F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).item()


def embedding_std1_wins(args) -> InitPlan:
    """The tied-output bug as a plan: output.weight listed first, so the embedding's std-1 entry
    wins."""
    entries = dict(qwen3_init_plan(args).entries)
    output = entries.pop("output.weight")
    entries["tok_embeddings.weight"] = trunc_normal(1.0)
    return InitPlan("qwen3", (("output.weight", output), *entries.items()))


def test_mean_log_partition_is_log_normal_mean_then_max_and_continuous():
    assert mean_log_partition(0.0, 2048) == pytest.approx(LN_V)
    assert mean_log_partition(1.0, 2048) == pytest.approx(LN_V + 0.5)
    critical = math.sqrt(2 * LN_V)
    assert mean_log_partition(critical, 2048) == pytest.approx(2 * LN_V)
    assert mean_log_partition(critical + 1e-9, 2048) == pytest.approx(2 * LN_V)
    assert mean_log_partition(16.0, 2048) == pytest.approx(16.0 * critical)


def test_expected_step1_loss_of_debug_flavors_from_the_plan():
    with torch.device("meta"):
        untied = Qwen3Model(qwen3_flavors["debug_untied"])
        tied = Qwen3Model(qwen3_flavors["debug"])
    e = expected_step1_loss(untied, qwen3_init_plan(qwen3_flavors["debug_untied"]))
    assert e.low == e.high == pytest.approx(LN_V + 256 * (STD3 / 16) ** 2 / 2)
    assert e.output_names == ("output.weight",) and e.self_logit == 0.0
    e = expected_step1_loss(tied, qwen3_init_plan(qwen3_flavors["debug"]))
    assert e.output_names == ("output.weight", "tok_embeddings.weight")
    assert e.logit_std == pytest.approx(16 * 0.02 * STD3)
    assert e.low == pytest.approx(LN_V + 0.0498, abs=1e-4)
    # 4 feed-forward branches (hidden 768, w2 at 0.02 / sqrt(8)) each add 256 * 768 * s2^2 *
    # M(0.3157) * s3^2 * 256
    s, s2 = 0.02 * STD3, 0.02 / math.sqrt(8) * STD3
    ffn = 4 * 256 * 768 * s2**2 * silu_square_mean(s * 16) * s**2 * 256
    assert e.ffn_norm_sq == pytest.approx(ffn) and ffn == pytest.approx(0.1016, abs=1e-4)
    assert e.embedding_norm_sq == pytest.approx(256 * s**2)
    assert e.cos == pytest.approx(math.sqrt(256 * s**2 / (256 * s**2 + ffn)))
    assert e.cos == pytest.approx(0.704, abs=1e-3)
    assert e.self_logit == pytest.approx(256 * 0.02 * STD3 * e.cos)  # cos <= 1 gave 5.05
    assert e.high == pytest.approx(LN_V + 0.0667, abs=1e-4)  # cos <= 1 gave + 0.1194


def test_silu_square_mean_matches_numerical_integration():
    from scipy import integrate

    def density(z: float) -> float:
        return math.exp(-z * z / 2) / math.sqrt(2 * math.pi)

    def silu(a: float) -> float:
        return a / (1 + math.exp(-a))

    for sigma in (0.05, 0.3157, 0.63, 2.0):
        reference = integrate.quad(
            lambda z, sigma=sigma: silu(sigma * z) ** 2 * density(z), -12, 12, epsabs=1e-14
        )[0]
        assert silu_square_mean(sigma) == pytest.approx(reference, rel=1e-7)
    assert silu_square_mean(0.01) == pytest.approx(0.01**2 / 4, rel=1e-3)  # silu(a) ~ a / 2 near 0


def test_the_tied_06b_expectation_is_tight_where_cos_le_1_spanned_8_nats():
    args = qwen3_flavors["0.6b"]
    with torch.device("meta"):
        model = Qwen3Model(args)
    e = expected_step1_loss(model, qwen3_init_plan(args))
    assert e.low == pytest.approx(math.log(151936) + 0.1993, abs=1e-4)
    assert e.high - e.low < 1e-3  # 28 feed-forward branches: cos(embedding, residual) <= 0.115
    assert e.cos == pytest.approx(0.115, abs=1e-3)


@pytest.mark.parametrize("flavor,layers,vocab", [("debug", 4, 2048), ("0.6b", 6, 8192)])
def test_measured_log_partition_and_loss_lie_in_the_tied_range(flavor, layers, vocab):
    # 0.6b's shapes (dim 1024, hidden 3072, plan of the 28-layer model) on 6 blocks, the vocabulary
    # cut to 8192
    # so that the model fits a test; E[ln sum exp z] is the loss without the noise of the target
    # logit.
    full = dataclasses.replace(qwen3_flavors[flavor], vocab_size=vocab)
    plan = qwen3_init_plan(full)
    with torch.device("meta"):
        model = Qwen3Model(dataclasses.replace(full, n_layers=layers, max_seq_len=64))
    init_weights(materialize(model, "cpu"), plan, 0, buffer_device="cpu")
    e = expected_step1_loss(model, plan)
    tokens = torch.randint(0, 2048, (4, 65), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = model(tokens[:, :-1]).float()
    log_partition = torch.logsumexp(logits, -1).mean().item()
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).item()
    assert e.high - e.low < 0.02
    assert e.low - 0.005 <= log_partition <= e.high + 0.005
    assert abs(loss - log_partition) < 4 * e.logit_std / math.sqrt(
        256
    )  # the target logit: mean 0, std sigma


@pytest.mark.parametrize("flavor", ["debug", "debug_untied"])
def test_measured_step1_loss_lies_in_the_expected_range(flavor):
    model, plan, result = build(flavor)
    e = expected_step1_loss(model, plan)
    loss = step1_loss(model)
    assert e.low - 0.1 <= loss <= e.high + 0.1
    assert (
        check_step1_loss(e, loss, margin=0.5, strict=True, report=init_report(model, plan, result))
        == []
    )


def test_repeated_targets_lower_the_tied_range_by_rate_times_self_logit_and_leave_untied_as_is():
    tied = expected_step1_loss(*build("debug")[:2])
    widened = tied.with_repeats(0.025)
    assert widened.bounds == (pytest.approx(tied.low - 0.025 * tied.self_logit), tied.high)
    assert tied.bounds == (tied.low, tied.high)
    assert (
        "2.5% of the step-1 targets repeat their input token, which lowers the low end by 0.089"
        in widened.describe()
    )
    untied = expected_step1_loss(*build("debug_untied")[:2])
    assert untied.with_repeats(0.025).bounds == (untied.low, untied.low)
    with pytest.raises(ValueError, match="rate must be a share in"):
        tied.with_repeats(1.5)


def test_the_debug_runs_first_batch_repeats_93_targets_and_its_loss_is_inside_the_widened_range():
    """The default run's step-1 batch (plays, seed 42, 16 windows of 256): 93 of its 4,096 targets
    repeat their input token, and the step-1 loss (7.6465 in the run's log) lies under the partition
    range but inside the widened one."""
    args = qwen3_flavors["debug"]
    with torch.device("meta"):
        model = Qwen3Model(args)
    plan = qwen3_init_plan(args)
    materialize(model, "cpu")
    init_weights(model, plan, 42, buffer_device="cpu")
    loader = build_dataloader(
        tokenizer=build_tokenizer(), seq_len=256, local_batch_size=16, seed=42
    )
    rate = loader.dataset.repeated_targets(16)
    inputs, labels = next(iter(loader))
    assert rate == 93 / 4096 == (inputs == labels).float().mean().item()
    with torch.no_grad():
        loss = F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten()).item()
    assert loss == pytest.approx(7.6465, abs=1e-3)
    e = expected_step1_loss(model, plan)
    assert loss < e.low
    low, high = e.with_repeats(rate).bounds
    assert low <= loss <= high


def test_tied_output_left_at_std_1_is_flagged_and_strict_names_output_weight():
    model, plan, result = build("debug")
    with torch.no_grad():
        model.output.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(1))
    e = expected_step1_loss(model, plan)
    loss = step1_loss(model)
    assert loss > 200  # about dim = 256: each token's own embedding dominates its logit
    report = init_report(model, plan, result)
    problems = check_step1_loss(e, loss, margin=0.5, report=report)
    assert len(problems) == 1 and "output.weight = tok_embeddings.weight" in problems[0]
    assert "measured std 1" in problems[0]
    with pytest.raises(InitCheckError, match=r"output\.weight.*debug\.strict_init"):
        check_step1_loss(e, loss, margin=0.5, strict=True, report=report)


def test_plan_where_the_embedding_std_1_wins_is_flagged_by_its_own_expectation():
    model, plan, _ = build("debug", embedding_std1_wins)
    e = expected_step1_loss(model, plan)
    assert e.output_spec.std == 1.0 and e.high == pytest.approx(256 * STD3, rel=1e-3)
    loss = step1_loss(model)
    assert loss == pytest.approx(e.high, rel=0.03)  # the formula's upper end is tight here
    problems = check_step1_loss(e, loss, margin=0.5)
    assert problems[-1].startswith(
        "the init plan of output.weight = tok_embeddings.weight: spec trunc_normal(std=1,"
    )
    assert "starts at least 54 nats above ln V" in problems[-1]
    with pytest.raises(InitCheckError, match=r"output\.weight"):
        check_step1_loss(e, loss, margin=0.5, strict=True)


def test_nan_loss_is_flagged():
    model, plan, _ = build("debug_untied")
    assert (
        "step-1 loss nan"
        in check_step1_loss(expected_step1_loss(model, plan), math.nan, margin=0.5)[0]
    )


@pytest.mark.parametrize("flavor", ["debug", "debug_untied"])
def test_init_report_lists_every_parameter_once_with_std_within_2_percent(flavor):
    model, plan, result = build(flavor)
    report = init_report(model, plan, result)
    names = [n for row in report.rows for n in row.names]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters(remove_duplicate=False))
    checked = [
        r
        for r in report.rows
        if r.spec.startswith(("normal", "trunc_normal")) and math.prod(r.shape) > 10_000
    ]
    assert len(checked) == 7 * 4 + (1 if flavor == "debug" else 2)
    for row in checked:
        assert abs(row.std / row.expected_std - 1) < 0.02, row.name
    assert init_report_summary(report) == f"init report: {len(report.rows)} tensors, none flagged"


def test_report_files_hold_every_row(tmp_path):
    model, plan, result = build("debug")
    report = init_report(model, plan, result)
    json_path, csv_path = write_init_report(report, tmp_path)
    rows = json.loads(json_path.read_text())
    with open(csv_path) as f:
        table = list(csv.DictReader(f))
    assert [r["name"] for r in rows] == [r["name"] for r in table] == [r.name for r in report.rows]
    tied = next(r for r in table if r["status"] == "tied")
    assert tied["names"] == "output.weight = tok_embeddings.weight" and tied["shape"] == "2048x256"
    assert float(tied["std"]) == pytest.approx(report.rows[0].std)


def test_layer_grad_norms_split_the_total_norm_by_block():
    model, _, _ = build("debug")
    tokens = torch.randint(0, 2048, (2, 17), generator=torch.Generator().manual_seed(0))
    F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    norms = layer_grad_norms(model)
    assert list(norms) == ["output", "layers.0", "layers.1", "layers.2", "layers.3", "norm"]
    layer0 = sum(
        p.grad.double().square().sum()
        for n, p in model.named_parameters()
        if n.startswith("layers.0.")
    )
    assert norms["layers.0"] == pytest.approx(layer0.sqrt().item(), rel=1e-6)
    total = sum(p.grad.double().square().sum() for p in model.parameters()).sqrt().item()
    assert math.sqrt(sum(v * v for v in norms.values())) == pytest.approx(total, rel=1e-6)


def test_event_files_hold_histogram_and_scalar_tags(tmp_path):
    model, _, _ = build("debug")
    logger = MetricsLogger(
        tmp_path,
        enable_tensorboard=True,
        tb_subfolder="tb",
        rank=0,
        log_freq=1,
        total_steps=2,
        world_size=1,
        num_flops_per_token=1e6,
        peak_flops=None,
    )
    log_weight_histograms(logger.writer, model, 0)
    tokens = torch.randint(0, 2048, (2, 17), generator=torch.Generator().manual_seed(0))
    F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    norms = log_layer_grad_norms(logger.writer, model, 1)
    logger.log_step(
        1,
        loss=7.7,
        grad_norm=1.0,
        lr=1e-3,
        tokens_per_step=32,
        elapsed_s=1.0,
        memory_bytes=None,
        data_wait_s=0.0,
    )
    logger.log_validation(1, 7.6, 4096)
    logger.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={SCALARS: 0, HISTOGRAMS: 0})
    events.Reload()
    histograms = events.Tags()[HISTOGRAMS]
    assert "weights/output.weight=tok_embeddings.weight" in histograms
    assert len(histograms) == 46
    hist = events.Histograms("weights/layers.0.attention.wq.weight")[0]
    assert hist.step == 0 and hist.histogram_value.num == 256 * 256
    scalars = events.Tags()[SCALARS]
    for tag in (
        "loss/train",
        "loss/validation",
        "lr",
        "tokens_seen",
        "grad_norm",
        "grad_norm/layers.3",
    ):
        assert tag in scalars
    assert events.Scalars("grad_norm/layers.3")[0].value == pytest.approx(norms["layers.3"])
    assert events.Scalars("tokens_seen")[0].value == 32


def test_profiler_writes_a_trace_of_the_window_and_says_cpu_has_no_memory_snapshot(tmp_path):
    profiler = StepProfiler(
        tmp_path, enable=True, start_step=2, steps=2, rank=0, device=torch.device("cpu")
    )
    x = torch.randn(32, 32, requires_grad=True)
    for step in range(1, 5):
        with profiler.step(step):
            (x @ x).sum().backward()
    profiler.close()
    assert profiler.written == [tmp_path / "profile" / "rank0_steps2-3.json"]
    trace = json.loads(profiler.written[0].read_text())
    assert sorted(
        {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    ) == ["ProfilerStep#2", "ProfilerStep#3"]
    assert profiler.memory_note == "memory snapshot: unsupported on cpu (no allocator history)"
    with pytest.raises(ValueError, match="profile_start_step"):
        StepProfiler(
            tmp_path, enable=True, start_step=0, steps=1, rank=0, device=torch.device("cpu")
        )


def test_deterministic_mode_turns_on_deterministic_algorithms():
    try:
        line = enable_deterministic()
        assert torch.are_deterministic_algorithms_enabled()
        assert line.startswith("deterministic algorithms on (CUBLAS_WORKSPACE_CONFIG=")
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False


@pytest.mark.multiprocess
def test_run_with_a_broken_tied_output_init_warns_and_strict_exits_naming_output_weight(tmp_path):
    """The knob ``model.overrides.output_init_std = 1.0`` leaves a tied output at the embedding-like
    std 1."""
    common = [
        "--model.overrides.output_init_std=1.0",
        "--training.steps=1",
        "--lr_scheduler.warmup_steps=1",
        "--training.seq_len=32",
        "--training.local_batch_size=2",
        "--validation.enable=false",
        "--checkpoint.enable=false",
        "--metrics.enable_tensorboard=false",
        "--training.num_threads=1",
    ]

    def run(*extra):
        return run_train(
            [f"--job.dump_folder={tmp_path / 'out'}", *common, *extra],
            timeout=300,
            TMPDIR=str(tmp_path),
        )

    warned = run()
    assert warned.returncode == 0, warned.stderr[-2000:]
    step1 = float(warned.stdout.split("step   1  loss")[1].split()[0])
    assert step1 > 100  # ln V = 7.62: a tied std-1 output starts in the hundreds
    assert "warning:" in warned.stdout and "output.weight" in warned.stdout
    strict = run("--debug.strict_init")
    assert strict.returncode == 1
    last = (strict.stdout + strict.stderr).strip().splitlines()[-1]
    assert last.startswith("error: ") and "output.weight" in last and "debug.strict_init" in last
