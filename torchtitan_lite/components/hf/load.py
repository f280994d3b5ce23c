"""Import an HF folder into the model, each rank reading only the boxes it holds.

Plan (:func:`import_plan`, also run before launch by ``components/hf/checks.py``): every tensor of
the adapter (``adapter.tensors``) is loaded when the folder holds all the HF tensors it is made of,
with the shapes it needs; it is missing (initialized by the trainer, listed) when the folder holds
none of them; anything between, and any shape that differs, is an error naming the tensor. Tensors
of the folder that no adapter tensor uses are skipped with their reason when the adapter knows them
(``adapter.skipped``: DeepSeek's multi-token-prediction layers, a tied ``lm_head.weight``), else
unexpected (an error unless allowed).

Load (:func:`import_hf`): for every tensor to load, the rank's box is its local shard's place in the
global tensor (:func:`torchtitan_lite.init.keyed.local_box`: plain tensors, FSDP ``Shard(0)``, TP
``Shard(1)``, ``_StridedShard``, 2-D meshes); the adapter's kind reads the HF boxes that make it
(``protocols/hf_tensors.py``) and the values are copied into the local shard. No collective runs and
no rank reads more of a tensor than the slice it holds, so the host memory a rank needs is about its
share (``SafetensorsFolder.bytes_read`` counts the bytes copied; see ``docs/design.md``, "HF:
reading by boxes").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from torchtitan_lite.components.hf.args import state_dict_adapter
from torchtitan_lite.components.hf.folder import (
    HFError,
    SafetensorsFolder,
    folder_quantization,
    read_config,
)
from torchtitan_lite.init.apply import named_state_tensors
from torchtitan_lite.init.keyed import local_box
from torchtitan_lite.models import get_model_spec


@dataclass
class ImportPlan:
    """What an import of a folder into a model does.

    Attributes:
        load: our names to read (one per tensor; tied aliases are added by :func:`import_hf`).
        missing: our names whose HF tensors the folder lacks (to be initialized).
        skipped: HF name -> why it is not loaded (known tensors the model does not build).
        unexpected: HF names nothing uses.
    """

    load: list[str]
    missing: list[str]
    skipped: dict[str, str]
    unexpected: list[str]


@dataclass
class HFImport:
    """What :func:`import_hf` did.

    Attributes:
        loaded: our names filled from the files (tied aliases included).
        missing: our names the files lack (to be initialized).
        skipped: HF name -> why it was not loaded.
        unexpected: HF names the model has no place for (only when allowed).
        bytes_read: bytes this rank copied out of the files.
    """

    loaded: list[str]
    missing: list[str]
    skipped: dict[str, str]
    unexpected: list[str]
    bytes_read: int

    def describe(self, folder: str, n_loaded: int | None = None) -> list[str]:
        """The log lines of the import of ``folder``: loaded and missing, skipped tensors by reason,
        ignored ones.
        ``n_loaded``: the loaded count to print (the init line's, a tied pair once); default
        ``len(loaded)``."""
        n_loaded = len(self.loaded) if n_loaded is None else n_loaded
        lines = [
            f"imported {folder}: {n_loaded} model tensors loaded; missing (initialized): "
            f"{', '.join(self.missing) or 'none'}"
        ]
        reasons: dict[str, list[str]] = {}
        for name, reason in self.skipped.items():
            reasons.setdefault(reason, []).append(name)
        lines += [
            f"skipped {len(names)} tensors of {folder} "
            f"({names[0]}{', ...' if len(names) > 1 else ''}): {reason}"
            for reason, names in reasons.items()
        ]
        if self.unexpected:
            lines.append(f"ignored tensors of {folder}: {', '.join(self.unexpected)}")
        return lines


def import_plan(
    shapes: dict[str, tuple[int, ...]], reader: SafetensorsFolder, adapter
) -> ImportPlan:
    """The plan (module docstring) for our tensors of global ``shapes`` (our name -> shape). Adapter
    tensors the model does not hold (the layers of other pipeline stages) are neither loaded nor
    missing, and their HF tensors are not unexpected.

    Raises:
        HFError: a shape that differs, or a tensor made of several HF tensors of which the folder
            holds some only.
    """
    available = reader.names()
    load, missing, used = [], [], set()
    for name, kind in adapter.tensors.items():
        if name not in shapes:
            used.update(kind.hf_names)
            continue
        wanted = kind.hf_shapes(shapes[name])
        present = [hf for hf in wanted if hf in available]
        used.update(present)
        if not present:
            missing.append(name)
            continue
        if len(present) < len(wanted):
            absent = sorted(set(wanted) - set(present))
            raise HFError(
                f"{reader.folder}: {name} is made of {len(wanted)} tensors but the folder lacks "
                f"{len(absent)} of them "
                f"({', '.join(absent[:3])}{', ...' if len(absent) > 3 else ''})"
            )
        for hf, shape in wanted.items():
            if tuple(available[hf]) != tuple(shape):
                raise HFError(
                    f"{reader.folder}: {hf} has shape {tuple(available[hf])} but {name} needs "
                    f"{tuple(shape)}; the folder's files and its config.json disagree"
                )
        load.append(name)
    skipped, unexpected = {}, []
    for hf in sorted(set(available) - used):
        reason = adapter.skipped(hf)
        if reason is None:
            unexpected.append(hf)
        else:
            skipped[hf] = reason
    return ImportPlan(load, missing, skipped, unexpected)


def unexpected_error(folder: str, unexpected: list[str]) -> HFError:
    """The error for HF tensors the model has no place for (lists up to 5)."""
    shown = ", ".join(unexpected[:5]) + (", ..." if len(unexpected) > 5 else "")
    return HFError(
        f"{folder}: {len(unexpected)} tensors have no place in the model ({shown}); check the "
        "model settings, or set checkpoint.initial_load_hf_allow_unexpected=true to ignore them"
    )


@torch.no_grad()
def import_hf(
    model: nn.Module, reader: SafetensorsFolder, adapter, *, allow_unexpected: bool = False
) -> HFImport:
    """Load the HF folder of ``reader`` into ``model`` (plain, FSDP2-sharded or any DTensor layout);
    call on every rank. Only this rank's boxes are read (module docstring).

    Raises:
        HFError: see :func:`import_plan`; unexpected tensors when not allowed (the message lists
            them and names ``checkpoint.initial_load_hf_allow_unexpected``).
    """
    tensors = dict(named_state_tensors(model))
    plan = import_plan({name: tuple(t.shape) for name, t in tensors.items()}, reader, adapter)
    if plan.unexpected and not allow_unexpected:
        raise unexpected_error(reader.folder, plan.unexpected)
    for name in plan.load:
        local, shape, offset = local_box(tensors[name])
        if math.prod(shape):
            box = tuple((start, start + size) for start, size in zip(offset, shape, strict=True))
            local.copy_(adapter.tensors[name].read(reader, box))
    loaded = set(plan.load)
    groups: dict[int, list[str]] = {}
    for name, tensor in tensors.items():
        groups.setdefault(id(tensor), []).append(name)
    for names in groups.values():  # a tied tensor loaded under one name is loaded under all
        if loaded.intersection(names):
            loaded.update(names)
    state_only = set(adapter.state_only)
    missing = [name for name in tensors if name not in loaded and name not in state_only]
    return HFImport(sorted(loaded), missing, plan.skipped, plan.unexpected, reader.bytes_read)


def open_folder(folder: str) -> tuple[dict, SafetensorsFolder]:
    """``(config.json dict, reader)`` of an HF folder, with the quantization its config declares.

    Raises:
        HFError: see :func:`~.folder.read_config`, :func:`~.folder.folder_quantization` and
            :class:`SafetensorsFolder`.
    """
    config = read_config(folder)
    return config, SafetensorsFolder(folder, folder_quantization(config, folder))


def check_hf_folder(
    folder: str, model_name: str, args, *, allow_unexpected: bool = False
) -> ImportPlan:
    """The import of ``folder`` into a ``model_name`` model of ``args`` would succeed: its files
    open and hold what the plan needs (run before launch; the model is built on meta, nothing is
    read but headers).

    Raises:
        HFError: see :func:`import_plan` and :func:`open_folder`; unexpected tensors when not
            allowed.
    """
    config, reader = open_folder(folder)
    with torch.device("meta"):
        model = get_model_spec(model_name).model_cls(args)
    plan = import_plan(
        {name: tuple(t.shape) for name, t in named_state_tensors(model)},
        reader,
        state_dict_adapter(model_name, args, config),
    )
    if plan.unexpected and not allow_unexpected:
        raise unexpected_error(folder, plan.unexpected)
    return plan


def load_hf_folder(
    model: nn.Module, folder: str, model_name: str, args, *, allow_unexpected: bool = False
) -> HFImport:
    """:func:`import_hf` of ``folder`` into ``model`` through the family's adapter; call on every
    rank."""
    config, reader = open_folder(folder)
    return import_hf(
        model,
        reader,
        state_dict_adapter(model_name, args, config),
        allow_unexpected=allow_unexpected,
    )
