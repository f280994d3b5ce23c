"""Activation memory on any device, CPU included: bytes of the tensors an autograd step keeps alive.

A ``TorchDispatchMode`` sees every op inside its ``with`` block (forward, recomputes, backward) and
counts each NEW storage an op returns (views and in-place results share their input's) until it is
freed (``weakref.finalize``): activations, recomputes, temporaries, gradients, the loss; not the
parameters or the batch made before. CPUs have no allocator statistic and the RSS only grows;
``saved_tensors_hooks`` miss what a selective-checkpoint policy caches and the recompute peak (see
``docs/design.md``, "Activation memory: why count storages").
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class ActivationMemory(TorchDispatchMode):
    """Live and peak bytes of the tensor storages created inside
    ``with ActivationMemory() as mem:``.

    Attributes:
        live: bytes of the counted storages still alive now (int).
        peak: the largest ``live`` seen after any op (int, bytes).
        at_mark: ``live`` when :meth:`mark` was last called, e.g. right after the forward (int,
            bytes).

    Use it in eager mode: compiled regions allocate inside the compiled code (inductor), which the
    mode does not see op by op.
    """

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.at_mark = 0
        self._seen: weakref.WeakSet = weakref.WeakSet()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if _has_storage(t)}
        for t in tree_leaves(out):
            if _has_storage(t):
                storage = t.untyped_storage()
                if id(storage) not in inputs and storage not in self._seen:
                    self._seen.add(storage)
                    self.live += storage.nbytes()
                    weakref.finalize(storage, self._free, storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def mark(self) -> int:
        """Record and return the live bytes now (``at_mark``)."""
        self.at_mark = self.live
        return self.at_mark


def _has_storage(t: object) -> bool:
    """A plain dense tensor (wrapper subclasses such as DTensor have no storage of their own)."""
    return (
        isinstance(t, torch.Tensor)
        and type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
    )
