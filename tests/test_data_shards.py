"""Sets of prepared shards (``data/shards.py``): prepared on several machines, read by training as
one corpus."""

from __future__ import annotations

import shutil

import pytest
import test_data
import test_data_prepared as tdp
import torch

from torchtitan_lite.data import prepare, prepared
from torchtitan_lite.data.loader import build_dataloaders
from torchtitan_lite.data.shards import contiguous_range

toy_tokenizer = test_data.toy_tokenizer  # the word "k" is id k, the EOS id 0
cache = tdp.cache


def _prepare_shards(src, out, tokenizer_path, count, indices=None):
    for i in range(count) if indices is None else indices:
        argv = [
            "--input",
            str(src),
            "--output",
            str(out),
            "--tokenizer",
            tokenizer_path,
            "--workers",
            "0",
            "--num_shards",
            str(count),
            "--shard_index",
            str(i),
        ]
        assert prepare.main(argv) == 0
    return out


def _all_batches(path, tokenizer, world_size=1, steps=14):
    """Every rank's training batches (input_ids, labels, document_ids) for ``steps`` steps (more
    than an epoch), and the validation batches, of ``path`` read with document ids."""
    out = []
    for rank in range(world_size):
        loaders = build_dataloaders(
            validation=True,
            min_val_windows=8,
            dataset_path=str(path),
            tokenizer=tokenizer,
            seq_len=4,
            local_batch_size=8 // world_size,
            dp_rank=rank,
            dp_world_size=world_size,
            seed=5,
            documents=True,
        )
        it = iter(loaders.train)
        out.append(
            ([next(it) for _ in range(steps)], list(loaders.validation), loaders.describe(steps, 8))
        )
    return out


def _same(a, b):
    for (train_a, val_a, _), (train_b, val_b, _) in zip(a, b, strict=True):
        for x, y in zip(train_a + val_a, train_b + val_b, strict=True):
            assert all(torch.equal(u, v) for u, v in zip(x, y, strict=True))


@pytest.mark.parametrize("by", ["file", "document"])
def test_a_set_of_three_shards_gives_bitwise_the_batches_of_one_prepared_folder(
    toy_tokenizer, tmp_path, by
):
    docs = tdp._docs(40)  # 40 documents of 7-9 words: ~360 tokens
    if by == "file":  # 5 files of 8 documents: shards of 2, 2, 1 files
        src = tmp_path / "corpus"
        src.mkdir()
        for f in range(5):
            tdp._jsonl(src / f"part{f}.jsonl", docs[8 * f : 8 * f + 8])
    else:  # one file: shards of 14, 13, 13 documents
        src = tdp._jsonl(tmp_path / "corpus.jsonl", docs)
    one = tmp_path / "one"
    assert (
        prepare.main(
            [
                "--input",
                str(src),
                "--output",
                str(one),
                "--tokenizer",
                toy_tokenizer.path,
                "--workers",
                "0",
            ]
        )
        == 0
    )
    shards = _prepare_shards(src, tmp_path / "set", toy_tokenizer.path, 3)
    manifests = [prepared.Manifest.read(shards / f"shard-0000{i}-of-00003") for i in range(3)]
    expected = [contiguous_range(5 if by == "file" else 40, 3, i) for i in range(3)]
    assert [m.shard["by"] for m in manifests] == [by] * 3
    assert [tuple(m.shard["files" if by == "file" else "documents"]) for m in manifests] == expected
    assert sum(m.n_documents for m in manifests) == 40
    assert sum(m.n_tokens for m in manifests) == prepared.Manifest.read(one).n_tokens

    reference = _all_batches(one, toy_tokenizer)
    _same(_all_batches(shards, toy_tokenizer), reference)
    # windows cross the shards' boundaries, and the same global batches come on 2 ranks
    assert (
        reference[0][2].split(": ", 1)[1]
        == _all_batches(shards, toy_tokenizer)[0][2].split(": ", 1)[1]
    )
    _same(
        _all_batches(shards, toy_tokenizer, world_size=2),
        _all_batches(one, toy_tokenizer, world_size=2),
    )


