"""The dense pre-norm block of Llama 3 and Qwen3: GQA self-attention then a SwiGLU, each behind an
RMSNorm and a residual (HF ``LlamaDecoderLayer``, ``Qwen3DecoderLayer``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchtitan_lite.models.common.attention import Attention
from torchtitan_lite.models.common.ffn import FeedForward
from torchtitan_lite.models.common.norm import RMSNorm


class DenseBlock(nn.Module):
    """``h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h))``.

    Args:
        args: a family's args; read here: ``dim``, ``hidden_dim``, ``norm_eps`` and
            :class:`Attention`'s fields.
        qk_norm: the attention's QK-norm (Qwen3: on; Llama 3: off).

    Shapes: ``x`` ``(bs, seqlen, dim)``, ``cos``/``sin`` ``(seqlen, head_dim)`` ->
    ``(bs, seqlen, dim)``.
    """

    def __init__(self, args: Any, qk_norm: bool):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args, qk_norm)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, document_ids=document_ids)
        return h + self.feed_forward(self.ffn_norm(h))
