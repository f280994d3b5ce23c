"""The expected step-1 loss of a freshly initialized model and the step-1 check.

Tied (``output.weight is tok_embeddings.weight``): the input token's own embedding ``e_t`` is in the
residual stream ``x = e_t + B`` (``B`` the sum of the blocks' branch outputs), so the self-logit is
``z_t = h . e_t = g sqrt(dim) (|e_t|^2 + B . e_t) / |x|`` with ``|e_t|^2 = dim s^2``. ``B`` is
independent of ``e_t``'s direction at init (zero-mean weights), so ``E[B . e_t] = 0`` and
``|x|^2 = |e_t|^2 + |B|^2``; ``|B|^2`` is at least ``F``, the sum over the dense SwiGLU feed-forward
branches the plan describes (pre-norm: each branch sees ``u = RMSNorm(x)``, ``|u|^2 = g_ffn^2 dim``,
whatever the depth; ``a = w1 u`` and ``b = w3 u`` have iid components ``N(0, s1^2 |u|^2)`` and
``N(0, s3^2 |u|^2)``; the output ``w2 (silu(a) * b)`` has
``E|y|^2 = dim * hidden * s2^2 * M(s1 |u|) * s3^2 |u|^2`` with ``M(sigma) = E[silu(sigma Z)^2]`` by
Gauss-Hermite quadrature). Attention branches and any block the estimate does not recognize (MoE,
MLA) are left out of ``F``: that can only make ``|x|`` smaller, so the self-logit
``mu = g sqrt(dim) |e|^2 / sqrt(|e|^2 + F)`` is an upper end
(``cos(e_t, x) <= |e| / sqrt(|e|^2 + F)``; ``F = 0`` gives the plain bound ``cos <= 1``). ``z_t``
varies from token to token: ``|e_t|^2`` has relative std ``sqrt(2 / dim)`` (a chi-square with
``dim`` degrees) and ``B . e_t`` std ``|B| |e| / sqrt(dim)``, so ``z_t ~ N(mu, tau^2)`` with
``tau^2 = mu^2 2 / dim + g^2 |e|^2 F / (|e|^2 + F)``. The range of a tied model goes from the untied
value (``low``, no self-logit) to ``high = E[logaddexp(partition of the V - 1 other rows, z_t)]``
(Gauss-Hermite over ``z_t``). This is tight when the embedding dominates (a tied output left at std
1: a loss in the hundreds) and when the branches do (deep models: the self-logit vanishes). Measured
against it: ``docs/benchmarks.md``. The step-1 loss is that of the first optimizer step of a freshly
initialized model (never on resume).

Repeated tokens. A target that repeats its input token (``y = t``) has the tied self-logit as its
target logit, ``E[z_y] = E[z_t] >= 0`` instead of 0, so real text with a share ``r`` of such targets
(2-3% in prose) has a lower loss than the partition range says: ``E[loss] >= low - r mu`` (the
partition is at least ``low``, the target logit at most ``mu`` on average).
:meth:`Step1Expectation.with_repeats` widens the range down to that, given ``r`` measured on the
step-1 batch; untied outputs have no self-logit and keep their value.

Note: docs/design.md, "on the expected step-1 loss".
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

import numpy as np
import torch
from torch import nn

from torchtitan_lite.errors import UserError
from torchtitan_lite.init.apply import tensor_groups
from torchtitan_lite.init.report import InitReport, truncated_normal_moments
from torchtitan_lite.init.spec import InitPlan, InitSpec

MAX_EXCESS_NATS = 1.0
"""A plan whose expected step-1 loss (low end) exceeds ln V by more than this is flagged on its own:
the usual inits start within 0.5 nats (untied ``dim^-0.5``: +0.49; tied 0.02: +0.05)."""


class InitCheckError(UserError, RuntimeError):
    """The step-1 check failed in strict mode (``debug.strict_init``); the message names the
    parameter."""


@dataclass(frozen=True)
class Step1Expectation:
    """The expected step-1 loss of a freshly initialized model: a range (see the module note).

    Attributes:
        low: expected mean token cross-entropy without the tied self-logit (``cos = 0``), nats.
        high: with the tied self-logit at its upper end (``mu``, spread ``tau``); ``low`` when
            untied, nats.
        ln_vocab: ``ln(vocab_size)``, nats.
        logit_std: std of the logits of rows independent of ``h`` (``sigma``).
        self_logit: the tied self-logit's upper end ``mu = g sqrt(dim) |e| cos`` (0.0 when untied).
        self_logit_std: its spread over tokens ``tau`` (0.0 when untied).
        cos: the upper end of ``cos(e_t, x)`` (0.0 when untied).
        ffn_norm_sq: ``F``, the squared norm the recognized feed-forward branches add to the
            residual stream.
        embedding_norm_sq: ``|e|^2 = dim s^2`` (0.0 when untied).
        output_names: every name of the output projection's tensor (two when tied).
        output_spec: the plan's winning spec for that tensor.
        repeat_rate: share of the step-1 targets equal to their input token (0.0: not measured); see
            :attr:`bounds`.
    """

    low: float
    high: float
    ln_vocab: float
    logit_std: float
    self_logit: float
    output_names: tuple[str, ...]
    output_spec: InitSpec
    self_logit_std: float = 0.0
    cos: float = 0.0
    ffn_norm_sq: float = 0.0
    embedding_norm_sq: float = 0.0
    repeat_rate: float = 0.0

    @property
    def tied(self) -> bool:
        """The output projection shares its tensor with another name (the embedding)."""
        return len(self.output_names) > 1

    @property
    def bounds(self) -> tuple[float, float]:
        """The expected step-1 loss range in nats: ``(low - repeat_rate * self_logit, high)``
        (module note)."""
        return self.low - self.repeat_rate * self.self_logit, self.high

    @property
    def span(self) -> str:
        """:attr:`bounds` as text, to 4 decimals: ``7.5937..7.6913`` (tied), ``8.1113`` (untied: one
        value)."""
        low, high = self.bounds
        return f"{low:.4f}" + (f"..{high:.4f}" if self.tied else "")

    def with_repeats(self, rate: float) -> Step1Expectation:
        """This expectation for a step-1 batch whose targets repeat their input token at share
        ``rate`` (module note, "Repeated tokens").

        Raises:
            ValueError: ``rate`` not in ``[0, 1]``.
        """
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"with_repeats: rate must be a share in [0, 1], got {rate}")
        return dataclasses.replace(self, repeat_rate=rate)

    def describe(self) -> str:
        """Every term of the expectation in one line, e.g. ``terms of the expected step-1 loss:
        logit std 0.316, ...``; the values are ``step1_line``'s (``lifecycle/startup.py``)."""
        extra = ""
        if self.tied:
            extra = (
                f", tied self-logit <= {self.self_logit:.3g} +- {self.self_logit_std:.2g}: "
                "cos(embedding, "
                f"residual) <= {self.cos:.3g}, feed-forward branches add {self.ffn_norm_sq:.3g} to "
                f"|e|^2 {self.embedding_norm_sq:.3g}"
            )
            if self.repeat_rate > 0:
                extra += (
                    f"; {self.repeat_rate:.1%} of the step-1 targets repeat their input token, "
                    f"which lowers the low end by {self.repeat_rate * self.self_logit:.3f}"
                )
        return (
            f"terms of the expected step-1 loss: logit std {self.logit_std:.3g}{extra}; "
            f"{' = '.join(self.output_names)}: {self.output_spec.describe()}"
        )


