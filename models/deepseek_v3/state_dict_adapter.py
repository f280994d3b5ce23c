"""DeepSeek-V3 <-> Hugging Face transformers: tensor names and ``config.json``
(``DeepseekV3ForCausalLM``; DeepSeek-V3 and Moonlight-16B-A3B, whose ``model_type`` is
``deepseek_v3``).

Names (HF ``modeling_deepseek_v3.py``), besides the decoder's: ``self_attn.q_proj`` =
``attention.wq`` (no query LoRA) or ``q_a_proj``/``q_a_layernorm``/``q_b_proj`` =
``wq_a``/``q_norm``/``wq_b``; ``kv_a_proj_with_mqa`` = ``wkv_a``, ``kv_a_layernorm`` = ``kv_norm``,
``kv_b_proj`` = ``wkv_b``, ``o_proj`` = ``wo``; dense blocks ``mlp.gate_proj/up_proj/down_proj`` =
``feed_forward.w1/w3/w2``; MoE blocks ``mlp.gate.weight`` = ``moe.router.gate.weight``,
``mlp.gate.e_score_correction_bias`` = ``moe.router.expert_bias`` (the balancing bias: loaded like a
weight, never re-initialized), the routed experts one tensor per expert
(:func:`torchtitan_lite.models.common.hf_adapter.per_expert`) and ``mlp.shared_experts.*`` =
``moe.shared_experts.w1/w3/w2``.

Multi-token prediction (``models/common/mtp.py``): with ``mtp_num_layers`` = D > 0 our
``mtp.layers.{k}`` is the folder's ``model.layers.{n_layers + k}`` (the published
``model.layers.61``, as vLLM's ``deepseek_mtp.py`` reads it): ``enorm``, ``hnorm``, ``eh_proj``,
``shared_head.norm`` = ``norm`` and the block's tensors under the usual names. The layer's
``embed_tokens`` and ``shared_head.head`` are copies of ``model.embed_tokens`` and ``lm_head``
(report sec. 2.2: shared): import skips them (the main tensors are loaded; a folder whose copies
differ loses them), export writes both copies of our one tensor (:class:`WithCopies`) and
``num_nextn_predict_layers`` = D. A folder without the layers leaves ours missing (initialized,
listed); with D = 0 the folder's ``num_nextn_predict_layers`` layers are skipped, listed
(transformers does not build them either), so a folder without them loads the same. YaRN: ``mscale``
must equal ``mscale_all_dim`` (then HF scales no cos/sin and the softmax scale gets
``mscale_all_dim``, as our ``softmax_scale``), the ramp bounds are rounded (``truncate``, HF's
default and the reference's), and YaRN needs
``max_position_embeddings > original_max_position_embeddings`` (our model turns it on by that rule,
the reference's). Training-only keys (``aux_loss_alpha``, ``seq_aux``) and the original parallel
layout (``ep_size``, ``pretraining_tp``) change no output.

Note: docs/design.md, "on the RoPE rows".
"""

from __future__ import annotations

import re
from typing import Any

from torchtitan_lite.models.common.hf_adapter import (
    SWIGLU_NAMES,
    DecoderStateDictAdapter,
    moe_counters,
    per_expert,
    read_decoder,
    same,
)
from torchtitan_lite.models.common.hf_config import FILE_FIELDS, ConfigFields, rope_parameters
from torchtitan_lite.protocols.hf_tensors import HFTensor, RowPermuted, Same, WithCopies

HF_DEFAULTS = {
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "n_group": 8,
    "topk_group": 4,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_interleave": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "num_nextn_predict_layers": 1,
}
"""transformers' ``DeepseekV3Config`` defaults for the keys read here
(``configuration_deepseek_v3.py``)."""
MODELING_DEFAULTS = {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1}
"""What transformers does for keys of DeepSeek's own ``config.json`` that ``DeepseekV3Config`` does
not declare, so a folder without them (as its ``save_pretrained`` writes) loads:
``DeepseekV3TopkRouter`` scores with a sigmoid and picks the top-k within the top groups after the
score-correction bias (``noaux_tc``), and every layer from ``first_k_dense_replace`` on is an MoE
(``DeepseekV3DecoderLayer``: no ``moe_layer_freq``)."""
DEFAULT_THETA = 10000.0
"""transformers' ``rope_theta`` when a config has none (``PreTrainedConfig.default_theta``)."""
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


