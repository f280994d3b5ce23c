"""The decoder-only scaffolding every model family shares: embeddings, a stack of blocks, a final
norm, the output projection and the RoPE tables.

Layout and names follow torchtitan's ``Transformer`` (``tok_embeddings``, ``layers`` as an
``nn.ModuleDict`` keyed by ``str(layer_id)``, ``norm``, ``output``) and the Llama/Qwen3 pre-norm
decoder (HF ``modeling_qwen3.py`` ``Qwen3Model`` + ``lm_head``). A family supplies its block through
a factory and, where its positions are not plain RoPE (YaRN, a separate rope head dim), overrides
:meth:`Decoder.rope_tables`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchtitan_lite.models.common.kv_cache import LayerKV
from torchtitan_lite.models.common.mtp import MTP
from torchtitan_lite.models.common.norm import RMSNorm
from torchtitan_lite.models.common.rope import rope_cos_sin
from torchtitan_lite.protocols.attention import KVCache


class Decoder(nn.Module):
    """``tok_embeddings`` -> ``layers`` ("0".."n_layers-1") -> ``norm`` -> ``output``; the model
    contract of ``torchtitan_lite/protocols/model_spec.py``.

    Args:
        args: the family's args dataclass; read here: ``vocab_size``, ``dim``, ``n_layers``,
            ``norm_eps``, ``tie_embeddings``, ``max_seq_len``, ``rope_theta``.
        block: factory ``(args, layer_id) -> nn.Module`` of one block, whose
            ``forward(h, cos, sin)`` maps ``h`` ``(bs, seqlen, dim)`` to ``(bs, seqlen, dim)`` given
            ``cos``/``sin`` ``(seqlen, rope_dim)``.
        rope_dim: features rotated per head (``head_dim``; DeepSeek-V3's ``qk_rope_head_dim``).

    With ``args.mtp_num_layers`` > 0 (a family whose args have the field) the multi-token-prediction
    modules ``mtp`` (:class:`torchtitan_lite.models.common.mtp.MTP`) follow ``output``; a training
    forward given ``labels`` adds their loss.

    Modules are registered in the order ``tok_embeddings``, ``layers``, ``norm``, ``output`` (,
    ``mtp``), which fixes the parameter and state-dict order. ``output`` has no bias (Qwen3, GPT-OSS
    and DeepSeek-V3 ``lm_head``). With ``args.tie_embeddings`` the output projection reuses the
    embedding table (``output.weight is tok_embeddings.weight``). A plain ``nn.Module.to_empty`` of
    a model built on meta makes two separate tensors of the pair
    (:func:`torchtitan_lite.init.materialize` re-ties them); after FSDP2 ``fully_shard`` the tie
    survives ``to_empty`` (FSDP modules swap tensors in place; torch 2.13).

    A pipeline stage (``torchtitan_lite/distributed/pipeline.py``) is this model with the layers it
    does not own deleted and ``tok_embeddings`` (all but the first stage) or ``norm`` and ``output``
    (all but the last) set to ``None``; :meth:`forward` then maps hidden states to hidden states, as
    torchtitan's stages do.

    Buffers ``rope_cos``/``rope_sin`` (fp32 ``(max_seq_len, rope_dim)``, non-persistent: not in the
    state dict) are created empty and filled by :meth:`init_buffers`.
    """

    def __init__(self, args: Any, block: Callable[[Any, int], nn.Module], rope_dim: int):
        super().__init__()
        self.args = args
        self.rope_dim = rope_dim
        # An empty weight skips nn.Embedding's N(0, 1) fill: init_weights draws every parameter, and
        # normal_ on a meta
        # tensor imports torch._dynamo, a second of CPU for the config check (which builds the model
        # on meta).
        self.tok_embeddings = nn.Embedding(
            args.vocab_size, args.dim, _weight=torch.empty(args.vocab_size, args.dim)
        )
        self.layers = nn.ModuleDict({str(i): block(args, i) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.mtp = MTP(args, block) if getattr(args, "mtp_num_layers", 0) else None
        self.register_buffer("rope_cos", torch.empty(args.max_seq_len, rope_dim), persistent=False)
        self.register_buffer("rope_sin", torch.empty(args.max_seq_len, rope_dim), persistent=False)

    def rope_tables(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(cos, sin)`` tables, each fp32 ``(max_seq_len, rope_dim)``, built on ``device``.

        Default: plain RoPE with base ``args.rope_theta``
        (:func:`torchtitan_lite.models.common.rope.rope_cos_sin`). Families with YaRN override this.
        """
        return rope_cos_sin(
            self.rope_dim, self.args.max_seq_len, self.args.rope_theta, device=device
        )

    def init_buffers(self, buffer_device: torch.device | str | None = None) -> None:
        """Recompute the RoPE tables (:meth:`rope_tables`) in fp32 on ``buffer_device`` (default:
        where the buffers are)."""
        device = self.rope_cos.device if buffer_device is None else buffer_device
        self.rope_cos, self.rope_sin = self.rope_tables(device)

    def forward(
        self,
        tokens: torch.Tensor,
        seqlen: int | None = None,
        document_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits of the next token at every position; on a pipeline stage, what the stage owns of
        that.

        Args:
            tokens: int64 ``(bs, seqlen)`` token ids in ``[0, vocab_size)``,
                ``seqlen <= max_seq_len``; on a stage without ``tok_embeddings`` (``None``: not the
                first pipeline stage) the hidden states ``(bs, seqlen, dim)`` the previous stage
                returned.
            seqlen: the batch's sequence length where ``tokens`` do not show it (hidden states
                sharded along the sequence by sequence parallelism, on a later pipeline stage);
                default ``tokens.shape[1]``.
            document_ids: int ``(bs, seqlen)``, the document of each position (non-decreasing along
                a row): a position attends only to earlier positions of its document (block-causal
                masking). ``None``: the whole window is one document.
            positions: int64 ``(bs, seqlen)`` RoPE positions (e.g. restarting at each document,
                :func:`torchtitan_lite.data.documents.document_positions`); ``None``:
                ``0 .. seqlen - 1``.
            cache: decoding state (:class:`~torchtitan_lite.protocols.attention.KVCache`):
                ``tokens`` are the positions ``cache.length ..`` of the sequences, each block's
                ``attention`` keeps what later positions need (``models/common/kv_cache.py``) and
                ``cache.length`` advances by ``seqlen``. Not with ``document_ids`` or ``positions``.
            labels: int64 ``(bs, seqlen)``, the next token of each position: in training mode, with
                ``mtp``, the multi-token-prediction loss is attached to the logits
                (``models/common/mtp.py``); else ignored.

        Returns:
            ``(bs, seqlen, vocab_size)`` logits in the compute dtype; on a stage without ``output``
            (``None``: not the last), the hidden states ``(bs, seqlen, dim)`` after its layers.

        Raises:
            ValueError: ``tokens`` is not 2-D (first stage) or 3-D (later stages), or ``seqlen``
                exceeds ``max_seq_len`` (the message names the model class and both lengths).
        """
        name = type(self).__name__
        first = self.tok_embeddings is not None
        if tokens.dim() != (2 if first else 3):
            expected = "tokens (bs, seqlen)" if first else "hidden states (bs, seqlen, dim)"
            raise ValueError(f"{name}: expected {expected}, got shape {tuple(tokens.shape)}")
        seqlen = tokens.shape[1] if seqlen is None else seqlen
        start = 0 if cache is None else cache.length
        if start + seqlen > self.args.max_seq_len:
            raise ValueError(
                f"{name}: sequence length {start + seqlen} exceeds max_seq_len "
                f"{self.args.max_seq_len}; raise model max_seq_len or lower training.seq_len"
            )
        if positions is None:
            cos, sin = (
                self.rope_cos[start : start + seqlen],
                self.rope_sin[start : start + seqlen],
            )  # (seqlen, rope_dim)
        else:
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # (bs, seqlen, rope_dim)
        h = self.tok_embeddings(tokens) if first else tokens  # (bs, seqlen, dim)
        for layer_id, layer in self.layers.items():
            if cache is not None:
                layer.attention.kv_cache = cache.layers.setdefault(layer_id, LayerKV())
            h = (
                layer(h, cos, sin)
                if document_ids is None
                else layer(h, cos, sin, document_ids=document_ids)
            )
        if cache is not None:
            cache.length += seqlen
            for layer in self.layers.values():
                layer.attention.kv_cache = None
        if self.output is None:
            return h
        h = self.norm(h)
        if self.mtp is not None and labels is not None and self.training and cache is None:
            h = self.mtp.attach_loss(
                h, tokens, labels, self.tok_embeddings, self.output, cos, sin, document_ids
            )
        return self.output(h)  # (bs, seqlen, vocab_size)
