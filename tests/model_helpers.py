"""Shared pieces of the model-family tests (test_<family> for every registered family, test_mla):
which families are mixtures of experts, building a model on meta with random or planned weights,
init-plan coverage, model args from a train config, the step-1 loss on random tokens, the float64
forward/backward comparison, and the reference math the float64 models are written with (RMSNorm,
rotate-half RoPE, SwiGLU, grouped-query softmax attention)."""

from __future__ import annotations

import math
from collections.abc import Callable
from fnmatch import fnmatch
from typing import Any

import torch
import torch.nn.functional as F
from dist_helpers import REPO
from torch import nn

from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.init.spec import InitPlan
from torchtitan_lite.models import get_model_spec, model_names
from torchtitan_lite.preflight.checks import parse_args
from torchtitan_lite.preflight.model_args import build_model_args

# ---------------------------------------------------------------- families


def is_moe(family: str) -> bool:
    """Whether ``family``'s blocks hold mixtures of experts: its args have ``num_experts`` (what the
    engine's expert-parallel check reads)."""
    return hasattr(get_model_spec(family).flavors["debug"], "num_experts")


def moe_families() -> list[str]:
    """The registered families with experts (:func:`is_moe`), in registry order."""
    return [name for name in model_names() if is_moe(name)]


# ---------------------------------------------------------------- building models


def build_random(
    model_cls: type[nn.Module], args: Any, seed: int = 0, std: float = 0.3
) -> nn.Module:
    """``model_cls(args)`` built on meta, materialized on CPU (ties kept), with N(0, std) weights
    and biases, N(1, std) norm weights, zeroed buffers (MoE state) and fresh RoPE tables, all
    fp32."""
    with torch.device("meta"):
        model = model_cls(args)
    materialize(model, "cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std + (1.0 if "norm" in name else 0.0))
        for buf in model.buffers():
            buf.zero_()
    model.init_buffers("cpu")
    return model


def build_planned(
    model_cls: type[nn.Module], init_plan: Callable[[Any], InitPlan], args: Any, seed: int = 0
) -> nn.Module:
    """``model_cls(args)`` built on meta, materialized on CPU and initialized by ``init_plan(args)``
    with ``seed``."""
    with torch.device("meta"):
        model = model_cls(args)
    materialize(model, "cpu")
    init_weights(model, init_plan(args), seed, buffer_device="cpu")
    return model


def poisoned_init(model: nn.Module, plan: InitPlan, seed: int) -> nn.Module:
    """Materializes the meta-built ``model`` on CPU, fills every parameter and buffer with NaN, runs
    ``init_weights(model, plan, seed)`` and asserts that no tensor is left non-finite (names the
    first)."""
    materialize(model, "cpu")
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            t.fill_(float("nan"))
    init_weights(model, plan, seed=seed, buffer_device="cpu")
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        assert torch.isfinite(t).all(), name
    return model


def assert_plan_covers_exactly(model: nn.Module, plan: InitPlan) -> list[str]:
    """Asserts that every parameter (each tied name too) and persistent buffer of ``model`` matches
    an entry of ``plan``, that every entry matches a name and that every entry has a source; returns
    the names."""
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in model.named_buffers() if "rope" not in n]
    patterns = [p for p, _ in plan.entries]
    assert [n for n in names if not any(fnmatch(n, p) for p in patterns)] == []
    assert [p for p in patterns if not any(fnmatch(n, p) for n in names)] == []
    assert [p for p, spec in plan.entries if not spec.source] == []
    return names


def config_model_args(config_name: str, *cli: str) -> Any:
    """The model args the trainer builds from ``train_configs/<config_name>.toml`` and the
    command-line arguments ``cli`` (e.g. ``"--model.overrides.swiglu_limit=0.5"``)."""
    config_file = REPO / "train_configs" / f"{config_name}.toml"
    return build_model_args(parse_args(["--job.config_file", str(config_file), *cli]))


