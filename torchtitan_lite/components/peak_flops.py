"""Dense peak FLOP/s of accelerators, for MFU: one datasheet per row."""

from __future__ import annotations

import torch

from torchtitan_lite.distributed.devices import device_module

# Dense (no 2:4 sparsity) peak throughput of one device: (substrings its name must contain,
# BF16/FP16 FLOP/s,
# FP32 FLOP/s or None where unpublished, source). The tensor-core BF16 and FP16 peaks are equal on
# every
# row; FP32 is the non-tensor (CUDA core / vector) peak, TF32 being off by default in PyTorch. First
# match
# wins, so variants come before their family. FP8 (e4m3, dense) is in _FP8_PEAK_FLOPS, keyed like
# this table.
_PEAK_FLOPS: tuple[tuple[tuple[str, ...], float, float | None, str], ...] = (
    (
        ("H100", "NVL"),
        835.5e12,
        60e12,
        "NVIDIA H100 datasheet, H100 NVL: BF16 1671 TFLOPS with sparsity / 2, FP32 60",
    ),
    (
        ("H100", "PCIe"),
        756e12,
        51e12,
        "NVIDIA H100 datasheet, H100 PCIe: BF16 1513 TFLOPS with sparsity / 2, FP32 51",
    ),
    (
        ("H100",),
        989e12,
        67e12,
        "NVIDIA H100 datasheet, H100 SXM: BF16 1979 TFLOPS with sparsity / 2, FP32 67",
    ),
    (
        ("H200", "NVL"),
        835.5e12,
        60e12,
        "NVIDIA H200 datasheet, H200 NVL: BF16 1671 TFLOPS with sparsity / 2, FP32 60",
    ),
    (
        ("H200",),
        989e12,
        67e12,
        "NVIDIA H200 datasheet, H200 SXM: BF16 1979 TFLOPS with sparsity / 2, FP32 67 "
        "(GH200 has the same GPU peaks)",
    ),
    (
        ("B200",),
        2250e12,
        75e12,
        "NVIDIA Blackwell datasheet, HGX B200 (1000 W): FP16/BF16 4.5 PFLOPS with "
        "sparsity / 2, FP32 75 TFLOPS",
    ),
    (
        ("A100",),
        312e12,
        19.5e12,
        "NVIDIA A100 datasheet (SXM and PCIe): BF16 tensor 312 TFLOPS dense, FP32 19.5",
    ),
    (
        ("MI300X",),
        1307.4e12,
        163.4e12,
        "AMD Instinct MI300X datasheet: BF16 1307.4 TFLOPS dense, FP32 163.4",
    ),
    (
        ("910B2",),
        376e12,
        None,
        "Ascend 910B2 (also 910B2C): 376 TFLOPS FP16 as commonly quoted; Huawei publishes "
        "no per-chip datasheet figure, so MFU on NPU is approximate; other 910B "
        "variants (B1, B3, B4) differ and are n/a",
    ),
)

# Dense FP8 tensor-core peak of the rows above that have one (the same datasheets: the FP8 figure
# with sparsity / 2;
# A100 and the Ascend 910B have no FP8 tensor cores).
_FP8_PEAK_FLOPS: dict[tuple[str, ...], float] = {
    ("H100", "NVL"): 1670.5e12,
    ("H100", "PCIe"): 1513e12,
    ("H100",): 1979e12,
    ("H200", "NVL"): 1670.5e12,
    ("H200",): 1979e12,
    ("B200",): 4500e12,
    ("MI300X",): 2614.9e12,
}


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Dense peak FLOP/s of one ``device`` computing in ``dtype``, for MFU; ``None`` = unknown
    ("n/a").

    ``bfloat16``/``float16`` use the tensor-core (cube) peak, ``float32`` the non-tensor FP32 peak
    (TF32 is off by default in PyTorch). The device's name (``get_device_name``) is looked up in the
    table ``_PEAK_FLOPS`` of this module (one datasheet per row: H100 SXM/PCIe/NVL, H200 SXM/NVL,
    B200, A100, MI300X, Ascend 910B2); ``float8_e4m3fn`` the FP8 tensor-core peak
    (``_FP8_PEAK_FLOPS``). ``None`` for CPU, for devices not in the table, for a dtype the table has
    no figure for (fp32 on NPU, fp8 on A100), and for other dtypes (fp64), so MFU shows "n/a" rather
    than a wrong number.
    """
    if device.type == "cpu":
        return None
    name = device_module(device.type).get_device_name(device)
    for parts, half, single, _source in _PEAK_FLOPS:
        if all(part in name for part in parts):
            if dtype in (torch.bfloat16, torch.float16):
                return half
            if dtype == torch.float8_e4m3fn:
                return _FP8_PEAK_FLOPS.get(parts)
            return single if dtype == torch.float32 else None
    return None


def mixed_peak_flops(
    total_flops: float, float8_flops: float, peak: float | None, float8_peak: float | None
) -> float | None:
    """The peak FLOP/s of a step whose ``float8_flops`` of ``total_flops`` (any unit, per token) run
    at ``float8_peak`` and the rest at ``peak``: ``total / (float8 / float8_peak + rest / peak)``,
    the rate of a step that ran each share at its own peak (so MFU 100% means both kinds of matmul
    at their peaks). ``peak`` when ``float8_flops`` is 0; ``None`` when a needed peak is unknown.

    Raises:
        ValueError: ``float8_flops`` outside ``[0, total_flops]``.
    """
    if not 0 <= float8_flops <= total_flops:
        raise ValueError(
            f"mixed_peak_flops: float8_flops {float8_flops} must lie in [0, total_flops = "
            f"{total_flops}]"
        )
    if float8_flops == 0 or peak is None:
        return peak
    if float8_peak is None:
        return None
    return total_flops / (float8_flops / float8_peak + (total_flops - float8_flops) / peak)
