"""Init plans as data: what distribution every parameter and state buffer starts from.

A model family declares an :class:`InitPlan`, an ordered table of (name pattern, :class:`InitSpec`)
that :mod:`torchtitan_lite.init.apply` applies. Patterns are ``fnmatch`` globs over canonical names,
and ``*`` matches dots too (``layers.*.attention.wq.weight`` covers every layer).

Note: docs/design.md, "on tied weights".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["normal", "trunc_normal", "zeros", "ones", "constant"]


@dataclass(frozen=True)
class InitSpec:
    """One parameter's initial distribution.

    Attributes:
        std, mean: of the (untruncated) normal, in the parameter's units.
        cutoff: ``trunc_normal``'s half-width in units of ``std`` (bounds ``mean +- cutoff * std``).
        value: the fill value of ``constant``.
        source: where the choice comes from (paper, model card, reference code).

    Raises:
        ValueError: a non-finite or non-positive ``std`` or ``cutoff`` for a random kind.
    """

    kind: Kind
    std: float = 0.0
    cutoff: float = math.inf
    mean: float = 0.0
    value: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind in ("normal", "trunc_normal"):
            if not (math.isfinite(self.std) and self.std > 0):
                raise ValueError(
                    f"InitSpec({self.kind}): std must be finite and > 0, got {self.std}"
                )
            if not self.cutoff > 0:
                raise ValueError(
                    f"InitSpec({self.kind}): cutoff must be > 0 sigma, got {self.cutoff}"
                )
        if self.kind == "trunc_normal" and not math.isfinite(self.cutoff):
            raise ValueError(
                "InitSpec(trunc_normal): cutoff must be finite; use normal() for no cutoff"
            )

    @property
    def bounds(self) -> tuple[float, float]:
        """Absolute bounds ``(a, b)``; ``(-inf, inf)`` for an untruncated normal."""
        if self.kind == "trunc_normal":
            return self.mean - self.cutoff * self.std, self.mean + self.cutoff * self.std
        return -math.inf, math.inf

    def describe(self) -> str:
        """Short human-readable form, e.g. ``trunc_normal(std=0.02, +-3 sigma)``."""
        if self.kind == "trunc_normal":
            return f"trunc_normal(std={self.std:.4g}, +-{self.cutoff:g} sigma)"
        if self.kind == "normal":
            return f"normal(std={self.std:.4g})"
        if self.kind == "constant":
            return f"constant({self.value:g})"
        return self.kind


def normal(std: float, mean: float = 0.0, source: str = "") -> InitSpec:
    """``N(mean, std^2)``, untruncated."""
    return InitSpec("normal", std=std, mean=mean, source=source)


def trunc_normal(std: float, cutoff: float = 3.0, mean: float = 0.0, source: str = "") -> InitSpec:
    """``N(mean, std^2)`` truncated to ``mean +- cutoff * std``."""
    return InitSpec("trunc_normal", std=std, cutoff=cutoff, mean=mean, source=source)


def zeros(source: str = "") -> InitSpec:
    """All zeros."""
    return InitSpec("zeros", source=source)


def ones(source: str = "") -> InitSpec:
    """All ones (e.g. RMSNorm weights)."""
    return InitSpec("ones", source=source)


def constant(value: float, source: str = "") -> InitSpec:
    """Every element set to ``value``."""
    return InitSpec("constant", value=value, source=source)


@dataclass(frozen=True)
class InitPlan:
    """An ordered table of ``(pattern, InitSpec)``: every parameter and persistent buffer matches a
    pattern and every pattern a tensor (else the engine raises ValueError); the last match wins."""

    model: str
    entries: tuple[tuple[str, InitSpec], ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        width = max((len(p) for p, _ in self.entries), default=0)
        lines = [f"init plan of {self.model}:"]
        for pattern, spec in self.entries:
            lines.append(f"  {pattern:<{width}}  {spec.describe():<34} {spec.source}")
        return "\n".join(lines)