def mean_log_partition(sigma: float, n: int) -> float:
    """``E[ln sum_{i<n} exp(sigma X_i)]`` for iid standard normal ``X_i`` (random energy model, see
    the note).

    Raises:
        ValueError: ``sigma < 0`` or ``n < 1``.
    """
    if not sigma >= 0 or n < 1:
        raise ValueError(
            f"mean_log_partition: need sigma >= 0 and n >= 1, got sigma={sigma}, n={n}"
        )
    critical = math.sqrt(2.0 * math.log(n))
    if sigma <= critical:
        return math.log(n) + 0.5 * sigma * sigma
    return sigma * critical


def _winning_spec(plan: InitPlan, names: tuple[str, ...], what: str) -> InitSpec:
    """The spec the engine applies to a tensor with ``names``: the last plan entry matching any of
    them."""
    matches = [
        spec for pattern, spec in plan.entries if any(fnmatchcase(n, pattern) for n in names)
    ]
    if not matches:
        raise ValueError(
            f"expected_step1_loss: {what} {' = '.join(names)} matches no entry of the init plan of "
            f"{plan.model}; add one"
        )
    return matches[-1]


def _effective_std(spec: InitSpec) -> float:
    """Std of the values a spec draws (0 for fills); a non-zero mean is not modelled (see the
    note)."""
    if spec.kind == "trunc_normal":
        return spec.std * truncated_normal_moments(-spec.cutoff, spec.cutoff)[1]
    return spec.std if spec.kind == "normal" else 0.0


