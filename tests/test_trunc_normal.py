"""trunc_normal_: exact law (KS, chi-square on rounded dtypes, theory moments), bounds, bad
input."""

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from torchtitan_lite.init import sampling
from torchtitan_lite.init.keyed import InitKey
from torchtitan_lite.init.report import truncated_normal_moments
from torchtitan_lite.init.sampling import trunc_normal_

N = 2**20
REGIMES = [  # (mean, std, a, b): the acceptance regimes
    (0.0, 0.02, -2.0, 2.0),
    (0.0, 1.0, -3.0, 3.0),
    (0.0, 1.0, -2.0, 2.0),
    (0.0, 1.0, -1.0, 3.0),
    (0.0, 1.0, 2.0, 4.0),
]


def _draw(shape, mean, std, a, b, path, dtype=torch.float32, seed=0):
    x = torch.empty(shape, dtype=dtype)
    if path == "key":
        return trunc_normal_(x, mean, std, a, b, key=InitKey(seed, "layers.0.attention.wq.weight"))
    return trunc_normal_(x, mean, std, a, b, generator=torch.Generator().manual_seed(seed))


def _law(mean, std, a, b):
    return stats.truncnorm((a - mean) / std, (b - mean) / std, loc=mean, scale=std)


@pytest.mark.parametrize("path", ["generator", "key"])
@pytest.mark.parametrize("mean,std,a,b", REGIMES)
def test_fp32_matches_truncnorm_ks_and_moments(mean, std, a, b, path):
    x = _draw(N, mean, std, a, b, path).double().numpy()
    law = _law(mean, std, a, b)
    assert stats.kstest(x, law.cdf).pvalue > 1e-3
    assert abs(x.mean() - law.mean()) < 5 * law.std() / math.sqrt(N)
    assert abs(x.std() / law.std() - 1) < 0.005
    _, _, kurt = truncated_normal_moments((a - mean) / std, (b - mean) / std)
    assert abs(stats.kurtosis(x) - kurt) < 0.03
    assert x.min() >= a and x.max() <= b


def test_theory_std_factor_and_kurtosis_match_published_values():
    _, s3, k3 = truncated_normal_moments(-3, 3)
    _, s2, k2 = truncated_normal_moments(-2, 2)
    assert (round(s3, 5), round(k3, 4)) == (0.98658, -0.1711)
    assert (round(s2, 5), round(k2, 4)) == (0.87963, -0.6345)


@pytest.mark.parametrize(
    "cutoff,std_factor,kurtosis", [(3.0, 0.98658, -0.1711), (2.0, 0.87963, -0.6345)]
)
def test_measured_std_factor_and_kurtosis(cutoff, std_factor, kurtosis):
    x = _draw(N, 0.0, 1.0, -cutoff, cutoff, "generator").double().numpy()
    assert abs(x.std() - std_factor) < 0.002
    assert abs(stats.kurtosis(x) - kurtosis) < 0.02


def test_wide_bounds_put_nothing_on_the_bounds():
    x = _draw(N, 0.0, 1.0, -100.0, 100.0, "generator")
    assert int((x.abs() == 100.0).sum()) == 0
    assert x.abs().max() < 7.0


