"""Device discovery, backends, the device module, the 1-process group, and the one-module rule."""

from __future__ import annotations

import io
import os
import resource
import sys
import tokenize
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_helpers import REPO

from torchtitan_lite.components import peak_flops as flops_table
from torchtitan_lite.distributed import devices as D
from torchtitan_lite.distributed import process_group as PG
from torchtitan_lite.preflight.checks import parse_args

TORCHRUN_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.fixture
def no_gpu(monkeypatch):
    """Hide CUDA and XPU, whatever this machine has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if hasattr(torch, "xpu"):
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)


@pytest.fixture
def fake_npu(monkeypatch, no_gpu):
    """A stand-in ``torch_npu`` package with one Ascend 910B2, doing what importing the real one
    does: ``torch.npu`` (also as ``torch.get_device_module("npu")``) and npu as torch's accelerator
    (a namespace for its device: ``torch.device("npu")`` needs the real torch_npu)."""
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    npu = types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 1,
        get_device_name=lambda device=None: "Ascend910B2",
    )
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    get_device_module = torch.get_device_module
    monkeypatch.setattr(
        torch,
        "get_device_module",
        lambda device=None: npu if device == "npu" else get_device_module(device),
    )
    monkeypatch.setattr(
        torch.accelerator,
        "current_accelerator",
        lambda check_available=False: types.SimpleNamespace(type="npu", index=None),
    )
    return npu


def test_npu_is_chosen_with_hccl_when_torch_npu_reports_a_device(fake_npu):
    assert D.device_type() == "npu"
    assert D.device_type("npu") == "npu"
    assert D.backend_for(D.device_type()) == "hccl"
    assert D.device_module("npu") is fake_npu
    npu0 = types.SimpleNamespace(
        type="npu", index=0
    )  # torch.device("npu") needs the real torch_npu
    assert flops_table.peak_flops(npu0, torch.bfloat16) == 376e12
    assert flops_table.peak_flops(npu0, torch.float32) is None


def test_cpu_is_chosen_without_accelerators(monkeypatch, no_gpu):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu raises ImportError
    assert D.device_type() == "cpu"
    assert D.backend_for("cpu") == "gloo"
    with pytest.raises(
        RuntimeError, match=r"training.device = 'npu' but no npu device is available"
    ):
        D.device_type("npu")
    with pytest.raises(
        ValueError, match=r"unknown device type 'tpu'; use auto or one of cuda, npu, xpu, cpu"
    ):
        D.device_type("tpu")


def test_the_accelerator_torch_reports_is_chosen_and_others_are_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setattr(
        torch.accelerator,
        "current_accelerator",
        lambda check_available=False: torch.device("cuda") if check_available else None,
    )
    assert (D.device_type(), D.device_type("cuda"), D.device_type("cpu")) == ("cuda", "cuda", "cpu")
    with pytest.raises(
        RuntimeError, match=r"training.device = 'xpu' but no xpu device is available"
    ):
        D.device_type("xpu")
    assert D.device_module("cuda") is torch.cuda


def test_backends():
    assert [D.backend_for(kind) for kind in ("cuda", "npu", "xpu", "cpu")] == [
        "nccl",
        "hccl",
        "xccl",
        "gloo",
    ]
    with pytest.raises(ValueError, match="'mps'"):
        D.backend_for("mps")


@pytest.mark.parametrize(
    "name, bf16, fp32, fp8",
    [  # names as torch.cuda.get_device_name reports them
        ("NVIDIA H100 80GB HBM3", 989e12, 67e12, 1979e12),  # SXM
        ("NVIDIA H100 PCIe", 756e12, 51e12, 1513e12),
        ("NVIDIA H100 NVL", 835.5e12, 60e12, 1670.5e12),
        ("NVIDIA H200", 989e12, 67e12, 1979e12),  # SXM
        ("NVIDIA H200 NVL", 835.5e12, 60e12, 1670.5e12),
        ("NVIDIA GH200 480GB", 989e12, 67e12, 1979e12),  # the H200 row: same GPU peaks
        ("NVIDIA B200", 2250e12, 75e12, 4500e12),
        ("NVIDIA A100-SXM4-80GB", 312e12, 19.5e12, None),  # no FP8 tensor cores
        ("NVIDIA A100 80GB PCIe", 312e12, 19.5e12, None),
        ("AMD Instinct MI300X", 1307.4e12, 163.4e12, 2614.9e12),
        (
            "NVIDIA H800",
            None,
            None,
            None,
        ),  # export variant, not in the table: n/a rather than H100's numbers
        ("NVIDIA GeForce RTX 4090", None, None, None),
    ],
)
def test_peak_flops_table(monkeypatch, name, bf16, fp32, fp8):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    cuda0 = torch.device("cuda", 0)
    assert (
        flops_table.peak_flops(cuda0, torch.bfloat16),
        flops_table.peak_flops(cuda0, torch.float32),
    ) == (bf16, fp32)
    assert flops_table.peak_flops(cuda0, torch.float16) == bf16
    assert flops_table.peak_flops(cuda0, torch.float64) is None
    assert flops_table.peak_flops(cuda0, torch.float8_e4m3fn) == fp8


def test_mixed_peak_runs_each_share_at_its_own_peak():
    # half the FLOPs at 2000, half at 1000: 1 FLOP takes 0.5/2000 + 0.5/1000 = 0.00075 s -> 1333.3
    # FLOP/s
    assert flops_table.mixed_peak_flops(1.0, 0.5, 1000.0, 2000.0) == pytest.approx(1000 / 0.75)
    assert flops_table.mixed_peak_flops(6.0, 0.0, 1000.0, None) == 1000.0
    assert flops_table.mixed_peak_flops(6.0, 6.0, 1000.0, 2000.0) == 2000.0
    assert flops_table.mixed_peak_flops(6.0, 3.0, 1000.0, None) is None
    with pytest.raises(ValueError, match="float8_flops"):
        flops_table.mixed_peak_flops(6.0, 7.0, 1000.0, 2000.0)


@pytest.mark.parametrize(
    "name, bf16",
    [
        ("Ascend910B2", 376e12),
        ("Ascend910B2C", 376e12),
        ("Ascend910B4", None),
        ("Ascend910B3", None),
    ],
)
def test_peak_flops_of_ascend_npus(fake_npu, name, bf16):
    fake_npu.get_device_name = lambda device=None: name
    npu0 = types.SimpleNamespace(
        type="npu", index=0
    )  # torch.device("npu") needs the real torch_npu
    assert (
        flops_table.peak_flops(npu0, torch.bfloat16),
        flops_table.peak_flops(npu0, torch.float16),
    ) == (bf16, bf16)
    assert flops_table.peak_flops(npu0, torch.float32) is None


def test_every_peak_flops_row_has_a_source():
    assert all(source and half > 0 for _, half, _, source in flops_table._PEAK_FLOPS)


def test_cpu_device_module_and_peak_memory():
    cpu = D.device_module("cpu")
    assert cpu.device_count() == 1
    cpu.synchronize()
    cpu.set_device(torch.device("cpu"))
    cpu.reset_peak_memory_stats()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = D.peak_memory_bytes(torch.device("cpu"))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert before <= peak <= after and peak > 10 * 2**20
    assert flops_table.peak_flops(torch.device("cpu"), torch.float32) is None


def test_init_distributed_without_torchrun_gives_a_one_rank_gloo_group(monkeypatch, no_gpu):
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    info = PG.init_distributed(parse_args(["--training.device=cpu"]))
    try:
        assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (0, 1, 0, 2)
        assert (info.device, info.backend, PG.uses_gloo(info)) == (
            torch.device("cpu"),
            "gloo",
            True,
        )
        assert tuple(info.dims.fsdp_mesh.shape) == (1,) and info.dims.fsdp_mesh.mesh_dim_names == (
            "dp_shard",
        )
        assert torch.get_num_threads() == max(1, len(os.sched_getaffinity(0)) // 2)
        summed = torch.tensor([1.5, 2.0])
        dist.all_reduce(summed)
        assert summed.tolist() == [1.5, 2.0]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mode", ["off", "layout"])
def test_cpu_threads_default_to_the_cores_per_process_and_to_one_in_layout_mode(
    monkeypatch, no_gpu, mode
):
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    PG.init_distributed(parse_args(["--training.device=cpu", f"--training.deterministic={mode}"]))
    try:
        cores = len(os.sched_getaffinity(0))
        assert cores > 1, "needs a machine of 2 or more cores to tell the defaults apart"
        assert torch.get_num_threads() == (1 if mode == "layout" else cores)
    finally:
        dist.destroy_process_group()


def test_init_distributed_rejects_a_shard_degree_other_than_the_world_before_starting(
    monkeypatch, no_gpu
):
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    config = parse_args(["--parallelism.data_parallel_shard_degree=2", "--training.num_threads=1"])
    with pytest.raises(
        RuntimeError,
        match=(
            r"data_parallel_shard_degree 2 .* = 2, not the world size 1; set "
            r"data_parallel_shard_degree = -1"
        ),
    ):
        PG.init_distributed(config)
    assert not dist.is_initialized()


def _accelerator_uses(path: Path) -> list[int]:
    """Lines of ``path`` whose code (not comments or strings) says ``torch.cuda``, ``torch.npu`` or
    ``torch.xpu``."""
    tokens = [
        tok
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE)
    ]
    return [
        a.start[0]
        for a, b, c in zip(tokens, tokens[1:], tokens[2:], strict=False)
        if (a.string, b.string) == ("torch", ".") and c.string in ("cuda", "npu", "xpu")
    ]


def test_no_module_calls_torch_cuda_directly():
    offenders = {}
    for root in ("torchtitan_lite", "models"):
        for path in sorted((REPO / root).rglob("*.py")):
            if _accelerator_uses(path):
                offenders[str(path.relative_to(REPO))] = _accelerator_uses(path)
    hint = (
        "use torch.accelerator or torchtitan_lite.distributed.devices instead of torch.cuda/npu/xpu"
    )
    assert offenders == {}, f"{hint} in {offenders}"
    assert _accelerator_uses(
        Path(__file__)
    )  # the scanner sees real uses: this file's fixtures patch torch.cuda
