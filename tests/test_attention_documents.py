"""Document masking through whole models: a packed window with document masking gives each document the logits it
gets alone (RoPE positions restarting per document; continuing positions equal up to rounding, since RoPE scores
depend only on distances); and the attention config combinations no backend can run are config errors (one line,
exit 2, before torchrun: ``config/checks.py``)."""

from __future__ import annotations

import pytest
import torch
from test_kv_cache import tiny_model

from models import model_names
from torchtitan_lite.config.checks import load_config
from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.memory import estimate_rank_memory
from torchtitan_lite.data.documents import document_inputs

EOS = 0
DOCS = [[5, 17, 3, 99, 42, 7, EOS], [7, 1, 8, EOS], [11, 12, 13, 14, 15]]  # the last one runs on past the window


@pytest.mark.parametrize("family", model_names())
def test_each_document_of_a_packed_window_gets_its_logits_alone(family):
    model, _ = tiny_model(family)  # GPT-OSS: sliding window 4, shorter than the first document
    tokens = torch.tensor([sum(DOCS, [])])
    with torch.no_grad():
        restart = model(tokens, **document_inputs(tokens, EOS, "restart"))[0]
        cont = model(tokens, **document_inputs(tokens, EOS, "continue"))[0]
        alone = torch.cat([model(torch.tensor([doc]))[0] for doc in DOCS])
    torch.testing.assert_close(restart, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cont, alone, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(model(tokens)[0], alone, atol=1e-3)  # without masking, later documents see earlier ones


@pytest.mark.parametrize("cli,message", [
    (["--model.attn_backend=flex"], r"model.attn_backend \(command line\): flex has no backward on CPU"),
    (["--model.name=gpt_oss", "--model.overrides.sliding_window=512"],
     r"model.overrides.sliding_window \(command line\): 512 exceeds max_seq_len 256"),
])
def test_attention_combinations_no_backend_runs_are_config_errors(cli, message, tmp_path):
    with pytest.raises(ConfigError, match=f"^{message}"):
        load_config(["--training.device=cpu", f"--job.dump_folder={tmp_path}", *cli])


def test_memory_estimate_keeps_the_s_squared_scores_only_for_the_dense_reference():
    class Args:
        dim, n_layers, n_heads, vocab_size = 1024, 4, 8, 1000

    kw = dict(world_size=1, seq_len=512, local_batch_size=2, compute_bytes=2, ac_mode="none")
    dense = estimate_rank_memory(10**9, Args, dense_scores=True, **kw)
    linear = estimate_rank_memory(10**9, Args, dense_scores=False, **kw)
    assert dense.activations - linear.activations == int(4 * 5 * 8 * 512 * 512 * 2)  # layers x 5 a s^2 b values
