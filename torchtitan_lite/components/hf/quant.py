"""Dequantizing the quantized tensors of published checkpoints while reading them by boxes.

Two formats are published for the families here (``config.json`` ``quantization_config``):
  * ``mxfp4`` (gpt-oss-20b/120b, the expert weights): ``X_blocks`` uint8 ``(*lead, rows, G, 16)``
    holds two FP4 (E2M1) codes per byte, low nibble first, for ``G`` blocks of 32 values;
    ``X_scales`` uint8 ``(*lead, rows, G)`` holds each block's E8M0 exponent, biased by 127. Value =
    ``FP4[code] * 2 ** (scale - 127)`` (OCP Microscaling Formats spec v1.0, sec. 5.3; transformers
    ``integrations/mxfp4.py`` ``convert_moe_packed_tensors``). The dequantized
    ``(*lead, rows, G * 32)`` is stored transposed in HF's parameter, so :func:`read_mxfp4` returns
    ``(*lead, G * 32, rows)`` boxes.
  * ``fp8`` (DeepSeek-V3, ``fmt: e4m3``, ``weight_block_size: [128, 128]``): ``X.weight``
    float8_e4m3fn ``(R, C)`` and ``X.weight_scale_inv`` fp32 ``(ceil(R / 128), ceil(C / 128))``;
    value = weight * scale_inv of its 128 x 128 block (DeepSeek-V3 ``inference/kernel.py``
    ``weight_dequant``; transformers ``integrations/finegrained_fp8.py``).
Both read only the blocks that overlap the requested box and return fp32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torchtitan_lite.protocols.hf_tensors import Box

FP4_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
"""The 16 E2M1 values by code (OCP MX spec v1.0, table 5)."""
MXFP4_BLOCK = 32
"""Values per MXFP4 scale block (OCP MX spec v1.0)."""

Read = Callable[[str, Box], torch.Tensor]


@dataclass(frozen=True)
class Quantization:
    """A checkpoint's quantization: ``method`` ``"mxfp4"`` or ``"fp8"``; ``block`` the FP8 weight
    block ``(rows, cols)``."""

    method: str
    block: tuple[int, int] = (128, 128)


def quantization(config: dict[str, Any]) -> Quantization | None:
    """The ``quantization_config`` of a ``config.json`` dict, checked key by key; ``None`` when
    there is none.

    Raises:
        ValueError: another method, an FP8 format other than e4m3, a malformed block size, or a key
            not known for the method.
    """
    quant = config.get("quantization_config")
    if quant is None:
        return None
    method = quant.get("quant_method")
    if method == "mxfp4":
        known = {
            "quant_method",
            "modules_to_not_convert",
        }  # the unquantized modules are read as stored
    elif method == "fp8":
        known = {
            "quant_method",
            "fmt",
            "weight_block_size",
            "activation_scheme",
        }  # activations: inference only
        if quant.get("fmt", "e4m3") != "e4m3":
            raise ValueError(
                f"quantization_config.fmt = {quant['fmt']!r}: only e4m3 FP8 is "
                "dequantized; convert the checkpoint to bf16 first"
            )
        block = quant.get("weight_block_size", [128, 128])
        if not (
            isinstance(block, list)
            and len(block) == 2
            and all(isinstance(b, int) and b > 0 for b in block)
        ):
            raise ValueError(
                f"quantization_config.weight_block_size = {block!r} is not two positive integers"
            )
    else:
        raise ValueError(
            f"quantization_config.quant_method = {method!r}: the loader "
            "dequantizes mxfp4 (gpt-oss) and fp8 (DeepSeek-V3) only; convert the checkpoint "
            "to bf16 first"
        )
    unknown = sorted(set(quant) - known)
    if unknown:
        raise ValueError(
            f"quantization_config.{unknown[0]} = {quant[unknown[0]]!r} is not "
            f"known for {method}; the loader cannot tell what it changes"
        )
    return Quantization(
        method, tuple(quant["weight_block_size"]) if "weight_block_size" in quant else (128, 128)
    )


def mxfp4_shape(blocks_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The HF parameter shape ``(*lead, G * 32, rows)`` of MXFP4 blocks ``(*lead, rows, G, 16)``."""
    *lead, rows, groups, _ = blocks_shape
    return (*lead, groups * MXFP4_BLOCK, rows)


def read_mxfp4(read: Read, name: str, box: Box) -> torch.Tensor:
    """The fp32 values of ``box`` of the HF parameter ``name`` (``(*lead, cols, rows)``, see the
    module docstring) from ``name + "_blocks"`` and ``name + "_scales"``, reading only the blocks
    the box overlaps."""
    *lead, (c0, c1), (r0, r1) = box
    g0, g1 = c0 // MXFP4_BLOCK, math.ceil(c1 / MXFP4_BLOCK)
    blocks = read(
        f"{name}_blocks", (*lead, (r0, r1), (g0, g1), (0, MXFP4_BLOCK // 2))
    )  # (*lead, rows, g, 16)
    scales = read(f"{name}_scales", (*lead, (r0, r1), (g0, g1)))  # (*lead, rows, g)
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    values = torch.stack(
        [lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]], dim=-1
    )  # (*lead, rows, g, 16, 2)
    values = values.flatten(-3)  # (*lead, rows, g * 32), low nibble first
    exponent = (scales.to(torch.int32) - 127).repeat_interleave(
        MXFP4_BLOCK, dim=-1
    )  # (*lead, rows, g * 32)
    values = torch.ldexp(values, exponent.float())
    return values[..., c0 - g0 * MXFP4_BLOCK : c1 - g0 * MXFP4_BLOCK].transpose(
        -1, -2
    )  # (*lead, cols, rows)


def read_fp8(read: Read, name: str, box: Box, block: tuple[int, int]) -> torch.Tensor:
    """The fp32 values of ``box`` of the 2-D FP8 weight ``name``, times ``name + "_scale_inv"`` per
    block."""
    (r0, r1), (c0, c1) = box
    (br, bc) = block
    weight = read(name, box).float()
    b0, b1, d0, d1 = r0 // br, math.ceil(r1 / br), c0 // bc, math.ceil(c1 / bc)
    scale = read(f"{name}_scale_inv", ((b0, b1), (d0, d1))).float()
    scale = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)
    return weight * scale[r0 - b0 * br : r1 - b0 * br, c0 - d0 * bc : c1 - d0 * bc]
