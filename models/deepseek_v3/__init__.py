"""DeepSeek-V3 (arXiv 2412.19437): multi-head latent attention, DeepSeekMoE with shared experts and
auxiliary-loss-free load balancing.

The 16b (Moonlight-16B-A3B) and 671b flavors need expert/tensor parallelism to train at scale; until
that lands they serve parameter counts, init inspection and FSDP-only runs on enough devices.
``debug`` trains on CPU. """

from models import ModelSpec
from models.deepseek_v3.args import DeepSeekV3ModelArgs, deepseek_v3_flavors
from models.deepseek_v3.flops import num_flops_per_token
from models.deepseek_v3.init_plan import deepseek_v3_init_plan
from models.deepseek_v3.model import DeepSeekV3Model

model_spec = ModelSpec(
    name="deepseek_v3",
    model_cls=DeepSeekV3Model,
    flavors=deepseek_v3_flavors,
    init_plan=deepseek_v3_init_plan,
    num_flops_per_token=num_flops_per_token,
)

__all__ = ["DeepSeekV3Model", "DeepSeekV3ModelArgs", "deepseek_v3_flavors", "deepseek_v3_init_plan", "model_spec"]
