"""Decoding with a KV cache (models/common/kv_cache.py, components/generation.py) equals the full
recompute for every family: logits within 1e-5 (absolute, fp32) on the family's own init and greedy
ids identical on large random weights; sliding-window layers keep only their window and MLA keeps
its compressed latent."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_helpers import build_planned, build_random

from torchtitan_lite.components.generation import generate
from torchtitan_lite.models import get_model_spec, model_names
from torchtitan_lite.protocols.attention import KVCache

WINDOW = 4  # GPT-OSS sliding layers: shorter than the prompt, so the cache must drop keys
PROMPT = [5, 17, 3, 99, 42, 7, 7, 1]


def tiny_model(family: str, planned: bool = False):
    """The family's debug flavor cut to two layers (one sliding, one full for GPT-OSS) in fp32:
    initialized by its init plan (seed 0) when ``planned``, else random N(0, 0.1) weights (logits up
    to ~7)."""
    spec = get_model_spec(family)
    args = dataclasses.replace(spec.flavors["debug"], n_layers=2)
    if hasattr(args, "sliding_window"):
        args = dataclasses.replace(args, sliding_window=WINDOW)
    if hasattr(args, "n_dense_layers"):
        args = dataclasses.replace(args, n_dense_layers=1)
    if planned:
        return build_planned(spec.model_cls, spec.init_plan, args).eval(), args
    return build_random(spec.model_cls, args, std=0.1).eval(), args


def cached_and_full_logits(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, KVCache]:
    """Logits ``(len, vocab)`` of ``PROMPT + ids``: the prompt in one cached forward then one token
    per forward, and one full forward; and the cache."""
    tokens = torch.tensor([PROMPT + ids])
    cache = KVCache()
    with torch.no_grad():
        full = model(tokens)[0]
        steps = [model(tokens[:, : len(PROMPT)], cache=cache)[0]]
        steps += [
            model(tokens[:, i : i + 1], cache=cache)[0] for i in range(len(PROMPT), tokens.shape[1])
        ]
    return torch.cat(steps), full, cache


@pytest.mark.parametrize("family", model_names())
def test_cached_logits_equal_the_full_recompute_within_1e_5_on_the_familys_init(family):
    model, _ = tiny_model(family, planned=True)
    with torch.no_grad():
        ids = generate(model, PROMPT, 6, device="cpu")
    cached, full, _ = cached_and_full_logits(model, ids)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", model_names())
def test_cached_greedy_ids_equal_the_full_recompute_on_large_random_weights(family):
    model, args = tiny_model(family)
    with torch.no_grad():
        ids = generate(model, PROMPT, 6, device="cpu")
        assert ids == generate(model, PROMPT, 6, device="cpu", use_cache=False)
    cached, full, cache = cached_and_full_logits(model, ids)
    length = len(PROMPT) + len(ids)
    assert cache.length == length
    # Random N(0, 0.1) weights make hidden states and logits (up to ~7) large, and fp32 rounding
    # with them: on GPT-OSS
    # every fp32 path is 0.9-1.4e-5 from the fp64 logits (AVX2), and cached vs full differ by up to
    # 2.1e-5 on an
    # AVX-512 CPU. A wrong cache entry moves logits by O(1).
    torch.testing.assert_close(cached, full, atol=4e-5, rtol=1e-5)

    kept = {layer_id: state.tensors for layer_id, state in cache.layers.items()}
    if family == "gpt_oss":  # layer 0 slides (keeps WINDOW positions), layer 1 is full
        assert kept["0"][0].shape[1] == WINDOW and kept["1"][0].shape[1] == length
    if (
        family == "deepseek_v3"
    ):  # the latent: c_kv (kv_lora_rank) and the shared k_pe (qk_rope_head_dim)
        c_kv, k_pe = kept["1"]
        assert c_kv.shape == (1, length, args.kv_lora_rank)
        assert k_pe.shape == (1, length, 1, args.qk_rope_head_dim)


def test_a_cached_forward_past_max_seq_len_is_refused():
    model, args = tiny_model("qwen3")
    cache = KVCache(length=args.max_seq_len)
    with pytest.raises(
        ValueError, match=f"sequence length {args.max_seq_len + 1} exceeds max_seq_len"
    ):
        model(torch.tensor([[1]]), cache=cache)
