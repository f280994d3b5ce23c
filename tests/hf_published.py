"""The ``config.json`` of published checkpoints, copied as data (no hub access in tests), each with its source.

Every key is as the file has it, ``architectures`` and the special token ids included (``auto_map`` of the
DeepSeek files points at their remote code and is kept too). ``tests/test_hf_config.py`` checks that each maps
to our flavor of the same name; ``tests/test_hf_fidelity.py`` scales them down (:func:`scaled`) and compares our
model with transformers'.
"""

from __future__ import annotations

import copy
from typing import Any

QWEN3_0_6B = {  # https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
    "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
    "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}
QWEN3_8B = {  # https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json
    **QWEN3_0_6B, "hidden_size": 4096, "intermediate_size": 12288, "max_window_layers": 36,
    "num_attention_heads": 32, "num_hidden_layers": 36, "tie_word_embeddings": False,
}
QWEN3_30B_A3B = {  # https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}
GPT_OSS_20B = {  # https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
    "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
    "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088,
}
DEEPSEEK_V3 = {  # https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}
MOONLIGHT_16B_A3B = {  # https://huggingface.co/moonshotai/Moonlight-16B-A3B/blob/main/config.json
    **{k: v for k, v in DEEPSEEK_V3.items() if k != "quantization_config"},
    "bos_token_id": 163584, "eos_token_id": 163585, "first_k_dense_replace": 1, "hidden_size": 2048,
    "intermediate_size": 11264, "max_position_embeddings": 8192, "moe_intermediate_size": 1408, "n_group": 1,
    "n_routed_experts": 64, "n_shared_experts": 2, "num_attention_heads": 16, "num_experts_per_tok": 6,
    "num_hidden_layers": 27, "num_key_value_heads": 16, "num_nextn_predict_layers": 0, "q_lora_rank": None,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 50000.0, "routed_scaling_factor": 2.446,
    "topk_group": 1, "transformers_version": "4.48.0", "vocab_size": 163840,
}
LLAMA_3_1_8B = {  # https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256,
}
LLAMA_3_2_1B = {  # https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json
    **LLAMA_3_1_8B, "head_dim": 64, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "rope_scaling": {**LLAMA_3_1_8B["rope_scaling"], "factor": 32.0}, "tie_word_embeddings": True,
    "transformers_version": "4.45.0.dev0",
}

PUBLISHED = {  # name: (config, our family, our flavor)
    "Qwen3-0.6B": (QWEN3_0_6B, "qwen3", "0.6b"),
    "Qwen3-8B": (QWEN3_8B, "qwen3", "8b"),
    "Qwen3-30B-A3B": (QWEN3_30B_A3B, "qwen3_moe", "30b-a3b"),
    "gpt-oss-20b": (GPT_OSS_20B, "gpt_oss", "20b"),
    "DeepSeek-V3": (DEEPSEEK_V3, "deepseek_v3", "671b"),
    "Moonlight-16B-A3B": (MOONLIGHT_16B_A3B, "deepseek_v3", "16b"),
    "Llama-3.1-8B": (LLAMA_3_1_8B, "llama3", "8b"),
    "Llama-3.2-1B": (LLAMA_3_2_1B, "llama3", "1b"),
}

_SCALED = {
    # Width: model, heads, head sizes, FFN and expert widths, LoRA ranks; depth: layers (keeping a dense block
    # before the MoE ones where the original has some); experts: fewer, keeping the group structure; vocab 512.
    "Qwen3-0.6B": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, num_hidden_layers=2, max_window_layers=2),
    "Qwen3-8B": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     num_hidden_layers=2, max_window_layers=2),
    "Qwen3-30B-A3B": dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, num_hidden_layers=2, max_window_layers=2, num_experts=16),
    "gpt-oss-20b": dict(hidden_size=64, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
                        num_local_experts=8),
    "DeepSeek-V3": dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_attention_heads=4,
                        num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, v_head_dim=16, num_hidden_layers=4, n_routed_experts=32),
    "Moonlight-16B-A3B": dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_attention_heads=4,
                              num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
                              v_head_dim=16, num_hidden_layers=2, n_routed_experts=8),
    "Llama-3.1-8B": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=2),
    "Llama-3.2-1B": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, num_hidden_layers=2),
}
SCALED_VOCAB = 512
SCALED_SPECIAL_IDS = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1}
"""The special ids of the scaled vocabulary (``<|endoftext|>`` and ``<|pad|>`` of the tests' tokenizer)."""


def scaled(name: str) -> dict[str, Any]:
    """The published config ``name`` with width, depth, expert count and vocabulary scaled down, its special token ids
    moved into the smaller vocabulary (every other key as published), without ``quantization_config`` (the
    random-weight reference model is not quantized)."""
    config = copy.deepcopy(PUBLISHED[name][0])
    config.pop("quantization_config", None)
    config.update(copy.deepcopy(_SCALED[name]), vocab_size=SCALED_VOCAB)
    config.update({key: value for key, value in SCALED_SPECIAL_IDS.items() if key in config})
    return config