def test_a_set_with_a_missing_shard_or_another_tokenizer_is_refused(
    toy_tokenizer, tmp_path, capsys
):
    src = tdp._jsonl(tmp_path / "corpus.jsonl", tdp._docs(12))
    shards = _prepare_shards(src, tmp_path / "set", toy_tokenizer.path, 3, indices=[0, 2])
    capsys.readouterr()
    assert prepare.main(["--verify", str(shards)]) == 2
    missing = (
        f"{shards} misses 1 of its 3 shards (shard-00001-of-00003 first); run prepare with "
        "--num_shards 3 --shard_index 1 (and each other missing index)"
    )
    assert capsys.readouterr().err.strip() == f"prepare error: {missing}"
    line = tdp._preflight_error(
        tmp_path,
        capsys,
        f"--training.dataset_path={shards}",
        f"--model.tokenizer_path={toy_tokenizer.path}",
        "--model.overrides.vocab_size=10000",
    )
    assert line == f"config error: training.dataset_path: {missing}"

    bundled = build_bundled_shard(src, shards)
    assert prepare.main(["--verify", str(shards)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"prepare error: {bundled} was prepared with tokenizer "
    ) and err.endswith(
        f"shard-00000-of-00003 with {toy_tokenizer.path} (sha256 "
        f"{prepared.tokenizer_identity(toy_tokenizer)['sha256'][:12]}, eos 0); prepare every shard "
        "with the same --tokenizer"
    ), err

    shutil.rmtree(bundled)
    _prepare_shards(src, shards, toy_tokenizer.path, 3, indices=[1])
    assert prepare.main(["--verify", str(shards)]) == 0
    assert (
        capsys.readouterr()
        .out.splitlines()[-1]
        .startswith(f"{shards}: 3 shards, each whole, 12 documents, ")
    )


def build_bundled_shard(src, shards):
    """Shard 1 of ``src`` prepared with the bundled tokenizer, its folder."""
    assert (
        prepare.main(
            [
                "--input",
                str(src),
                "--output",
                str(shards),
                "--workers",
                "0",
                "--num_shards",
                "3",
                "--shard_index",
                "1",
            ]
        )
        == 0
    )
    return shards / "shard-00001-of-00003"


def test_shard_arguments_are_checked_before_any_work(toy_tokenizer, tmp_path, capsys):
    src = tdp._jsonl(tmp_path / "corpus.jsonl", tdp._docs(2))
    base = [
        "--input",
        str(src),
        "--output",
        str(tmp_path / "set"),
        "--tokenizer",
        toy_tokenizer.path,
    ]
    for extra, expected in [
        (
            ["--num_shards", "3"],
            "--num_shards 3 needs --shard_index in 0..2, got None (on a Slurm array: "
            "--shard_index $SLURM_ARRAY_TASK_ID)",
        ),
        (
            ["--num_shards", "3", "--shard_index", "3"],
            "--num_shards 3 needs --shard_index in 0..2, got 3",
        ),
        (
            ["--num_shards", "3", "--shard_index", "0"],
            f"{src} holds 2 documents, fewer than --num_shards 3; use at most 2 shards",
        ),
    ]:
        assert prepare.main(base + extra) == 2
        assert capsys.readouterr().err.strip().startswith(f"prepare error: {expected}")
    assert not (tmp_path / "set" / "shard-00000-of-00003").exists()


def test_a_hub_dataset_is_split_by_its_files_into_the_stream_of_one_prepare(
    toy_tokenizer, tmp_path, capsys, monkeypatch
):
    import datasets

    files = [
        str(tdp._jsonl(tmp_path / f"part{f}.jsonl", tdp._docs(4, first=4 * f))) for f in range(4)
    ]
    load = datasets.load_dataset
    monkeypatch.setattr(
        prepare.datasets,
        "load_dataset",  # the hub dataset "org/corpus": these 4 files, streamed
        lambda name, config, split, streaming: load(
            "json", data_files=files, split="train", streaming=True
        ),
    )
    one = tmp_path / "one"
    assert (
        prepare.main(
            [
                "--input",
                "org/corpus",
                "--output",
                str(one),
                "--tokenizer",
                toy_tokenizer.path,
                "--workers",
                "0",
            ]
        )
        == 0
    )
    shards = _prepare_shards("org/corpus", tmp_path / "set", toy_tokenizer.path, 3)
    folders = [shards / f"shard-0000{i}-of-00003" for i in range(3)]
    assert [prepared.Manifest.read(f).n_documents for f in folders] == [8, 4, 4]  # files 2, 1, 1
    joined = b"".join((f / prepared.TOKENS).read_bytes() for f in folders)
    assert joined == (one / prepared.TOKENS).read_bytes()
    capsys.readouterr()
    assert (
        prepare.main(
            [
                "--input",
                "org/corpus",
                "--output",
                str(tmp_path / "set5"),
                "--tokenizer",
                toy_tokenizer.path,
                "--num_shards",
                "5",
                "--shard_index",
                "0",
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.strip() == (
        "prepare error: hub dataset org/corpus has 4 files, fewer than "
        "--num_shards 5; use at most 4 shards"
    )
