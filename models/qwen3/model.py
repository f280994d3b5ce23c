"""Dense Qwen3 decoder (Qwen3 technical report, arXiv 2505.09388; HF transformers ``modeling_qwen3.py``).

Pre-norm blocks ``h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h))``, a final
``norm`` and an ``output`` projection to the vocabulary. Parameter names follow torchtitan
(``wq/wk/wv/wo``, ``w1/w2/w3``); ``__init__`` creates uninitialized tensors (see ``models/__init__.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from models.common.attention import causal_attention
from models.common.ffn import FeedForward
from models.common.norm import RMSNorm
from models.common.rope import apply_rope, rope_cos_sin
from models.qwen3.args import Qwen3ModelArgs


class Attention(nn.Module):
    """Causal GQA self-attention with QK-norm, no biases (Qwen3 ``attention_bias=false``).

    QK-norm: an RMSNorm over ``head_dim`` (one weight vector shared by all heads) on each query and
    key head, applied BEFORE RoPE (HF ``Qwen3Attention.forward``: ``q_norm(q_proj(x))`` then
    ``apply_rotary_pos_emb``; report section 2: QK-Norm replaces Qwen2's QKV bias).

    Shapes: ``x`` ``(bs, seqlen, dim)``, ``cos``/``sin`` ``(seqlen, head_dim)`` -> ``(bs, seqlen, dim)``.
    """

    def __init__(self, args: Qwen3ModelArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        self.q_norm = RMSNorm(args.head_dim, eps=args.norm_eps)
        self.k_norm = RMSNorm(args.head_dim, eps=args.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        q = self.wq(x).view(bs, seqlen, self.n_heads, self.head_dim)
        k = self.wk(x).view(bs, seqlen, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(bs, seqlen, self.n_kv_heads, self.head_dim)
        q = apply_rope(self.q_norm(q), cos, sin)
        k = apply_rope(self.k_norm(k), cos, sin)
        out = causal_attention(q, k, v)  # (bs, seqlen, n_heads, head_dim)
        return self.wo(out.reshape(bs, seqlen, self.n_heads * self.head_dim))


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


class Qwen3Model(nn.Module):
    """The Qwen3 decoder: ``tok_embeddings``, ``layers`` ("0".."n_layers-1"), ``norm``, ``output``.

    With ``args.tie_embeddings`` the output projection reuses the embedding table
    (``output.weight is tok_embeddings.weight``). A plain ``nn.Module.to_empty`` of a model built on
    meta makes two separate tensors of the pair (re-tie after it); after FSDP2 ``fully_shard`` the tie
    survives ``to_empty`` (FSDP modules swap tensors in place; checked with torch 2.13).

    Buffers ``rope_cos``/``rope_sin`` (fp32 ``(max_seq_len, head_dim)``, non-persistent) are created
    empty and filled by :meth:`init_buffers`.
    """

    def __init__(self, args: Qwen3ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.register_buffer("rope_cos", torch.empty(args.max_seq_len, args.head_dim), persistent=False)
        self.register_buffer("rope_sin", torch.empty(args.max_seq_len, args.head_dim), persistent=False)

    def init_buffers(self, buffer_device: torch.device | str | None = None) -> None:
        """Recompute the RoPE tables in fp32 on ``buffer_device`` (default: where the buffers are)."""
        device = buffer_device if buffer_device is not None else self.rope_cos.device
        self.rope_cos, self.rope_sin = rope_cos_sin(
            self.args.head_dim, self.args.max_seq_len, self.args.rope_theta, device=device
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of the next token at every position.

        Args:
            tokens: int64 ``(bs, seqlen)`` token ids in ``[0, vocab_size)``, ``seqlen <= max_seq_len``.

        Returns:
            ``(bs, seqlen, vocab_size)`` logits in the compute dtype.

        Raises:
            ValueError: ``tokens`` is not 2-D or longer than ``max_seq_len``.
        """
        if tokens.dim() != 2:
            raise ValueError(f"Qwen3Model: tokens must be (bs, seqlen), got shape {tuple(tokens.shape)}")
        seqlen = tokens.shape[1]
        if seqlen > self.args.max_seq_len:
            raise ValueError(
                f"Qwen3Model: sequence length {seqlen} exceeds max_seq_len {self.args.max_seq_len}; "
                "build the model with a larger max_seq_len"
            )
        cos, sin = self.rope_cos[:seqlen], self.rope_sin[:seqlen]
        h = self.tok_embeddings(tokens)  # (bs, seqlen, dim)
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        return self.output(self.norm(h))  # (bs, seqlen, vocab_size)
