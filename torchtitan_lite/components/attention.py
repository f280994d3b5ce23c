"""The engine's side of attention: the configured backend set on a model, and the config checks of
attention (``model.attn_backend``, ``training.document_masking``) that ``preflight/checks.py`` runs
before any work."""

from __future__ import annotations

from typing import Any

from torch import nn

from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.load import Sources, where
from torchtitan_lite.distributed.devices import device_type
from torchtitan_lite.protocols.attention import ATTN_BACKENDS, AttentionKernel


def set_attn_backend(model: nn.Module, backend: str) -> None:
    """Run every :class:`~torchtitan_lite.protocols.attention.AttentionKernel` of ``model`` through
    ``backend``.

    Raises:
        ValueError: ``backend`` not one of
            :data:`~torchtitan_lite.protocols.attention.ATTN_BACKENDS`.
    """
    if backend not in ATTN_BACKENDS:
        raise ValueError(
            f"attention backend must be one of {', '.join(ATTN_BACKENDS)}, got {backend!r}"
        )
    for module in model.modules():
        if isinstance(module, AttentionKernel):
            module.attn_backend = backend


def check_attention_config(config: Any, args: Any, sources: Sources) -> None:
    """Combinations of a training run no attention backend can run, each one :class:`ConfigError`
    line:

    * ``model.attn_backend = "flex"`` for training on CPU (torch 2.13's FlexAttention has no CPU
      backward);
    * a ``sliding_window`` larger than the model's ``max_seq_len`` (the window would be the whole
      context);
    * ``training.document_masking`` with pipeline parallelism (stages receive only hidden states,
      not the document ids). (A tokenizer without an EOS id is refused for every run by
      ``data/tokenizer.py``.)

    Args:
        config: the job config; ``args``: the model's args
            (``preflight.model_args.build_model_args``);
            ``sources``: where each key was set (``config.load.read_config``), named in the message.
    """
    if config.model.attn_backend == "flex" and device_type(config.training.device) == "cpu":
        raise ConfigError(
            f"{where(sources, 'model.attn_backend')}: flex has no backward on CPU (torch 2.13); "
            "use auto or blockwise for training on CPU"
        )
    window = getattr(args, "sliding_window", None)
    if window is not None and window > args.max_seq_len:
        raise ConfigError(
            f"{where(sources, 'model.overrides.sliding_window')}: {window} exceeds max_seq_len "
            f"{args.max_seq_len}; use a window of at most max_seq_len positions"
        )
    if config.training.document_masking and config.parallelism.pipeline_parallel_degree > 1:
        raise ConfigError(
            f"{where(sources, 'training.document_masking')}: not supported with pipeline "
            "parallelism "
            "(stages receive only hidden states); set parallelism.pipeline_parallel_degree = 1 or "
            "document_masking = false"
        )