def interleaved_to_half(
    n_rows: int, block: int, rope_dim: int, rope_offset: int
) -> tuple[int, ...]:
    """The row permutation from DeepSeek's interleaved RoPE pairs to our rotate-half pairs.

    Rows come in ``n_rows // block`` blocks (one per head, or one for ``wkv_a``); in each, the
    ``rope_dim`` rows from ``rope_offset`` on are RoPE features. DeepSeek pairs features
    ``(2i, 2i + 1)`` (the reference's ``view_as_complex``; HF ``apply_rotary_pos_emb_interleave``
    with ``rope_interleave: true``), we pair ``(i, i + rope_dim / 2)`` (``models/common/rope.py``),
    so our RoPE row ``j`` is their row ``2j`` for ``j < rope_dim / 2`` and
    ``2 (j - rope_dim / 2) + 1`` after; other rows stay.

    Returns:
        ``perm`` with our row ``i`` = their row ``perm[i]`` (for :class:`RowPermuted`).
    """
    half = rope_dim // 2
    inner = [2 * j for j in range(half)] + [2 * j + 1 for j in range(half)]
    perm = list(range(n_rows))
    for start in range(0, n_rows, block):
        base = start + rope_offset
        perm[base : base + rope_dim] = [base + k for k in inner]
    return tuple(perm)


def _read_rope(fields: ConfigFields, max_seq_len: int) -> dict[str, Any]:
    """The RoPE keys as args fields: no scaling, or YaRN (module docstring)."""
    rope = rope_parameters(fields, DEFAULT_THETA)
    kind = rope.expect("rope_type", "default", "yarn")
    values: dict[str, Any] = {"rope_theta": float(rope.get("rope_theta"))}
    if kind == "default":
        values.update(rope_factor=1.0, rope_original_max_seq_len=max_seq_len)
    else:
        mscale = rope.get("mscale_all_dim", 0)
        if not mscale or rope.get("mscale", None) != mscale:
            raise rope.fail(
                "mscale",
                f"with mscale_all_dim = {mscale!r}: the model implements YaRN with mscale = "
                "mscale_all_dim > 0 (the published value 1.0 for both)",
            )
        rope.expect("truncate", True)
        original = rope.get("original_max_position_embeddings")
        if not max_seq_len > original:
            raise rope.fail(
                "original_max_position_embeddings",
                f"is not below max_position_embeddings = "
                f"{max_seq_len}: the model turns YaRN on only then",
            )
        values.update(
            rope_factor=float(rope.get("factor")),
            rope_original_max_seq_len=original,
            rope_beta_fast=float(rope.get("beta_fast")),
            rope_beta_slow=float(rope.get("beta_slow")),
            rope_mscale=float(mscale),
        )
    rope.finish()
    return values


def args_from_hf_config(config: dict[str, Any]) -> dict[str, Any]:
    """:class:`torchtitan_lite.models.deepseek_v3.args.DeepSeekV3ModelArgs` field -> value of an HF
    ``config.json`` of ``DeepseekV3ForCausalLM``.

    Raises:
        HFConfigError: GQA (``num_key_value_heads`` != heads), attention bias or dropout, another
            router (``scoring_func``, ``topk_method``), MoE on every k-th layer only
            (``moe_layer_freq``), a RoPE the module docstring does not allow, or a key the model
            does not implement.
    """
    fields = ConfigFields(config, {**HF_DEFAULTS, **MODELING_DEFAULTS}, family="deepseek_v3")
    fields.ignore(
        *FILE_FIELDS,
        "rope_interleave",
        "num_nextn_predict_layers",
        "aux_loss_alpha",
        "seq_aux",
        "ep_size",
        "pretraining_tp",
    )
    values = read_decoder(fields)
    n_heads = fields.get("num_attention_heads")
    if fields.get("num_key_value_heads") not in (None, n_heads):
        raise fields.fail(
            "num_key_value_heads",
            f"differs from num_attention_heads = {n_heads} (MLA has one key and value per head)",
        )
    fields.expect("attention_bias", False)
    fields.expect("attention_dropout", 0.0)
    fields.expect("hidden_act", "silu")
    fields.expect("scoring_func", "sigmoid")
    fields.expect("topk_method", "noaux_tc")
    fields.expect("moe_layer_freq", 1)
    values.update(
        n_heads=n_heads,
        n_dense_layers=fields.get("first_k_dense_replace"),
        hidden_dim=fields.get("intermediate_size"),
        moe_inter_dim=fields.get("moe_intermediate_size"),
        num_experts=fields.get("n_routed_experts"),
        num_shared_experts=fields.get("n_shared_experts") or 0,
        top_k=fields.get("num_experts_per_tok"),
        num_expert_groups=fields.get("n_group") or 1,
        num_limited_groups=fields.get("topk_group") or 1,
        route_norm=fields.get("norm_topk_prob"),
        route_scale=float(fields.get("routed_scaling_factor")),
        q_lora_rank=fields.get("q_lora_rank") or 0,
        kv_lora_rank=fields.get("kv_lora_rank"),
        qk_nope_head_dim=fields.get("qk_nope_head_dim"),
        qk_rope_head_dim=fields.get("qk_rope_head_dim"),
        v_head_dim=fields.get("v_head_dim"),
        score_func="sigmoid",
    )
    derived = {
        "head_dim": values["qk_rope_head_dim"],
        "qk_head_dim": values["qk_nope_head_dim"] + values["qk_rope_head_dim"],
    }
    for key, value in derived.items():  # transformers 5 writes these derived sizes
        if fields.get(key, value) != value:
            raise fields.fail(
                key, f"differs from the {value} that qk_nope_head_dim and qk_rope_head_dim give"
            )
    values.update(_read_rope(fields, values["max_seq_len"]))
    fields.finish()
    return values


