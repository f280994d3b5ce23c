"""Multi-token prediction (MTP, DeepSeek-V3 technical report arXiv 2412.19437, sec. 2.2): ``D``
sequential modules beside the main model, module ``k`` predicting the token ``k + 1`` places ahead
with the shared embedding and output head; their mean loss, weighted by lambda, is added to the
training loss.

For depth ``k`` (1-based) and position ``i`` (report eq. 21-25):
``h'_i = M_k [RMSNorm(Emb(t_{i+k})); RMSNorm(h_i^{k-1})]`` (``eh_proj``, ``2 dim -> dim``),
``h^k = TRM_k(h')`` (one block of the family), ``P^k_{i+k+1} = softmax(OutHead(RMSNorm(h^k_i)))``,
``L^k = -1/T sum_i log P^k_i[t_{i+k+1}]``, ``L_MTP = lambda / D sum_k L^k``. ``h^0`` is the main
model's output after its final norm and ``h^k`` (``k >= 1``) the block's output before the head's
norm, and the concatenation puts the embedding first: the order of the published checkpoint's
``eh_proj`` (vLLM ``deepseek_mtp.py`` ``DeepSeekMultiTokenPredictorLayer``, Megatron-LM
``multi_token_prediction.py``; the report writes ``[h; e]``). Depth ``k`` runs on the ``seqlen - k``
positions whose target is in the window, and ``T`` is the window's ``bs * seqlen`` tokens (the
report's ``1/T``).

Note: docs/design.md, "on the MTP loss without touching the forward output".
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from torchtitan_lite.distributed.parallel_dims import ParallelDims
from torchtitan_lite.models.common.moe import AddAuxiliaryLoss
from torchtitan_lite.models.common.norm import RMSNorm
from torchtitan_lite.protocols.model_spec import HookReport, TrainingHooks


class MTPLayer(nn.Module):
    """One MTP module ``k``: ``enorm``, ``hnorm`` (RMSNorm ``(dim,)``), ``eh_proj`` ``(dim, 2 dim)``
    without bias, ``block`` (the family's block, ``(bs, s, dim) -> (bs, s, dim)``) and ``norm`` (the
    output head's RMSNorm; the checkpoint's ``shared_head.norm``)."""

    def __init__(self, dim: int, eps: float, block: nn.Module):
        super().__init__()
        self.enorm = RMSNorm(dim, eps=eps)
        self.hnorm = RMSNorm(dim, eps=eps)
        self.eh_proj = nn.Linear(2 * dim, dim, bias=False)
        self.block = block
        self.norm = RMSNorm(dim, eps=eps)

    def forward(
        self,
        h: torch.Tensor,
        emb: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``h^{k-1}`` and ``Emb(t_{i+k})``, each ``(bs, s, dim)`` -> ``h^k`` ``(bs, s, dim)``
        (module docstring)."""
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h)], dim=-1))
        return (
            self.block(x, cos, sin)
            if document_ids is None
            else self.block(x, cos, sin, document_ids=document_ids)
        )


class MTP(nn.Module):
    """The ``D`` MTP modules of a decoder: ``layers`` ``"0".."D-1"`` of :class:`MTPLayer`, the block
    of module ``k`` built as ``block(args, n_layers + k)`` (the published checkpoint's
    ``model.layers.61`` is a block of index 61).

    Args:
        args: the family's args; read: ``dim``, ``norm_eps``, ``n_layers``, ``mtp_num_layers``
            (``D`` > 0), ``mtp_loss_scaling_factor`` (lambda).
        block: the decoder's block factory.

    Attributes:
        loss_scale: gradient the MTP loss gets in backward (module note), default 1.
        stats: fp32 ``(D + 1,)``: the summed cross-entropy of each depth and the tokens ``T``,
            accumulated over training forwards since :meth:`take_stats`.
    """

    def __init__(self, args, block: Callable[[object, int], nn.Module]):
        super().__init__()
        self.depth, self.weight = args.mtp_num_layers, args.mtp_loss_scaling_factor
        self.layers = nn.ModuleDict(
            {
                str(k): MTPLayer(args.dim, args.norm_eps, block(args, args.n_layers + k))
                for k in range(self.depth)
            }
        )
        self.loss_scale = 1.0
        self.stats: torch.Tensor | None = None

    def attach_loss(
        self,
        h: torch.Tensor,
        tokens: torch.Tensor,
        labels: torch.Tensor,
        embed: nn.Module,
        head: Callable[[torch.Tensor], torch.Tensor],
        cos: torch.Tensor,
        sin: torch.Tensor,
        document_ids: torch.Tensor | None,
    ) -> torch.Tensor:
        """``h`` with ``L_MTP`` attached (module note), for the main output head.

        Args:
            h: the main model's output after its final norm ``(bs, seqlen, dim)``; tokens, labels:
                int64 ``(bs, seqlen)``, ``labels[:, i] = t_{i+1}``.
            embed, head: the shared embedding and output projection.
            cos, sin: the RoPE tables of the positions, ``(seqlen, r)`` or ``(bs, seqlen, r)``.
            document_ids: ``(bs, seqlen)`` or ``None``, as the decoder's.

        Raises:
            ValueError: ``seqlen <= D`` (depth ``D`` would have no position).
        """
        bs, seqlen = tokens.shape
        if seqlen <= self.depth:
            raise ValueError(
                f"MTP: mtp_num_layers {self.depth} needs sequences longer than {self.depth} "
                f"tokens, got {seqlen}; raise training.seq_len"
            )
        sums = []
        h_k = h
        for k, layer in enumerate(self.layers.values(), start=1):
            n = seqlen - k
            docs = None if document_ids is None else document_ids[:, :n]
            h_k = layer(h_k[:, :n], embed(tokens[:, k:]), cos[..., :n, :], sin[..., :n, :], docs)
            logits_k = head(layer.norm(h_k))
            sums.append(
                F.cross_entropy(
                    logits_k.flatten(0, 1).float(), labels[:, k:].flatten(), reduction="sum"
                )
            )
        total = torch.stack(sums)  # (D,)
        loss = self.weight / self.depth * total.sum() / (bs * seqlen)
        count = torch.full((1,), float(bs * seqlen), device=total.device)
        stats = torch.cat([total.detach(), count])
        self.stats = stats if self.stats is None else self.stats + stats
        return AddAuxiliaryLoss.apply(h, loss, self.loss_scale)

    def take_stats(self) -> torch.Tensor:
        """:attr:`stats` (zeros before a forward), then reset."""
        device = next(self.parameters()).device
        stats = torch.zeros(self.depth + 1, device=device) if self.stats is None else self.stats
        self.stats = None
        return stats


