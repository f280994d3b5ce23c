"""Keyed values of any box (torchtitan_lite/init/keyed.py, draw.py): a box filled alone holds
exactly the values of the whole tensor, and its kernels compute exactly its elements; on a 2 x 2
mesh, every DTensor placement gets the 1-process values."""

import numpy as np
import pytest
import torch
from dist_helpers import REPO, launch

from torchtitan_lite.init import counter, draw, sampling
from torchtitan_lite.init.keyed import InitKey, element_runs

KEY = InitKey(20261201, "layers.3.attention.wq.weight")
LAW = sampling._law(0.0, 0.02, -0.06, 0.06, torch.float32)


def _fill_box(shape, offset, size, computed=None):
    """The box ``offset`` + ``size`` of a tensor of global ``shape``, filled alone; ``computed`` (a
    list) receives the element count of every first-pass kernel call."""
    box = torch.empty(size)
    starts, length = element_runs(tuple(shape), tuple(size), tuple(offset))
    real = draw._call

    def spy(fn, compiled, chunk, x, attempt, *args, **static):
        if computed is not None and int(attempt) == 0:
            computed.append(x.numel() * (4 if fn is draw._normal_blocks else 1))
        return real(fn, compiled, chunk, x, attempt, *args, **static)

    draw._call = spy
    try:
        draw.fill_local(
            box.view(-1),
            starts,
            length,
            counter.stream_words(KEY.seed, KEY.digest),
            LAW,
            lambda v: v,
            compiled=False,
        )
    finally:
        draw._call = real
    return box


def _random_box(rng, shape):
    offset = [int(rng.integers(0, n)) for n in shape]
    size = [int(rng.integers(1, n - o + 1)) for n, o in zip(shape, offset, strict=True)]
    return tuple(offset), tuple(size)


@pytest.mark.parametrize(
    "shape", [(300, 700), (8, 40, 130), (2, 3, 37, 70), (5000,), (17, 1), (1, 3000), ()]
)
def test_every_box_holds_the_values_of_the_whole_tensor_and_computes_only_its_elements(shape):
    full = _fill_box(shape, (0,) * len(shape), shape)
    rng = np.random.default_rng(len(shape))
    for _ in range(20):
        offset, size = _random_box(rng, shape) if shape else ((), ())
        computed = []
        box = _fill_box(shape, offset, size, computed)
        assert torch.equal(
            box, full[tuple(slice(o, o + s) for o, s in zip(offset, size, strict=True))]
        ), (
            offset,
            size,
        )
        assert sum(computed) == box.numel(), (offset, size)


def test_whole_tensor_equals_the_public_keyed_trunc_normal():
    x = sampling.trunc_normal_(torch.empty(300, 700), 0.0, 0.02, -0.06, 0.06, key=KEY)
    assert torch.equal(x, _fill_box((300, 700), (0, 0), (300, 700)))
    assert x.abs().max() <= 0.06 and abs(x.std().item() / (0.02 * 0.98658) - 1) < 0.01


def test_runs_of_a_column_shard_are_its_rows():
    starts, length = element_runs((6, 8), (6, 4), (0, 4))
    assert (starts, length) == ([4, 12, 20, 28, 36, 44], 4)
    assert element_runs((6, 8), (3, 8), (3, 0)) == ([24], 24)  # a row shard is one run
    assert element_runs((2, 3, 4), (2, 1, 4), (0, 2, 0)) == ([8, 20], 4)


@pytest.mark.multiprocess
def test_dtensor_placements_on_a_2d_mesh_equal_the_one_process_init_and_draw_exactly_their_share():
    """Shard on either dim, Replicate, two shardings of one dim, a 3-D tensor, and TP + FSDP
    (_StridedShard): every rank's local values equal the 1-process ones, and it draws exactly its
    local elements."""
    results = launch(
        REPO / "tests" / "dist_placement_init_worker.py", nproc=4, timeout=180
    ).results()
    assert len(results) == 4
    cases = results[0]["cases"]
    assert "_StridedShard" in cases["fsdp_tp.0.weight"]["placements"]
    for name in cases:
        for r in results:
            case = r["cases"][name]
            assert case["equal"], (name, r["rank"])
            assert case["drawn"] == case["local"], (name, r["rank"], case)
