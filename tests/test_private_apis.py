"""Every private torch API of docs/private_apis.md, resolved and used as the code uses it: a torch
release that moves, renames or changes one fails here with the API's name (the test id and the
first words of the failure)."""

import inspect
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

REPO = Path(__file__).resolve().parents[1]
ATTENTION_OPS = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)


def resolve(dotted: str):
    """The object at ``dotted`` (a module path, then attributes)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = __import__(".".join(parts[:cut]), fromlist=["_"])
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def world_mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (1,), mesh_dim_names=("world",))


def check_unflatten():
    mesh = world_mesh()._unflatten(0, (1, 1), ("a", "b"))
    assert mesh.mesh_dim_names == ("a", "b")


def check_flatten():
    mesh = world_mesh()._unflatten(0, (1, 1), ("a", "b"))
    assert mesh[("a", "b")]._flatten("a_b").mesh_dim_names == ("a_b",)


def check_strided_shard():
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    cls = resolve("torch.distributed.tensor.placement_types._StridedShard")
    placement = cls(0, split_factor=2)
    assert (placement.dim, placement.split_factor) == (0, 2)
    shape, offset = compute_local_shape_and_global_offset((8, 4), world_mesh(), [placement])
    assert (tuple(shape), tuple(offset)) == ((8, 4), (0, 0))


def check_local_box():
    from torch.distributed.tensor import Shard

    compute = resolve("torch.distributed.tensor._utils.compute_local_shape_and_global_offset")
    shape, offset = compute((8, 4), world_mesh(), [Shard(0)])
    assert (tuple(shape), tuple(offset)) == ((8, 4), (0, 0))


def check_all_to_all():
    fn = resolve("torch.distributed._functional_collectives.all_to_all_single_autograd")
    params = list(inspect.signature(fn).parameters.values())[:4]
    assert [p.kind for p in params] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 4
    assert params[3].name == "group"
    x = torch.arange(6.0).view(3, 2).requires_grad_()
    y = fn(x, [3], [3], dist.group.WORLD) * 2
    y.sum().backward()
    assert torch.equal(y, x.detach() * 2) and torch.equal(x.grad, torch.full((3, 2), 2.0))


def check_async_tensor():
    import torch.distributed._functional_collectives as funcol

    cls = resolve("torch.distributed._functional_collectives.AsyncCollectiveTensor")
    out = funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD)
    assert isinstance(out, cls) and torch.equal(out.clone(), torch.ones(2))


def check_checkpoint_wrapper():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    from torchtitan_lite.init.apply import canonical_name

    wrap = resolve("torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper")
    block = wrap(nn.Linear(2, 2), context_fn=lambda: create_selective_checkpoint_contexts([]))
    names = [n for n, _ in nn.Sequential(block).named_parameters()]
    assert [canonical_name(n) for n in names] == ["0.weight", "0.bias"], names
    block(torch.ones(1, 2, requires_grad=True)).sum().backward()
    assert torch.equal(block._checkpoint_wrapped_module.weight.grad, torch.ones(2, 2))


def check_attention_ops():
    for name in ATTENTION_OPS:
        assert hasattr(getattr(torch.ops.aten, name), "default"), name


def check_grouped_mm():
    assert hasattr(torch.ops.aten._grouped_mm, "default")


def check_inductor_options():
    from torchtitan_lite.init.counter import EXACT_COMPILE_OPTIONS

    for name, value in EXACT_COMPILE_OPTIONS.items():
        current = resolve(f"torch._inductor.config.{name}")
        assert type(current) is type(value), name


def check_parameters_assignment():
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    second._parameters["weight"] = first.weight
    assert second.weight is first.weight and [p is first.weight for p in second.parameters()] == [
        True,
        False,
    ]


def check_to_local_view():
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    for placement in (Shard(0), Replicate()):
        tensor = distribute_tensor(torch.zeros(4), world_mesh(), [placement])
        tensor.to_local().fill_(3.0)
        assert torch.equal(tensor.full_tensor(), torch.full((4,), 3.0)), placement


def check_cxx():
    cxx = resolve("torch._inductor.config.cpp.cxx")
    assert isinstance(cxx, (list, tuple, str)) and all(
        c is None or isinstance(c, str) for c in (cxx if isinstance(cxx, (list, tuple)) else [cxx])
    )


def check_dispatch_mode():
    mode = resolve("torch.utils._python_dispatch.TorchDispatchMode")
    seen = []

    class Record(mode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record():
        torch.ones(2) + 1
    assert "aten.add.Tensor" in seen


def check_tree_leaves():
    leaves = resolve("torch.utils._pytree.tree_leaves")
    assert leaves(((1, [2]), {"a": 3})) == [1, 2, 3]


def check_memory_history():
    fn = resolve("torch.cuda.memory._record_memory_history")
    assert {"enabled", "max_entries"} <= set(inspect.signature(fn).parameters)


def check_dump_snapshot():
    fn = resolve("torch.cuda.memory._dump_snapshot")
    assert list(inspect.signature(fn).parameters)[:1] == ["filename"]


def check_last_lr():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    assert scheduler._last_lr == [0.1]
    scheduler._last_lr = [0.5]
    assert scheduler.get_last_lr() == [0.5]


def check_fake_store():
    store = resolve("torch.testing._internal.distributed.fake_pg.FakeStore")
    dist.init_process_group("fake", store=store(), rank=1, world_size=4)
    try:
        assert (dist.get_rank(), dist.get_world_size()) == (1, 4)
    finally:
        dist.destroy_process_group()


CHECKS = {
    "DeviceMesh._unflatten": (check_unflatten, True),
    "DeviceMesh._flatten": (check_flatten, True),
    "_StridedShard": (check_strided_shard, True),
    "compute_local_shape_and_global_offset": (check_local_box, True),
    "all_to_all_single_autograd": (check_all_to_all, True),
    "AsyncCollectiveTensor": (check_async_tensor, True),
    "checkpoint_wrapper": (check_checkpoint_wrapper, False),
    "torch.ops.aten._scaled_dot_product_*_attention": (check_attention_ops, False),
    "torch.ops.aten._grouped_mm": (check_grouped_mm, False),
    "inductor options": (check_inductor_options, False),
    "Module._parameters": (check_parameters_assignment, False),
    "DTensor.to_local()": (check_to_local_view, True),
    "torch._inductor.config.cpp.cxx": (check_cxx, False),
    "TorchDispatchMode": (check_dispatch_mode, False),
    "tree_leaves": (check_tree_leaves, False),
    "_record_memory_history": (check_memory_history, False),
    "_dump_snapshot": (check_dump_snapshot, False),
    "LambdaLR._last_lr": (check_last_lr, False),
    "FakeStore": (check_fake_store, False),
}
"""Each API's check, and whether it needs a process group (gloo, this process alone)."""


def doc_rows() -> list[str]:
    """The first cells of docs/private_apis.md's tables (the header rows left out)."""
    rows = re.findall(r"^\| (.+?) \| `", (REPO / "docs" / "private_apis.md").read_text(), re.M)
    return [row for row in rows if row != "Private API"]


def test_every_documented_private_api_has_a_check():
    missing = [row for row in doc_rows() if not any(name in row for name in CHECKS)]
    assert missing == [], f"docs/private_apis.md rows without a check in CHECKS: {missing}"
    unused = [name for name in CHECKS if not any(name in row for row in doc_rows())]
    assert unused == [], f"checks of APIs that docs/private_apis.md no longer lists: {unused}"


@pytest.mark.parametrize("name", list(CHECKS))
def test_private_api_is_where_the_code_uses_it(name, request):
    check, needs_group = CHECKS[name]
    if needs_group:
        request.getfixturevalue("one_rank_group")
    try:
        check()
    except Exception as err:  # any failure: name the API first
        pytest.fail(
            f"{name} (docs/private_apis.md) moved or changed in torch {torch.__version__}: "
            f"{type(err).__name__}: {err}"
        )
