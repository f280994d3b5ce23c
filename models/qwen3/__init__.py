"""Qwen3 dense models: args and flavors, the module, its init plan, FLOPs, parallelize and HF
adapter, as one ModelSpec."""

from torchtitan_lite.models.qwen3.args import Qwen3ModelArgs, qwen3_flavors
from torchtitan_lite.models.qwen3.flops import num_flops_per_token
from torchtitan_lite.models.qwen3.init_plan import qwen3_init_plan
from torchtitan_lite.models.qwen3.model import Qwen3Model
from torchtitan_lite.models.qwen3.parallelize import parallelize_qwen3
from torchtitan_lite.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter
from torchtitan_lite.protocols.model_spec import ModelSpec

__all__ = ["Qwen3Model", "Qwen3ModelArgs", "model_spec", "qwen3_flavors", "qwen3_init_plan"]

model_spec = ModelSpec(
    name="qwen3",
    model_cls=Qwen3Model,
    flavors=qwen3_flavors,
    init_plan=qwen3_init_plan,
    num_flops_per_token=num_flops_per_token,
    parallelize=parallelize_qwen3,
    state_dict_adapter=Qwen3StateDictAdapter,
)