def expected_step1_loss(model: nn.Module, plan: InitPlan) -> Step1Expectation:
    """The expected step-1 loss of ``model`` initialized from ``plan`` (formula and accuracy: module
    note).

    Reads shapes and ties only (works on meta): ``output`` ``(vocab_size, dim)`` and the final
    ``norm``.

    Raises:
        ValueError: the model has no ``output.weight``, its final ``norm.weight`` is not a constant
            fill (``ones``/``constant``), or a tensor matches no plan entry.
    """
    groups = dict(tensor_groups(model))
    out_names = next((names for names in groups if "output.weight" in names), None)
    if out_names is None:
        raise ValueError(
            "expected_step1_loss: the model has no output.weight; it must follow the registry "
            "contract (torchtitan_lite/protocols/model_spec.py)"
        )
    vocab_size, dim = groups[out_names].shape
    out_spec = _winning_spec(plan, out_names, "tensor")
    gain = 1.0
    norm_names = next((names for names in groups if "norm.weight" in names), None)
    if norm_names is not None:
        norm_spec = _winning_spec(plan, norm_names, "tensor")
        if norm_spec.kind not in ("ones", "constant"):
            raise ValueError(
                f"expected_step1_loss: final norm.weight has spec {norm_spec.describe()}; the "
                "formula needs a constant fill (ones or constant)"
            )
        gain = abs(norm_spec.value) if norm_spec.kind == "constant" else 1.0
    s = _effective_std(out_spec)
    sigma = gain * math.sqrt(dim) * s
    low = mean_log_partition(sigma, vocab_size)
    if len(out_names) == 1:
        return Step1Expectation(low, low, math.log(vocab_size), sigma, 0.0, out_names, out_spec)
    e_sq, ffn_sq = dim * s * s, _ffn_norm_sq(groups, plan)
    cos = math.sqrt(e_sq / (e_sq + ffn_sq)) if e_sq > 0 else 0.0
    mu = gain * math.sqrt(dim * e_sq) * cos
    tau = (
        math.sqrt(mu * mu * 2.0 / dim + gain * gain * e_sq * ffn_sq / (e_sq + ffn_sq))
        if e_sq > 0
        else 0.0
    )
    others = mean_log_partition(sigma, vocab_size - 1)
    nodes, weights = _GAUSS_HERMITE
    high = max(
        low,
        sum(
            w * float(np.logaddexp(others, mu + tau * z))
            for z, w in zip(nodes, weights, strict=True)
        ),
    )
    return Step1Expectation(
        low, high, math.log(vocab_size), sigma, mu, out_names, out_spec, tau, cos, ffn_sq, e_sq
    )


_GAUSS_HERMITE = (lambda x, w: (x, w / math.sqrt(2.0 * math.pi)))(
    *np.polynomial.hermite_e.hermegauss(64)
)
"""Nodes and weights of ``E[f(Z)] = sum w_i f(x_i)`` for a standard normal ``Z`` (64 points)."""


def silu_square_mean(sigma: float) -> float:
    """``M(sigma) = E[silu(sigma Z)^2]`` for a standard normal ``Z`` (Gauss-Hermite quadrature)."""
    nodes, weights = _GAUSS_HERMITE
    a = sigma * nodes
    return float(np.sum(weights * (a / (1.0 + np.exp(-a))) ** 2))


