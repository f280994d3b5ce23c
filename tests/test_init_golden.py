"""Pinned init values (issue 32): the counter-based init gives known bits, the same on every host
CPU kernel and compiled or eager; any change of values fails here loudly."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from init_fingerprints import CONFIGS, REPO, fingerprint

from torchtitan_lite.init import counter, native
from torchtitan_lite.init.keyed import InitKey
from torchtitan_lite.init.sampling import trunc_normal_

GOLDEN = {
    "deepseek_v3_debug.toml": "e7a3529f244bd4f4",
    "gpt_oss_debug.toml": "fbfbecf207405721",
    "llama3_debug.toml": "7c081a222374db47",
    "qwen3_debug.toml": "9cd3f61dba0c9434",
    "qwen3_moe_debug.toml": "24e76a232e4e1ddf",
}
"""The fingerprint of every debug config's init (one process; every layout must print the same)."""


def test_every_debug_config_is_pinned():
    assert sorted(GOLDEN) == CONFIGS


@pytest.mark.parametrize("name", CONFIGS)
def test_debug_config_init_has_its_pinned_fingerprint(name):
    assert fingerprint(name)[0] == GOLDEN[name]


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_the_fingerprints_are_the_same_with_other_cpu_kernels(capability, tmp_path):
    """``ATEN_CPU_CAPABILITY=default`` makes torch run its scalar CPU kernels instead of
    AVX2/AVX-512 ones (whose ``normal_`` rounds differently) and builds the native init kernels
    without vector ISA flags (``avx2``: for AVX2); the counter-based init does not depend on them. A
    fresh kernel cache: each build is a new one."""
    if capability == "avx2" and "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("no AVX2 on this CPU")
    env = dict(
        os.environ,
        ATEN_CPU_CAPABILITY=capability,
        PYTHONPATH=f"{REPO}:{REPO / 'tests'}",
        TORCHTITAN_LITE_KERNEL_CACHE=str(tmp_path),
    )
    out = subprocess.run(
        [sys.executable, str(REPO / "tests" / "init_fingerprints.py")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.split("\n")
    assert {line.split()[0]: line.split()[1] for line in out if line.strip()} == GOLDEN


def test_first_values_of_a_keyed_tensor_are_pinned():
    """float32 bits of N(0, 1) truncated to +-2 under key (0, "w"); 9 elements: one run not a
    multiple of 4 long, drawn element by element, equal to the first 8 of a block-drawn run (also
    pinned: -1.9267102 first), by the native kernels and by eager torch ops."""
    bits = lambda t: [f"{v & 0xFFFFFFFF:08x}" for v in t.view(torch.int32).tolist()]  # noqa: E731
    for compiled in (None, False):
        assert bits(
            trunc_normal_(
                torch.empty(9), 0.0, 1.0, -2.0, 2.0, key=InitKey(0, "w"), compiled=compiled
            )
        ) == [
            "bff69e71",
            "be9e1cb9",
            "3eb7eeeb",
            "3fb79029",
            "3e94503e",
            "3f30c564",
            "3ebf35ab",
            "be2495c9",
            "bef81557",
        ]
        assert (
            bits(
                trunc_normal_(
                    torch.empty(8), 0.0, 1.0, -2.0, 2.0, key=InitKey(0, "w"), compiled=compiled
                )
            )[0]
            == "bff69e71"
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_native_kernels_give_the_eager_values_bitwise(dtype):
    """Blocks, elements (the redo of rejected ones and unaligned runs) and proposals: the native CPU
    kernels (as init_weights uses them) against eager torch ops, on 2 threads (the kernels split a
    chunk among threads)."""
    assert native.library() is not None
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for shape in ((300, 1024), (333, 1001)):
            for a, b in (
                (-2.0, 2.0),
                (-100.0, 100.0),
                (2.0, 4.0),
                (-0.5, 0.7),
                (-math.inf, math.inf),
            ):

                def draw_(c, shape=shape, a=a, b=b):
                    return trunc_normal_(
                        torch.empty(shape, dtype=dtype),
                        0.1,
                        0.9,
                        a,
                        b,
                        key=InitKey(3, "w"),
                        compiled=c,
                    )

                assert torch.equal(draw_(False), draw_(True)), (shape, a, b)
    finally:
        torch.set_num_threads(threads)


def test_compiled_kernels_give_the_eager_values_bitwise():
    """The torch ops of the keyed normals compiled by inductor (C++ here; the path of GPUs, as
    Triton there) with :data:`counter.EXACT_COMPILE_OPTIONS` against eager."""
    index = torch.arange(2**16, dtype=torch.int64) * 7919
    scal = [torch.tensor(v, dtype=torch.int32) for v in (5, 1, 2, 3)]
    eager = counter.element_normals(index, *scal)
    compiled = torch.compile(
        counter.element_normals, dynamic=False, options=counter.EXACT_COMPILE_OPTIONS
    )(index, *scal)
    assert torch.equal(eager, compiled)
