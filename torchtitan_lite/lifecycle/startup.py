"""The start-up lines of a run that describe its layout, its memory and compile settings and its
expected step-1 loss (printed through :class:`~torchtitan_lite.components.metrics.StartupLog`), and
the step-1 check's line."""

from __future__ import annotations

from torch import nn

from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.data.streams import GlobalWindowStream
from torchtitan_lite.distributed.compile import compiles
from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.init.spec import InitPlan
from torchtitan_lite.init.step1 import Step1Expectation, expected_step1_loss


def layout_text(dims: ParallelDims, config: JobConfig, loss_parallel: bool) -> str:
    """``layout dp_shard 2 x tp 2 (sequence parallel, loss parallel)``: the degrees above 1
    (``dp_shard`` always), the expert split, and under tensor parallelism what it parallelizes
    besides the blocks."""
    par = config.parallelism
    degrees = [
        ("pp", dims.pp),
        ("dp_replicate", dims.dp_replicate),
        ("dp_shard", dims.dp_shard),
        ("cp", dims.cp),
        ("tp", dims.tp),
    ]
    text = "layout " + " x ".join(
        f"{name} {n}" for name, n in degrees if n > 1 or name == "dp_shard"
    )
    if dims.ep > 1:
        text += f", experts ep {dims.ep} x efsdp {dims.dp_shard * dims.cp * dims.tp // dims.ep}"
    if dims.tp > 1:
        parts = [
            name
            for name, on in (
                ("sequence parallel", par.enable_sequence_parallel),
                ("loss parallel", loss_parallel),
            )
            if on
        ]
        text += f" ({', '.join(parts)})" if parts else ""
    return text


def memory_and_compile_line(config: JobConfig, device_type: str, fused_adamw: bool) -> str:
    """``activation checkpointing full, compile inductor (model, loss), AdamW fused``
    (``Muon + AdamW fused`` under ``optimizer.name = "Muon"``)."""
    ac, cfg = config.activation_checkpoint, config.compile
    ac_text = ac.mode + (f" {ac.selective_ac_option}" if ac.mode == "selective" else "")
    compiled = [
        c
        for c in cfg.components
        if compiles(cfg.enable, cfg.components, cfg.backend, device_type, c)
    ]
    compile_text = (
        f"{cfg.backend} ({', '.join(compiled)})"
        if compiled
        else "off (eager fallback, see the warning above)"
        if cfg.enable
        else "off"
    )
    muon = "Muon + " if config.optimizer.name == "Muon" else ""
    return (
        f"activation checkpointing {ac_text}, compile {compile_text}, "
        f"{muon}AdamW {'fused' if fused_adamw else 'foreach'}"
    )


def step1_expectation(
    model: nn.Module, plan: InitPlan, dataset: object, global_batch: int
) -> Step1Expectation:
    """The expected step-1 loss of ``model`` initialized from ``plan``
    (:func:`expected_step1_loss`), the tied self-logit's effect of the step-1 batch's repeated
    tokens included when ``dataset`` is the training :class:`GlobalWindowStream` (its first
    ``global_batch`` windows: the same for any layout; a streamed dataset's are unknown before it is
    read). The one predictor of the trainer's start-up line and check and of ``inspect_init``."""
    expected = expected_step1_loss(model, plan)
    if expected.tied and isinstance(dataset, GlobalWindowStream):
        expected = expected.with_repeats(dataset.repeated_targets(global_batch))
    return expected


STEP1_TERMS = "every term: inspect_init or --debug.init_report"
"""Where the start-up line of the expected step-1 loss sends a reader for its terms
(``Step1Expectation.describe``)."""


def step1_line(
    expected: Step1Expectation, batch_read: bool, terms: str = STEP1_TERMS, mtp_depths: int = 0
) -> str:
    """The short start-up line of :func:`step1_expectation`, e.g.
    ``expected step-1 loss 7.5937..7.6913 = ln V 7.6246 -0.0309..+0.0667 (a range: tied output; init
    plan and the step-1 batch; every term: inspect_init or
    --debug.init_report)``; an untied output gives one value (``8.1113 = ln V 7.6246
    +0.4867``). ``batch_read``: whether the step-1 batch's repeated tokens were counted (a tied
    output only); ``terms``: where the terms are; ``mtp_depths``: multi-token-prediction heads,
    whose input is normalized as the main head's, so each depth's loss per predicted token has the
    same expectation (said at the end)."""
    ln_v, (low, high) = expected.ln_vocab, expected.bounds
    if expected.tied:
        values = f"{low:.4f}..{high:.4f} = ln V {ln_v:.4f} {low - ln_v:+.4f}..{high - ln_v:+.4f}"
        why = "a range: tied output; init plan " + (
            "and the step-1 batch" if batch_read else "only, the step-1 batch not read"
        )
    else:
        values, why = (
            f"{low:.4f} = ln V {ln_v:.4f} {low - ln_v:+.4f}",
            "one value: untied output; init plan",
        )
    line = f"expected step-1 loss {values} ({why}; {terms})"
    if mtp_depths:
        depths = "depth 1" if mtp_depths == 1 else f"depths 1..{mtp_depths}"
        line += f"; the same for MTP {depths}, per predicted token"
    return line


def step1_check_line(
    expected: Step1Expectation, loss: float, margin: float, what: str = "loss"
) -> str:
    """``step-1 check: loss 7.6465 is inside the expected 7.5937..7.6913``, or
    ``... is 0.0163 below the expected 8.1113 (allowed: debug.init_loss_margin = 0.5 nats)``: where
    a step-1 loss that passed :func:`~torchtitan_lite.init.step1.check_step1_loss` lies against
    :func:`step1_expectation`; ``what`` names it (e.g. ``mtp depth 1 loss``)."""
    low, high = expected.bounds
    if low <= loss <= high:
        return f"step-1 check: {what} {loss:.4f} is inside the expected {expected.span}"
    side = f"{low - loss:.4f} below" if loss < low else f"{loss - high:.4f} above"
    return (
        f"step-1 check: {what} {loss:.4f} is {side} the expected {expected.span} (allowed: "
        f"debug.init_loss_margin = {margin} nats)"
    )
