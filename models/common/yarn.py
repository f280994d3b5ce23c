"""YaRN context extension for RoPE (Peng et al. 2023, arXiv 2309.00071), as GPT-OSS uses it.

Source of the exact form: ``RotaryEmbedding._compute_concentration_and_inv_freq`` in the OpenAI
reference ``gpt_oss/torch/model.py`` and HF ``_compute_yarn_parameters`` with ``truncate=False``
(the ``rope_scaling`` of openai/gpt-oss-20b and -120b ``config.json``: factor 32,
original_max_position_embeddings 4096, beta_fast 32, beta_slow 1). The tables are built by
:func:`torchtitan_lite.models.common.rope.rope_cos_sin` and applied with
:func:`torchtitan_lite.models.common.rope.apply_rope`.
"""

from __future__ import annotations

import math

import torch

from torchtitan_lite.models.common.rope import rope_cos_sin


def yarn_inv_freq(
    head_dim: int,
    theta: float,
    factor: float,
    original_max_seq_len: int,
    beta_fast: float,
    beta_slow: float,
    device: torch.device | str | None = None,
    truncate: bool = False,
) -> torch.Tensor:
    """YaRN's "NTK-by-parts" frequencies: interpolate the slow dimensions, keep the fast ones.

    With ``d = head_dim / 2`` base frequencies ``f_i = theta ** (-2i / head_dim)``, a dimension that
    turns ``r`` times over the original context has index
    ``i(r) = d * ln(original_max_seq_len / (2 pi r)) / ln(theta)`` (paper eq. 17-18). With
    ``low = i(beta_fast)`` and ``high = i(beta_slow)`` (rounded down and up with ``truncate``, as
    the DeepSeek-V3 reference's ``find_correction_range`` and HF's default; GPT-OSS does not round),
    clamped to ``[0, head_dim - 1]`` (HF ``find_correction_range``; the published configs never
    reach the bounds), the ramp ``gamma_i = 1 - clamp((i - low) / (high - low), 0, 1)`` mixes
    ``inv_freq_i = f_i / factor * (1 - gamma_i) + f_i * gamma_i``: dimensions below ``low``
    (more than ``beta_fast`` turns) are kept, those above ``high`` (less than ``beta_slow`` turns)
    are divided by ``factor``.

    Args:
        head_dim: rotated size per head (even).
        theta: RoPE base (GPT-OSS: 150000).
        factor: context extension factor ``s`` (GPT-OSS: 32).
        original_max_seq_len: context length of pre-training before extension (GPT-OSS: 4096).
        beta_fast, beta_slow: turn counts bounding the ramp (GPT-OSS: 32 and 1).
        device: where to build the result.
        truncate: round ``low`` down and ``high`` up (DeepSeek-V3: true; GPT-OSS: false).

    Returns:
        fp32 ``(head_dim // 2,)`` angular frequencies in radians per position.

    Raises:
        ValueError: odd or non-positive ``head_dim``, ``theta <= 1``, ``factor < 1``, a non-positive
            ``original_max_seq_len``, or not ``0 < beta_slow < beta_fast``.
    """
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"yarn_inv_freq: head_dim must be a positive even number, got {head_dim}")
    if not theta > 1:
        raise ValueError(f"yarn_inv_freq: theta (rope_theta) must be > 1, got {theta}")
    if not factor >= 1:
        raise ValueError(f"yarn_inv_freq: factor must be >= 1 (1 = no extension), got {factor}")
    if original_max_seq_len <= 0:
        raise ValueError(
            f"yarn_inv_freq: original_max_seq_len must be > 0, got {original_max_seq_len}"
        )
    if not 0 < beta_slow < beta_fast:
        raise ValueError(
            f"yarn_inv_freq: need 0 < beta_slow < beta_fast, got beta_slow={beta_slow}, "
            f"beta_fast={beta_fast}"
        )
    half = head_dim // 2

    def dim_of_turns(turns: float) -> float:
        return half * math.log(original_max_seq_len / (turns * 2 * math.pi)) / math.log(theta)

    low, high = dim_of_turns(beta_fast), dim_of_turns(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # HF linear_ramp_factor: no division by zero
    idx = torch.arange(half, dtype=torch.float32, device=device)
    base_freq = 1.0 / theta ** (2 * idx / head_dim)
    keep = 1 - ((idx - low) / (high - low)).clamp(0, 1)  # 1: extrapolate (keep), 0: interpolate
    return base_freq / factor * (1 - keep) + base_freq * keep


def yarn_attention_scaling(factor: float) -> float:
    """YaRN's attention temperature ``0.1 ln(factor) + 1`` (paper eq. 22: ``sqrt(1/t)``).

    GPT-OSS multiplies both cos and sin by it (the reference's ``concentration``), so q.k logits
    grow by its square. 1.0 for ``factor <= 1``.
    """
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def yarn_cos_sin(
    head_dim: int,
    max_seq_len: int,
    theta: float,
    factor: float,
    original_max_seq_len: int,
    beta_fast: float,
    beta_slow: float,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables with YaRN frequencies, scaled by :func:`yarn_attention_scaling`.

    Returns:
        ``(cos, sin)``, each fp32 ``(max_seq_len, head_dim)`` in the layout of
        :func:`torchtitan_lite.models.common.rope.rope_cos_sin`, ready for
        :func:`torchtitan_lite.models.common.rope.apply_rope`.

    Raises:
        ValueError: as :func:`yarn_inv_freq` and
            :func:`torchtitan_lite.models.common.rope.rope_cos_sin`.
    """
    inv_freq = yarn_inv_freq(
        head_dim, theta, factor, original_max_seq_len, beta_fast, beta_slow, device
    )
    cos, sin = rope_cos_sin(head_dim, max_seq_len, theta, inv_freq=inv_freq, device=device)
    scaling = yarn_attention_scaling(factor)
    return cos * scaling, sin * scaling
