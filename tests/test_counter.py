"""The counter-based generator (torchtitan_lite/init/counter.py) against outside references:
Random123's Philox known-answer vectors, exact integer products, libm's log, sqrt, sin and cos, and
the normal law (moments, KS on 10M draws, tail mass)."""

import math

import numpy as np
import torch
from scipy import stats

from torchtitan_lite.init import counter
from torchtitan_lite.init.keyed import InitKey
from torchtitan_lite.init.sampling import trunc_normal_


def _words(*values):
    return [torch.tensor([counter.as_word32(v)], dtype=torch.int32) for v in values]


def _random_words(n: int, seed: int = 0) -> torch.Tensor:
    """int64 32-bit words: the edges and ``n`` random ones."""
    edges = torch.tensor([0, 1, 2, 2**16 - 1, 2**16, 2**31 - 1, 2**31, 2**32 - 200, 2**32 - 1])
    return torch.cat(
        [edges, torch.randint(0, 2**32, (n,), generator=torch.Generator().manual_seed(seed))]
    )


def _as_int32(words: torch.Tensor) -> torch.Tensor:
    return ((words ^ 0x80000000) - 0x80000000).to(torch.int32)


def test_philox4x32_10_matches_random123_known_answers():
    """kat_vectors of Random123 (Salmon et al. 2011): philox4x32 with 10 rounds, in int32 words."""
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ]
    for ctr, key, expected in cases:
        out = counter.philox4x32(*_words(*ctr), *(w.view(()) for w in _words(*key)))
        assert all(w.dtype == torch.int32 for w in out)
        assert tuple(int(w) & 0xFFFFFFFF for w in out) == expected


def test_mulhilo_from_16_bit_partial_products_is_the_exact_64_bit_product():
    words = _random_words(2**18)
    for m in counter.PHILOX_M:
        hi, lo = counter.mulhilo(_as_int32(words), m)
        exact = [w * m for w in words.tolist()]
        assert [v & 0xFFFFFFFF for v in hi.tolist()] == [p >> 32 for p in exact]
        assert [v & 0xFFFFFFFF for v in lo.tolist()] == [p & 0xFFFFFFFF for p in exact]


def test_float32_log_sqrt_and_sincos_match_libm():
    """Relative error of ``ln u`` below 3e-7 where ``|ln u| > 1/2`` (absolute 2e-7 closer to 1,
    where float32 ``u`` rounds); ``sqrt`` below 3e-7 relative; ``sin``/``cos`` of the 25-bit angle
    below 2e-7."""
    words = _random_words(2**20)
    w32 = _as_int32(words)
    exact_log = torch.log((words.double() + 0.5) * 2.0**-32)
    err = (counter.log_uniform32(w32).double() - exact_log).abs()
    far = exact_log.abs() > 0.5
    assert (err[far] / exact_log[far].abs()).max() < 3e-7 and err[~far].max() < 2e-7
    uniform = torch.rand(2**20, generator=torch.Generator().manual_seed(0))
    x = torch.cat([torch.tensor([0.0, 1.2e-7, 1.0, 46.2]), 1e-7 + uniform * 46.2])
    exact_sqrt = x.double().sqrt()
    assert counter.sqrt32(x)[0] == 0
    assert ((counter.sqrt32(x)[1:].double() - exact_sqrt[1:]).abs() / exact_sqrt[1:]).max() < 3e-7
    angle = ((words >> 7).double() + 0.5) * 2.0**-25 * 2 * math.pi
    sin_t, cos_t = counter.sincos_turns32(w32)
    assert (sin_t.double() - angle.sin()).abs().max() < 2e-7 and (
        cos_t.double() - angle.cos()
    ).abs().max() < 2e-7


def test_float64_log_of_the_proposals_matches_libm_to_1e_12():
    words = _random_words(2**18)
    u = counter.unit_uniform(words)
    exact_log = torch.tensor([math.log(v) for v in u.tolist()], dtype=torch.float64)
    assert ((counter.log_word_uniform(words) - exact_log).abs() / exact_log.abs()).max() < 1e-12


def test_block_normals_have_the_moments_of_a_standard_normal_and_elements_see_the_same_values():
    n_blocks = 2**19
    scal = [torch.tensor(v, dtype=torch.int32) for v in (0, 11, 12, 13)]
    z = torch.stack(counter.block_normals(torch.arange(n_blocks), *scal), dim=1).view(
        -1
    )  # 2M values
    assert z.dtype == torch.float32
    se = 1 / math.sqrt(z.numel())
    assert abs(z.mean()) < 5 * se and abs(z.var() - 1) < 5 * math.sqrt(2) * se
    assert abs((z**4).mean() / z.var() ** 2 - 3) < 5 * math.sqrt(96) * se  # excess kurtosis 0
    index = torch.randint(0, z.numel(), (4096,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(counter.element_normals(index, *scal), z[index])
    other_attempt = counter.element_normals(index, torch.tensor(1, dtype=torch.int32), *scal[1:])
    assert not torch.equal(other_attempt, z[index])


def test_the_largest_reachable_normal_is_6_764():
    """``r`` is largest at the smallest uniform, ``u = 2**-33`` (word 0):
    ``sqrt(66 ln 2) = 6.7638``, reached at the angle of word 0 (``cos t`` just below 1)."""
    z_cos, _ = counter.box_muller(
        torch.tensor([0], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
    )
    assert abs(z_cos.item() - math.sqrt(66 * math.log(2))) < 1e-5
    r_second = counter.sqrt32(counter.log_uniform32(torch.tensor([1], dtype=torch.int32)) * -2.0)
    assert r_second.item() < z_cos.item()


def test_ten_million_normals_pass_ks_and_have_the_moments_and_tail_mass_of_theory():
    n = 10_000_000
    z = (
        trunc_normal_(torch.empty(n), 0.0, 1.0, -math.inf, math.inf, key=InitKey(0, "quality"))
        .double()
        .numpy()
    )
    assert stats.kstest(z, "norm").pvalue > 1e-3
    se = 1 / math.sqrt(n)
    assert abs(z.mean()) < 5 * se and abs(z.var() - 1) < 5 * math.sqrt(2) * se
    assert (
        abs(stats.skew(z)) < 5 * math.sqrt(6) * se
        and abs(stats.kurtosis(z)) < 5 * math.sqrt(24) * se
    )
    for k in (3.0, 4.0, 5.0):
        p = 2 * stats.norm.sf(k)
        assert abs(np.mean(np.abs(z) > k) - p) < 5 * math.sqrt(p * (1 - p) / n) + 1 / n, k
    assert np.abs(z).max() < 6.77
