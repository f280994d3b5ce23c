"""Document masking through whole models: a packed window with document masking gives each document
the logits it gets alone (RoPE positions restarting per document; continuing positions equal up to
rounding, since RoPE scores depend only on distances); and the attention config combinations no
backend can run are config errors (one line, exit 2, before torchrun: ``preflight/checks.py``)."""

from __future__ import annotations

import pytest
import test_data
import torch
from test_data_prepared import _prepare
from test_kv_cache import tiny_model
from test_tokenizer import _word_level

from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.data.documents import document_ids_from_eos, document_inputs
from torchtitan_lite.data.loader import build_dataloader
from torchtitan_lite.data.streams import collate_windows
from torchtitan_lite.models import model_names
from torchtitan_lite.preflight.checks import load_run
from torchtitan_lite.preflight.memory import estimate_rank_memory

EOS = 0
toy_tokenizer = (
    test_data.toy_tokenizer
)  # the word-level fixture: the word "k" is id k, the EOS id 0
DOCS = [
    [5, 17, 3, 99, 42, 7, EOS],
    [7, 1, 8, EOS],
    [11, 12, 13, 14, 15],
]  # the last one runs on past the window


@pytest.mark.parametrize("family", model_names())
def test_each_document_of_a_packed_window_gets_its_logits_alone(family):
    # The family's own init (logits <= 4.4): the packed and the separate forwards differ by <=
    # 2.9e-6 on an AVX-512
    # CPU, where random N(0, 0.1) weights (logits ~7) differ by up to 2.2e-5: past 1e-5 from
    # rounding alone.
    model, _ = tiny_model(
        family, planned=True
    )  # GPT-OSS: sliding window 4, shorter than the first document
    tokens = torch.tensor([sum(DOCS, [])])
    ids = document_ids_from_eos(tokens, EOS)
    with torch.no_grad():
        restart = model(tokens, **document_inputs(ids, "restart"))[0]
        cont = model(tokens, **document_inputs(ids, "continue"))[0]
        alone = torch.cat([model(torch.tensor([doc]))[0] for doc in DOCS])
    torch.testing.assert_close(restart, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cont, alone, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(
        model(tokens)[0], alone, atol=1e-3
    )  # without masking, later documents see earlier ones


def test_the_loader_gives_document_ids_from_the_document_starts_not_from_eos(
    toy_tokenizer, tmp_path
):
    # Document 0's text holds the word "0", the EOS id: the prepared document starts still end it at
    # its own EOS.
    folder = _prepare(
        tmp_path, toy_tokenizer, ["1 2 0 3", "4 5", "6 7 8 9 10", "11 12 13 14 15 16 17"]
    )
    loader = build_dataloader(
        dataset_path=str(folder),
        tokenizer=toy_tokenizer,
        seq_len=6,
        local_batch_size=2,
        val_fraction=0.01,
        documents=True,
    )
    windows = loader.dataset.windows
    inputs, labels, ids = collate_windows([windows[0], windows[1]])
    assert inputs.tolist() == [[1, 2, 0, 3, 0, 4], [5, 0, 6, 7, 8, 9]]
    assert labels.tolist() == [[2, 0, 3, 0, 4, 5], [0, 6, 7, 8, 9, 10]]
    assert ids.dtype == torch.int32 and ids.tolist() == [[0, 0, 0, 0, 0, 1], [0, 0, 1, 1, 1, 1]]
    assert [len(batch) for batch in next(iter(loader))] == [2, 2, 2]
    # Streamed data has no document starts: the ids come from the EOS the loader puts after each
    # document, so the
    # "0" inside document 0 starts a document there.
    stream = build_dataloader(
        dataset_path=str(tmp_path / "p.jsonl"),
        tokenizer=toy_tokenizer,
        seq_len=6,
        local_batch_size=2,
        streaming=True,
        documents=True,
    )
    streamed, _, streamed_ids = next(iter(stream))
    assert streamed.tolist() == inputs.tolist()
    assert streamed_ids.tolist() == [[0, 0, 0, 1, 1, 2], [0, 0, 1, 1, 1, 1]]


@pytest.mark.parametrize(
    "cli,message",
    [
        (
            ["--model.attn_backend=flex"],
            r"model.attn_backend \(command line\): flex has no backward on CPU",
        ),
        (
            ["--model.name=gpt_oss", "--model.overrides.sliding_window=512"],
            r"model.overrides.sliding_window \(command line\): 512 exceeds max_seq_len 256",
        ),
    ],
)
def test_attention_combinations_no_backend_runs_are_config_errors(cli, message, tmp_path):
    with pytest.raises(ConfigError, match=f"^{message}"):
        load_run(["--training.device=cpu", f"--job.dump_folder={tmp_path}", *cli])


def test_document_masking_with_a_tokenizer_without_eos_is_one_config_error(tmp_path):
    """Documents are cut at the EOS the data pipeline writes, so a tokenizer without one is refused
    before launch (for every run: the pipeline needs it between documents)."""
    noeos = _word_level(tmp_path / "noeos.json", {"<unk>": 0, "a": 1})
    with pytest.raises(
        ConfigError,
        match=r"^model.tokenizer_path: tokenizer .*noeos.json has none of the EOS "
        r"tokens .*; use a tokenizer.json whose vocab has one",
    ):
        load_run(
            [
                "--training.device=cpu",
                f"--job.dump_folder={tmp_path}",
                f"--model.tokenizer_path={noeos}",
                "--training.document_masking=true",
            ]
        )


def test_memory_estimate_keeps_the_s_squared_scores_only_for_the_dense_reference():
    class Args:
        dim, n_layers, n_heads, vocab_size = 1024, 4, 8, 1000

    kw = dict(world_size=1, seq_len=512, local_batch_size=2, compute_bytes=2, ac_mode="none")
    dense = estimate_rank_memory(10**9, Args, dense_scores=True, **kw)
    linear = estimate_rank_memory(10**9, Args, dense_scores=False, **kw)
    assert dense.activations - linear.activations == int(
        4 * 5 * 8 * 512 * 512 * 2
    )  # layers x 5 a s^2 b values
