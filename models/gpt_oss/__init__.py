"""GPT-OSS (OpenAI gpt-oss-20b / -120b): MoE with attention sinks and alternating sliding-window attention.

The 20b and 120b flavors need tensor/expert parallelism to train; until that lands they serve
parameter counts, init inspection and FSDP-only runs on enough devices. ``debug`` trains on CPU.
"""

from models import ModelSpec
from models.gpt_oss.args import GptOssModelArgs, gpt_oss_flavors
from models.gpt_oss.flops import num_flops_per_token
from models.gpt_oss.init_plan import gpt_oss_init_plan
from models.gpt_oss.model import GptOssModel

model_spec = ModelSpec(
    name="gpt_oss",
    model_cls=GptOssModel,
    flavors=gpt_oss_flavors,
    init_plan=gpt_oss_init_plan,
    num_flops_per_token=num_flops_per_token,
)

__all__ = ["GptOssModel", "GptOssModelArgs", "gpt_oss_flavors", "gpt_oss_init_plan", "model_spec"]
