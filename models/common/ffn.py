"""SwiGLU feed-forward network (Shazeer 2020, "GLU Variants Improve Transformer", arXiv
2002.05202)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FeedForward(nn.Module):
    """``w2(silu(w1(x)) * w3(x))``, no biases (Llama / Qwen3 MLP; HF ``gate_proj``=w1,
    ``up_proj``=w3, ``down_proj``=w2).

    Args:
        dim: model width (input and output size).
        hidden_dim: inner width (HF ``intermediate_size``).

    Shapes: ``x`` ``(..., dim)`` -> ``(..., dim)``. Weights ``w1, w3``: ``(hidden_dim, dim)``,
    ``w2``: ``(dim, hidden_dim)``, created uninitialized (the model's init plan sets them).
    """

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
