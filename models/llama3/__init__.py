"""Llama 3 dense models (Llama 3.1 8B/70B, Llama 3.2 1B/3B): args and flavors, the module, its init
plan, FLOPs, parallelize and HF adapter, as one ModelSpec."""

from torchtitan_lite.models.llama3.args import Llama3ModelArgs, llama3_flavors
from torchtitan_lite.models.llama3.flops import num_flops_per_token
from torchtitan_lite.models.llama3.init_plan import llama3_init_plan
from torchtitan_lite.models.llama3.model import Llama3Model
from torchtitan_lite.models.llama3.parallelize import parallelize_llama3
from torchtitan_lite.models.llama3.state_dict_adapter import Llama3StateDictAdapter
from torchtitan_lite.protocols.model_spec import ModelSpec

__all__ = ["Llama3Model", "Llama3ModelArgs", "llama3_flavors", "llama3_init_plan", "model_spec"]

model_spec = ModelSpec(
    name="llama3",
    model_cls=Llama3Model,
    flavors=llama3_flavors,
    init_plan=llama3_init_plan,
    num_flops_per_token=num_flops_per_token,
    parallelize=parallelize_llama3,
    state_dict_adapter=Llama3StateDictAdapter,
)
