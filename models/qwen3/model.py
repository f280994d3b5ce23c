"""Dense Qwen3 decoder (Qwen3 technical report, arXiv 2505.09388; HF transformers ``modeling_qwen3.py``).

Pre-norm blocks ``h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h))``, a final
``norm`` and an ``output`` projection to the vocabulary. Parameter names follow torchtitan
(``wq/wk/wv/wo``, ``w1/w2/w3``); ``__init__`` creates uninitialized tensors (see ``models/__init__.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from models.common.attention import causal_attention
from models.common.decoder import Decoder
from models.common.ffn import FeedForward
from models.common.norm import RMSNorm
from models.common.rope import apply_rope
from models.qwen3.args import Qwen3ModelArgs


class Attention(nn.Module):
    """Causal GQA self-attention with QK-norm, no biases (Qwen3 ``attention_bias=false``).

    QK-norm: an RMSNorm over ``head_dim`` (one weight vector shared by all heads) on each query and
    key head, applied BEFORE RoPE (HF ``Qwen3Attention.forward``: ``q_norm(q_proj(x))`` then
    ``apply_rotary_pos_emb``; report section 2: QK-Norm replaces Qwen2's QKV bias).

    Shapes: ``x`` ``(bs, seqlen, dim)``, ``cos``/``sin`` ``(seqlen, head_dim)`` -> ``(bs, seqlen, dim)``. Head counts
    are read from the projections' outputs, so a rank holding some of the heads (tensor parallelism) runs its heads.
    """

    def __init__(self, args: Qwen3ModelArgs):
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        self.q_norm = RMSNorm(args.head_dim, eps=args.norm_eps)
        self.k_norm = RMSNorm(args.head_dim, eps=args.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        q = self.wq(x).view(bs, seqlen, -1, self.head_dim)  # (bs, seqlen, n_heads, head_dim)
        k = self.wk(x).view(bs, seqlen, -1, self.head_dim)  # (bs, seqlen, n_kv_heads, head_dim)
        v = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        q = apply_rope(self.q_norm(q), cos, sin)
        k = apply_rope(self.k_norm(k), cos, sin)
        out = causal_attention(q, k, v)  # (bs, seqlen, n_heads, head_dim)
        return self.wo(out.flatten(2))


class TransformerBlock(nn.Module):
    """One pre-norm decoder block: attention then SwiGLU, each with an RMSNorm and a residual.

    Shapes: ``x`` ``(bs, seqlen, dim)`` -> ``(bs, seqlen, dim)``.
    """

    def __init__(self, args: Qwen3ModelArgs):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Qwen3Model(Decoder):
    """The Qwen3 decoder (:class:`models.common.decoder.Decoder`) with :class:`TransformerBlock` blocks and
    plain RoPE over ``head_dim`` (base ``rope_theta``; tied embeddings in the 0.6b/1.7b/4b flavors).

    ``tokens`` int64 ``(bs, seqlen)`` -> logits ``(bs, seqlen, vocab_size)``.
    """

    def __init__(self, args: Qwen3ModelArgs):
        super().__init__(args, lambda a, _layer_id: TransformerBlock(a), rope_dim=args.head_dim)
