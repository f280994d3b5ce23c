"""RMSNorm (Zhang & Sennrich 2019, arXiv 1910.07467), as used by Qwen3, GPT-OSS and DeepSeek-V3."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """``y = x / sqrt(mean(x^2, -1) + eps) * weight``, computed in fp32 and cast back to ``x.dtype``.

    Args:
        dim: size of the last dimension of the input.
        eps: added to the mean square; 1e-6 in the Qwen3, GPT-OSS (1e-5) and DeepSeek-V3 configs.

    Shapes: ``x`` ``(..., dim)`` -> ``(..., dim)``. The weight (shape ``(dim,)``) is created
    uninitialized; the model's init plan sets it (normally to ones).
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)
