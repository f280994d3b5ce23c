"""The DeepSeek-V3 transformer (technical report arXiv 2412.19437; reference ``inference/model.py``
of deepseek-ai/DeepSeek-V3; HF ``modeling_deepseek_v3.py``).

Per block (pre-norm): ``h = x + attention(attention_norm(x))``, ``out = h + ffn(ffn_norm(h))`` with
  * multi-head latent attention (:class:`MLA`, report sec. 2.1.1);
  * a dense SwiGLU ``feed_forward`` in the first ``n_dense_layers`` blocks, a DeepSeekMoE ``moe``
    (:func:`build_moe`) in the others (report sec. 2.1.2, reference ``Block``);
  * RMSNorm everywhere; untied ``output`` after a final RMSNorm.

Note: docs/design.md, "on the RoPE layout".
"""

from __future__ import annotations

import math

import torch
from torch import nn

from torchtitan_lite.models.common.attention_backends import InnerAttention
from torchtitan_lite.models.common.balance_loss import sequence_aux_loss
from torchtitan_lite.models.common.decoder import Decoder
from torchtitan_lite.models.common.experts import GroupedSwiGLUExperts
from torchtitan_lite.models.common.ffn import FeedForward
from torchtitan_lite.models.common.kv_cache import LayerKV, cached_attention
from torchtitan_lite.models.common.moe import MoE
from torchtitan_lite.models.common.norm import RMSNorm
from torchtitan_lite.models.common.rope import apply_rope, rope_cos_sin
from torchtitan_lite.models.common.routers import TokenChoiceTopKRouter
from torchtitan_lite.models.common.yarn import yarn_inv_freq
from torchtitan_lite.models.deepseek_v3.args import DeepSeekV3ModelArgs

LATENT_NORM_EPS = 1e-6
"""Epsilon of the latent RMSNorms ``q_norm`` and ``kv_norm``, whatever ``norm_eps`` is (reference
``MLA.__init__``: ``RMSNorm(self.kv_lora_rank)`` with its default 1e-6; HF
``DeepseekV3RMSNorm(config.kv_lora_rank)``). Moonlight's ``rms_norm_eps`` 1e-5 applies to the block
and final norms only."""


def softmax_scale(args: DeepSeekV3ModelArgs) -> float:
    """``qk_head_dim ** -0.5``, times ``mscale ** 2`` with
    ``mscale = 0.1 * rope_mscale * ln(rope_factor) + 1`` when YaRN is on (reference
    ``MLA.__init__``; YaRN paper arXiv 2309.00071 eq. 22)."""
    scale = args.qk_head_dim**-0.5
    if args.uses_yarn:
        scale *= (0.1 * args.rope_mscale * math.log(args.rope_factor) + 1.0) ** 2
    return scale