class DeepSeekV3StateDictAdapter(DecoderStateDictAdapter):
    """Maps tensors and configs between our
    :class:`~torchtitan_lite.models.deepseek_v3.args.DeepSeekV3ModelArgs` model and HF
    ``DeepseekV3ForCausalLM``.

    Args:
        args: the arguments of our model.
        hf_config: the ``config.json`` of the folder to import: its ``rope_interleave`` (default
            true: the HF tensors pair RoPE features ``(2i, 2i+1)``, see the note) and
                ``num_nextn_predict_layers``; ``None`` for
            an export (the published layout).
    """

    model_type = "deepseek_v3"
    architecture = "DeepseekV3ForCausalLM"
    free_fields = ()
    args_from_hf_config = staticmethod(args_from_hf_config)

    def _rope_rows(self, hf_name: str, n_rows: int, block: int, offset: int) -> HFTensor:
        """``hf_name`` with its RoPE rows permuted when the folder interleaves them (the note)."""
        if not self.hf_config.get("rope_interleave", HF_DEFAULTS["rope_interleave"]):
            return Same(hf_name)
        return RowPermuted(
            hf_name, interleaved_to_half(n_rows, block, self.args.qk_rope_head_dim, offset)
        )

    def layer_tensors(self, i: int, prefix: str) -> dict[str, HFTensor]:
        """MLA, then the dense FFN or the MoE (module docstring)."""
        a, attn = self.args, f"{prefix}self_attn."
        q_rows, kv_rows = a.n_heads * a.qk_head_dim, a.kv_lora_rank + a.qk_rope_head_dim
        tensors = same(
            attn,
            {
                "attention.kv_norm.weight": "kv_a_layernorm.weight",
                "attention.wkv_b.weight": "kv_b_proj.weight",
                "attention.wo.weight": "o_proj.weight",
            },
        )
        tensors["attention.wkv_a.weight"] = self._rope_rows(
            f"{attn}kv_a_proj_with_mqa.weight", kv_rows, kv_rows, a.kv_lora_rank
        )
        if a.q_lora_rank:
            tensors.update(
                same(
                    attn,
                    {
                        "attention.wq_a.weight": "q_a_proj.weight",
                        "attention.q_norm.weight": "q_a_layernorm.weight",
                    },
                )
            )
            tensors["attention.wq_b.weight"] = self._rope_rows(
                f"{attn}q_b_proj.weight", q_rows, a.qk_head_dim, a.qk_nope_head_dim
            )
        else:
            tensors["attention.wq.weight"] = self._rope_rows(
                f"{attn}q_proj.weight", q_rows, a.qk_head_dim, a.qk_nope_head_dim
            )
        if i < a.n_dense_layers:
            return {
                **tensors,
                **same(f"{prefix}mlp.", {f"feed_forward.{k}": v for k, v in SWIGLU_NAMES.items()}),
            }
        tensors.update(
            same(
                prefix,
                {
                    "moe.router.gate.weight": "mlp.gate.weight",
                    "moe.router.expert_bias": "mlp.gate.e_score_correction_bias",
                },
            )
        )
        tensors.update(per_expert(prefix, a.num_experts))
        if a.num_shared_experts:
            shared = {f"moe.shared_experts.{k}": v for k, v in SWIGLU_NAMES.items()}
            tensors.update(same(f"{prefix}mlp.shared_experts.", shared))
        return tensors

    def __init__(self, args: Any, hf_config: dict[str, Any] | None = None):
        super().__init__(args, hf_config)
        n, depth = args.n_layers, args.mtp_num_layers
        if not depth:
            return
        self.tensors["tok_embeddings.weight"] = WithCopies(
            "model.embed_tokens.weight",
            tuple(f"model.layers.{n + k}.embed_tokens.weight" for k in range(depth)),
        )
        self.tensors["output.weight"] = WithCopies(
            "lm_head.weight",
            tuple(f"model.layers.{n + k}.shared_head.head.weight" for k in range(depth)),
        )
        for k in range(depth):
            prefix = f"model.layers.{n + k}."
            layer = same(
                prefix,
                {
                    "enorm.weight": "enorm.weight",
                    "hnorm.weight": "hnorm.weight",
                    "eh_proj.weight": "eh_proj.weight",
                    "norm.weight": "shared_head.norm.weight",
                    "block.attention_norm.weight": "input_layernorm.weight",
                    "block.ffn_norm.weight": "post_attention_layernorm.weight",
                },
            )
            layer.update(
                {f"block.{name}": t for name, t in self.layer_tensors(n + k, prefix).items()}
            )
            self.tensors.update({f"mtp.layers.{k}.{name}": t for name, t in layer.items()})

    def state_tensors(self) -> tuple[str, ...]:
        """The token counters of the MoE layers (the MTP blocks' too)."""
        mtp = tuple(
            f"mtp.layers.{k}.block.moe.tokens_per_expert" for k in range(self.args.mtp_num_layers)
        )
        return moe_counters(self.args, self.args.n_dense_layers) + mtp

    def skipped(self, hf_name: str) -> str | None:
        """Why the HF tensor ``hf_name`` is not loaded (a copy of the shared embedding or head in an
        MTP layer, an MTP layer beyond ``mtp_num_layers``, a tied ``lm_head.weight``), or
        ``None``."""
        match = _LAYER_RE.match(hf_name)
        mtp = (
            self.hf_config.get("num_nextn_predict_layers", HF_DEFAULTS["num_nextn_predict_layers"])
            or 0
        )
        n, depth = self.args.n_layers, self.args.mtp_num_layers
        if match and n <= int(match.group(1)) < n + max(mtp, depth):
            if int(match.group(1)) < n + depth and hf_name.endswith(
                (".embed_tokens.weight", ".shared_head.head.weight")
            ):
                return (
                    "copy of model.embed_tokens / lm_head in a multi-token-prediction layer "
                    "(shared)"
                )
            return (
                f"multi-token-prediction layer (num_nextn_predict_layers {mtp}) beyond the model's "
                f"mtp_num_layers {depth}: set --model.overrides.mtp_num_layers={mtp} to train it"
            )
        return super().skipped(hf_name)

    def family_config(self) -> dict[str, Any]:
        """MLA, MoE, router, RoPE keys (interleaved RoPE rows) and ``num_nextn_predict_layers`` =
        ``mtp_num_layers``."""
        a = self.args
        rope = None
        if a.uses_yarn:
            rope = {
                "type": "yarn",
                "factor": a.rope_factor,
                "original_max_position_embeddings": a.rope_original_max_seq_len,
                "beta_fast": a.rope_beta_fast,
                "beta_slow": a.rope_beta_slow,
                "mscale": a.rope_mscale,
                "mscale_all_dim": a.rope_mscale,
            }
        return {
            "num_attention_heads": a.n_heads,
            "num_key_value_heads": a.n_heads,
            "first_k_dense_replace": a.n_dense_layers,
            "intermediate_size": a.hidden_dim,
            "moe_intermediate_size": a.moe_inter_dim,
            "n_routed_experts": a.num_experts,
            "n_shared_experts": a.num_shared_experts,
            "num_experts_per_tok": a.top_k,
            "n_group": a.num_expert_groups,
            "topk_group": a.num_limited_groups,
            "norm_topk_prob": a.route_norm,
            "routed_scaling_factor": a.route_scale,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "moe_layer_freq": 1,
            "q_lora_rank": a.q_lora_rank or None,
            "kv_lora_rank": a.kv_lora_rank,
            "qk_nope_head_dim": a.qk_nope_head_dim,
            "qk_rope_head_dim": a.qk_rope_head_dim,
            "v_head_dim": a.v_head_dim,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "rope_interleave": True,
            "num_nextn_predict_layers": a.mtp_num_layers,
            "rope_theta": a.rope_theta,
            "rope_scaling": rope,
        }
