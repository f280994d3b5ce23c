"""Counting host-device syncs on CPU: every ``.item()``, ``bool()``, ``float()`` or ``.tolist()`` of
a tensor."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class HostReads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense`` calls (the op behind ``.item()`` and its relatives, and
    the one CUDA's sync debug mode reports) plus ``Tensor.tolist`` calls (which read memory
    directly).

    On a GPU each of them waits for the device; on CPU they cost nothing, so counting them is how a
    CPU test proves that a code path would not stall a GPU.
    """

    def __init__(self):
        super().__init__()
        self.count = 0
        self._tolist = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        original = self._tolist = torch.Tensor.tolist

        def counted(tensor):
            self.count += 1
            return original(tensor)

        torch.Tensor.tolist = counted
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)