# ---------------------------------------------------------------- measurements


def random_token_loss(model: nn.Module, vocab_size: int, seed: int, seqlen: int = 256) -> float:
    """Mean next-token cross-entropy (nats) of ``model`` on 2 uniform random sequences of
    ``seqlen + 1`` tokens, without gradients: about ``ln(vocab_size)`` for a model at init."""
    tokens = torch.randint(
        0, vocab_size, (2, seqlen + 1), generator=torch.Generator().manual_seed(seed)
    )
    with torch.no_grad():
        logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).item()


def logit_change(model: nn.Module, tokens: torch.Tensor, position: int) -> torch.Tensor:
    """Max absolute change of the logits at each position ``(seqlen,)`` when the token at
    ``position`` of the single sequence ``tokens`` ``(1, seqlen)`` is replaced by the next id (mod
    ``model.args.vocab_size``)."""
    changed = tokens.clone()
    changed[0, position] = (tokens[0, position] + 1) % model.args.vocab_size
    return (model(tokens) - model(changed)).abs().amax(-1)[0]


def assert_matches_float64_reference(
    module: nn.Module,
    out: torch.Tensor,
    reference: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    out_tol: float,
    grad_tol: float = 1e-4,
) -> None:
    """Asserts that ``out`` (fp32, from ``module``) and the gradients of ``(out * target).sum()``
    for a N(0, 1) ``target`` (seed 2) equal those of ``reference(params)``, run on float64 copies of
    the parameters (by name), within ``out_tol`` / ``grad_tol`` (absolute and relative)."""
    target = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    (out * target).sum().backward()
    params = {n: p.detach().double().requires_grad_() for n, p in module.named_parameters()}
    ref = reference(params)
    (ref * target.double()).sum().backward()
    torch.testing.assert_close(out.double(), ref.detach(), atol=out_tol, rtol=out_tol)
    for name, p in module.named_parameters():
        torch.testing.assert_close(
            p.grad.double(), params[name].grad, atol=grad_tol, rtol=grad_tol, msg=name
        )


# ---------------------------------------------------------------- reference math (written out, no
# model code)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension (Zhang & Sennrich 2019)."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x`` ``(..., d)`` pairing feature ``i`` with ``i + d/2`` (HF ``rotate_half``);
    ``cos``/``sin`` broadcast against ``(..., d/2)``."""
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def swiglu(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """``(silu(x w1^T) * (x w3^T)) w2^T`` (Shazeer 2020), ``x`` ``(..., dim)`` -> ``(..., dim)``."""
    return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Grouped-query attention by repeating kv heads, scores scaled by ``head_dim ** -0.5``.

    Args:
        q: ``(bs, T, n_heads, head_dim)``; k, v: ``(bs, T, n_kv_heads, head_dim)`` (query head ``j``
            reads kv head ``j // (n_heads / n_kv_heads)``).
        allowed: bool ``(T, T)``, ``[query, key]`` pairs that may attend.
        sinks: optional ``(n_heads,)`` logits of one extra key without value per head (GPT-OSS): it
            joins the softmax and is dropped after.

    Returns:
        ``(bs, T, n_heads * head_dim)``.
    """
    bs, T, n_heads, head_dim = q.shape
    rep = n_heads // k.shape[2]
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, -1)
    else:
        sink = sinks.view(1, -1, 1, 1).expand(bs, -1, T, 1)
        probs = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(bs, T, -1)


def train_to_the_end(config):
    """The :class:`~torchtitan_lite.train.Trainer` of ``config`` (a ``JobConfig``), trained to its
    last step in this process (1 rank); the process group is destroyed after, also on an error."""
    import torch.distributed as dist

    from torchtitan_lite.lifecycle.faults import StopRequest
    from torchtitan_lite.train import Trainer

    trainer, stop = Trainer(config), StopRequest()
    try:
        trainer.train(stop)
    finally:
        stop.restore()
        dist.destroy_process_group()
    return trainer
