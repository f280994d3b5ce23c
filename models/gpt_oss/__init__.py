"""GPT-OSS (OpenAI gpt-oss-20b / -120b): MoE with attention sinks and alternating sliding-window
attention.

``debug`` trains on CPU; the 20b and 120b flavors give the published parameter counts and init
plans.
"""

from torchtitan_lite.models.common.moe_hooks import MoETrainingHooks
from torchtitan_lite.models.gpt_oss.args import GptOssModelArgs, gpt_oss_flavors
from torchtitan_lite.models.gpt_oss.flops import num_flops_per_token
from torchtitan_lite.models.gpt_oss.init_plan import gpt_oss_init_plan
from torchtitan_lite.models.gpt_oss.model import GptOssModel
from torchtitan_lite.models.gpt_oss.parallelize import parallelize_gpt_oss
from torchtitan_lite.models.gpt_oss.state_dict_adapter import GptOssStateDictAdapter
from torchtitan_lite.protocols.model_spec import ModelSpec

model_spec = ModelSpec(
    name="gpt_oss",
    model_cls=GptOssModel,
    flavors=gpt_oss_flavors,
    init_plan=gpt_oss_init_plan,
    num_flops_per_token=num_flops_per_token,
    parallelize=parallelize_gpt_oss,
    training_hooks=MoETrainingHooks,
    state_dict_adapter=GptOssStateDictAdapter,
)

__all__ = ["GptOssModel", "GptOssModelArgs", "gpt_oss_flavors", "gpt_oss_init_plan", "model_spec"]
