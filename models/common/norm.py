"""RMSNorm (Zhang & Sennrich 2019, arXiv 1910.07467), as used by Llama 3, Qwen3, GPT-OSS and
DeepSeek-V3."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x^2, -1) + eps) * weight`` through :func:`torch.nn.functional.rms_norm`:
    computed in fp32 and returned in ``x.dtype`` (torch's fused kernel upcasts bf16 inputs; with an
    fp32 weight on bf16 inputs, e.g. under autocast, both are upcast here).

    Args:
        dim: size of the last dimension of the input.
        eps: added to the mean square; 1e-6 in the Qwen3 and DeepSeek-V3 configs, 1e-5 in Llama 3's
            and GPT-OSS's.

    Shapes: ``x`` ``(..., dim)`` -> ``(..., dim)``. The weight (shape ``(dim,)``) is created
    uninitialized; the model's init plan sets it (normally to ones).
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype:
            return F.rms_norm(x.float(), self.weight.shape, self.weight.float(), self.eps).to(
                x.dtype
            )
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
