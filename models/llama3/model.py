"""Dense Llama 3 decoder ("The Llama 3 Herd of Models", arXiv 2407.21783; HF transformers
``modeling_llama.py``).

Qwen3's dense decoder without QK-norm
(:class:`torchtitan_lite.models.common.dense_block.DenseBlock`): pre-norm blocks of GQA attention
and a SwiGLU, a final ``norm`` and an untied ``output`` (tied in Llama 3.2 1B/3B). Its RoPE (Llama
3.1) rescales the frequencies (:func:`llama3_inv_freq`).
"""

from __future__ import annotations

import math

import torch

from torchtitan_lite.models.common.decoder import Decoder
from torchtitan_lite.models.common.dense_block import DenseBlock
from torchtitan_lite.models.common.rope import rope_cos_sin
from torchtitan_lite.models.llama3.args import Llama3ModelArgs


def llama3_inv_freq(
    args: Llama3ModelArgs, device: torch.device | str | None = None
) -> torch.Tensor:
    """Llama 3.1's RoPE frequencies: fp32 ``(head_dim // 2,)`` radians per position.

    The plain frequencies ``rope_theta ** (-2i / head_dim)``; those whose wavelength ``2 pi / f``
    exceeds ``rope_original_max_seq_len / rope_low_freq_factor`` are divided by ``rope_factor``,
    those below ``rope_original_max_seq_len / rope_high_freq_factor`` kept, and in between
    interpolated with the smooth factor
    ``s = (rope_original_max_seq_len / wavelength - low) / (high - low)``:
    ``(1 - s) f / factor + s f`` (Meta's ``apply_scaling`` in llama-models ``reference_impl``;
    transformers' ``_compute_llama3_parameters``, whose operations this repeats in the same order).
    """
    a = args
    inv_freq = 1.0 / (
        a.rope_theta
        ** (torch.arange(0, a.head_dim, 2, dtype=torch.int64, device=device).float() / a.head_dim)
    )
    low_freq_wavelen = a.rope_original_max_seq_len / a.rope_low_freq_factor
    high_freq_wavelen = a.rope_original_max_seq_len / a.rope_high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / a.rope_factor, inv_freq)
    smooth = (a.rope_original_max_seq_len / wavelen - a.rope_low_freq_factor) / (
        a.rope_high_freq_factor - a.rope_low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / a.rope_factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


class Llama3Model(Decoder):
    """The Llama 3 decoder (:class:`torchtitan_lite.models.common.decoder.Decoder`) with
    :class:`~torchtitan_lite.models.common.dense_block.DenseBlock` blocks without QK-norm:
    ``tokens`` int64 ``(bs, seqlen)`` -> logits ``(bs, seqlen, vocab_size)``.
    """

    def __init__(self, args: Llama3ModelArgs):
        super().__init__(
            args, lambda a, _layer_id: DenseBlock(a, qk_norm=False), rope_dim=args.head_dim
        )

    def rope_tables(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """The RoPE tables, each fp32 ``(max_seq_len, head_dim)``: of :func:`llama3_inv_freq` with
        ``args.rope_scaling``, else plain."""
        if not self.args.rope_scaling:
            return super().rope_tables(device)
        a = self.args
        return rope_cos_sin(
            a.head_dim,
            a.max_seq_len,
            a.rope_theta,
            inv_freq=llama3_inv_freq(a, device),
            device=device,
        )
