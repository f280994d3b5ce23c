"""Pinned init values (issue 32): the counter-based init gives known bits, the same on every host CPU kernel and
compiled or eager; any change of values fails here loudly."""

import os
import subprocess
import sys

import pytest
import torch
from init_fingerprints import CONFIGS, REPO, fingerprint

from torchtitan_lite.init import counter, draw
from torchtitan_lite.init.keyed import InitKey
from torchtitan_lite.init.sampling import trunc_normal_

GOLDEN = {
    "deepseek_v3_debug.toml": "827d25cae01f60f7",
    "gpt_oss_debug.toml": "865a00cf12493ef8",
    "llama3_debug.toml": "b3a2587d83941cb8",
    "qwen3_debug.toml": "637e0f1a874f99cd",
    "qwen3_moe_debug.toml": "133e717c3de2332b",
}
"""The fingerprint of every debug config's init (one process; every layout must print the same)."""


def test_every_debug_config_is_pinned():
    assert sorted(GOLDEN) == CONFIGS


@pytest.mark.parametrize("name", CONFIGS)
def test_debug_config_init_has_its_pinned_fingerprint(name):
    assert fingerprint(name)[0] == GOLDEN[name]


def test_the_fingerprints_are_the_same_with_torchs_scalar_cpu_kernels():
    """``ATEN_CPU_CAPABILITY=default`` makes torch run its scalar CPU kernels instead of AVX2/AVX-512 ones (whose
    ``normal_`` rounds differently); the counter-based init does not depend on them."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default", PYTHONPATH=f"{REPO}:{REPO / 'tests'}")
    out = subprocess.run([sys.executable, str(REPO / "tests" / "init_fingerprints.py")], env=env, capture_output=True,
                         text=True, check=True, timeout=300).stdout.split("\n")
    assert {line.split()[0]: line.split()[1] for line in out if line.strip()} == GOLDEN


def test_first_values_of_a_keyed_tensor_are_pinned():
    """float32 bits of N(0, 1) truncated to +-2 under key (0, "w"); 9 elements: one run not a multiple of 4 long,
    drawn element by element, equal to the first 8 of a block-drawn run (also pinned: -1.9267102 first)."""
    bits = lambda t: [f"{v & 0xFFFFFFFF:08x}" for v in t.view(torch.int32).tolist()]  # noqa: E731
    assert bits(trunc_normal_(torch.empty(9), 0.0, 1.0, -2.0, 2.0, key=InitKey(0, "w"))) == [
        "bff69e71", "be9e1cb9", "3eb7eeed", "3fb7902a", "3e94503f", "3f30c564", "3ebf35ae", "be2495c8", "bef81554"]
    assert bits(trunc_normal_(torch.empty(8), 0.0, 1.0, -2.0, 2.0, key=InitKey(0, "w")))[0] == "bff69e71"


def test_compiled_kernels_give_the_eager_values_bitwise():
    """Blocks, elements (the redo of rejected ones and unaligned runs) and proposals, compiled as init_weights
    compiles them for large models."""
    shape = (300, 1024)
    for a, b in ((-2.0, 2.0), (-100.0, 100.0), (2.0, 4.0)):
        eager = trunc_normal_(torch.empty(shape), 0.0, 1.0, a, b, key=InitKey(3, "w"), compiled=False)
        compiled = trunc_normal_(torch.empty(shape), 0.0, 1.0, a, b, key=InitKey(3, "w"), compiled=True)
        assert torch.equal(eager, compiled), (a, b)
    index = torch.arange(2**16, dtype=torch.int64) * 7919
    scal = [torch.tensor(v) for v in (5, 1, 2, 3)]
    eager = counter.element_normals(index, *scal)
    compiled = torch.compile(counter.element_normals, dynamic=False, options=counter.EXACT_COMPILE_OPTIONS)(index, *scal)
    assert torch.equal(eager, compiled)
    assert draw.compile_seconds() > 0
