"""Dense peak FLOP/s of accelerators, for MFU: one datasheet per row."""

from __future__ import annotations

import torch

from torchtitan_lite.distributed.devices import device_module

# Dense (no 2:4 sparsity) peak throughput of one device: (substrings its name must contain, BF16/FP16 FLOP/s,
# FP32 FLOP/s or None where unpublished, source). The tensor-core BF16 and FP16 peaks are equal on every
# row; FP32 is the non-tensor (CUDA core / vector) peak, TF32 being off by default in PyTorch. First match
# wins, so variants come before their family. FP8 is left out: the trainer computes in bf16 or fp32.
_PEAK_FLOPS: tuple[tuple[tuple[str, ...], float, float | None, str], ...] = (
    (("H100", "NVL"), 835.5e12, 60e12, "NVIDIA H100 datasheet, H100 NVL: BF16 1671 TFLOPS with sparsity / 2, FP32 60"),
    (("H100", "PCIe"), 756e12, 51e12, "NVIDIA H100 datasheet, H100 PCIe: BF16 1513 TFLOPS with sparsity / 2, FP32 51"),
    (("H100",), 989e12, 67e12, "NVIDIA H100 datasheet, H100 SXM: BF16 1979 TFLOPS with sparsity / 2, FP32 67"),
    (("H200", "NVL"), 835.5e12, 60e12, "NVIDIA H200 datasheet, H200 NVL: BF16 1671 TFLOPS with sparsity / 2, FP32 60"),
    (("H200",), 989e12, 67e12, "NVIDIA H200 datasheet, H200 SXM: BF16 1979 TFLOPS with sparsity / 2, FP32 67 "
                               "(GH200 has the same GPU peaks)"),
    (("B200",), 2250e12, 75e12, "NVIDIA Blackwell datasheet, HGX B200 (1000 W): FP16/BF16 4.5 PFLOPS with "
                                "sparsity / 2, FP32 75 TFLOPS"),
    (("A100",), 312e12, 19.5e12, "NVIDIA A100 datasheet (SXM and PCIe): BF16 tensor 312 TFLOPS dense, FP32 19.5"),
    (("MI300X",), 1307.4e12, 163.4e12, "AMD Instinct MI300X datasheet: BF16 1307.4 TFLOPS dense, FP32 163.4"),
    (("910B2",), 376e12, None, "Ascend 910B2 (also 910B2C): 376 TFLOPS FP16 as commonly quoted; Huawei publishes "
                               "no per-chip datasheet figure, so MFU on NPU is approximate; other 910B "
                               "variants (B1, B3, B4) differ and are n/a"),
)


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Dense peak FLOP/s of one ``device`` computing in ``dtype``, for MFU; ``None`` = unknown ("n/a").

    ``bfloat16``/``float16`` use the tensor-core (cube) peak, ``float32`` the non-tensor FP32 peak (TF32
    is off by default in PyTorch). The device's name (``get_device_name``) is looked up in the table
    ``_PEAK_FLOPS`` of this module (one datasheet per row: H100 SXM/PCIe/NVL, H200 SXM/NVL, B200, A100,
    MI300X, Ascend 910B2). ``None`` for CPU, for devices not in the table, for a dtype the table has no
    figure for (fp32 on NPU), and for other dtypes (fp64, fp8), so MFU shows "n/a" rather than a wrong number.
    """
    if device.type == "cpu":
        return None
    name = device_module(device.type).get_device_name(device)
    for parts, half, single, _source in _PEAK_FLOPS:
        if all(part in name for part in parts):
            if dtype in (torch.bfloat16, torch.float16):
                return half
            return single if dtype == torch.float32 else None
    return None

