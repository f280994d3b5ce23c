"""Will the run fit in memory? An estimate per rank from the model's shapes against the device or
host memory, checked before the model is built (:func:`check_memory`: by
``preflight.checks.load_run`` for the world size the launcher starts, and by each worker for its
node).

Per rank, FSDP2 sharding everything over the ``world_size`` ranks: the fp32 parameters, their fp32
gradients and AdamW's two fp32 moments (16 bytes per parameter / world size), plus the activations
of one micro-batch, which are not sharded. Activations per block without checkpointing: ``s b h (34
+ 5 a s / h)`` bytes at 2 bytes per value (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", arXiv 2205.05198, Sec. 4.1; ``s`` seq_len, ``b`` local
batch, ``h`` dim, ``a`` heads), scaled to the compute dtype. The ``5 a s / h`` term is the ``s x s``
scores, softmax and mask each layer keeps: only the dense ``reference`` attention backend keeps
them; SDPA's fused kernels, FlexAttention and the blockwise tiles keep the output and one
log-sum-exp per query instead (FlashAttention, Dao et al. 2022: memory linear in ``s``), so the term
is dropped for them (Korthikanti et al. Sec. 4.1 note the same for FlashAttention-style kernels);
with ``activation_checkpoint.mode = "full"`` each block keeps only its input (``s b h`` values) and
one block's activations are live at a time (Sec. 5); the output logits and their gradient add ``2 s
b V`` fp32 values. Under context parallelism (``cp`` > 1) a rank holds ``s / cp`` positions of each
window, so all of the above use ``s / cp``, and each block also keeps the keys and values of the
whole window it gathered (``s b`` times their width, :func:`gathered_kv_width`), one block's under
full checkpointing. On a CPU the ranks of a node share the host memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.distributed.devices import device_module, device_type
from torchtitan_lite.errors import LaunchError
from torchtitan_lite.preflight.run import ResolvedRun

GIB = 2**30
TIGHT = 0.9
"""A run that needs more than this fraction of the memory gets a warning."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one rank needs: ``states`` (parameters, gradients, optimizer moments) and
    ``activations``."""

    states: int
    activations: int

    @property
    def total(self) -> int:
        """Bytes: model states (parameters, gradients, AdamW moments) plus activations."""
        return self.states + self.activations


def gathered_kv_width(args) -> int:
    """Values per position of the keys and values a context-parallel rank gathers and keeps per
    block: ``2 x n_kv_heads x head_dim``; MLA (``kv_lora_rank``) keeps the latent and the keys and
    values expanded from it."""
    if hasattr(args, "kv_lora_rank"):
        heads = args.n_heads * (args.qk_nope_head_dim + args.qk_rope_head_dim + args.v_head_dim)
        return args.kv_lora_rank + args.qk_rope_head_dim + heads
    return 2 * args.n_kv_heads * args.head_dim


def estimate_rank_memory(
    n_params: int,
    args,
    *,
    world_size: int,
    seq_len: int,
    local_batch_size: int,
    compute_bytes: int,
    ac_mode: str,
    dense_scores: bool = True,
    cp: int = 1,
) -> MemoryEstimate:
    """The per-rank estimate of the module notes for a model of ``n_params`` parameters with args
    ``args`` (``dim``, ``n_layers``, ``n_heads``, ``vocab_size``; under ``cp`` > 1 also
    :func:`gathered_kv_width`'s fields); ``compute_bytes`` per activation value (4 fp32, 2 bf16);
    ``dense_scores``: the attention keeps ``s x s`` scores (``model.attn_backend = "reference"``;
    never under context parallelism); ``cp``: ``context_parallel_degree``."""
    states = 16 * n_params // world_size
    s, b, h, a = seq_len // cp, local_batch_size, args.dim, args.n_heads
    dense_scores = dense_scores and cp == 1
    block = s * b * h * (34 + (5 * a * s / h if dense_scores else 0)) * compute_bytes / 2
    kv = seq_len * b * gathered_kv_width(args) * compute_bytes if cp > 1 else 0
    if ac_mode == "full":
        blocks = args.n_layers * s * b * h * compute_bytes + block + kv
    else:
        blocks = args.n_layers * (block + kv)
    logits = 2 * s * b * args.vocab_size * 4
    return MemoryEstimate(states, int(blocks + logits))


def memory_limit(device_kind: str) -> tuple[int, int, str]:
    """``(total, available, name)`` bytes of the memory one rank of ``device_kind`` uses: a device's
    own memory (total both times), or on CPU the host's physical memory and what it has available
    now (``MemAvailable``)."""
    if device_kind != "cpu":
        total = device_module(device_kind).get_device_properties(0).total_memory
        return total, total, f"{device_kind} device memory"
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    available = total
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    return total, available, "host memory"


def fit_problem(
    estimate: MemoryEstimate,
    *,
    ranks_sharing: int,
    total: int,
    available: int,
    name: str,
    world_size: int,
    ac_mode: str = "none",
    local_batch_size: int = 1,
) -> tuple[str, str] | None:
    """``("error" | "warning", text)`` when ``ranks_sharing`` ranks of ``estimate`` each do not fit
    in the memory (``total`` bytes; ``available`` now), or ``None``: an error when even the
    parameters, gradients and optimizer moments exceed the total, or everything exceeds it twice; a
    warning above :data:`TIGHT` of what is available. The error names only changes that would help
    (:func:`helpful_changes`)."""
    need = estimate.total * ranks_sharing
    states = estimate.states * ranks_sharing
    numbers = (
        f"about {need / GIB:,.1f} GiB ({states / GIB:,.1f} GiB parameters, gradients and "
        f"AdamW moments over {world_size} rank(s) + "
        f"{estimate.activations * ranks_sharing / GIB:,.1f} GiB activations"
        + (f", for {ranks_sharing} ranks" if ranks_sharing > 1 else "")
        + f") of {total / GIB:,.1f} GiB {name}"
    )
    if states > total or need > 2 * total:
        changes = helpful_changes(
            states_fit=states <= total, ac_mode=ac_mode, local_batch_size=local_batch_size
        )
        return "error", f"the run needs {numbers}; use {changes}"
    if need > TIGHT * available:
        return "warning", (
            f"the run may not fit: it needs {numbers} ({available / GIB:,.1f} GiB available now)"
        )
    return None


def helpful_changes(*, states_fit: bool, ac_mode: str, local_batch_size: int) -> str:
    """The changes that shrink what does not fit, as one phrase: a smaller model or more ranks
    always; when the model states fit and activations do not, also a smaller local batch (if above
    1), a shorter ``seq_len`` and full activation checkpointing (if not already on)."""
    changes = ["a smaller model", "more ranks"]
    if states_fit:
        if local_batch_size > 1:
            changes.append("a smaller training.local_batch_size")
        changes.append("a smaller training.seq_len")
        if ac_mode != "full":
            changes.append('activation_checkpoint.mode = "full"')
    return ", ".join(changes[:-1]) + ", or " + changes[-1]


def meta_parameter_count(model_cls, args) -> int:
    """Parameters of ``model_cls(args)`` built on the meta device (no memory; a tied weight counts
    once)."""
    with torch.device("meta"):
        model = model_cls(args)
    return sum(p.numel() for p in model.parameters())


def run_estimate(run: ResolvedRun, world_size: int, kind: str) -> MemoryEstimate:
    """:func:`estimate_rank_memory` of ``run`` on ``world_size`` ranks of device type ``kind``
    (``compute_dtype = "auto"``: fp32 on ``cpu``, else bf16)."""
    config, args = run.config, run.model_args
    n_params = meta_parameter_count(run.spec.model_cls, args)
    dtype = config.training.compute_dtype
    fp32 = dtype == "float32" or (dtype == "auto" and kind == "cpu")
    return estimate_rank_memory(
        n_params,
        args,
        world_size=world_size,
        seq_len=config.training.seq_len,
        local_batch_size=config.training.local_batch_size,
        compute_bytes=4 if fp32 else 2,
        ac_mode=config.activation_checkpoint.mode,
        dense_scores=config.model.attn_backend == "reference",
        cp=config.parallelism.context_parallel_degree,
    )


def check_memory(run: ResolvedRun, world_size: int, ranks_sharing: int | None = None) -> str | None:
    """The memory one rank of a ``world_size``-rank ``run`` needs (:func:`run_estimate`)
    against its device's memory, or on CPU the host's, shared by ``ranks_sharing`` ranks (default:
    all); ``warning: ...`` when tight, else ``None``.

    Raises:
        ConfigError: clearly impossible (the numbers in the message), or ``training.device`` is not
            available.
    """
    try:
        kind = device_type(run.config.training.device)
    except LaunchError as err:
        raise ConfigError(f"training.device: {err}") from None
    n_params = meta_parameter_count(run.spec.model_cls, run.model_args)
    estimate = run_estimate(run, world_size, kind)
    total, available, name = memory_limit(kind)
    sharing = (ranks_sharing or world_size) if kind == "cpu" else 1
    problem = fit_problem(
        estimate,
        ranks_sharing=sharing,
        total=total,
        available=available,
        name=name,
        world_size=world_size,
        ac_mode=run.config.activation_checkpoint.mode,
        local_batch_size=run.config.training.local_batch_size,
    )
    if problem is None:
        return None
    level, text = problem
    if level == "error":
        raise ConfigError(f"memory: the model has {n_params:,} parameters and {text}")
    return f"warning: {text}"
