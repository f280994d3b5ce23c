"""torchrun worker of tests/test_expert_parallel.py: the all-to-all token dispatch under skewed
routing vs one process.

    TORCHTITAN_LITE_TEST_RESULTS=DIR torchrun --nproc_per_node=2 tests/dist_ep_worker.py

Every rank builds the same grouped experts (4 experts: SwiGLU with fp32 widths that take
``F.grouped_mm``, and the GPT-OSS biased experts with widths that take the loop fallback) and a
full-weight reference copy, then shards the copy with :class:`ExpertParallel` over both ranks
(experts 0-1 on rank 0, 2-3 on rank 1). Each rank routes its own tokens: rank 0 sends 15 of its 16
tokens' first choice to expert 0, rank 1 all of them; no token picks expert 2 or 3, so rank 1
receives no rows at all. Rank 0 returns (``dist_helpers.write_result``, to ``DIR/rank0.pt``) per
expert class: the largest difference of the outputs, of the input and router-weight gradients and of
the expert-weight gradients (the sharded grads against the reference's summed over both ranks), and
the rows each rank received.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from dist_helpers import leave_together, write_result
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from torchtitan_lite.distributed.expert_parallel import ExpertParallel
from torchtitan_lite.models.common.experts import (
    GroupedExperts,
    GroupedSwiGLUExperts,
    clamped_swiglu,
)

NUM_EXPERTS, TOKENS, TOP_K = 4, 16, 2


def skewed_routing(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices, weights)`` ``(TOKENS, TOP_K)``: first choice expert 0 (rank 0: all but the last
    token, which picks expert 1), second choice expert 1 (expert 0 for rank 0's last token);
    positive weights."""
    indices = torch.tensor([[0, 1]] * TOKENS)
    if rank == 0:
        indices[-1] = torch.tensor([1, 0])
    weights = torch.rand(TOKENS, TOP_K, generator=torch.Generator().manual_seed(10 + rank)) + 0.1
    return indices, weights


def compare(make, mesh, rank: int) -> dict:
    torch.manual_seed(0)
    reference = make()
    for param in reference.parameters():
        torch.nn.init.normal_(param, std=0.1)
    sharded = make()
    sharded.load_state_dict(reference.state_dict())
    parallelize_module(sharded, mesh, ExpertParallel())
    received = []
    sharded.register_forward_pre_hook(lambda module, args: received.append(int(args[0].shape[0])))

    x = torch.randn(
        TOKENS,
        8 if isinstance(reference, GroupedSwiGLUExperts) else 6,
        generator=torch.Generator().manual_seed(20 + rank),
    )
    indices, weights = skewed_routing(rank)
    results = []
    for module in (reference, sharded):
        xi, wi = x.clone().requires_grad_(), weights.clone().requires_grad_()
        out = module(xi, indices, wi)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results.append((out.detach(), xi.grad, wi.grad))
    worst = max((a - b).abs().max().item() for a, b in zip(*results, strict=True))
    grad_worst = 0.0
    for (name, ref), param in zip(reference.named_parameters(), sharded.parameters(), strict=True):
        summed = ref.grad.clone()
        dist.all_reduce(summed)  # the reference's gradient over both ranks' tokens
        assert isinstance(param, DTensor), name
        grad_worst = max(grad_worst, (param.grad.full_tensor() - summed).abs().max().item())
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, received[0])
    return {"out_and_input_grads": worst, "expert_grads": grad_worst, "rows_received": rows}


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("ep",))
    result = {
        "swiglu": compare(lambda: GroupedSwiGLUExperts(NUM_EXPERTS, 8, 16), mesh, rank),
        "gpt_oss": compare(lambda: GroupedExperts(NUM_EXPERTS, 6, 5, clamped_swiglu), mesh, rank),
    }
    if rank == 0:
        write_result(result)
    leave_together()


if __name__ == "__main__":
    main()
