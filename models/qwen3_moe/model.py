"""The Qwen3-MoE transformer (Qwen3 technical report, arXiv 2505.09388, sec. 2; HF ``modeling_qwen3_moe.py``).

Per block (pre-norm): ``h = x + attention(attention_norm(x))``, ``out = h + moe(ffn_norm(h))`` with the
dense Qwen3 attention (GQA with QK-norm, ``models/qwen3/model.py``) and a mixture of bias-free SwiGLU
experts, no shared experts. Routing (HF ``Qwen3MoeSparseMoeBlock``): softmax over all experts, top-k,
renormalized when ``route_norm``: :class:`models.deepseek_v3.moe.DeepSeekV3Router` with
``score_func="softmax"``, one group, ``route_scale`` 1 and its expert bias kept at zero
(``bias_update_speed`` 0), so that bias changes no choice. Balancing: the Switch loss of
:class:`models.common.moe.MoE` (``load_balance_coeff``).
"""

from __future__ import annotations

import torch
from torch import nn

from models.common.decoder import Decoder
from models.common.moe import MoE
from models.common.norm import RMSNorm
from models.deepseek_v3.moe import DeepSeekV3Router, GroupedSwiGLUExperts
from models.qwen3.model import Attention
from models.qwen3_moe.args import Qwen3MoeModelArgs


class TransformerBlock(nn.Module):
    """One pre-norm block: Qwen3 attention (QK-norm) then the MoE. ``(bs, seqlen, dim)`` -> same."""

    def __init__(self, args: Qwen3MoeModelArgs):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)  # reads dim, n_heads, n_kv_heads, head_dim, norm_eps
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        router = DeepSeekV3Router(args.dim, args.num_experts, args.experts_per_token, n_groups=1, n_limited_groups=1,
                                  score_func="softmax", route_norm=args.route_norm, route_scale=1.0,
                                  bias_update_speed=0.0)
        experts = GroupedSwiGLUExperts(args.num_experts, args.dim, args.moe_inter_dim)
        self.moe = MoE(router, experts, load_balance_coeff=args.load_balance_coeff)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.moe(self.ffn_norm(h))


class Qwen3MoeModel(Decoder):
    """The Qwen3-MoE decoder (:class:`models.common.decoder.Decoder`) with MoE :class:`TransformerBlock`
    blocks and plain RoPE over ``head_dim``: ``tokens`` int64 ``(bs, seqlen)`` -> logits
    ``(bs, seqlen, vocab_size)``.
    """

    def __init__(self, args: Qwen3MoeModelArgs):
        super().__init__(args, lambda a, _layer_id: TransformerBlock(a), rope_dim=args.head_dim)


def num_active_params(args: Qwen3MoeModelArgs) -> int:
    """Parameters used per token: all but the ``tok_embeddings`` lookup and the unchosen experts.

    3,041,867,776 for 30b-a3b (model card "3.3B activated" counts the input embedding: 3,353,032,704).
    """
    a = args
    attention = a.dim * a.head_dim * (2 * a.n_heads + 2 * a.n_kv_heads) + 2 * a.head_dim
    moe = a.dim * a.num_experts + a.experts_per_token * 3 * a.dim * a.moe_inter_dim
    return a.n_layers * (attention + 2 * a.dim + moe) + a.dim + a.dim * a.vocab_size


def num_flops_per_token(args: Qwen3MoeModelArgs, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) for sequences of ``seq_len`` tokens.

    ``6 * num_active_params + 12 * n_layers * n_heads * head_dim * seq_len``: 6N for the matmuls of
    forward (2N) and backward (4N), N the active parameters (:func:`num_active_params`: router and top-k
    experts; norms included as torchtitan counts all parameters; the output, not the embedding lookup),
    and ``12 * h * d * T`` per layer for the attention scores and weighted values over the full ``T x T``
    square (PaLM, Chowdhery et al. 2022, app. B; torchtitan ``get_dense_model_nparams_and_flops``).

    Raises:
        ValueError: ``seq_len`` is not positive.
    """
    if seq_len <= 0:
        raise ValueError(f"num_flops_per_token: seq_len must be > 0, got {seq_len}")
    a = args
    return 6.0 * num_active_params(a) + 12.0 * a.n_layers * a.n_heads * a.head_dim * seq_len
