"""Text continuation with any model of the registry: greedy or sampled, one sequence, with a KV
cache.

The prompt runs once and each new token runs alone against the per-layer key/value cache
(:class:`~torchtitan_lite.protocols.attention.KVCache`; sliding-window layers keep only their
window, MLA its compressed latent), so a step costs ``O(length)`` instead of the full recompute's
``O(length^2)``; ``use_cache=False`` runs the model on the whole sequence for every token (the same
ids; logits equal within fp32 rounding). Greedy (``temperature = 0``) takes the arg-max, first index
on ties (``torch.argmax``, as transformers' greedy search); sampling divides the logits by
``temperature``, keeps the ``top_k`` largest (all when ``None``) and draws from their softmax with
``generator``.
"""

from __future__ import annotations

import torch
from torch import nn

from torchtitan_lite.protocols.attention import KVCache


@torch.no_grad()
def next_token(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> int:
    """The next token id from the last position's ``logits`` ``(vocab_size,)`` (module
    docstring)."""
    logits = logits.float()
    if temperature == 0:
        return int(torch.argmax(logits))
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    device: torch.device | str,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    eos_id: int | None = None,
    use_cache: bool = True,
) -> list[int]:
    """The ids ``model`` continues ``prompt_ids`` with: ``max_new_tokens`` of them, fewer when it
    produces ``eos_id`` (which ends the list, as transformers' ``generate`` stops).

    Args:
        model: a model of the registry in eval mode
            (``forward(tokens (1, seqlen)) -> (1, seqlen, vocab)``).
        prompt_ids: at least one id.
        device: where the model runs.
        temperature: 0 for greedy, else the softmax temperature (> 0).
        top_k: sample among the ``top_k`` most likely tokens only.
        generator: a CPU generator for the draws (seeded by the caller).
        use_cache: decode with a KV cache (module docstring); ``False``: recompute the whole
            sequence per token.

    Raises:
        ValueError: an empty prompt or a negative ``temperature``.
    """
    if not prompt_ids:
        raise ValueError("generate: the prompt has no tokens; give a non-empty prompt")
    if temperature < 0:
        raise ValueError(f"generate: temperature must be >= 0 (0 = greedy), got {temperature}")
    tokens = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    cache = KVCache() if use_cache else None
    new: list[int] = []
    if max_new_tokens == 0:
        return new
    logits = model(tokens, cache=cache)[0, -1] if use_cache else model(tokens)[0, -1]
    for i in range(max_new_tokens):
        token = next_token(logits, temperature, top_k, generator)
        new.append(token)
        if token == eos_id or i == max_new_tokens - 1:
            break
        step = torch.tensor([[token]], dtype=torch.long, device=device)
        if use_cache:
            logits = model(step, cache=cache)[0, -1]
        else:
            tokens = torch.cat([tokens, step], dim=1)
            logits = model(tokens)[0, -1]
    return new
