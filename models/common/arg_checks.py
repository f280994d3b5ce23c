"""Checks shared by the families' args dataclasses, called from their ``__post_init__`` as
``from torchtitan_lite.models.common import arg_checks as check; check.ints(self)``.

Every check raises ``ValueError`` with one line naming the class, the field(s) and the value(s),
e.g. ``Qwen3ModelArgs.dim must be a positive integer, got 0``.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any


def ints(args: Any, may_be_zero: tuple[str, ...] = ()) -> None:
    """Every field annotated ``int`` holds an ``int`` (not a ``bool``) >= 1, or >= 0 for
    ``may_be_zero``."""
    name = type(args).__name__
    for f in fields(args):
        value = getattr(args, f.name)
        if f.type != "int":
            continue
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or value < (0 if f.name in may_be_zero else 1)
        ):
            wanted = "an integer >= 0" if f.name in may_be_zero else "a positive integer"
            raise ValueError(f"{name}.{f.name} must be {wanted}, got {value!r}")


def bools(args: Any, *names: str) -> None:
    """Each field of ``names`` is ``True`` or ``False``."""
    for field in names:
        if not isinstance(getattr(args, field), bool):
            raise ValueError(
                f"{type(args).__name__}.{field} must be true or false, got {getattr(args, field)!r}"
            )


def positive(args: Any, *names: str) -> None:
    """Each field of ``names`` is > 0."""
    for field in names:
        if not getattr(args, field) > 0:
            raise ValueError(
                f"{type(args).__name__}.{field} must be > 0, got {getattr(args, field)!r}"
            )


def non_negative(args: Any, *names: str) -> None:
    """Each field of ``names`` (a coefficient or step size, 0 = off) is >= 0."""
    for field in names:
        if not getattr(args, field) >= 0:
            raise ValueError(
                f"{type(args).__name__}.{field} must be >= 0 (0 = off), got "
                f"{getattr(args, field)!r}"
            )


def even(args: Any, field: str) -> None:
    """``field`` (a RoPE-rotated size) is even: RoPE rotates feature pairs."""
    if getattr(args, field) % 2:
        raise ValueError(
            f"{type(args).__name__}.{field} must be even (RoPE rotates pairs), got "
            f"{getattr(args, field)}"
        )


def multiple(args: Any, field: str, of: str) -> None:
    """``field`` is a multiple of ``of`` (e.g. ``n_heads`` of ``n_kv_heads``: GQA groups)."""
    value, divisor = getattr(args, field), getattr(args, of)
    if value % divisor:
        raise ValueError(
            f"{type(args).__name__}: {field} ({value}) must be a multiple of {of} ({divisor})"
        )


def at_most(args: Any, field: str, bound: str) -> None:
    """``field <= bound`` (e.g. ``top_k <= num_experts``)."""
    value, limit = getattr(args, field), getattr(args, bound)
    if value > limit:
        raise ValueError(f"{type(args).__name__}: {field} ({value}) must be <= {bound} ({limit})")


def rope(args: Any, yarn: bool) -> None:
    """``rope_theta > 1``; with ``yarn`` also ``rope_factor >= 1`` and
    ``0 < rope_beta_slow < rope_beta_fast`` (YaRN's ramp, Peng et al. 2023, arXiv 2309.00071 sec.
    3.2)."""
    name = type(args).__name__
    if not args.rope_theta > 1:
        raise ValueError(f"{name}.rope_theta must be > 1, got {args.rope_theta!r}")
    if not yarn:
        return
    if not args.rope_factor >= 1:
        raise ValueError(
            f"{name}.rope_factor must be >= 1 (1 = no extension), got {args.rope_factor!r}"
        )
    if not 0 < args.rope_beta_slow < args.rope_beta_fast:
        raise ValueError(
            f"{name}: need 0 < rope_beta_slow < rope_beta_fast, got {args.rope_beta_slow!r} and "
            f"{args.rope_beta_fast!r}"
        )