def mtp_module(model: nn.Module) -> MTP | None:
    """The model's :class:`MTP` (``model.mtp``), or ``None``."""
    return getattr(model, "mtp", None)


class MTPTrainingHooks(TrainingHooks):
    """The hooks ``inner`` (e.g. :class:`~torchtitan_lite.models.common.moe_hooks.MoETrainingHooks`)
    plus MTP's: the loss's gradient scale ``1 / (dp_degree * micro_batches)`` (module note), the
    step's per-depth sums taken after each optimizer step, and in :meth:`report` their mean over the
    data-parallel ranks (one all-reduce).

    Args: as every ``training_hooks`` (``model``, ``parallel_dims``, ``micro_batches``) and
    ``inner``.
    """

    def __init__(
        self,
        inner: TrainingHooks,
        model: nn.Module,
        parallel_dims: ParallelDims,
        micro_batches: int,
    ):
        self.inner, self.mtp, self.group = inner, mtp_module(model), parallel_dims.dp_group
        self.last: torch.Tensor | None = None
        if self.mtp is not None:
            self.mtp.loss_scale = 1.0 / (parallel_dims.dp_degree * micro_batches)

    def after_optimizer_step(self, step: int) -> None:
        """The inner hooks', then keep the step's MTP sums."""
        self.inner.after_optimizer_step(step)
        if self.mtp is not None:
            self.last = self.mtp.take_stats()

    def _sums(self) -> torch.Tensor:
        """The last step's ``(D + 1,)`` sums over the data-parallel ranks (one all-reduce)."""
        stats = self.last.clone()
        if dist.is_initialized():
            dist.all_reduce(stats, group=self.group)
        return stats

    def step1_heads(self, seq_len: int) -> dict[str, float]:
        """``{"mtp depth k": L^k per predicted token}``: depth ``k`` predicts ``seq_len - k``
        of each window's ``seq_len`` tokens."""
        heads = self.inner.step1_heads(seq_len)
        if self.mtp is None or self.last is None:
            return heads
        stats = self._sums()
        tokens = stats[-1].clamp_min(1).item()
        per_token = {
            f"mtp depth {k}": stats[k - 1].item() / (tokens * (seq_len - k) / seq_len)
            for k in range(1, self.mtp.depth + 1)
        }
        return {**heads, **per_token}

    def report(self, step: int) -> HookReport:
        """The inner report, plus ``loss/mtp`` (``L_MTP / lambda``: the mean over depths of ``L^k``)
        and ``loss/mtp_<k>`` scalars, and ``mtp loss 7.6123 (depth 1 7.6123)`` on the summary
        line."""
        report = self.inner.report(step)
        if self.mtp is None or self.last is None:
            return report
        stats = self._sums()
        per_depth = (stats[:-1] / stats[-1].clamp_min(1)).tolist()
        scalars = {**report.scalars, "loss/mtp": sum(per_depth) / len(per_depth)}
        scalars.update({f"loss/mtp_{k}": v for k, v in enumerate(per_depth, start=1)})
        text = (
            f"mtp loss {scalars['loss/mtp']:.4f} ("
            + ", ".join(f"depth {k} {v:.4f}" for k, v in enumerate(per_depth, start=1))
            + ")"
        )
        summary = (
            f"step {step:>3}  {text}" if report.summary is None else f"{report.summary}  {text}"
        )
        return HookReport(scalars, summary)
