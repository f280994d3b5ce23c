"""Training FLOPs per token of every model family: a hand count, and the count PyTorch measures.

Convention (issue 8; PaLM, Chowdhery et al. 2022, app. B; torchtitan): ``6 * N_active`` per token
plus an attention term per layer, ``N_active`` = every parameter a token uses except the embedding
lookup (the output projection counts even when tied; MoE: the router and the top-k experts, plus
DeepSeek's shared experts). Each family below has one tiny config and, written out by hand:
  * ``MATMUL``: active weights of the matmuls (one term per weight shape);
  * ``ELEMENTWISE``: active norm weights, biases and sinks; they are in ``N_active`` (torchtitan
    counts all parameters) but do no matmul, so the measured count leaves them out;
  * the attention term of the formula, and the one ``FlopCounterMode`` measures.

Measurement: :class:`torch.utils.flop_counter.FlopCounterMode` over one forward + backward of
``BS x T`` tokens. It has no formula for the CPU fused SDPA kernel
(``_scaled_dot_product_flash_attention_for_cpu`` counts 0), so the measurement runs SDPA's math
backend, whose matmuls it does count: the full ``T x T`` score square whatever the mask (as its
formulas for the GPU kernels do), i.e. ``12 * h * d * T`` per token and layer for causal attention,
the convention of the formula. It has no formula for ``aten._grouped_mm`` (the MoE experts,
``models/common/token_dispatch.py``) either: :func:`grouped_mm_flops` supplies one.

MoE experts compute more rows than top-k: the dispatch buffer holds the ``T * k`` (token, expert)
pairs plus ``E * ALIGN`` padding rows per layer (each expert's group padded to a multiple of
``ALIGN``, the last one to the end of the buffer), and every row goes through each expert
projection. The formula counts the top-k work only (model FLOPs, as MFU wants); the tests below
measure the padding rows' extra work exactly.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from model_helpers import build_random
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from torchtitan_lite.models import model_names
from torchtitan_lite.models.common.token_dispatch import ALIGN
from torchtitan_lite.models.deepseek_v3 import DeepSeekV3Model, deepseek_v3_flavors
from torchtitan_lite.models.deepseek_v3.flops import num_active_params as deepseek_v3_active
from torchtitan_lite.models.deepseek_v3.flops import num_flops_per_token as deepseek_v3_flops
from torchtitan_lite.models.gpt_oss import GptOssModel, gpt_oss_flavors
from torchtitan_lite.models.gpt_oss.flops import num_active_params as gpt_oss_active
from torchtitan_lite.models.gpt_oss.flops import num_flops_per_token as gpt_oss_flops
from torchtitan_lite.models.llama3 import Llama3Model, Llama3ModelArgs
from torchtitan_lite.models.llama3.flops import llama3_num_params
from torchtitan_lite.models.llama3.flops import num_flops_per_token as llama3_flops
from torchtitan_lite.models.qwen3 import Qwen3Model, Qwen3ModelArgs
from torchtitan_lite.models.qwen3.flops import num_flops_per_token as qwen3_flops
from torchtitan_lite.models.qwen3.flops import qwen3_num_params
from torchtitan_lite.models.qwen3_moe import Qwen3MoeModel, qwen3_moe_flavors
from torchtitan_lite.models.qwen3_moe.flops import num_active_params as qwen3_moe_active
from torchtitan_lite.models.qwen3_moe.flops import num_flops_per_token as qwen3_moe_flops

BS, T = 2, 8
TOKENS = BS * T

QWEN3 = Qwen3ModelArgs(
    dim=16,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    hidden_dim=24,
    vocab_size=64,
    max_seq_len=16,
    tie_embeddings=True,
)
QWEN3_MATMUL = (
    2
    * (
        16 * 32  # wq: dim -> n_heads * head_dim
        + 16 * 16  # wk: dim -> n_kv_heads * head_dim
        + 16 * 16  # wv
        + 32 * 16  # wo: n_heads * head_dim -> dim
        + 3 * 16 * 24  # w1, w3: dim -> hidden_dim; w2: hidden_dim -> dim
    )
    + 64 * 16
)  # output: dim -> vocab_size (tied or not: a matmul either way)
QWEN3_ELEMENTWISE = (
    2
    * (
        16
        + 16  # attention_norm, ffn_norm
        + 8
        + 8  # q_norm, k_norm over head_dim
    )
    + 16
)  # final norm
QWEN3_ATTENTION = 2 * 12 * 4 * 8 * T  # n_layers * 12 * n_heads * head_dim * seq_len

QWEN3_MOE = replace(
    qwen3_moe_flavors["debug"],
    dim=16,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    moe_inter_dim=12,
    num_experts=4,
    top_k=2,
    vocab_size=64,
    max_seq_len=16,
)
QWEN3_MOE_MATMUL = (
    2
    * (
        16 * 32
        + 16 * 16
        + 16 * 16
        + 32 * 16  # wq, wk, wv, wo as in QWEN3
        + 16 * 4  # router gate: dim -> num_experts (every expert is scored)
        + 2 * 3 * 16 * 12  # top-2 experts, each w1, w3: dim -> moe_inter_dim, w2 back
    )
    + 64 * 16
)  # output
QWEN3_MOE_ELEMENTWISE = 2 * (16 + 16 + 8 + 8) + 16  # as QWEN3
QWEN3_MOE_ATTENTION = 2 * 12 * 4 * 8 * T

GPT_OSS = replace(
    gpt_oss_flavors["debug"],
    dim=16,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    moe_inter_dim=12,
    num_experts=4,
    top_k=2,
    vocab_size=64,
    sliding_window=4,
    max_seq_len=16,
)
GPT_OSS_MATMUL = (
    2
    * (
        16 * 32
        + 16 * 16
        + 16 * 16
        + 32 * 16  # wq, wk, wv, wo
        + 16 * 4  # router gate
        + 2
        * (
            16 * 2 * 12 + 12 * 16
        )  # top-2 experts: mlp1 dim -> 2 * moe_inter_dim (fused gate/up), mlp2 back
    )
    + 64 * 16
)  # output
GPT_OSS_ELEMENTWISE = (
    2
    * (
        32
        + 16
        + 16
        + 16  # biases of wq, wk, wv, wo
        + 4  # sinks, one per head
        + 16
        + 16  # attention_norm, ffn_norm
        + 4  # router bias
        + 2 * (2 * 12 + 16)  # top-2 experts' mlp1 and mlp2 biases
    )
    + 16
)  # final norm
GPT_OSS_ATTENTION = 12 * 4 * 8 * (4 + T)  # layer 0 sliding: min(window 4, T); layer 1 full: T

DEEPSEEK_V3 = replace(
    deepseek_v3_flavors["debug"],
    dim=16,
    n_layers=2,
    n_dense_layers=1,
    n_heads=4,
    vocab_size=64,
    hidden_dim=24,
    moe_inter_dim=12,
    num_experts=4,
    num_shared_experts=1,
    top_k=2,
    num_expert_groups=2,
    num_limited_groups=1,
    q_lora_rank=8,
    kv_lora_rank=8,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=8,
    max_seq_len=16,
    rope_original_max_seq_len=16,
)
DEEPSEEK_V3_MATMUL = (
    2
    * (
        16 * 8  # wq_a: dim -> q_lora_rank
        + 8 * 4 * 12  # wq_b: q_lora_rank -> n_heads * qk_head_dim (8 nope + 4 rope)
        + 16 * (8 + 4)  # wkv_a: dim -> kv_lora_rank + qk_rope_head_dim
        + 8 * 4 * (8 + 8)  # wkv_b: kv_lora_rank -> n_heads * (qk_nope_head_dim + v_head_dim)
        + 4 * 8 * 16  # wo: n_heads * v_head_dim -> dim
    )
    + (
        3 * 16 * 24  # layer 0 (dense): w1, w3: dim -> hidden_dim, w2 back
    )
    + (
        16 * 4  # layer 1 (MoE): router gate
        + 2 * 3 * 16 * 12  # top-2 routed experts
        + 1 * 3 * 16 * 12  # 1 shared expert, run on every token
    )
    + 64 * 16
)  # output
DEEPSEEK_V3_ELEMENTWISE = (
    2
    * (
        16
        + 16  # attention_norm, ffn_norm
        + 8
        + 8  # q_norm (q_lora_rank), kv_norm (kv_lora_rank)
    )
    + 16
)  # final norm
DEEPSEEK_V3_ATTENTION = (
    2 * 6 * 4 * (12 + 8) * T
)  # n_layers * 6 * n_heads * (qk_head_dim + v_head_dim) * T

LLAMA3 = Llama3ModelArgs(
    dim=16,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    hidden_dim=24,
    vocab_size=64,
    max_seq_len=16,
)
LLAMA3_MATMUL = QWEN3_MATMUL  # the same projections; untied, the output matmul as in QWEN3
LLAMA3_ELEMENTWISE = (
    2 * (16 + 16) + 16
)  # attention_norm, ffn_norm per layer, final norm (no QK-norm)
LLAMA3_ATTENTION = QWEN3_ATTENTION

# name: (model class, args, flops function, MATMUL, ELEMENTWISE, formula attention per token)
CASES = {
    "qwen3 tied": (
        Qwen3Model,
        QWEN3,
        qwen3_flops,
        QWEN3_MATMUL,
        QWEN3_ELEMENTWISE,
        QWEN3_ATTENTION,
    ),
    "qwen3 untied": (
        Qwen3Model,
        replace(QWEN3, tie_embeddings=False),
        qwen3_flops,
        QWEN3_MATMUL,
        QWEN3_ELEMENTWISE,
        QWEN3_ATTENTION,
    ),
    "qwen3_moe": (
        Qwen3MoeModel,
        QWEN3_MOE,
        qwen3_moe_flops,
        QWEN3_MOE_MATMUL,
        QWEN3_MOE_ELEMENTWISE,
        QWEN3_MOE_ATTENTION,
    ),
    "gpt_oss": (
        GptOssModel,
        GPT_OSS,
        gpt_oss_flops,
        GPT_OSS_MATMUL,
        GPT_OSS_ELEMENTWISE,
        GPT_OSS_ATTENTION,
    ),
    "deepseek_v3": (
        DeepSeekV3Model,
        DEEPSEEK_V3,
        deepseek_v3_flops,
        DEEPSEEK_V3_MATMUL,
        DEEPSEEK_V3_ELEMENTWISE,
        DEEPSEEK_V3_ATTENTION,
    ),
    "llama3": (
        Llama3Model,
        LLAMA3,
        llama3_flops,
        LLAMA3_MATMUL,
        LLAMA3_ELEMENTWISE,
        LLAMA3_ATTENTION,
    ),
}

# What FlopCounterMode counts for the attention of BS x T tokens (forward QK^T and PV, backward
# twice that):
MEASURED_ATTENTION = {
    "qwen3 tied": 2 * 12 * BS * 4 * T * T * 8,  # full T x T square per layer: equals the formula
    "qwen3 untied": 2 * 12 * BS * 4 * T * T * 8,
    "qwen3_moe": 2 * 12 * BS * 4 * T * T * 8,
    # Sink attention on CPU: the sliding layer runs the blockwise tiles
    # (models/common/blockwise.py): T < one
    # tile, so it multiplies the whole T x T square (the window only masks), 2 matmuls forward and 5
    # backward
    # (the scores are recomputed, not kept); the full layer runs SDPA is_causal with the sink folded
    # in
    # (models/common/sink_attention.py): one more key and query row, the head dim padded 8 -> 16.
    # The formula
    # counts the useful work instead: min(window, T) keys on sliding layers, T on full ones,
    # head_dim 8.
    "gpt_oss": 2 * 7 * BS * 4 * T * T * 8 + 12 * BS * 4 * (T + 1) * (T + 1) * 16,
    # MLA: scores with qk_head_dim 12, weighted values with v_head_dim 8: 6 * h * (12 + 8) * T^2 per
    #     layer.
    "deepseek_v3": 2 * 6 * BS * 4 * T * T * (12 + 8),
    "llama3": 2 * 12 * BS * 4 * T * T * 8,
}


def test_every_registered_family_has_a_hand_count():
    assert {name.split()[0] for name in CASES} == set(model_names())


@pytest.mark.parametrize("name", CASES)
def test_flops_per_token_equal_the_hand_count(name):
    _, args, flops, matmul, elementwise, attention = CASES[name]
    assert flops(args, T) == 6 * (matmul + elementwise) + attention


def test_hand_counts_have_the_sizes_written_out():
    assert (QWEN3_MATMUL, QWEN3_ELEMENTWISE, QWEN3_ATTENTION) == (6400, 112, 6144)
    assert (QWEN3_MOE_MATMUL, GPT_OSS_MATMUL, DEEPSEEK_V3_MATMUL) == (6528, 6528, 7424)
    assert (
        GPT_OSS_ELEMENTWISE,
        DEEPSEEK_V3_ELEMENTWISE,
        GPT_OSS_ATTENTION,
        DEEPSEEK_V3_ATTENTION,
    ) == (416, 112, 4608, 7680)


def test_active_params_are_the_hand_count():
    # The output counts once (a matmul), the embedding lookup not at all, tied or untied.
    assert (
        qwen3_num_params(QWEN3, include_embedding=False) + 64 * 16
        == QWEN3_MATMUL + QWEN3_ELEMENTWISE
    )
    assert qwen3_num_params(replace(QWEN3, tie_embeddings=False), include_embedding=False) == (
        QWEN3_MATMUL + QWEN3_ELEMENTWISE
    )
    assert qwen3_moe_active(QWEN3_MOE) == QWEN3_MOE_MATMUL + QWEN3_MOE_ELEMENTWISE
    assert gpt_oss_active(GPT_OSS) == GPT_OSS_MATMUL + GPT_OSS_ELEMENTWISE
    assert deepseek_v3_active(DEEPSEEK_V3) == DEEPSEEK_V3_MATMUL + DEEPSEEK_V3_ELEMENTWISE
    assert llama3_num_params(LLAMA3, include_embedding=False) == LLAMA3_MATMUL + LLAMA3_ELEMENTWISE


def grouped_mm_flops(a_shape, b_shape, *args, **kwargs) -> int:
    """FLOPs of ``aten._grouped_mm(a, b, offs)`` as the experts call it: ``(M, K) x (E, K, N)``
    (forward and input gradient) or ``(K, M) x (M, N)`` grouped over ``M`` (weight gradient):
    ``2 * a[0] * a[1] * b[-1]``."""
    assert len(a_shape) == 2 and len(b_shape) in (2, 3), (a_shape, b_shape)
    return 2 * a_shape[0] * a_shape[1] * b_shape[-1]


def measured_flops(name: str) -> dict[str, int]:
    """FlopCounterMode's counts by op for one training forward + backward of ``BS x T`` random
    tokens."""
    model_cls, args = CASES[name][:2]
    model = build_random(model_cls, args)
    model.train()
    tokens = torch.randint(0, args.vocab_size, (BS, T), generator=torch.Generator().manual_seed(0))
    counter = FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten._grouped_mm: grouped_mm_flops}
    )
    with sdpa_kernel(SDPBackend.MATH), counter:
        model(tokens).pow(2).mean().backward()
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


# Expert rows computed beyond top-k, BS x T tokens: E * ALIGN padding rows per MoE layer, each
# through one
# expert's matmul weights (576 = 3 * 16 * 12 in all three tiny configs), forward and backward.
PADDING_ROWS = 4 * ALIGN  # num_experts * ALIGN
EXPERT_PADDING = {
    "qwen3_moe": 6 * PADDING_ROWS * 3 * 16 * 12 * 2,  # 2 MoE layers; w1, w3, w2
    "gpt_oss": 6 * PADDING_ROWS * (16 * 2 * 12 + 12 * 16) * 2,  # 2 MoE layers; mlp1, mlp2
    "deepseek_v3": 6
    * PADDING_ROWS
    * 3
    * 16
    * 12
    * 1,  # 1 MoE layer (layer 0 is dense); shared expert: no padding
}


@pytest.mark.parametrize("name", CASES)
def test_flop_counter_measures_six_matmul_params_per_token_plus_attention(name):
    counts = measured_flops(name)
    # Attention is the only batched matmul (bmm); every weight is an mm/addmm, or a grouped mm
    # (experts).
    assert counts.pop("aten.bmm") == MEASURED_ATTENTION[name]
    assert sum(counts.values()) == 6 * CASES[name][3] * TOKENS + EXPERT_PADDING.get(name, 0)


@pytest.mark.parametrize("name", EXPERT_PADDING)
def test_experts_run_top_k_rows_plus_the_padding_rows_only(name):
    counts = measured_flops(name)
    n_moe_layers = 1 if name == "deepseek_v3" else 2
    top_k_rows = TOKENS * 2  # top_k 2
    # 576 matmul weights per expert in all three configs (see EXPERT_PADDING)
    assert counts["aten._grouped_mm"] == 6 * (top_k_rows + PADDING_ROWS) * 576 * n_moe_layers


def test_measured_attention_equals_the_formula_where_the_kernel_does_no_extra_work():
    for name in ("qwen3 tied", "qwen3_moe", "deepseek_v3", "llama3"):
        assert MEASURED_ATTENTION[name] == CASES[name][5] * TOKENS
    # gpt_oss: 181760 measured vs 4608 * 16 = 73728 counted: the masked part of the sliding layer's
    #     tile, its
    # scores recomputed in backward (7 tile matmuls, not 6), and the full layer's sink key, extra
    # query row and
    # head-dim padding are work the kernels do but the model does not need.
    assert (MEASURED_ATTENTION["gpt_oss"], GPT_OSS_ATTENTION * TOKENS) == (181760, 73728)


def test_seq_len_must_be_positive():
    for _, args, flops, *_ in CASES.values():
        with pytest.raises(ValueError, match="seq_len must be > 0, got 0"):
            flops(args, 0)
