"""DeepSeek-V3 (arXiv 2412.19437): multi-head latent attention, DeepSeekMoE with shared experts and
auxiliary-loss-free load balancing (the expert biases move once per optimizer step, in the training
hooks), and optional multi-token prediction (``mtp_num_layers``, ``models/common/mtp.py``).

``debug`` trains on CPU; the 16b (Moonlight-16B-A3B) and 671b flavors give the published parameter
counts and init plans.
"""

from torch import nn

from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.models.common.moe_hooks import MoETrainingHooks
from torchtitan_lite.models.common.mtp import MTPTrainingHooks, mtp_module
from torchtitan_lite.models.deepseek_v3.args import DeepSeekV3ModelArgs, deepseek_v3_flavors
from torchtitan_lite.models.deepseek_v3.flops import num_flops_per_token
from torchtitan_lite.models.deepseek_v3.init_plan import deepseek_v3_init_plan
from torchtitan_lite.models.deepseek_v3.model import DeepSeekV3Model
from torchtitan_lite.models.deepseek_v3.parallelize import parallelize_deepseek_v3
from torchtitan_lite.models.deepseek_v3.state_dict_adapter import DeepSeekV3StateDictAdapter
from torchtitan_lite.protocols.model_spec import ModelSpec, TrainingHooks


def deepseek_v3_training_hooks(
    model: nn.Module, parallel_dims: ParallelDims, micro_batches: int
) -> TrainingHooks:
    """The MoE hooks (expert loads, expert biases, aux-loss scale); with MTP modules inside the MTP
    hooks (MTP loss scale and log)."""
    hooks = MoETrainingHooks(model, parallel_dims, micro_batches)
    if mtp_module(model) is None:
        return hooks
    return MTPTrainingHooks(hooks, model, parallel_dims, micro_batches)


model_spec = ModelSpec(
    name="deepseek_v3",
    model_cls=DeepSeekV3Model,
    flavors=deepseek_v3_flavors,
    init_plan=deepseek_v3_init_plan,
    num_flops_per_token=num_flops_per_token,
    parallelize=parallelize_deepseek_v3,
    training_hooks=deepseek_v3_training_hooks,
    state_dict_adapter=DeepSeekV3StateDictAdapter,
)

__all__ = [
    "DeepSeekV3Model",
    "DeepSeekV3ModelArgs",
    "deepseek_v3_flavors",
    "deepseek_v3_init_plan",
    "model_spec",
]
