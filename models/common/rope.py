"""Rotary position embedding (RoPE; Su et al. 2021, arXiv 2104.09864), "rotate_half" layout.

Layout: the HF transformers convention (``rotate_half`` in ``modeling_qwen3.py`` /
``modeling_llama.py``): feature ``i`` is paired with feature ``i + head_dim/2`` (not with ``i + 1``
as in Meta's complex ``view_as_complex`` layout), so Hugging Face checkpoints load without permuting
``wq``/``wk`` rows.

Tables: ``cos``/``sin`` are fp32 ``(max_seq_len, head_dim)``, the ``head_dim/2`` frequencies written
twice (``cat([freqs, freqs])``), exactly as HF builds them. Models keep them as non-persistent
buffers and recompute them in ``init_buffers``; YaRN (``models/common/yarn.py``) passes its own
``inv_freq`` and may scale the returned tables by its attention factor.
"""

from __future__ import annotations

import torch


def rope_cos_sin(
    head_dim: int,
    max_seq_len: int,
    theta: float,
    inv_freq: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The RoPE tables for positions ``0 .. max_seq_len-1``.

    Args:
        head_dim: rotated size per head; must be even.
        max_seq_len: number of positions.
        theta: RoPE base (``rope_theta``: 1e6 for Qwen3, 1e4 in the RoPE paper); ignored when
            ``inv_freq`` is given.
        inv_freq: optional ``(head_dim // 2,)`` angular frequencies in radians per position
            (e.g. YaRN's); default ``theta ** (-2i / head_dim)`` for ``i = 0 .. head_dim/2 - 1``
            (RoPE paper eq. 15; HF ``_compute_default_rope_parameters``).
        device: where to build the tables (default: ``inv_freq``'s device, else CPU).

    Returns:
        ``(cos, sin)``, each fp32 ``(max_seq_len, head_dim)``; row ``p`` holds ``cos(p * f)`` /
        ``sin(p * f)`` with the frequency vector ``f`` repeated twice along the last dimension.

    Raises:
        ValueError: odd or non-positive ``head_dim``, non-positive ``max_seq_len`` or ``theta``,
            or an ``inv_freq`` whose shape is not ``(head_dim // 2,)``.
    """
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rope_cos_sin: head_dim must be a positive even number, got {head_dim}")
    if max_seq_len <= 0:
        raise ValueError(f"rope_cos_sin: max_seq_len must be > 0, got {max_seq_len}")
    if inv_freq is None:
        if not theta > 0:
            raise ValueError(f"rope_cos_sin: theta (rope_theta) must be > 0, got {theta}")
        exponents = (
            torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
        )
        inv_freq = 1.0 / (theta**exponents)
    elif tuple(inv_freq.shape) != (head_dim // 2,):
        raise ValueError(
            f"rope_cos_sin: inv_freq must have shape ({head_dim // 2},) = (head_dim // 2,), "
            f"got {tuple(inv_freq.shape)}"
        )
    inv_freq = inv_freq.to(
        device=device if device is not None else inv_freq.device, dtype=torch.float32
    )
    positions = torch.arange(max_seq_len, dtype=torch.float32, device=inv_freq.device)
    freqs = torch.outer(positions, inv_freq)  # (max_seq_len, head_dim // 2)
    angles = torch.cat([freqs, freqs], dim=-1)  # (max_seq_len, head_dim)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` by the position angles: ``x * cos + rotate_half(x) * sin``.

    ``rotate_half(x) = cat([-x2, x1])`` with ``x1, x2`` the two halves of the last dimension
    (HF ``rotate_half``). Computed in fp32, returned in ``x.dtype``.

    Args:
        x: ``(bs, seqlen, n_heads, head_dim)`` queries or keys.
        cos, sin: ``(seqlen, head_dim)`` rows of :func:`rope_cos_sin` for the positions of ``x``
            (slice ``cos[:seqlen]`` for positions ``0 .. seqlen-1``), or ``(bs, seqlen, head_dim)``
            rows per sequence (positions restarting at each document).

    Returns:
        A tensor of the shape and dtype of ``x``.

    Raises:
        ValueError: ``x`` is not 4-D or ``cos``/``sin`` are not ``([bs,] seqlen, head_dim)``.
    """
    if x.dim() != 4:
        raise ValueError(
            f"apply_rope: x must be (bs, seqlen, n_heads, head_dim), got shape {tuple(x.shape)}"
        )
    expected = (x.shape[1], x.shape[3]) if cos.dim() == 2 else (x.shape[0], x.shape[1], x.shape[3])
    if tuple(cos.shape) != expected or tuple(sin.shape) != expected:
        raise ValueError(
            f"apply_rope: cos and sin must be (seqlen, head_dim) = {expected}, got "
            f"{tuple(cos.shape)} and {tuple(sin.shape)}; slice the tables with [:seqlen]"
        )
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    cos = cos.float().view(-1, x.shape[1], 1, x.shape[3])  # (1 or bs, seqlen, 1, head_dim)
    sin = sin.float().view(-1, x.shape[1], 1, x.shape[3])
    return (x32 * cos + rotated * sin).to(x.dtype)