def _ffn_norm_sq(groups: dict[tuple[str, ...], torch.Tensor], plan: InitPlan) -> float:
    """``F``: the expected squared norm that the dense SwiGLU feed-forward branches
    (``layers.<i>.feed_forward`` ``.w1/.w3`` ``(hidden, dim)``, ``.w2`` ``(dim, hidden)`` after
    ``layers.<i>.ffn_norm``, a constant fill) add to the residual stream at init (module note);
    blocks without one add nothing."""
    by_name = {name: (names, tensor) for names, tensor in groups.items() for name in names}
    total = 0.0
    for name in by_name:
        match = _FFN_W1.fullmatch(name)
        parts = {k: by_name.get(f"{match.group(1)}.{k}") for k in _FFN_PARTS} if match else {}
        if not match or None in parts.values():
            continue
        specs = {k: _winning_spec(plan, names, "tensor") for k, (names, _) in parts.items()}
        (hidden, dim), shapes = (
            parts["feed_forward.w1.weight"][1].shape,
            {k: tuple(t.shape) for k, (_, t) in parts.items()},
        )
        if (
            shapes["feed_forward.w3.weight"] != (hidden, dim)
            or shapes["feed_forward.w2.weight"] != (dim, hidden)
            or specs["ffn_norm.weight"].kind not in ("ones", "constant")
        ):
            continue
        norm = specs["ffn_norm.weight"]
        u_sq = (1.0 if norm.kind == "ones" else norm.value**2) * dim
        s1, s2, s3 = (_effective_std(specs[f"feed_forward.{w}.weight"]) for w in ("w1", "w2", "w3"))
        total += dim * hidden * s2 * s2 * silu_square_mean(s1 * math.sqrt(u_sq)) * s3 * s3 * u_sq
    return total


_FFN_W1 = re.compile(r"(layers\.[^.]+)\.feed_forward\.w1\.weight")
_FFN_PARTS = (
    "ffn_norm.weight",
    "feed_forward.w1.weight",
    "feed_forward.w2.weight",
    "feed_forward.w3.weight",
)


def check_step1_loss(
    expected: Step1Expectation,
    measured: float,
    *,
    margin: float,
    strict: bool = False,
    report: InitReport | None = None,
    max_excess: float = MAX_EXCESS_NATS,
) -> list[str]:
    """The problem lines (warnings; empty when it passes) of a fresh run's measured step-1 loss
    against
    :func:`expected_step1_loss`: not finite or more than ``margin`` nats outside the expected range,
    or a range whose low end exceeds ``ln V`` by more than ``max_excess``. Each names the output
    tensor, its spec and, given ``report``, its measured std.

    Raises:
        ValueError: ``margin`` or ``max_excess`` not > 0.
        InitCheckError: ``strict`` and a problem was found (its message holds every line).
    """
    if not (margin > 0 and max_excess > 0):
        raise ValueError(
            f"check_step1_loss: margin and max_excess must be > 0 nats, got {margin}, {max_excess}"
        )
    detail = f"{' = '.join(expected.output_names)}: spec {expected.output_spec.describe()}"
    row = (
        next((r for r in report.rows if r.names == list(expected.output_names)), None)
        if report
        else None
    )
    if row is not None:
        detail += f", measured std {row.std:.4g} vs expected {row.expected_std:.4g}"
    problems = []
    low, high = expected.bounds
    if not low - margin <= measured <= high + margin:
        problems.append(
            f"step-1 loss {measured:.4f} is outside the {expected.span} expected from the init "
            "plan by more than "
            f"debug.init_loss_margin = {margin} nats; check the init of {detail} (a tied output "
            f"left at the embedding's std-1 init starts near dim nats)"
        )
    excess = expected.low - expected.ln_vocab
    if excess > max_excess:
        problems.append(
            f"the init plan of {detail} starts at least {excess:.3g} nats above ln V = "
            f"{expected.ln_vocab:.4f} "
            f"(limit {max_excess}); lower that std (tied outputs: about 0.02, untied: dim^-0.5)"
        )
    if problems and strict:
        raise InitCheckError("; ".join(problems) + " (debug.strict_init is on)")
    return problems
