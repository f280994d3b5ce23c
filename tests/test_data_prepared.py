"""Prepared corpora: the format, the prepare command, the cache of raw text, the global batches and
resume on memory-mapped data, mixing, document starts, and the one-line errors of bad input."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from itertools import islice

import numpy as np
import pytest
import test_data
import torch

from torchtitan_lite.data import prepare, prepared
from torchtitan_lite.data.loader import build_dataloader, build_dataloaders
from torchtitan_lite.data.mixing import BLOCK, Mixture
from torchtitan_lite.data.sources import tokenize_documents
from torchtitan_lite.data.tokenizer import build_tokenizer
from torchtitan_lite.data.windows import document_ids
from torchtitan_lite.preflight.checks import load_run_or_exit

toy_tokenizer = (
    test_data.toy_tokenizer
)  # the word-level fixture: the word "k" is id k, the EOS id 0


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(prepared.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _docs(n_docs: int, length: int = 7, first: int = 0) -> list[str]:
    """Document d holds the words 100*d+1 .. 100*d+length (document lengths vary when ``length`` is
    a list)."""
    return [
        " ".join(str(100 * d + i) for i in range(1, length + 1 + d % 3))
        for d in range(first, first + n_docs)
    ]


def _jsonl(path, docs):
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def _prepare(tmp_path, tokenizer, docs, name="p", workers=0):
    src = _jsonl(tmp_path / f"{name}.jsonl", docs)
    argv = [
        "--input",
        str(src),
        "--output",
        str(tmp_path / name),
        "--tokenizer",
        tokenizer.path,
        "--workers",
        str(workers),
    ]
    assert prepare.main(argv) == 0
    return tmp_path / name


# --- format and equality with the in-memory stream
# -------------------------------------------------------


# split: (tokens, sha256 of the int32 stream the in-memory path of main@53678a8 tokenized)
PLAY_STREAMS = {
    "train": (1_759_944, "6c6a97b0d54a176ee343ed71539897715ad3612c5a90dc252ad6027d3ec7e6f9"),
    "validation": (36_778, "706f23cb097a47ff25695e6f33682c2853769eaaaaa945cad0816327fcdd8e0b"),
}


def test_prepared_plays_are_bitwise_todays_token_stream_and_windows(monkeypatch):
    monkeypatch.delenv(
        prepared.CACHE_ENV
    )  # the shared cache: other tests prepare the plays there too
    tok = build_tokenizer()
    for split, (n_tokens, sha256) in PLAY_STREAMS.items():
        loader = build_dataloader(
            dataset="shakespeare", tokenizer=tok, seq_len=256, local_batch_size=4, split=split
        )
        windows = loader.dataset.windows
        stream = windows.tokens.numpy().astype(np.int32)
        assert windows.tokens.dtype == torch.uint16 and stream.size == n_tokens
        assert hashlib.sha256(stream.tobytes()).hexdigest() == sha256
        x, y = windows[len(windows) - 1]
        last = torch.from_numpy(stream[(len(windows) - 1) * 256 : len(windows) * 256 + 1]).long()
        assert torch.equal(x, last[:-1]) and torch.equal(y, last[1:])


@pytest.mark.parametrize("workers", [0, 2])
def test_prepare_writes_tokens_document_starts_and_manifest(
    toy_tokenizer, tmp_path, workers, monkeypatch
):
    monkeypatch.setattr(prepared, "CHUNK_DOCUMENTS", 3)  # several chunks in flight
    docs = _docs(10)
    folder = _prepare(tmp_path, toy_tokenizer, docs, workers=workers)
    m = prepared.check_files(folder)
    expected = tokenize_documents(toy_tokenizer, docs)
    corpus = prepared.PreparedCorpus(folder)
    tokens = np.fromfile(corpus.tokens_path, dtype=np.uint16)
    assert (
        m.dtype == "uint16"
        and m.n_documents == 10
        and m.n_tokens == expected.numel() == 10 * 8 + 3 + 3 * 2
    )
    assert tokens.tolist() == expected.tolist()
    lengths = [8 + d % 3 for d in range(10)]  # words + EOS
    assert corpus.starts.tolist() == np.concatenate([[0], np.cumsum(lengths)[:-1]]).tolist()
    assert (
        m.max_token_id == 907
        and m.tokenizer["sha256"] == prepared.tokenizer_identity(toy_tokenizer)["sha256"]
    )
    assert m.sources == [
        {
            "path": str((tmp_path / "p.jsonl").resolve()),
            "size": (tmp_path / "p.jsonl").stat().st_size,
        }
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p", "p.jsonl"]  # no partial folder left
    umask = os.umask(0)
    os.umask(umask)
    assert (
        folder.stat().st_mode & 0o777 == 0o777 & ~umask
    )  # as a folder made with mkdir: readable by the group


def test_raw_files_are_prepared_once_into_the_cache_keyed_by_files_and_tokenizer(
    toy_tokenizer, tmp_path, cache
):
    path = _jsonl(tmp_path / "d.jsonl", _docs(12))
    kw = dict(dataset_path=str(path), tokenizer=toy_tokenizer, seq_len=4, local_batch_size=2)
    first = build_dataloader(**kw).dataset.windows
    (folder,) = cache.iterdir()
    mtime = (folder / prepared.TOKENS).stat().st_mtime_ns
    second = build_dataloader(**kw).dataset.windows
    assert (folder / prepared.TOKENS).stat().st_mtime_ns == mtime and len(
        list(cache.iterdir())
    ) == 1
    assert (first.tokens.numpy() == second.tokens.numpy()).all()
    _jsonl(path, _docs(13))  # another size: another key
    build_dataloader(**kw)
    assert len(list(cache.iterdir())) == 2


def test_document_starts_and_ids_of_a_window(toy_tokenizer, tmp_path):
    folder = _prepare(
        tmp_path, toy_tokenizer, _docs(4)
    )  # documents of 8, 9, 10, 8 tokens (EOS included)
    windows = build_dataloader(
        dataset_path=str(folder),
        tokenizer=toy_tokenizer,
        seq_len=6,
        local_batch_size=1,
        val_fraction=0.01,
    ).dataset.windows
    assert windows.document_starts(0).tolist() == [0]
    assert windows.document_starts(1).tolist() == [2]  # document 1 starts at token 8
    assert windows.document_starts(2).tolist() == [5]  # document 2 at token 17
    ids = document_ids(windows.document_starts(1), 6)
    assert ids.dtype == torch.int32 and ids.tolist() == [0, 0, 1, 1, 1, 1]
    assert document_ids(torch.tensor([0, 3], dtype=torch.int64), 5).tolist() == [0, 0, 0, 1, 1]


# --- the global window stream on prepared data
# -----------------------------------------------------------


def _global_batches(
    folder, tokenizer, world_size, local_batch, steps, global_batch, state=None, **kw
):
    """The windows of each step over all ranks, as rank-interleaved lists of first tokens (the
    global order)."""
    loaders = [
        build_dataloader(
            dataset_path=str(folder),
            tokenizer=tokenizer,
            seq_len=4,
            local_batch_size=local_batch,
            dp_rank=r,
            dp_world_size=world_size,
            seed=5,
            **kw,
        )
        for r in range(world_size)
    ]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
    its = [iter(loader) for loader in loaders]
    accum = global_batch // (local_batch * world_size)
    steps_out = []
    for _ in range(steps):
        per_rank = [[next(it)[0][:, 0].tolist() for _ in range(accum)] for it in its]
        steps_out.append(
            [w for a in range(accum) for r in range(world_size) for w in per_rank[r][a]]
        )
    return steps_out, loaders[0].state_dict()


def test_same_global_batches_for_one_to_four_ranks(toy_tokenizer, tmp_path):
    folder = _prepare(tmp_path, toy_tokenizer, _docs(30))  # 270 tokens: 66 training windows of 4
    reference, _ = _global_batches(folder, toy_tokenizer, 1, 12, 8, 12)  # crosses an epoch
    for world_size in (2, 3, 4):
        local = 12 // world_size // (2 if world_size == 2 else 1)
        got, _ = _global_batches(folder, toy_tokenizer, world_size, local, 8, 12)
        assert got == reference, world_size


def test_resume_mid_epoch_on_another_world_size_is_exact(toy_tokenizer, tmp_path):
    folder = _prepare(tmp_path, toy_tokenizer, _docs(30))
    reference, _ = _global_batches(folder, toy_tokenizer, 1, 12, 9, 12)
    first, state = _global_batches(folder, toy_tokenizer, 2, 3, 4, 12)
    assert state["dataset_state"]["windows_consumed"] == 48  # mid-epoch: 66 windows
    rest, _ = _global_batches(folder, toy_tokenizer, 3, 2, 5, 12, state=state)
    assert first + rest == reference


# --- mixing
# ---------------------------------------------------------------------------------------------


def test_mixture_pattern_is_exact_per_block_and_locates_every_position():
    mix = Mixture([0.7, 0.2, 0.1])
    assert mix.quotas == [700, 200, 100] and mix.counts(BLOCK) == mix.quotas
    seen = Counter()
    for g in range(2500):
        k, i = mix.locate(g)
        assert i == seen[k]  # each source's own stream is read in order, without gaps
        seen[k] += 1
    assert [seen[k] for k in range(3)] == mix.counts(2500) == [1750, 500, 250]
    assert Mixture([1, 1, 1]).quotas == [334, 333, 333]


def test_mixed_sources_proportions_resume_and_tokens_per_source(toy_tokenizer, tmp_path):
    a = _prepare(tmp_path, toy_tokenizer, _docs(30), name="a")  # ids below 3000
    b = _prepare(tmp_path, toy_tokenizer, _docs(20, first=50), name="b")  # ids from 5001
    kw = dict(
        dataset_paths=[str(a), str(b)],
        dataset_weights=[0.7, 0.3],
        tokenizer=toy_tokenizer,
        seq_len=4,
        seed=1,
    )

    def first_tokens(loader, n):
        """The largest input id of each window of the next ``n`` batches (source b's are above
        5000)."""
        return [int(t) for x, _ in islice(iter(loader), n) for t in x.max(dim=1).values]

    data = build_dataloaders(validation=True, min_val_windows=4, local_batch_size=2, **kw)
    tokens = first_tokens(data.train, 5000)  # 10,000 windows
    share_b = sum(t > 5000 for t in tokens) / len(tokens)
    assert abs(share_b - 0.3) < 0.01
    assert data.tokens_per_source(10_000 * 4) == {str(a): 7000 * 4, str(b): 3000 * 4}
    assert [len(w) for w in data.validation.dataset.windows.parts] == [
        2,
        2,
    ]  # each source's held-out end

    reference = first_tokens(build_dataloader(local_batch_size=2, **kw), 50)  # 100 windows
    two = [build_dataloader(local_batch_size=2, dp_rank=r, dp_world_size=2, **kw) for r in range(2)]
    its = [iter(loader) for loader in two]
    head = [int(t) for _ in range(20) for it in its for t in next(it)[0].max(dim=1).values]
    resumed = build_dataloader(local_batch_size=4, **kw)
    resumed.load_state_dict(two[1].state_dict())
    assert head + first_tokens(resumed, 5) == reference


# --- bad input: one line, exit 2
# -------------------------------------------------------------------------


def _preflight_error(tmp_path, capsys, *args) -> str:
    with pytest.raises(SystemExit) as exit_info:
        load_run_or_exit([f"--job.dump_folder={tmp_path / 'out'}", *args])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


def _edit_manifest(folder, **changes):
    path = folder / prepared.MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_bad_prepared_folders_fail_preflight_with_one_line(toy_tokenizer, tmp_path, capsys):
    bundled = build_tokenizer()
    folder = _prepare(tmp_path, toy_tokenizer, _docs(5))
    line = _preflight_error(tmp_path, capsys, f"--training.dataset_path={folder}")
    assert (
        line.startswith(
            f"config error: training.dataset_path: {folder / 'manifest.json'}: prepared with "
            f"tokenizer {toy_tokenizer.path}"
        )
        and "set model.tokenizer_path" in line
    )

    good = tmp_path / "good"
    _jsonl(tmp_path / "g.jsonl", ["to be or not to be"] * 3)
    assert (
        prepare.main(
            ["--input", str(tmp_path / "g.jsonl"), "--output", str(good), "--workers", "0"]
        )
        == 0
    )
    arg = f"--training.dataset_path={good}"
    load_run_or_exit([f"--job.dump_folder={tmp_path / 'out'}", arg])  # passes
    again = "prepare it again with python -m torchtitan_lite.data.prepare"
    cases = [
        (
            dict(max_token_id=5000),
            "token id 5000 exceeds the model's vocab_size 2048; set "
            "--model.overrides.vocab_size=5001 (or more)",
        ),
        (dict(max_token_id=70000), f"token ids up to 70000 do not fit dtype uint16; {again}"),
        (dict(n_tokens=0), "holds no tokens (empty input); prepare non-empty data"),
        (dict(n_tokens=10**6), f"the manifest says 2,000,000 (truncated or replaced); {again}"),
    ]
    original = (good / prepared.MANIFEST).read_text()
    for changes, expected in cases:
        _edit_manifest(good, **changes)
        line = _preflight_error(tmp_path, capsys, arg)
        assert line.startswith("config error: training.dataset_path: ") and expected in line, line
        (good / prepared.MANIFEST).write_text(original)
    (good / prepared.TOKENS).unlink()
    line = _preflight_error(tmp_path, capsys, arg)
    assert line == (
        f"config error: training.dataset_path: {good / prepared.TOKENS} is missing; prepare it "
        "again with python -m torchtitan_lite.data.prepare"
    )
    assert bundled.vocab_size == 2048


def test_bad_mixture_settings_fail_preflight(tmp_path, capsys):
    _jsonl(tmp_path / "a.jsonl", ["to be"] * 3)
    paths = f"--training.dataset_paths={tmp_path / 'a.jsonl'},{tmp_path / 'a.jsonl'}"
    line = _preflight_error(tmp_path, capsys, paths, "--training.dataset_weights=1")
    assert line == (
        "config error: training.dataset_weights: 1 weights for 2 dataset_paths; give one weight "
        "per path (or none for equal weights)"
    )
    line = _preflight_error(tmp_path, capsys, paths, "--training.dataset_weights=1,0")
    assert line.startswith(
        "config error: training.dataset_paths: training.dataset_weights [1.0, 0.0] must all be > 0"
    )


def test_prepare_refuses_empty_input_and_an_existing_output(toy_tokenizer, tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "x").write_text("kept")
    argv = [
        "--input",
        str(tmp_path / "empty.jsonl"),
        "--output",
        str(tmp_path / "out"),
        "--workers",
        "0",
    ]
    assert prepare.main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"prepare error: dataset_path {tmp_path / 'empty.jsonl'} holds no "
        "documents (its files are empty); point it at non-empty data"
    )
    assert prepare.main(argv[:3] + [str(tmp_path / "done")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"prepare error: --output {tmp_path / 'done'} exists; choose a new folder or delete it"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done", "empty.jsonl"]
    assert (tmp_path / "done" / "x").read_text() == "kept"


# --- prepare's worker count and progress lines
# --------------------------------------------------------------


def test_prepare_default_workers_follow_the_input_size_and_the_cpu_count():
    mib = 2**20
    per = prepare.BYTES_PER_WORKER // mib
    cases = [
        ((1 * mib, 2), 0),
        ((2 * per * mib, 2), 2),
        ((2 * per * mib - 1, 2), 0),
        ((10 * per * mib, 2), 2),
        ((3 * per * mib, 64), 3),
        ((per * mib, 64), 0),
        ((2**40, 64), 64),
        ((2**40, 1), 0),
        ((None, 8), 8),
    ]
    assert [prepare.default_workers(*args) for args, _ in cases] == [n for _, n in cases]


def test_prepare_says_its_worker_count_and_prints_a_line_per_ten_percent(
    toy_tokenizer, tmp_path, capsys, monkeypatch
):
    from torchtitan_lite.data import progress

    monkeypatch.setattr(progress, "LINES_AFTER_S", 0.0)  # as if the prepare were slow,
    monkeypatch.setattr(
        prepared, "MIN_CHUNK_CHARACTERS", 1
    )  # and large: chunks of 1/40 of the input
    docs = _docs(80, length=120)  # ~480 bytes each: the JSON keys are ~3% of the file
    _prepare_default = [
        "--input",
        str(_jsonl(tmp_path / "c.jsonl", docs)),
        "--output",
        str(tmp_path / "out"),
        "--tokenizer",
        toy_tokenizer.path,
    ]
    assert prepare.main(_prepare_default) == 0
    lines = capsys.readouterr().out.splitlines()
    size = (tmp_path / "c.jsonl").stat().st_size
    assert lines[0] == (
        f"prepare: encoding in this process (default for {size / 2**20:,.1f} MiB on "
        f"{prepare.available_cpus()} CPU{'s' * (prepare.available_cpus() > 1)}: one worker per 16 "
        "MiB, none below 2; --workers N to choose)"
    )
    bars = [line for line in lines if line.startswith("preparing: ")]
    percents = [int(line.split()[1].rstrip("%")) for line in bars]
    assert [p // 10 for p in percents[:-1]] == list(range(1, 10)), (
        bars
    )  # one line in each 10% of the file's bytes
    text_bytes = sum(len(d.encode()) for d in docs)
    assert bars[-1].startswith(f"preparing: 100% ({text_bytes:,} bytes), ") and bars[-1].endswith(
        " tokens/s"
    )
    assert lines[-1].startswith(f"{tmp_path / 'out'}: 80 documents, ")
