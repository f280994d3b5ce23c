"""The Qwen3-MoE transformer (Qwen3 technical report, arXiv 2505.09388, sec. 2; HF
``modeling_qwen3_moe.py``).

Per block (pre-norm): ``h = x + attention(attention_norm(x))``, ``out = h + moe(ffn_norm(h))`` with
the dense Qwen3 attention (GQA with QK-norm,
:class:`torchtitan_lite.models.common.attention.Attention`) and a mixture of bias-free SwiGLU
experts, no shared experts. Routing (HF ``Qwen3MoeSparseMoeBlock``): softmax over all experts,
top-k, renormalized when ``route_norm``:
:class:`torchtitan_lite.models.common.routers.TokenChoiceTopKRouter` with ``score_func="softmax"``,
one group, ``route_scale`` 1 and its expert bias kept at zero (``bias_update_speed`` 0), so that
bias changes no choice. Balancing: the Switch loss
(:func:`torchtitan_lite.models.common.balance_loss.switch_aux_loss`, weight ``aux_loss_coeff``).
"""

from __future__ import annotations

import torch
from torch import nn

from torchtitan_lite.models.common.attention import Attention
from torchtitan_lite.models.common.balance_loss import switch_aux_loss
from torchtitan_lite.models.common.decoder import Decoder
from torchtitan_lite.models.common.experts import GroupedSwiGLUExperts
from torchtitan_lite.models.common.moe import MoE
from torchtitan_lite.models.common.norm import RMSNorm
from torchtitan_lite.models.common.routers import TokenChoiceTopKRouter
from torchtitan_lite.models.qwen3_moe.args import Qwen3MoeModelArgs


class TransformerBlock(nn.Module):
    """One pre-norm block: Qwen3 attention (QK-norm) then the MoE. ``(bs, seqlen, dim)`` -> same."""

    def __init__(self, args: Qwen3MoeModelArgs):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args, qk_norm=True)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        router = TokenChoiceTopKRouter(
            args.dim,
            args.num_experts,
            args.top_k,
            num_expert_groups=1,
            num_limited_groups=1,
            score_func="softmax",
            route_norm=args.route_norm,
            route_scale=1.0,
            bias_update_speed=0.0,
        )
        experts = GroupedSwiGLUExperts(args.num_experts, args.dim, args.moe_inter_dim)
        self.moe = MoE(
            router, experts, aux_loss=switch_aux_loss, aux_loss_coeff=args.aux_loss_coeff
        )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, document_ids=document_ids)
        return h + self.moe(self.ffn_norm(h))


class Qwen3MoeModel(Decoder):
    """The Qwen3-MoE decoder (:class:`torchtitan_lite.models.common.decoder.Decoder`) with MoE
    :class:`TransformerBlock` blocks and plain RoPE over ``head_dim``: ``tokens`` int64
    ``(bs, seqlen)`` -> logits ``(bs, seqlen, vocab_size)``.
    """

    def __init__(self, args: Qwen3MoeModelArgs):
        super().__init__(args, lambda a, _layer_id: TransformerBlock(a), rope_dim=args.head_dim)
