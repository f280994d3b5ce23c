"""The model fingerprint: one hash of all initial weights, the same for every world size and wrapping."""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from torchtitan_lite.init.apply import tensor_groups
from torchtitan_lite.init.report import _full_cpu


def model_fingerprint(model: nn.Module) -> str:
    """First 16 hex digits of the sha256 of every parameter and persistent buffer, full tensors.

    Tensors are hashed in canonical-name order (wrappers stripped, each tied tensor once, under all
    its names), with dtype and shape: equal on every rank and for every world size and wrapping.
    """
    digest = hashlib.sha256()
    for names, tensor in sorted(tensor_groups(model), key=lambda group: group[0]):
        full = _full_cpu(tensor)
        digest.update(f"{','.join(names)}|{full.dtype}|{tuple(full.shape)}\n".encode())
        digest.update(full.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]