class MLA(nn.Module):
    """Multi-head latent attention (report sec. 2.1.1, eq. 1-11), causal, through SDPA.

    Queries: ``wq`` (``q_lora_rank == 0``) or ``wq_b(q_norm(wq_a(x)))``,
    ``(bs, s, n_heads, qk_head_dim)``, split into ``q_nope`` and ``q_pe`` (RoPE). Keys/values:
    ``wkv_a(x)`` gives the latent ``c_kv`` (``kv_lora_rank``) and one RoPE key ``k_pe``
    (``qk_rope_head_dim``) shared by all heads; ``wkv_b(kv_norm(c_kv))`` gives per head ``k_nope``
    and ``v``. Keys are ``[k_nope, k_pe]``, queries ``[q_nope, q_pe]``; softmax scale
    :func:`softmax_scale`; ``wo`` maps ``n_heads * v_head_dim`` to ``dim``.

    Parameters (no biases): ``wq`` ``(n_heads * qk_head_dim, dim)`` or ``wq_a``
    ``(q_lora_rank, dim)``, ``q_norm`` ``(q_lora_rank,)``, ``wq_b``
    ``(n_heads * qk_head_dim, q_lora_rank)``; ``wkv_a`` ``(kv_lora_rank + qk_rope_head_dim, dim)``,
    ``kv_norm`` ``(kv_lora_rank,)``, ``wkv_b``
    ``(n_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank)``; ``wo``
    ``(dim, n_heads * v_head_dim)``.
    """

    def __init__(self, args: DeepSeekV3ModelArgs):
        super().__init__()
        self.n_heads, self.q_lora_rank, self.kv_lora_rank = (
            args.n_heads,
            args.q_lora_rank,
            args.kv_lora_rank,
        )
        self.qk_nope_head_dim, self.qk_rope_head_dim = args.qk_nope_head_dim, args.qk_rope_head_dim
        self.v_head_dim = args.v_head_dim
        q_out = args.n_heads * args.qk_head_dim
        if args.q_lora_rank == 0:
            self.wq = nn.Linear(args.dim, q_out, bias=False)
        else:
            self.wq_a = nn.Linear(args.dim, args.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(args.q_lora_rank, eps=LATENT_NORM_EPS)
            self.wq_b = nn.Linear(args.q_lora_rank, q_out, bias=False)
        self.wkv_a = nn.Linear(args.dim, args.kv_lora_rank + args.qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(args.kv_lora_rank, eps=LATENT_NORM_EPS)
        self.wkv_b = nn.Linear(
            args.kv_lora_rank, args.n_heads * (args.qk_nope_head_dim + args.v_head_dim), bias=False
        )
        self.wo = nn.Linear(args.n_heads * args.v_head_dim, args.dim, bias=False)
        self.inner_attention = InnerAttention(scale=softmax_scale(args))
        self.kv_cache: LayerKV | None = None  # set by the decoder for a forward with a KV cache

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``q`` ``(bs, seqlen, n_heads, qk_head_dim)`` of ``x`` ``(bs, seqlen, dim)`` at the
        positions of ``cos``/``sin`` ``(seqlen, qk_rope_head_dim)`` (the last ``qk_rope_head_dim``
        features rotated)."""
        bs, seqlen, _ = x.shape
        q = self.wq(x) if self.q_lora_rank == 0 else self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.view(bs, seqlen, self.n_heads, self.qk_nope_head_dim + self.qk_rope_head_dim)
        q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        return torch.cat([q_nope, apply_rope(q_pe, cos, sin)], dim=-1)

    def latent(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The compressed key/value latent of ``x``: ``c_kv`` ``(bs, seqlen, kv_lora_rank)`` after
        ``kv_norm`` and the rotated shared key ``k_pe`` ``(bs, seqlen, 1, qk_rope_head_dim)`` (what
        a KV cache keeps)."""
        c_kv, k_pe = self.wkv_a(x).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        return self.kv_norm(c_kv), apply_rope(k_pe.unsqueeze(2), cos, sin)

    def keys_values(
        self, c_kv: torch.Tensor, k_pe: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``k`` ``(bs, seqlen, n_heads, qk_head_dim)`` and ``v``
        ``(bs, seqlen, n_heads, v_head_dim)`` up-projected from the latent (:meth:`latent`)."""
        bs, seqlen, _ = c_kv.shape
        kv = self.wkv_b(c_kv).view(
            bs, seqlen, self.n_heads, self.qk_nope_head_dim + self.v_head_dim
        )
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        return torch.cat([k_nope, k_pe.expand(-1, -1, self.n_heads, -1)], dim=-1), v

    def qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`queries`, then keys and values (:meth:`keys_values` of :meth:`latent`) of
        ``x``."""
        return self.queries(x, cos, sin), *self.keys_values(*self.latent(x, cos, sin))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` ``(bs, seqlen, dim)``, ``cos``/``sin`` ``(seqlen, qk_rope_head_dim)``,
        ``document_ids`` int ``(bs, seqlen)`` or ``None`` -> ``(bs, seqlen, dim)``. With
        ``kv_cache`` set (decoding) the latent is kept
        (:mod:`torchtitan_lite.models.common.kv_cache`)."""
        if self.kv_cache is None:  # context parallelism gathers the latent, not the expanded heads
            latent = self.inner_attention.gather(*self.latent(x, cos, sin))
            out = self.inner_attention(
                self.queries(x, cos, sin), *self.keys_values(*latent), document_ids=document_ids
            )
        else:
            q = self.queries(x, cos, sin)
            latent, k_start = self.kv_cache.extend(self.latent(x, cos, sin), keep=None)
            out = cached_attention(
                q,
                *self.keys_values(*latent),
                self.kv_cache.end - q.shape[1],
                k_start,
                scale=self.inner_attention.scale,
            )
        return self.wo(out.flatten(2))  # out: (bs, seqlen, n_heads, v_head_dim)


def build_moe(args: DeepSeekV3ModelArgs) -> MoE:
    """DeepSeekMoE (report sec. 2.1.2): the V3 router, ``num_experts`` routed SwiGLU experts, the
    shared experts (one SwiGLU of width ``num_shared_experts * moe_inter_dim``, reference
    ``MoE.shared_experts``) and the sequence-wise balance loss (report eq. 17-20)."""
    router = TokenChoiceTopKRouter(
        args.dim,
        args.num_experts,
        args.top_k,
        args.num_expert_groups,
        args.num_limited_groups,
        args.score_func,
        args.route_norm,
        args.route_scale,
        args.bias_update_speed,
    )
    experts = GroupedSwiGLUExperts(args.num_experts, args.dim, args.moe_inter_dim)
    shared = (
        FeedForward(args.dim, args.num_shared_experts * args.moe_inter_dim)
        if args.num_shared_experts
        else None
    )
    return MoE(
        router,
        experts,
        shared_experts=shared,
        aux_loss=sequence_aux_loss,
        aux_loss_coeff=args.aux_loss_coeff,
    )


class TransformerBlock(nn.Module):
    """One pre-norm block: MLA, then a dense ``feed_forward`` (``layer_id < n_dense_layers``) or a
    ``moe``."""

    def __init__(self, args: DeepSeekV3ModelArgs, layer_id: int):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = MLA(args)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.is_moe = layer_id >= args.n_dense_layers
        if not self.is_moe:
            self.feed_forward = FeedForward(args.dim, args.hidden_dim)
        else:
            self.moe = build_moe(args)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` ``(bs, seqlen, dim)`` -> ``(bs, seqlen, dim)``."""
        h = x + self.attention(self.attention_norm(x), cos, sin, document_ids=document_ids)
        ffn = self.moe if self.is_moe else self.feed_forward
        return h + ffn(self.ffn_norm(h))


class DeepSeekV3Model(Decoder):
    """The DeepSeek-V3 decoder (:class:`torchtitan_lite.models.common.decoder.Decoder`) with
    :class:`TransformerBlock` blocks and RoPE tables over ``qk_rope_head_dim`` (YaRN frequencies
    when ``args.uses_yarn``): ``tokens`` int64 ``(bs, seqlen)`` -> logits
    ``(bs, seqlen, vocab_size)``. Values come from ``models/deepseek_v3/init_plan.py``.
    """

    def __init__(self, args: DeepSeekV3ModelArgs):
        super().__init__(args, TransformerBlock, rope_dim=args.qk_rope_head_dim)

    def rope_tables(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables, each fp32 ``(max_seq_len, qk_rope_head_dim)`` on ``device``.

        With YaRN the frequencies are :func:`torchtitan_lite.models.common.yarn.yarn_inv_freq`'s
        with the ramp bounds rounded (``truncate``, the reference's ``find_correction_range``) and
        cos/sin are NOT scaled: DeepSeek puts the attention temperature into the softmax scale
        (:func:`softmax_scale`).
        """
        a = self.args
        inv_freq = None
        if a.uses_yarn:
            inv_freq = yarn_inv_freq(
                a.qk_rope_head_dim,
                a.rope_theta,
                a.rope_factor,
                a.rope_original_max_seq_len,
                a.rope_beta_fast,
                a.rope_beta_slow,
                device=device,
                truncate=True,
            )
        return rope_cos_sin(
            a.qk_rope_head_dim, a.max_seq_len, a.rope_theta, inv_freq=inv_freq, device=device
        )
