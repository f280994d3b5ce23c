"""Float8 training of linear layers through torchao (``[float8]``, docs/performance.md "Float8
training").

torchao's ``convert_to_float8_training`` swaps each chosen ``nn.Linear`` for a ``Float8Linear``: its
weights stay in the high-precision parameter dtype (so init, checkpoints and the HF export see plain
fp32 weights), and each matmul of forward and backward casts its operands to float8 (e4m3) with
dynamic scales and runs ``torch._scaled_mm`` (torchao ``float8/README.md``; recipes ``tensorwise``,
``rowwise``, ``rowwise_with_gw_hp`` from its ``Float8LinearRecipeName``). The conversion happens on
the meta model before tensor parallelism, activation checkpointing, compile and FSDP2, as
torchtitan's float8 converter does (``torchtitan/components/quantization``).

torchao is optional (``pip install -e ".[float8]"``); this module imports it only in
:func:`import_torchao`, so the config checks (:func:`check_float8_config`) stay light.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.load import Sources, where

INSTALL_HINT = 'pip install -e ".[float8]"'
"""The command that installs torchao at the version range this project is tested with
(pyproject.toml)."""
_ALIGNMENT = 16
"""``torch._scaled_mm`` needs both matmul dimensions of a float8 linear to be multiples of 16 (its
CUDA kernel's constraint, kept on CPU too so a layer converted here is converted on a GPU);
torchtitan's filter skips others."""


@dataclass(frozen=True)
class Float8Settings:
    """What :func:`convert_to_float8` applies (from ``[float8]``, see the schema for each field).

    Attributes:
        recipe_name: ``tensorwise``, ``rowwise`` or ``rowwise_with_gw_hp``.
        filter_fqns: a linear whose fully qualified name contains any of these stays in high
            precision.
        enable_fsdp_float8_all_gather: FSDP2 all-gathers the weights in float8 (tensorwise only).
        precompute_float8_dynamic_scale_for_fsdp: one all-reduce of all weights' amax after each
            optimizer step.
    """

    recipe_name: str = "tensorwise"
    filter_fqns: tuple[str, ...] = ("output", "router.gate")
    enable_fsdp_float8_all_gather: bool = False
    precompute_float8_dynamic_scale_for_fsdp: bool = False


def float8_settings(config: Any) -> Float8Settings | None:
    """The run's :class:`Float8Settings` from ``config.float8`` (a
    :class:`~torchtitan_lite.config.schema.JobConfig`), or ``None`` when ``float8.enable`` is
    false."""
    f8 = config.float8
    if not f8.enable:
        return None
    return Float8Settings(
        recipe_name=f8.recipe_name,
        filter_fqns=tuple(f8.filter_fqns),
        enable_fsdp_float8_all_gather=f8.enable_fsdp_float8_all_gather,
        precompute_float8_dynamic_scale_for_fsdp=f8.precompute_float8_dynamic_scale_for_fsdp,
    )


def check_float8_config(config: Any, sources: Sources) -> None:
    """``[float8]`` against the installation and the layout, before launch.

    Raises:
        ConfigError: one line naming the key and the fix: torchao not installed; the float8
            all-gather with a rowwise recipe (torchao casts a weight to float8 before the all-gather
            only with one scale per tensor); the precomputed scales without the float8 all-gather
            (they are that all-gather's scales); tensor parallelism (torchao's float8 TP styles are
            not wired into the families' plans here).
    """
    f8 = config.float8
    if not f8.enable:
        return
    key = where(sources, "float8.enable")
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError(
            f"{key}: float8 training needs torchao, which is not installed; run {INSTALL_HINT}"
        )
    if f8.enable_fsdp_float8_all_gather and f8.recipe_name != "tensorwise":
        raise ConfigError(
            f"{where(sources, 'float8.enable_fsdp_float8_all_gather')}: the float8 all-gather "
            "needs "
            f'recipe_name = "tensorwise" (one scale per weight), not {f8.recipe_name!r}; set it '
            "false or use the tensorwise recipe"
        )
    if f8.precompute_float8_dynamic_scale_for_fsdp and not f8.enable_fsdp_float8_all_gather:
        raise ConfigError(
            f"{where(sources, 'float8.precompute_float8_dynamic_scale_for_fsdp')}: precomputes the "
            "scales of the float8 all-gather; also set float8.enable_fsdp_float8_all_gather = true"
        )
    if config.parallelism.tensor_parallel_degree > 1:
        raise ConfigError(
            f"{key}: float8 with tensor parallelism (torchao's Float8ColwiseParallel/"
            "Float8RowwiseParallel styles) is not supported here; set "
            "parallelism.tensor_parallel_degree = 1 or float8.enable = false"
        )


def _has_cuda() -> bool:
    """A CUDA device is visible (``torch.accelerator``)."""
    device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return device is not None and device.type == "cuda"


class _DropRecords(logging.Filter):
    """Drops the log records of torchao's import that say nothing about this run (see
    :func:`import_torchao`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if (
            record.name == "torchao"
            and message.startswith("Failed to load ")
            and "torchao/_C" in message
        ):
            return _has_cuda()  # a CUDA-only kernel library failing where there is no CUDA
        if (
            record.name == "torch.utils._pytree"
            and "register_constant() on Enum subclasses" in message
        ):
            return not any(
                str(arg).startswith("<enum 'KernelPreference'") or "torchao" in str(arg)
                for arg in (record.args or ())
            )
        return True


@contextlib.contextmanager
def _quiet_import() -> Iterator[None]:
    """While importing torchao: drop (only) its two known import-time warnings. torchao 0.18's
    ``__init__`` logs ``Failed to load .../_C_cutlass_90a.abi3.so`` (and ``_C_mxfp8``) for its
    CUDA-only kernel libraries on a machine without CUDA, and its ``register_as_pytree_constant`` on
    the ``KernelPreference`` enum makes torch 2.13's pytree log a deprecation. Both are kept where
    they mean something: the failed load on a CUDA machine."""
    drop = _DropRecords()
    loggers = [logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")]
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)


def import_torchao():
    """``torchao.float8``, imported without its two known import-time warning lines
    (:func:`_quiet_import`).

    Raises:
        ImportError: torchao is not installed (the config check names the install command first).
    """
    with _quiet_import():
        import torchao.float8
    return torchao.float8


def _linear_filter(filter_fqns: tuple[str, ...]):
    """``(module, fqn) -> bool``: convert an ``nn.Linear`` unless its name contains one of
    ``filter_fqns`` or a dimension is not a multiple of :data:`_ALIGNMENT` (torchtitan's
    ``module_filter_fn`` rule)."""

    def keep(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or any(part in fqn for part in filter_fqns):
            return False
        return module.in_features % _ALIGNMENT == 0 and module.out_features % _ALIGNMENT == 0

    return keep


def convert_to_float8(model: nn.Module, settings: Float8Settings) -> list[str]:
    """Swap the chosen ``nn.Linear`` modules of ``model`` for torchao ``Float8Linear``, in place (on
    meta or materialized; before any parallelism). Grouped MoE experts (3-D weights, not
    ``nn.Linear``) stay in high precision: torchao 0.18's float8 grouped GEMM
    (``torchao.prototype.moe_training``) runs on CUDA only.

    Returns:
        the fully qualified names of the converted modules, in module order.
    """
    f8 = import_torchao()
    if settings.recipe_name == "tensorwise":
        config = f8.Float8LinearConfig(
            enable_fsdp_float8_all_gather=settings.enable_fsdp_float8_all_gather
        )
    else:
        config = f8.Float8LinearConfig.from_recipe_name(settings.recipe_name)
    f8.convert_to_float8_training(
        model, config=config, module_filter_fn=_linear_filter(settings.filter_fqns)
    )
    return float8_linear_names(model)


def float8_flops_per_token(model: nn.Module, settings: Float8Settings | None) -> int:
    """Training FLOPs per token of the matmuls that run in float8, counted on the unconverted
    ``model`` (meta is fine) with the filter :func:`convert_to_float8` uses: per converted
    ``nn.Linear`` ``2 * in * out`` for each of forward, input gradient and weight gradient (6, or 4
    for ``rowwise_with_gw_hp``, whose weight-gradient matmul stays in high precision). 0 without
    float8.
    """
    if settings is None:
        return 0
    keep = _linear_filter(settings.filter_fqns)
    per_weight = 4 if settings.recipe_name == "rowwise_with_gw_hp" else 6
    return sum(
        per_weight * m.in_features * m.out_features
        for name, m in model.named_modules()
        if keep(m, name)
    )


def float8_linear_names(model: nn.Module) -> list[str]:
    """The fully qualified names of ``model``'s ``Float8Linear`` modules (empty without float8)."""
    return [
        name for name, module in model.named_modules() if type(module).__name__ == "Float8Linear"
    ]


def high_precision(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor inside torchao's ``WeightWithDynamicFloat8CastTensor`` (the weight wrapper
    of the float8 all-gather, same dtype and values), for writers that need plain storage
    (safetensors); ``tensor`` otherwise."""
    return (
        tensor._tensor if type(tensor).__name__ == "WeightWithDynamicFloat8CastTensor" else tensor
    )


def float8_line(model: nn.Module, settings: Float8Settings) -> str:
    """The start-up line of a float8 run, e.g.
    ``float8 (tensorwise, float8 all-gather off): 14 linear layers converted; high precision: names
    containing 'output', 'router.gate', dimensions not multiples of 16, grouped MoE experts``."""
    gather = "on" if settings.enable_fsdp_float8_all_gather else "off"
    kept = ", ".join(repr(f) for f in settings.filter_fqns)
    return (
        f"float8 ({settings.recipe_name}, float8 all-gather {gather}): "
        f"{len(float8_linear_names(model))} linear "
        f"layers converted; high precision: names containing {kept or 'nothing'}, dimensions not "
        f"multiples of {_ALIGNMENT}, grouped MoE experts"
    )


def precompute_scales(model: nn.Module, settings: Float8Settings | None) -> None:
    """After an optimizer step, under ``precompute_float8_dynamic_scale_for_fsdp``: torchao's
    ``precompute_float8_dynamic_scale_for_fsdp`` (one all-reduce of every float8 weight's amax, the
    scales the next forward's float8 all-gathers use); nothing otherwise."""
    if settings is not None and settings.precompute_float8_dynamic_scale_for_fsdp:
        import_torchao().precompute_float8_dynamic_scale_for_fsdp(model)
