"""Qwen3-MoE (Qwen3-30B-A3B): Qwen3 attention with QK-norm, 128 experts top-8, softmax router, no
shared experts.

``debug`` trains on CPU; the 30b-a3b flavor gives the published parameter counts and init plan.
"""

from torchtitan_lite.models.common.moe_hooks import MoETrainingHooks
from torchtitan_lite.models.qwen3_moe.args import Qwen3MoeModelArgs, qwen3_moe_flavors
from torchtitan_lite.models.qwen3_moe.flops import num_flops_per_token
from torchtitan_lite.models.qwen3_moe.init_plan import qwen3_moe_init_plan
from torchtitan_lite.models.qwen3_moe.model import Qwen3MoeModel
from torchtitan_lite.models.qwen3_moe.parallelize import parallelize_qwen3_moe
from torchtitan_lite.models.qwen3_moe.state_dict_adapter import Qwen3MoeStateDictAdapter
from torchtitan_lite.protocols.model_spec import ModelSpec

model_spec = ModelSpec(
    name="qwen3_moe",
    model_cls=Qwen3MoeModel,
    flavors=qwen3_moe_flavors,
    init_plan=qwen3_moe_init_plan,
    num_flops_per_token=num_flops_per_token,
    parallelize=parallelize_qwen3_moe,
    training_hooks=MoETrainingHooks,
    state_dict_adapter=Qwen3MoeStateDictAdapter,
)

__all__ = [
    "Qwen3MoeModel",
    "Qwen3MoeModelArgs",
    "model_spec",
    "qwen3_moe_flavors",
    "qwen3_moe_init_plan",
]
