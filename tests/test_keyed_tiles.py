"""Keyed tiles (torchtitan_lite/init/keyed.py): any box of a tensor gets exactly the values of the whole tensor,
and filling a box draws only the tiles it overlaps."""

import numpy as np
import pytest
import torch
from dist_helpers import REPO, launch

from torchtitan_lite.init import keyed, sampling
from torchtitan_lite.init.keyed import InitKey, keyed_fill_local, tile_shape

KEY = InitKey(20261201, "layers.3.attention.wq.weight")
LAW = sampling._law(0.0, 0.02, -0.06, 0.06, torch.float32)


class _Counting(sampling.TileSampler):
    """The sampler of LAW, counting the elements of every tile it draws."""

    def __init__(self, counter):
        super().__init__(LAW)
        self.counter = counter

    def draw(self, buffer, n, generator):
        if self.counter is not None:
            self.counter.append(n)
        super().draw(buffer, n, generator)


def _fill_box(shape, offset, size, counter=None):
    """The box ``offset`` + ``size`` of a tensor of global ``shape``, filled alone; ``counter`` sums the drawn."""
    box = torch.empty(size)
    keyed_fill_local(box, shape, offset, KEY, torch.float32, _Counting(counter),
                     lambda t, v: sampling._write(t, v, -0.06, 0.06))
    return box


def _random_box(rng, shape):
    offset = [int(rng.integers(0, n)) for n in shape]
    size = [int(rng.integers(1, n - o + 1)) for n, o in zip(shape, offset)]
    return tuple(offset), tuple(size)


@pytest.mark.parametrize("shape", [(300, 700), (8, 40, 130), (2, 3, 37, 70), (5000,), (17, 1), (1, 3000), ()])
def test_every_box_holds_the_values_of_the_whole_tensor(shape):
    full = _fill_box(shape, (0,) * len(shape), shape)
    rng = np.random.default_rng(len(shape))
    for _ in range(20):
        offset, size = _random_box(rng, shape) if shape else ((), ())
        box = _fill_box(shape, offset, size)
        assert torch.equal(box, full[tuple(slice(o, o + s) for o, s in zip(offset, size))]), (offset, size)


def test_whole_tensor_equals_the_public_keyed_trunc_normal():
    x = sampling.trunc_normal_(torch.empty(300, 700), 0.0, 0.02, -0.06, 0.06, key=KEY)
    assert torch.equal(x, _fill_box((300, 700), (0, 0), (300, 700)))
    assert x.abs().max() <= 0.06 and abs(x.std().item() / (0.02 * 0.98658) - 1) < 0.01


def test_tiles_are_short_rows_and_a_quarter_of_the_columns_wide():
    assert tile_shape((4096, 4096)) == (32, 1024)
    assert tile_shape((5120, 25600)) == (32, 4096)  # capped at 4096 columns
    assert tile_shape((256, 256)) == (32, 64)
    assert tile_shape((128, 128)) == (32, 64)  # at least 64 columns
    assert tile_shape((8, 40, 130)) == (32, 64)  # leading dims: one grid each
    assert tile_shape((10, 30)) == (10, 30)  # clipped to the tensor
    assert tile_shape((5000,)) == (1, 1024) and tile_shape(()) == (1, 1)


@pytest.mark.parametrize("rows, cols, ways_r, ways_c", [(256, 256, 8, 4), (512, 1024, 16, 1), (4096, 512, 1, 4), (96, 192, 3, 1)])
def test_a_box_aligned_to_power_of_two_cuts_draws_exactly_its_elements(rows, cols, ways_r, ways_c):
    for i in range(ways_r):
        for j in range(ways_c):
            counter = []
            size = (rows // ways_r, cols // ways_c)
            _fill_box((rows, cols), (i * size[0], j * size[1]), size, counter)
            assert sum(counter) == size[0] * size[1]


def test_an_unaligned_box_draws_at_most_its_box_grown_to_tile_boundaries():
    shape = (255, 700)
    tile_r, tile_c = tile_shape(shape)
    rng = np.random.default_rng(3)
    for _ in range(30):
        offset, size = _random_box(rng, shape)
        counter = []
        _fill_box(shape, offset, size, counter)
        rows = min(shape[0], size[0] + 2 * (tile_r - 1))
        cols = min(shape[1], size[1] + 2 * (tile_c - 1))
        assert size[0] * size[1] <= sum(counter) <= rows * cols


def test_distinct_keys_and_tiles_give_distinct_generator_states():
    tiles = np.arange(1000)
    states = keyed.keyed_states(7, keyed.name_digest("w"), tiles)
    other_seed = keyed.keyed_states(8, keyed.name_digest("w"), tiles)
    other_name = keyed.keyed_states(7, keyed.name_digest("v"), tiles)
    rows = {bytes(s) for s in np.concatenate([states, other_seed, other_name])}
    assert len(rows) == 3000
    words = states[:, 24 : 24 + 624 * 8].view("<u8")
    assert (words[:, 7] == tiles).all() and (words[:, 8] == 0).all(), "the tile index is written verbatim"


@pytest.mark.multiprocess
def test_dtensor_placements_on_a_2d_mesh_equal_the_single_process_init_and_draw_their_share():
    """Shard on either dim, Replicate, two shardings of one dim, a 3-D tensor, and TP + FSDP (_StridedShard):
    every rank draws at most its box grown to tile boundaries (S0_S1: 300 x 260 cut off the tiles), exactly its
    box where the cuts fall on tile boundaries (all other cases)."""
    results = launch(REPO / "tests" / "dist_placement_init_worker.py", nproc=4, timeout=180).results()
    assert len(results) == 4
    cases = results[0]["cases"]
    assert "_StridedShard" in cases["fsdp_tp.0.weight"]["placements"]
    for name in cases:
        for r in results:
            case = r["cases"][name]
            assert case["equal"], (name, r["rank"])
            (*lead, rows, cols), (*_, rs, cs) = case["shape"], case["local_shape"]
            tile_r, tile_c = case["tile"]
            grown = min(rows, rs + 2 * (tile_r - 1)) * min(cols, cs + 2 * (tile_c - 1)) * int(np.prod(lead or [1]))
            assert case["local"] <= case["drawn"] <= grown, (name, r["rank"], case)
    exact = [name for name in cases if name != "S0_S1"]  # every cut but S0_S1's on tile boundaries
    assert all(r["cases"][name]["drawn"] == r["cases"][name]["local"] for r in results for name in exact)