def _rounded_law_cells(law, a, b, dtype):
    """Representable values of ``dtype`` in [a, b] and the exact law's mass rounding onto each
    (the edge values also carry the mass that rounds outside [a, b] and is clamped onto them)."""
    lo, hi = sampling.inner_bounds(a, b, dtype)
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).double()
    values = torch.unique(bits[torch.isfinite(bits) & (bits >= lo) & (bits <= hi)]).numpy()
    edges = np.concatenate([[a], (values[1:] + values[:-1]) / 2, [b]])
    return values, np.diff(law.cdf(edges))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "mean,std,a,b", [(0.0, 0.02, -0.06, 0.06), (0.0, 1.0, -2.0, 2.0), (0.0, 1.0, 2.0, 4.0)]
)
def test_low_precision_follows_rounded_law_chi_square(mean, std, a, b, dtype):
    x = _draw(N, mean, std, a, b, "key", dtype=dtype).double().numpy()
    law = _law(mean, std, a, b)
    values, probs = _rounded_law_cells(law, a, b, dtype)
    index = np.searchsorted(values, x)
    assert np.array_equal(values[index], x), "every value is a representable value inside [a, b]"
    observed = np.bincount(index, minlength=len(values)).astype(float)
    expected = probs * N
    obs_pooled, exp_pooled, o, e = [], [], 0.0, 0.0  # pool adjacent cells to >= 20 expected
    for oi, ei in zip(observed, expected, strict=True):
        o, e = o + oi, e + ei
        if e >= 20:
            obs_pooled.append(o), exp_pooled.append(e)
            o = e = 0.0
    obs_pooled[-1] += o
    exp_pooled[-1] += e
    chi2 = sum((oo - ee) ** 2 / ee for oo, ee in zip(obs_pooled, exp_pooled, strict=True))
    assert stats.chi2.sf(chi2, len(exp_pooled) - 1) > 1e-3
    assert abs(x.mean() - law.mean()) < 0.05 * std
    assert abs(x.std() / law.std() - 1) < 0.05


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("path", ["generator", "key"])
def test_no_value_outside_bounds_after_cast(dtype, path):
    a, b = -0.0601, 0.0601  # not representable in any of these dtypes
    x = _draw(N // 4, 0.0, 0.02, a, b, path, dtype=dtype).double()
    assert x.min().item() >= a and x.max().item() <= b


def test_mean_far_outside_bounds_is_exact_in_the_tail():
    mean, std, a, b = 0.0, 1.0, 40.0, 41.0
    x = _draw(2**18, mean, std, a, b, "generator").double().numpy()
    law = _law(mean, std, a, b)
    assert stats.kstest(x, law.cdf).pvalue > 1e-3
    assert abs(x.mean() - law.mean()) < 5 * law.std() / math.sqrt(2**18)


def test_without_a_key_it_is_the_keyed_draw_seeded_by_the_generator():
    """One sampler: the generator's next int64 (as a 64-bit seed) keys the stream
    ``"trunc_normal_"``."""
    seed = torch.randint(
        -(2**63), 2**63 - 1, (), dtype=torch.int64, generator=torch.Generator().manual_seed(5)
    )
    keyed = trunc_normal_(
        torch.empty(300, 7), 0.0, 1.0, -2.0, 2.0, key=InitKey(int(seed) % 2**64, "trunc_normal_")
    )
    plain = trunc_normal_(
        torch.empty(300, 7), 0.0, 1.0, -2.0, 2.0, generator=torch.Generator().manual_seed(5)
    )
    assert torch.equal(plain, keyed)
    gen = torch.Generator().manual_seed(5)
    first, second = (trunc_normal_(torch.empty(300, 7), generator=gen) for _ in range(2))
    assert not torch.equal(first, second)


def test_tiny_std_stays_tiny():
    x = _draw(10_000, 0.0, 1e-10, -2.0, 2.0, "generator")
    assert x.abs().max().item() < 1e-8
    assert 0.5e-10 < x.std().item() < 2e-10


def test_leaf_parameter_requiring_grad_outside_no_grad_returns_same_object():
    p = nn.Parameter(torch.empty(64, 32))
    out = trunc_normal_(p, std=0.02, a=-0.04, b=0.04)
    assert out is p and p.requires_grad and p.grad_fn is None
    assert p.abs().max().item() <= 0.04 and p.std().item() > 0.01


def test_meta_tensor_is_a_no_op():
    t = torch.empty(3, 4, device="meta")
    assert trunc_normal_(t) is t and t.device.type == "meta"


def test_non_contiguous_tensor_is_filled_in_logical_order():
    t = torch.full((40, 30), math.nan).t()
    trunc_normal_(t, key=InitKey(3, "w"))
    reference = trunc_normal_(torch.empty(30, 40), key=InitKey(3, "w"))
    assert torch.equal(t, reference)


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(std=0.0), "std must be > 0, got 0.0"),
        (dict(std=-1.0), "std must be > 0, got -1.0"),
        (dict(std=math.inf), "std must be finite, got inf"),
        (dict(std=math.nan), "std must be finite, got nan"),
        (dict(mean=math.nan), "mean must be finite, got nan"),
        (dict(a=1.0, b=1.0), "need a < b, got a=1.0, b=1.0"),
        (dict(a=2.0, b=-2.0), "need a < b, got a=2.0, b=-2.0"),
        (dict(a=math.nan), "bound a is NaN"),
        (dict(b=math.nan), "bound b is NaN"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        trunc_normal_(torch.empty(4), **kwargs)


def test_dtype_without_representable_value_in_bounds_raises():
    with pytest.raises(ValueError, match="torch.bfloat16 has no representable value in"):
        trunc_normal_(torch.empty(4, dtype=torch.bfloat16), mean=1.0, std=1e-4, a=1.0001, b=1.0002)
    with pytest.raises(ValueError, match="must be floating point, got torch.int64"):
        trunc_normal_(torch.zeros(4, dtype=torch.int64))


def test_bad_key_seed_raises():
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*64\), got -1"):
        InitKey(-1, "w")


KEYED_N = 3 * 2**20 + 5  # several chunks, and a length that is not a multiple of 4


def test_keyed_values_depend_only_on_key_and_index():
    a = trunc_normal_(torch.empty(KEYED_N), key=InitKey(7, "w"))
    b = trunc_normal_(torch.empty(KEYED_N), key=InitKey(7, "w"))
    c = trunc_normal_(torch.empty(KEYED_N), key=InitKey(8, "w"))
    d = trunc_normal_(torch.empty(KEYED_N), key=InitKey(7, "v"))
    assert torch.equal(a, b)
    assert not torch.equal(a[:100], c[:100]) and not torch.equal(a[:100], d[:100])
    bf16 = trunc_normal_(torch.empty(KEYED_N, dtype=torch.bfloat16), key=InitKey(7, "w"))
    assert torch.equal(
        bf16, a.to(torch.bfloat16).clamp(*sampling.inner_bounds(-2.0, 2.0, torch.bfloat16))
    )


def test_the_public_import_is_the_exact_sampler_and_fills_in_place():
    from torchtitan_lite import init

    assert (
        init.trunc_normal_ is trunc_normal_
        and init.InitKey is InitKey
        and sorted(init.__all__) == ["InitKey", "trunc_normal_"]
    )
    weight = nn.Parameter(torch.empty(512, 512))
    out = init.trunc_normal_(
        weight, 0.0, 1.0, -2.0, 2.0, generator=torch.Generator().manual_seed(0)
    )
    assert out is weight and weight.requires_grad
    law = _law(0.0, 1.0, -2.0, 2.0)
    x = weight.detach().double()
    assert -2.0 <= x.min() and x.max() <= 2.0
    assert abs(x.std().item() - law.std()) < 4 * law.std() / math.sqrt(
        2 * x.numel()
    )  # 0.8796, 4 standard errors
    with pytest.raises(AttributeError, match="no attribute 'normal_'"):
        init.normal_  # noqa: B018
