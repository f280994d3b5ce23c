"""The GPT-OSS transformer (OpenAI gpt-oss model card, Aug 2025; reference
``gpt_oss/torch/model.py``; HF transformers ``modeling_gpt_oss.py``).

Per block (pre-norm): ``h = x + attention(attention_norm(x))``, ``out = h + moe(ffn_norm(h))``.
  * RMSNorm, eps 1e-5 (``models/common/norm.py``).
  * Grouped-query attention with biases on ``wq/wk/wv/wo`` (HF ``attention_bias: true``), a learned
    per-head sink logit (``models/common/sink_attention.py``, run by
    ``models/common/attention_backends.py``), YaRN RoPE in the rotate-half layout (the reference's
    ``_apply_rotary_emb`` splits halves; ``models/common/yarn.py``); even layers see only the
    ``sliding_window`` most recent keys, odd layers are full causal (reference
    ``layer_idx % 2 == 0``; HF ``layer_types`` starts with ``sliding_attention``).
  * Mixture of experts (``models/common/moe.py``): top-k softmax router with bias
    (``models/common/routers.py``), biased grouped experts with the clamped SwiGLU
    (``models/common/experts.py``), the Switch load-balancing loss.
  * Untied ``output`` projection without bias (HF ``lm_head``), after a final RMSNorm.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from torchtitan_lite.models.common import attention as common_attention
from torchtitan_lite.models.common.attention_backends import InnerAttention
from torchtitan_lite.models.common.balance_loss import switch_aux_loss
from torchtitan_lite.models.common.decoder import Decoder
from torchtitan_lite.models.common.experts import GroupedExperts, clamped_swiglu
from torchtitan_lite.models.common.moe import MoE
from torchtitan_lite.models.common.norm import RMSNorm
from torchtitan_lite.models.common.routers import TopKRouter
from torchtitan_lite.models.common.yarn import yarn_cos_sin
from torchtitan_lite.models.gpt_oss.args import GptOssModelArgs


class Attention(common_attention.Attention):
    """GQA with biases, YaRN RoPE and attention sinks; sliding-window or full causal.

    Args:
        args: model hyperparameters.
        sliding_window: keys visible to each query, or ``None`` for full causal attention.

    Parameters: ``wq`` ``(n_heads * head_dim, dim)``, ``wk``/``wv``
    ``(n_kv_heads * head_dim, dim)``, ``wo`` ``(dim, n_heads * head_dim)``, each with a bias
    (:class:`torchtitan_lite.models.common.attention.Attention`); ``sinks`` ``(n_heads,)`` logits.
    Head counts are read from the projections' outputs, so a rank holding some of the heads (tensor
    parallelism) runs its heads.
    """

    def __init__(self, args: GptOssModelArgs, sliding_window: int | None):
        super().__init__(args, qk_norm=False, bias=True)
        self.sinks = nn.Parameter(torch.empty(args.n_heads))
        self.inner_attention = InnerAttention(sliding_window=sliding_window)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` ``(bs, seqlen, dim)``, ``cos``/``sin`` ``(seqlen, head_dim)``, ``document_ids`` int
        ``(bs, seqlen)`` or ``None`` -> ``(bs, seqlen, dim)``."""
        out = self.attend(
            *self.qkv(x, cos, sin), self.sinks, document_ids
        )  # (bs, seqlen, n_heads, head_dim)
        return self.wo(out.flatten(2))


class TransformerBlock(nn.Module):
    """One pre-norm block: sink attention (sliding on even ``layer_id``) then the MoE."""

    def __init__(self, args: GptOssModelArgs, layer_id: int):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args, args.sliding_window if layer_id % 2 == 0 else None)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        activation = functools.partial(
            clamped_swiglu, limit=args.swiglu_limit, alpha=args.swiglu_alpha
        )
        self.moe = MoE(
            TopKRouter(args.dim, args.num_experts, args.top_k),
            GroupedExperts(args.num_experts, args.dim, args.moe_inter_dim, activation),
            aux_loss=switch_aux_loss,
            aux_loss_coeff=args.aux_loss_coeff,
        )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` ``(bs, seqlen, dim)`` -> ``(bs, seqlen, dim)``."""
        h = x + self.attention(self.attention_norm(x), cos, sin, document_ids=document_ids)
        return h + self.moe(self.ffn_norm(h))


class GptOssModel(Decoder):
    """The GPT-OSS decoder (:class:`torchtitan_lite.models.common.decoder.Decoder`) with
    :class:`TransformerBlock` blocks and YaRN RoPE tables over ``head_dim``: ``tokens`` int64
    ``(bs, seqlen)`` -> logits ``(bs, seqlen, vocab_size)``. Values come from the init plan,
    ``models/gpt_oss/init_plan.py``.
    """

    def __init__(self, args: GptOssModelArgs):
        super().__init__(args, TransformerBlock, rope_dim=args.head_dim)

    def rope_tables(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """The YaRN tables (:func:`torchtitan_lite.models.common.yarn.yarn_cos_sin`, scaled by the
        YaRN attention factor), each fp32 ``(max_seq_len, head_dim)`` on ``device``."""
        a = self.args
        return yarn_cos_sin(
            a.head_dim,
            a.max_seq_len,
            a.rope_theta,
            a.rope_factor,
            a.rope_original_max_seq_len,
            a.rope_beta_fast,
            a.rope_beta_slow,
            device=device,
        )
