"""The init fingerprint: a sum mod 2**64 of per-element hashes of (tensor key, global index, value
bits)."""

import hashlib

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial
from torch.distributed.tensor.debug import CommDebugMode

from torchtitan_lite.init.fingerprint import model_fingerprint

MASK = 2**64 - 1


def _mix(z: int) -> int:
    """splitmix64's finalizer on Python ints (Vigna's splitmix64.c)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference_fingerprint(groups: list[tuple[tuple[str, ...], torch.Tensor]]) -> str:
    """The module docstring's formula element by element, in Python integers."""
    total = 0
    for names, tensor in groups:
        text = f"{','.join(names)}|{tensor.dtype}|{tuple(tensor.shape)}".encode()
        key = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
        ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[
            tensor.element_size()
        ]
        for index, bits in enumerate(tensor.detach().reshape(-1).view(ints).tolist()):
            total += _mix(_mix((key + index * 0x9E3779B97F4A7C15) & MASK) ^ (bits & MASK))
    return f"{total & MASK:016x}"


class Small(nn.Module):
    """fp32 and bf16 parameters, a tied pair, a 0-dim parameter and an int64 persistent buffer."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.tok_embeddings = nn.Embedding(5, 3)
        self.tok_embeddings.weight.data = torch.randn(5, 3, generator=gen)
        self.layers = nn.ModuleDict({"0": nn.Linear(3, 4)})
        self.layers["0"].weight.data = torch.randn(4, 3, generator=gen).bfloat16()
        self.layers["0"].bias.data = torch.randn(4, generator=gen)
        self.scale = nn.Parameter(torch.tensor(-0.5))
        self.output = nn.Linear(3, 5, bias=False)
        self.output.weight = self.tok_embeddings.weight
        self.register_buffer("tokens_per_expert", torch.tensor([3, -1, 2**40], dtype=torch.int64))


def test_fingerprint_is_the_sum_of_splitmix_element_hashes_mod_2_64():
    model = Small()
    groups = [
        (("output.weight", "tok_embeddings.weight"), model.tok_embeddings.weight),
        (("layers.0.weight",), model.layers["0"].weight),
        (("layers.0.bias",), model.layers["0"].bias),
        (("scale",), model.scale),
        (("tokens_per_expert",), model.tokens_per_expert),
    ]
    assert model_fingerprint(model) == reference_fingerprint(groups)


def test_one_flipped_bit_changes_the_fingerprint_and_flipping_it_back_restores_it():
    model = Small()
    before = model_fingerprint(model)
    bits = model.layers["0"].bias.data.view(torch.int32)
    bits[2] ^= 1  # the lowest mantissa bit of one element
    flipped = model_fingerprint(model)
    bits[2] ^= 1
    assert flipped != before == model_fingerprint(model)
    weight = model.tok_embeddings.weight.data
    weight[[0, 1]] = weight[[1, 0]]  # the same values at other indices
    assert model_fingerprint(model) != before


def test_checkpoint_and_compile_wrappers_leave_the_fingerprint_unchanged():
    model = Small()
    before = model_fingerprint(model)
    model.layers["0"] = checkpoint_wrapper(model.layers["0"])
    compiled = torch.compile(model, backend="eager")  # names gain _orig_mod. until the first call
    assert any(n.startswith("_orig_mod.") for n, _ in compiled.named_parameters())
    assert model_fingerprint(model) == model_fingerprint(compiled) == before


def test_a_sharded_model_is_fingerprinted_from_its_local_shards_without_a_collective_on_one_rank(
    monkeypatch, one_rank_group
):
    reference = model_fingerprint(Small())
    model = Small()
    fully_shard(
        model, ignored_params={model.scale}
    )  # FSDP2 takes no 0-dim parameter: it stays plain
    assert isinstance(model.layers["0"].weight, DTensor) and not isinstance(model.scale, DTensor)

    def no_gather(self, *args, **kwargs):
        raise AssertionError("full_tensor() called while fingerprinting")

    monkeypatch.setattr(DTensor, "full_tensor", no_gather)
    with CommDebugMode() as comms:
        fingerprint = model_fingerprint(model)
    assert {str(op): n for op, n in comms.get_comm_counts().items()} == {}
    assert fingerprint == reference


def test_a_meta_tensor_or_a_partial_placement_is_refused_naming_it(one_rank_group):
    meta = Small().to("meta")
    with pytest.raises(
        ValueError, match=r"^model_fingerprint: scale is on meta; materialize and initialize first$"
    ):
        model_fingerprint(meta)
    partial = nn.Module()
    partial.w = nn.Parameter(
        DTensor.from_local(torch.ones(3), init_device_mesh("cpu", (1,)), [Partial()])
    )
    with pytest.raises(
        ValueError, match=r"^model_fingerprint: unsupported DTensor placement P\(sum\)"
    ):
        model_fingerprint(partial)
