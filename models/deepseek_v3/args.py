"""DeepSeek-V3 model arguments and flavors (DeepSeek-V3 technical report, arXiv 2412.19437).

Field names are those shared by the families here (torchtitan's ``MoEArgs`` names for the MoE
fields, the reference ``inference/model.py`` ``ModelArgs`` of deepseek-ai/DeepSeek-V3 for MLA); the
Hugging Face ``config.json`` key of each is given in brackets.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torchtitan_lite.models.common import arg_checks as check


@dataclass(frozen=True)
class DeepSeekV3ModelArgs:
    """Hyperparameters of a DeepSeek-V3-style model: MLA attention, DeepSeekMoE with shared experts.

    Defaults are the published DeepSeek-V3 values (``config.json`` of deepseek-ai/DeepSeek-V3).
    Derive a variant with ``dataclasses.replace(args, bias_update_speed=0.0)``: the checks run
    again.

    Raises:
        ValueError: a size that is not a positive integer (``q_lora_rank``, ``n_dense_layers`` and
            ``num_shared_experts`` may be 0), an odd ``qk_rope_head_dim``,
            ``n_dense_layers > n_layers``, ``top_k > num_experts``, experts not divisible into
            ``num_expert_groups`` of at least 2, ``num_limited_groups > num_expert_groups``, fewer
            than ``top_k`` experts in the limited groups, an unknown ``score_func``, a non-bool
            flag, or a float out of its range (each message names the field and the value).
    """

    dim: int = 7168
    """Model width [hidden_size]."""
    n_layers: int = 61
    """Number of transformer blocks [num_hidden_layers]."""
    n_dense_layers: int = 3
    """The first ``n_dense_layers`` blocks use a dense SwiGLU FFN, the rest the MoE
    [first_k_dense_replace]."""
    n_heads: int = 128
    """Attention heads (MLA: keys and values per head, no GQA) [num_attention_heads]."""
    vocab_size: int = 129280
    """Vocabulary size [vocab_size]."""
    hidden_dim: int = 18432
    """Inner width of the dense SwiGLU FFN [intermediate_size]."""
    moe_inter_dim: int = 2048
    """Inner width of each routed and shared expert [moe_intermediate_size]."""
    num_experts: int = 256
    """Routed experts per MoE layer, ``N_r`` of the report [n_routed_experts]."""
    num_shared_experts: int = 1
    """Shared experts, run on every token as one SwiGLU of width
    ``num_shared_experts * moe_inter_dim`` (reference ``MoE.shared_experts``); 0 = none
    [n_shared_experts]."""
    top_k: int = 8
    """Routed experts per token, ``K_r`` of the report [num_experts_per_tok]."""
    num_expert_groups: int = 8
    """Groups the routed experts are split into, ``M`` nodes in the report (sec. 2.1.2); 1 = no
    group-limited routing [n_group]."""
    num_limited_groups: int = 4
    """Groups each token may be routed to (node-limited routing, report sec. 2.1.2) [topk_group]."""
    score_func: str = "sigmoid"
    """Affinity scores: ``"sigmoid"`` (V3, report eq. 15) or ``"softmax"`` (V2) [scoring_func]."""
    route_norm: bool = True
    """Divide the chosen scores by their sum (report eq. 13) [norm_topk_prob]."""
    route_scale: float = 2.5
    """Multiplier of the gating weights [routed_scaling_factor]."""
    bias_update_speed: float = 0.001
    """``gamma``, the "bias update speed" of the auxiliary-loss-free balancing: the step of each
    expert bias per optimizer step (report sec. 2.1.2: 0.001 for the first 14.3T tokens, then 0); 0
    turns the update off. Not in config.json (torchtitan: ``load_balance_coeff``)."""
    aux_loss_coeff: float = 0.0001
    """``alpha`` of the sequence-wise balance loss (report eq. 17; 0.0001 in sec. 4.2); 0 = off.
    config.json's ``aux_loss_alpha`` 0.001 is the HF default, not the training value."""
    q_lora_rank: int = 1536
    """Rank of the query down-projection; 0 = a direct ``dim -> n_heads * qk_head_dim`` projection
    [q_lora_rank, null = 0]."""
    kv_lora_rank: int = 512
    """Rank of the shared key/value latent ``c_kv`` [kv_lora_rank]."""
    qk_nope_head_dim: int = 128
    """Per-head query/key size without position information [qk_nope_head_dim]."""
    qk_rope_head_dim: int = 64
    """Per-head query/key size carrying RoPE (the key part is shared by all heads); even
    [qk_rope_head_dim]."""
    v_head_dim: int = 128
    """Per-head value size [v_head_dim]."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon [rms_norm_eps]."""
    rope_theta: float = 10000.0
    """RoPE base [rope_theta]."""
    max_seq_len: int = 163840
    """Length of the RoPE tables: the longest sequence the model accepts. YaRN is on when it
    exceeds ``rope_original_max_seq_len`` (the reference rule) [max_position_embeddings]."""
    rope_original_max_seq_len: int = 4096
    """Pre-extension context of YaRN [rope_scaling.original_max_position_embeddings]."""
    rope_factor: float = 40.0
    """YaRN context extension factor [rope_scaling.factor]."""
    rope_beta_fast: float = 32.0
    """YaRN ramp bound, in turns over the original context [rope_scaling.beta_fast]."""
    rope_beta_slow: float = 1.0
    """YaRN ramp bound, in turns over the original context [rope_scaling.beta_slow]."""
    rope_mscale: float = 1.0
    """YaRN attention temperature factor: the softmax scale is multiplied by
    ``(0.1 * rope_mscale * ln(rope_factor) + 1) ** 2`` when YaRN is on
    [rope_scaling.mscale_all_dim]."""
    tie_embeddings: bool = False
    """``output.weight is tok_embeddings.weight`` [tie_word_embeddings]."""
    init_std: float = 0.02
    """Std of the random initial weights [initializer_range]."""
    mtp_num_layers: int = 0
    """Multi-token-prediction depth ``D``: modules predicting the tokens 2..D+1 ahead (report sec.
    2.2; ``models/common/mtp.py``); 0 = off. A training knob (Megatron-LM ``--mtp-num-layers``): the
    published ``num_nextn_predict_layers`` is 1, and an HF import reads that many
    ``model.layers.{n_layers + k}`` modules when this is set
    (``models/deepseek_v3/state_dict_adapter.py``)."""
    mtp_loss_scaling_factor: float = 0.3
    """``lambda``, the weight of the mean MTP loss over the depths (report sec. 4.2: 0.3 for the
    first 10T tokens, 0.1 after; Megatron-LM ``--mtp-loss-scaling-factor``)."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        check.ints(
            self,
            may_be_zero=("q_lora_rank", "n_dense_layers", "num_shared_experts", "mtp_num_layers"),
        )
        check.even(self, "qk_rope_head_dim")
        check.at_most(self, "n_dense_layers", "n_layers")
        check.at_most(self, "top_k", "num_experts")
        if self.num_expert_groups > 1:
            per_group = self.num_experts // self.num_expert_groups
            if self.num_experts % self.num_expert_groups or per_group < 2:
                raise ValueError(
                    f"{name}: num_experts ({self.num_experts}) must split into num_expert_groups "
                    f"({self.num_expert_groups}) equal groups of >= 2 experts (a group scores by "
                    "its top 2)"
                )
            check.at_most(self, "num_limited_groups", "num_expert_groups")
            if self.num_limited_groups * per_group < self.top_k:
                raise ValueError(
                    f"{name}: num_limited_groups ({self.num_limited_groups}) groups of {per_group} "
                    f"experts hold fewer than top_k ({self.top_k}); raise num_limited_groups"
                )
        if self.score_func not in ("sigmoid", "softmax"):
            raise ValueError(
                f"{name}.score_func must be 'sigmoid' or 'softmax', got {self.score_func!r}"
            )
        check.bools(self, "route_norm", "tie_embeddings")
        check.positive(self, "route_scale", "norm_eps", "init_std", "rope_mscale")
        check.non_negative(self, "bias_update_speed", "aux_loss_coeff", "mtp_loss_scaling_factor")
        check.rope(self, yarn=True)

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key size: ``qk_nope_head_dim + qk_rope_head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def uses_yarn(self) -> bool:
        """YaRN frequencies and softmax-scale correction are on (reference:
        ``max_seq_len > original_seq_len``)."""
        return self.max_seq_len > self.rope_original_max_seq_len


# Published sizes. 671b: config.json of deepseek-ai/DeepSeek-V3 (the defaults above). Main model
# only by default;
# with mtp_num_layers = 1 (the published num_nextn_predict_layers) it has 11,610,067,968 parameters
# more
# (tests/test_mtp.py): eh_proj 2 * 7168^2, enorm, hnorm, shared_head.norm 3 * 7168, and one MoE
# block
# (11,507,286,016), the embedding and head shared. Totals on meta, checked in
# tests/test_deepseek_v3.py: 671,026,404,352 parameters (report: 671B),
# 36,625,603,584 activated per token without the input embedding, 37,552,300,544 with it (report:
# 37B).
_671B = DeepSeekV3ModelArgs()

# 16b: config.json of moonshotai/Moonlight-16B-A3B (the V3 architecture, model_type deepseek_v3):
# q_lora_rank null, no expert groups, rope_scaling null (8192 <= 4096 is false, so the YaRN fields
# are
# set to keep it off: original context = max_seq_len). 15,960,108,544 parameters (model card: 16B),
# 2,579,230,208 activated without the input embedding, 2,914,774,528 with it (model card: 3B).
_16B = replace(
    _671B,
    dim=2048,
    n_layers=27,
    n_dense_layers=1,
    n_heads=16,
    vocab_size=163840,
    hidden_dim=11264,
    moe_inter_dim=1408,
    num_experts=64,
    num_shared_experts=2,
    top_k=6,
    num_expert_groups=1,
    num_limited_groups=1,
    route_scale=2.446,
    q_lora_rank=0,
    norm_eps=1e-5,
    rope_theta=50000.0,
    max_seq_len=8192,
    rope_original_max_seq_len=8192,
    rope_factor=1.0,
)

# Debug: vocab 2048 = the bundled byte-level BPE tokenizer; 8 experts in 2 groups of 4, each token
# limited to 1 group and 2 experts, 1 shared expert; the V3 router (sigmoid, bias update 1e-3).
_DEBUG = replace(
    _671B,
    dim=256,
    n_layers=4,
    n_dense_layers=1,
    n_heads=4,
    vocab_size=2048,
    hidden_dim=768,
    moe_inter_dim=256,
    num_experts=8,
    num_shared_experts=1,
    top_k=2,
    num_expert_groups=2,
    num_limited_groups=1,
    q_lora_rank=0,
    kv_lora_rank=64,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    max_seq_len=4096,
    rope_original_max_seq_len=4096,
    rope_factor=1.0,
)

deepseek_v3_flavors: dict[str, DeepSeekV3ModelArgs] = {
    "debug": _DEBUG,
    "16b": _16B,
    "671b": _671B,
}
