"""Sharded HF import on 2 ranks (``tests/dist_hf_worker.py``): under FSDP2 (the trainer's layout)
and with every parameter cut on its last dimension (a tensor-parallel-like ``Shard(1)``), the model
is bitwise the 1-process import, no init value is drawn, and each rank reads about half of the
files' bytes, though one tensor (the tied embedding) is larger than that half."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from ckpt_helpers import text_file
from dist_helpers import REPO, launch
from hf_published import scaled
from hf_reference import hf_model, ours_from_folder
from safetensors import safe_open

from torchtitan_lite.init.fingerprint import model_fingerprint

WORKER = REPO / "tests" / "dist_hf_worker.py"
BIG_VOCAB = 8192
"""Vocabulary of the tied Qwen3: its embedding is most of the checkpoint's bytes."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer_file):
    """name -> (folder, data file): a tied Qwen3-0.6B with a big embedding, and DeepSeek-V3 (experts
    per tensor, interleaved RoPE rows, the expert-score bias), scaled."""
    tmp = tmp_path_factory.mktemp("sharded")
    data = text_file(tmp, n_plays=1)
    out = {}
    for name, changes in (("Qwen3-0.6B", {"vocab_size": BIG_VOCAB}), ("DeepSeek-V3", {})):
        folder = tmp / name
        hf_model({**scaled(name), **changes}).save_pretrained(folder)
        if name == "DeepSeek-V3":  # the bundled tokenizer's 2048 ids do not fit its 512
            shutil.copy(tokenizer_file, folder / "tokenizer.json")
        out[name] = (folder, data)
    return out


def file_bytes(folder) -> tuple[int, int]:
    """``(bytes of all tensors, bytes of the largest)`` of the folder's safetensors."""
    sizes = []
    with safe_open(os.path.join(folder, "model.safetensors"), framework="pt") as handle:
        for name in handle.keys():
            tensor = handle.get_slice(name)
            sizes.append(
                torch.Size(tensor.get_shape()).numel() * 4
            )  # the reference is saved in fp32
    return sum(sizes), max(sizes)


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "name, layout", [("Qwen3-0.6B", "fsdp"), ("DeepSeek-V3", "fsdp"), ("DeepSeek-V3", "shard_last")]
)
def test_two_rank_import_is_bitwise_the_one_process_import_and_reads_only_each_share(
    folders, tmp_path, name, layout
):
    folder, data = folders[name]
    plain, _, _ = ours_from_folder(folder)
    from dist_hf_worker import digests

    expected = digests(plain)
    results = launch(
        WORKER,
        [layout, str(folder), str(tmp_path / "out"), f"--training.dataset_path={data}"],
        nproc=2,
        timeout=600,
    ).results()
    assert [r["rank"] for r in results] == [0, 1]
    assert results[0]["digests"] == expected
    assert all(r["draws"] == 0 and r["missing"] == [] for r in results)
    assert {r["fingerprint"] for r in results} == {model_fingerprint(plain)}
    total, largest = file_bytes(folder)
    shares = [r["bytes_read"] for r in results]
    print(f"{name} {layout}: bytes read per rank {shares} of {total} (largest tensor {largest})")
    assert sum(shares) >= total and all(s <= 0.56 * total for s in shares)
    if name == "Qwen3-0.6B":
        assert largest > 1.5 * max(
            shares
        )  # the embedding is well above a share: no rank read it whole
