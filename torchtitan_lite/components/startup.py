"""The start-up lines of a run that describe its layout and its memory and compile settings (printed through
:class:`~torchtitan_lite.components.metrics.StartupLog`)."""

from __future__ import annotations

from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.distributed.compile import compiles
from torchtitan_lite.distributed.parallel_dims import ParallelDims


def layout_text(dims: ParallelDims, config: JobConfig, loss_parallel: bool) -> str:
    """``layout dp_shard 2 x tp 2 (sequence parallel, loss parallel)``: the degrees above 1 (``dp_shard`` always),
    the expert split, and under tensor parallelism what it parallelizes besides the blocks."""
    par = config.parallelism
    degrees = [("pp", dims.pp), ("dp_replicate", dims.dp_replicate), ("dp_shard", dims.dp_shard), ("tp", dims.tp)]
    text = "layout " + " x ".join(f"{name} {n}" for name, n in degrees if n > 1 or name == "dp_shard")
    if dims.ep > 1:
        text += f", experts ep {dims.ep} x efsdp {dims.dp_shard * dims.tp // dims.ep}"
    if dims.tp > 1:
        parts = [name for name, on in (("sequence parallel", par.enable_sequence_parallel),
                                       ("loss parallel", loss_parallel)) if on]
        text += f" ({', '.join(parts)})" if parts else ""
    return text


def memory_and_compile_line(config: JobConfig, device_type: str, fused_adamw: bool) -> str:
    """``activation checkpointing full, compile inductor (model, loss), AdamW fused`` (``Muon + AdamW fused`` under
    ``optimizer.name = "Muon"``)."""
    ac, cfg = config.activation_checkpoint, config.compile
    ac_text = ac.mode + (f" {ac.selective_ac_option}" if ac.mode == "selective" else "")
    compiled = [c for c in cfg.components if compiles(cfg.enable, cfg.components, cfg.backend, device_type, c)]
    compile_text = (f"{cfg.backend} ({', '.join(compiled)})" if compiled else
                    "off (eager fallback, see the warning above)" if cfg.enable else "off")
    muon = "Muon + " if config.optimizer.name == "Muon" else ""
    return (f"activation checkpointing {ac_text}, compile {compile_text}, "
            f"{muon}AdamW {'fused' if fused_adamw else 'foreach'}")
