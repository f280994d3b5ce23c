"""Tests of the Shakespeare corpus, packing, rank slicing, resume and local loading."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import datasets
import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from torchtitan_lite.data.corpus import VALIDATION_PLAY, markdown_to_text, shakespeare_plays
from torchtitan_lite.data.loader import DataLoaders, SplitSize, build_dataloader
from torchtitan_lite.data.sources import tokenize_documents
from torchtitan_lite.data.streams import GlobalWindowStream, OrderedWindows, StreamingWindows
from torchtitan_lite.data.tokenizer import Tokenizer, build_tokenizer
from torchtitan_lite.data.windows import PackedWindows
from torchtitan_lite.errors import InputError


@pytest.fixture(scope="module")
def toy_tokenizer(tmp_path_factory) -> Tokenizer:
    """Word-level: the word ``"k"`` (k = 1..9999) is id k; ``<|endoftext|>`` is id 0."""
    vocab = {"<|endoftext|>": 0, **{str(k): k for k in range(1, 10_000)}}
    tok = HFTokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path_factory.mktemp("tok") / "toy.json"
    tok.save(str(path))
    return Tokenizer(path)


def _docs(n_docs: int = 10, length: int = 7) -> list[str]:
    """Document d holds the words 100*d+1 .. 100*d+length (distinct ids across documents)."""
    return [" ".join(str(100 * d + i) for i in range(1, length + 1)) for d in range(n_docs)]


def _write_jsonl(path: Path, docs: list[str], column: str = "text") -> Path:
    path.write_text("".join(json.dumps({column: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def _local_loader(tokenizer, path, **kw):
    args = dict(dataset_path=str(path), tokenizer=tokenizer, seq_len=4, local_batch_size=2, seed=3)
    return build_dataloader(**{**args, **kw})


def _windows(batches) -> list[tuple[int, ...]]:
    """Each sequence of each ``(input_ids, labels)`` batch as a hashable tuple of its seq_len+1
    tokens."""
    return [
        tuple(x.tolist()) + (y[-1].item(),) for x, y in batches for x, y in zip(x, y, strict=True)
    ]


# --- corpus -------------------------------------------------------------------------------------


def test_markdown_to_text_snippet():
    markdown = (
        "# The Tempest\n\n## ACT I\n\n### SCENE I. On a ship at sea.\n\n"
        "_Enter a Master and a Boatswain_\n\n**Master**  \nBoatswain!  \nfall to't, yarely,\n\n"
        "__\\[Aside]_  \n*Exeunt lords.*\n'I would request you,'\\--or 1\\. _Enter TITANIA, "
        "with\nhers_\n"
    )
    assert markdown_to_text(markdown) == (
        "The Tempest\n\nACT I\n\nSCENE I. On a ship at sea.\n\n"
        "Enter a Master and a Boatswain\n\nMaster\nBoatswain!\nfall to't, yarely,\n\n"
        "[Aside]\nExeunt lords.\n'I would request you,'--or 1. Enter TITANIA, with\nhers"
    )


def test_corpus_has_37_train_plays_and_the_held_out_one():
    train, validation = shakespeare_plays("train"), shakespeare_plays("validation")
    assert len(train) == 37 and [n for n, _ in validation] == [VALIDATION_PLAY]
    assert VALIDATION_PLAY not in {n for n, _ in train}
    assert sum(len(t) for _, t in train) == 4_860_319
    assert sum(len(t) for _, t in validation) == 95_944
    text = "".join(t for _, t in train)
    assert "**" not in text and "_" not in text and "\\" not in text and "\n#" not in text


# --- packing ------------------------------------------------------------------------------------


def test_packing_joins_documents_with_eos_and_cuts_overlapping_windows(toy_tokenizer):
    tokens = tokenize_documents(toy_tokenizer, ["1 2 3", "4 5", "6"])
    assert tokens.dtype == torch.int32 and tokens.tolist() == [1, 2, 3, 0, 4, 5, 0, 6, 0]
    windows = PackedWindows(tokens, seq_len=3, name="toy")
    assert len(windows) == 2  # (9 - 1) // 3; token 0 at the tail is dropped
    x, y = windows[1]
    assert x.dtype == y.dtype == torch.int64
    assert (x.tolist(), y.tolist()) == ([0, 4, 5], [4, 5, 0])
    assert windows[0][0].tolist() == [1, 2, 3] and windows[0][1].tolist() == [2, 3, 0]


def test_tokenizing_in_chunks_of_characters_gives_the_same_stream(toy_tokenizer, monkeypatch):
    from torchtitan_lite.data import sources

    docs = _docs(10)  # 13 characters, then 27 each
    whole = tokenize_documents(toy_tokenizer, docs)
    monkeypatch.setattr(sources, "_ENCODE_CHARACTERS", 60)
    assert [len(chunk) for chunk in sources._encode_chunks(docs)] == [2, 2, 2, 2, 2]
    assert torch.equal(tokenize_documents(toy_tokenizer, docs), whole)
    monkeypatch.setattr(sources, "_ENCODE_CHARACTERS", 10)  # a document longer than that goes alone
    assert [len(chunk) for chunk in sources._encode_chunks(docs)] == [1] * 10


def test_shakespeare_loader_shapes_and_sizes():
    tok = build_tokenizer()
    loader = build_dataloader(
        dataset="shakespeare", tokenizer=tok, seq_len=256, local_batch_size=3, seed=0
    )
    windows = loader.dataset.windows
    assert windows.tokens.numel() == 1_759_944  # 1,759,907 BPE tokens + 37 EOS
    assert len(windows) == 6874
    x, y = next(iter(loader))
    assert x.shape == y.shape == (3, 256) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    validation = build_dataloader(
        dataset="shakespeare", tokenizer=tok, seq_len=256, local_batch_size=4, split="validation"
    )
    assert len(validation.dataset.windows) == (36_777 + 1 - 1) // 256 and len(validation) == 35


# --- the global stream and rank slicing -----------------------------------------------------------


def _stream(n_windows, seq_len=2, **kw):
    windows = PackedWindows(
        torch.arange(n_windows * seq_len + 1, dtype=torch.int32), seq_len, "arange"
    )
    return GlobalWindowStream(windows, **kw)


def _window_ids(stream, n):
    """Indices of the next n windows a stream yields (window i starts with token i * seq_len)."""
    return [int(x[0]) // stream.windows.seq_len for x, _ in islice(iter(stream), n)]


def test_each_epoch_is_the_permutation_seeded_by_seed_plus_epoch():
    stream = _stream(10, local_batch_size=1, dp_rank=0, dp_world_size=1, seed=7)
    expected = [
        torch.randperm(10, generator=torch.Generator().manual_seed(7 + e)).tolist()
        for e in range(3)
    ]
    assert _window_ids(stream, 30) == expected[0] + expected[1] + expected[2]


@pytest.mark.parametrize("world_size,local_batch", [(2, 2), (3, 1), (2, 3)])
def test_ranks_take_every_world_size_th_chunk_of_the_global_stream(world_size, local_batch):
    # 7 windows: chunks cross epoch boundaries; the global stream is what one rank with L=1 sees.
    n, steps = 7, 5
    global_batch = 2 * local_batch * world_size  # two micro-batches per rank per step
    reference = _window_ids(
        _stream(n, local_batch_size=1, dp_rank=0, dp_world_size=1, seed=0), steps * global_batch
    )
    per_rank = [
        _window_ids(
            _stream(n, local_batch_size=local_batch, dp_rank=r, dp_world_size=world_size, seed=0),
            steps * global_batch // world_size,
        )
        for r in range(world_size)
    ]
    for r in range(world_size):
        for i in range(steps * 2):  # the i-th chunk of rank r is global chunk i * W + r
            c = i * world_size + r
            mine, chunk = (
                slice(i * local_batch, (i + 1) * local_batch),
                slice(c * local_batch, (c + 1) * local_batch),
            )
            assert per_rank[r][mine] == reference[chunk]


def test_one_and_two_ranks_train_on_the_same_windows_each_step(toy_tokenizer, tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", _docs(40))  # 79 windows: 6 steps of 8 stay in epoch 0
    one = iter(_local_loader(toy_tokenizer, path))
    two = [iter(_local_loader(toy_tokenizer, path, dp_rank=r, dp_world_size=2)) for r in range(2)]
    for _ in range(6):  # global batch 8: 4 micro-batches of 2 on one rank, 2 on each of two ranks
        single = _windows(next(one) for _ in range(4))
        double = _windows(next(it) for it in two for _ in range(2))
        assert len(set(single)) == 8 and sorted(single) == sorted(double)


# --- resume ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("rank,world_size", [(0, 1), (1, 2)])
def test_loader_resumes_exactly_across_epochs(toy_tokenizer, tmp_path, rank, world_size):
    path = _write_jsonl(tmp_path / "d.jsonl", _docs(4))  # 32 tokens, 24 for training -> 5 windows
    kw = dict(
        dp_rank=rank, dp_world_size=world_size, val_fraction=0.25
    )  # batches of 2: epochs end mid-batch
    loader = _local_loader(toy_tokenizer, path, **kw)
    it = iter(loader)
    [next(it) for _ in range(5)]
    state = loader.state_dict()
    expected = [next(it) for _ in range(6)]
    resumed = _local_loader(toy_tokenizer, path, **kw)
    resumed.load_state_dict(state)
    got = list(islice(iter(resumed), 6))
    assert _windows(got) == _windows(expected)
    assert len(loader.dataset.windows) == 5
    # the global position: 5 batches of 2 windows on each of world_size ranks, the same on every
    # rank
    assert state["dataset_state"] == {
        "windows_consumed": 5 * 2 * world_size,
        "n_windows": 5,
        "seq_len": 4,
        "seed": 3,
    }


@pytest.mark.parametrize("new_world_size,new_local_batch", [(1, 2), (3, 2), (3, 1)])
def test_state_saved_on_two_ranks_resumes_on_other_world_sizes_at_the_same_global_batch(
    toy_tokenizer, tmp_path, new_world_size, new_local_batch
):
    # 79 windows, global batch 12: saved after 5 steps (60 windows); the 3 steps after it cross into
    # epoch 1.
    path = _write_jsonl(tmp_path / "d.jsonl", _docs(40))
    global_batch, saved_steps, steps = 12, 5, 3

    def step_batches(loaders, local_batch):
        """The windows of one step over all ranks, as a sorted list (a set, but repeats would
        show)."""
        accum = global_batch // (local_batch * len(loaders))
        return sorted(_windows(next(it) for it in loaders for _ in range(accum)))

    single = iter(_local_loader(toy_tokenizer, path))
    reference = [step_batches([single], 2) for _ in range(saved_steps + steps)]
    assert len(set(reference[saved_steps])) == 12 and set(reference[saved_steps]) != set(
        reference[saved_steps + 1]
    )
    two = [_local_loader(toy_tokenizer, path, dp_rank=r, dp_world_size=2) for r in range(2)]
    its = [iter(loader) for loader in two]
    assert [step_batches(its, 2) for _ in range(saved_steps)] == reference[:saved_steps]
    states = [loader.state_dict() for loader in two]
    assert (
        states[0] == states[1]
        and states[0]["dataset_state"]["windows_consumed"] == saved_steps * global_batch
    )
    resumed = [
        _local_loader(
            toy_tokenizer,
            path,
            local_batch_size=new_local_batch,
            dp_rank=r,
            dp_world_size=new_world_size,
        )
        for r in range(new_world_size)
    ]
    for (
        loader
    ) in resumed:  # as the checkpointer does on another world size: every rank loads rank 0's state
        loader.load_state_dict(states[0])
    its = [iter(loader) for loader in resumed]
    assert [step_batches(its, new_local_batch) for _ in range(steps)] == reference[saved_steps:]


def test_resume_with_other_settings_is_refused(toy_tokenizer, tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", _docs(4))
    loader = _local_loader(toy_tokenizer, path)
    next(iter(loader))
    other = _local_loader(toy_tokenizer, path, seq_len=3, seed=4)
    other.load_state_dict(loader.state_dict())
    with pytest.raises(
        ValueError, match=r"n_windows=\d+ \(now \d+\), seq_len=4 \(now 3\), seed=3 \(now 4\)"
    ):
        next(iter(other))


# --- validation -----------------------------------------------------------------------------------


def test_validation_is_ordered_equal_per_rank_and_restarts(toy_tokenizer, tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", _docs(10, length=15))
    ranks = [
        _local_loader(
            toy_tokenizer, path, split="validation", val_fraction=0.3, dp_rank=r, dp_world_size=2
        )
        for r in range(2)
    ]
    windows = ranks[
        0
    ].dataset.windows  # last 48 tokens (3 documents) -> 11 windows -> 5 chunks of 2 -> 4 used
    assert windows.tokens.tolist()[:16] == list(range(701, 716)) + [0]
    assert len(windows) == 11 and len(ranks[0]) == len(ranks[1]) == 2
    per_rank = [_windows(loader) for loader in ranks]
    by_index = [
        tuple(windows[i][0].tolist()) + (windows[i][1][-1].item(),) for i in range(len(windows))
    ]
    assert per_rank == [[by_index[i] for i in (0, 1, 4, 5)], [by_index[i] for i in (2, 3, 6, 7)]]
    assert _windows(ranks[1]) == per_rank[1]  # a new iterator starts again from its first window
    train = _local_loader(toy_tokenizer, path, val_fraction=0.3).dataset.windows
    assert train.tokens.numel() == 7 * 16


def test_validation_reads_the_same_whole_global_batches_on_every_layout(toy_tokenizer, tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", _docs(10, length=15))
    windows = _local_loader(
        toy_tokenizer, path, split="validation", val_fraction=0.3
    ).dataset.windows
    assert len(windows) == 11  # one global batch of 8 windows; the other 3 are never read
    for local_batch_size, world in ((8, 1), (2, 1), (2, 2), (1, 4), (2, 4)):
        ranks = [
            OrderedWindows(
                windows,
                local_batch_size=local_batch_size,
                dp_rank=r,
                dp_world_size=world,
                batch_windows=8,
            )
            for r in range(world)
        ]
        read = [[tuple(window[0].tolist()) for window in rank] for rank in ranks]
        chunks = [
            read[r][i : i + local_batch_size]
            for i in range(0, len(read[0]), local_batch_size)
            for r in range(world)
        ]
        # the first 8 windows, the i-th chunk of rank r being global chunk i * world + r
        assert sum(chunks, []) == [tuple(windows[i][0].tolist()) for i in range(8)], (
            local_batch_size,
            world,
        )
    with pytest.raises(
        ValueError,
        match="batch_windows 6 is not a multiple of local_batch_size 2 \\* dp_world_size 2",
    ):
        OrderedWindows(windows, local_batch_size=2, dp_rank=0, dp_world_size=2, batch_windows=6)


# --- local files ----------------------------------------------------------------------------------


def test_txt_jsonl_parquet_and_folder_give_the_same_tokens(toy_tokenizer, tmp_path):
    docs = _docs(5)
    (tmp_path / "txt").mkdir()
    for i, d in enumerate(docs):
        (tmp_path / "txt" / f"{i:02d}.txt").write_text(d + "\n")
    _write_jsonl(tmp_path / "d.jsonl", docs, column="body")
    datasets.Dataset.from_dict({"body": docs}).to_parquet(str(tmp_path / "d.parquet"))
    expected = tokenize_documents(toy_tokenizer, docs[:4]).tolist()
    sources = (
        (tmp_path / "txt", "ignored"),
        (tmp_path / "d.jsonl", "body"),
        (tmp_path / "d.parquet", "body"),
    )
    for path, column in sources:
        loader = _local_loader(toy_tokenizer, path, text_column=column, val_fraction=0.2)
        assert loader.dataset.windows.tokens.tolist() == expected, path


def test_local_split_holds_out_the_end_of_one_file(toy_tokenizer, tmp_path):
    (tmp_path / "one.txt").write_text(" ".join(str(k) for k in range(1, 200)))  # 199 words + EOS
    train, validation = (
        _local_loader(
            toy_tokenizer, tmp_path / "one.txt", split=s, val_fraction=0.1
        ).dataset.windows
        for s in ("train", "validation")
    )
    assert train.tokens.tolist() == list(range(1, 181))
    assert validation.tokens.tolist() == list(range(181, 200)) + [0]


def test_streaming_local_packs_in_order_and_resumes_exactly(toy_tokenizer, tmp_path):
    path = _write_jsonl(
        tmp_path / "d.jsonl", _docs(3)
    )  # 24 tokens -> 5 windows of seq_len 4 + 1 per pass
    loader = _local_loader(toy_tokenizer, path, streaming=True, local_batch_size=1)
    it = iter(loader)
    first = _windows(next(it) for _ in range(5))
    tokens = tokenize_documents(toy_tokenizer, _docs(3)).tolist()
    assert first == [tuple(tokens[4 * i : 4 * i + 5]) for i in range(5)]
    state = loader.state_dict()
    expected = _windows(next(it) for _ in range(7))  # into the second pass over the stream
    resumed = _local_loader(toy_tokenizer, path, streaming=True, local_batch_size=1)
    resumed.load_state_dict(state)
    assert _windows(islice(iter(resumed), 7)) == expected


def test_streaming_ranks_read_alternate_documents(toy_tokenizer, tmp_path):
    # One file, two ranks: split_dataset_by_node gives each rank every second document.
    path = _write_jsonl(tmp_path / "d.jsonl", _docs(4))
    tokens = [tokenize_documents(toy_tokenizer, _docs(4)[r::2]).tolist() for r in range(2)]
    for rank in range(2):
        loader = _local_loader(
            toy_tokenizer, path, streaming=True, local_batch_size=1, dp_rank=rank, dp_world_size=2
        )
        assert _windows(islice(iter(loader), 3)) == [
            tuple(tokens[rank][4 * i : 4 * i + 5]) for i in range(3)
        ]


def test_streaming_rank_with_no_document_raises_instead_of_looping(toy_tokenizer, tmp_path):
    # One document, two ranks: rank 1's share of the stream is empty.
    path = _write_jsonl(tmp_path / "d.jsonl", _docs(1))
    loader = _local_loader(
        toy_tokenizer, path, streaming=True, local_batch_size=1, dp_rank=1, dp_world_size=2
    )
    with pytest.raises(ValueError, match="share of the stream holds no document"):
        next(iter(loader))


def test_streaming_validation_restarts_from_the_beginning(toy_tokenizer, tmp_path):
    stream = datasets.load_dataset(
        "json",
        data_files=str(_write_jsonl(tmp_path / "d.jsonl", _docs(3))),
        split="train",
        streaming=True,
    )
    ds = StreamingWindows(
        stream,
        tokenizer=toy_tokenizer,
        text_column="text",
        seq_len=4,
        dp_rank=0,
        dp_world_size=1,
        name="toy",
        restart=True,
    )
    first, again = (_windows((x[None], y[None]) for x, y in islice(iter(ds), 7)) for _ in range(2))
    assert first == again and first[0] == (1, 2, 3, 4, 5)


# --- errors ---------------------------------------------------------------------------------------


def test_missing_path(toy_tokenizer, tmp_path):
    with pytest.raises(InputError, match="dataset_path not found: .*nowhere"):
        _local_loader(toy_tokenizer, tmp_path / "nowhere")


def test_unknown_extension(toy_tokenizer, tmp_path):
    (tmp_path / "d.csv").write_text("text\nhello\n")
    with pytest.raises(ValueError, match=r"d.csv has unknown extension '.csv'; use one of .txt"):
        _local_loader(toy_tokenizer, tmp_path / "d.csv")


def test_empty_dataset(toy_tokenizer, tmp_path):
    (tmp_path / "d.jsonl").write_text("")
    with pytest.raises(ValueError, match="d.jsonl holds no documents"):
        _local_loader(toy_tokenizer, tmp_path / "d.jsonl")


def test_dataset_shorter_than_one_window(toy_tokenizer, tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", ["1 2", "3"])
    with pytest.raises(
        ValueError, match=r"has 3 tokens, fewer than one window of seq_len \+ 1 = 5"
    ):
        _local_loader(toy_tokenizer, path, val_fraction=0.5)


def test_missing_text_column(toy_tokenizer, tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", _docs(3), column="body")
    with pytest.raises(ValueError, match=r"no text column 'text' \(columns: body, id\)"):
        _local_loader(toy_tokenizer, path)


def test_too_few_validation_windows_for_every_rank(toy_tokenizer, tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", _docs(3))
    with pytest.raises(ValueError, match="fewer than one global batch = 4"):
        _local_loader(
            toy_tokenizer, path, split="validation", val_fraction=0.5, dp_world_size=2, dp_rank=1
        )


def test_bad_arguments_are_named():
    tok = build_tokenizer()
    common = dict(tokenizer=tok, seq_len=8, local_batch_size=1)
    with pytest.raises(ValueError, match="unknown dataset 'c4'; use one of shakespeare, hf"):
        build_dataloader(dataset="c4", **common)
    with pytest.raises(ValueError, match="a streaming local dataset has no validation split"):
        build_dataloader(dataset_path="x.txt", streaming=True, split="validation", **common)
    with pytest.raises(ValueError, match=r"dp_rank must be in \[0, dp_world_size=2\), got 2"):
        build_dataloader(dp_rank=2, dp_world_size=2, **common)


def test_the_data_line_says_one_step_and_one_window_in_the_singular():
    loaders = DataLoaders(
        train=None, validation=None, name="toy", seq_len=32, train_size=SplitSize(1, 100, 3)
    )
    assert loaders.describe(1, 1) == (
        "toy: train 1 document, 100 tokens = 3 windows of 32, "
        "1 step x 1 window = 0.333 epochs; no validation"
    )
