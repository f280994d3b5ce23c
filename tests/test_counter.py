"""The counter-based generator (torchtitan_lite/init/counter.py) against outside references: Random123's Philox
known-answer vectors, and libm's log, sin and cos."""

import math

import torch

from torchtitan_lite.init import counter


def _words(*values):
    return [torch.tensor([v], dtype=torch.int64) for v in values]


def test_philox4x32_10_matches_random123_known_answers():
    """kat_vectors of Random123 (Salmon et al. 2011): philox4x32 with 10 rounds."""
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for ctr, key, expected in cases:
        out = counter.philox4x32(*_words(*ctr), torch.tensor(key[0]), torch.tensor(key[1]))
        assert tuple(int(w) for w in out) == expected


def test_log_and_sincos_match_libm_to_1e_12():
    words = torch.cat([torch.tensor([0, 1, 2**31, 2**32 - 1]), torch.randint(0, 2**32, (2**18,),
                                                                           generator=torch.Generator().manual_seed(0))])
    u = counter.unit_uniform(words)
    exact_log = torch.tensor([math.log(v) for v in u.tolist()], dtype=torch.float64)
    assert ((counter.log_word_uniform(words) - exact_log).abs() / exact_log.abs()).max() < 1e-12
    angle = [2 * math.pi * (w + 0.5) / 2**32 for w in words.tolist()]
    sin_t, cos_t = counter.sincos_2pi_turns(words)
    assert (sin_t - torch.tensor([math.sin(a) for a in angle], dtype=torch.float64)).abs().max() < 1e-12
    assert (cos_t - torch.tensor([math.cos(a) for a in angle], dtype=torch.float64)).abs().max() < 1e-12


def test_sqrt_matches_libm_to_1e_15_and_compiled_code_gives_the_eager_bits():
    x = torch.cat([torch.tensor([1.2e-10, 1.0, 2.0, 46.0], dtype=torch.float64),
                   torch.rand(2**16, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 46])
    exact = torch.tensor([math.sqrt(v) for v in x.tolist()], dtype=torch.float64)
    ours = counter.sqrt_positive(x)
    assert ((ours - exact).abs() / exact).max() < 1e-15
    compiled = torch.compile(counter.sqrt_positive, dynamic=False, options=counter.EXACT_COMPILE_OPTIONS)(x)
    assert torch.equal(ours, compiled)


def test_block_normals_have_the_moments_of_a_standard_normal_and_elements_see_the_same_values():
    n_blocks = 2**19
    scal = [torch.tensor(v) for v in (0, 11, 12, 13)]
    z = torch.stack(counter.block_normals(torch.arange(n_blocks), *scal), dim=1).view(-1)  # 2M values
    se = 1 / math.sqrt(z.numel())
    assert abs(z.mean()) < 5 * se and abs(z.var() - 1) < 5 * math.sqrt(2) * se
    assert abs((z**4).mean() / z.var() ** 2 - 3) < 5 * math.sqrt(96) * se  # excess kurtosis 0
    assert z.abs().max() < 6.8  # r = sqrt(-2 ln u) with u >= 2**-33
    index = torch.randint(0, z.numel(), (4096,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(counter.element_normals(index, *scal), z[index])
    other_attempt = counter.element_normals(index, torch.tensor(1), *scal[1:])
    assert not torch.equal(other_attempt, z[index])
