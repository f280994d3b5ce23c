"""Hugging Face safetensors: import pretrained weights into the (sharded) model, export the trained one.

An HF folder holds ``config.json`` and one or more ``*.safetensors`` files (a local folder; nothing is
downloaded). Names and config keys go through the model family's state-dict adapter
(``ModelSpec.state_dict_adapter``, e.g. ``models/qwen3/state_dict_adapter.py``).

Import (:func:`import_hf`): every rank reads the full tensors (memory-mapped by safetensors) and copies
its own FSDP2 shard (``distribute_tensor`` with ``src_data_rank=None``: a local slice, no communication).
Imported names are returned so ``init_weights(skip=...)`` leaves them alone; model tensors the files lack
are reported as missing (the trainer initializes and lists them); file tensors the model lacks are an
error unless allowed (then listed).

Export (:func:`export_hf`): the full state is gathered to rank 0 (``get_model_state_dict`` with
``full_state_dict``, CPU offload), cast to the chosen dtype and written as ``model.safetensors`` +
``config.json`` into ``<folder>.tmp``, renamed to ``<folder>`` when complete (an existing export is replaced).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from models import get_model_spec
from torchtitan_lite.errors import UserError
from torchtitan_lite.init.apply import named_state_tensors

EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""Values of ``checkpoint.export_hf_dtype``."""
IGNORED_CONFIG_FIELDS = ("max_seq_len",)
"""Args that may differ from the HF config: the RoPE table length changes no weight."""


class HFError(UserError, ValueError):
    """An HF folder that cannot be imported: one line naming the file or key and what to do."""


@dataclass
class HFImport:
    """What :func:`import_hf` did.

    Attributes:
        loaded: our names that were filled from the files (tied aliases included).
        missing: our names the files lack (to be initialized).
        unexpected: HF names the model has no place for (only when allowed).
    """

    loaded: list[str]
    missing: list[str]
    unexpected: list[str]


def state_dict_adapter(model_name: str, args):
    """The HF state-dict adapter of a model family: ``get_model_spec(model_name).state_dict_adapter(args)``.

    Raises:
        HFError: the family has no adapter.
    """
    build = get_model_spec(model_name).state_dict_adapter
    if build is None:
        raise HFError(f"model {model_name} has no Hugging Face state-dict adapter (ModelSpec.state_dict_adapter); "
                      "HF import/export is not available for it")
    return build(args)


def safetensors_files(folder: str) -> list[str]:
    """The ``*.safetensors`` files of ``folder``, sorted.

    Raises:
        HFError: no such folder, or no safetensors file in it.
    """
    if not os.path.isdir(folder):
        raise HFError(f"checkpoint.initial_load_hf: no such folder {folder!r}; point it at a local HF model "
                      "folder (config.json + *.safetensors)")
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise HFError(f"checkpoint.initial_load_hf: {folder} holds no *.safetensors file")
    return files


def check_hf_folder(folder: str, model_name: str, args) -> None:
    """``folder`` is an HF model this model can import: ``config.json`` parses, describes the same
    architecture and sizes (``IGNORED_CONFIG_FIELDS`` aside), and safetensors files exist.

    Raises:
        HFError: naming the file or the config key that differs, with both values.
    """
    files = safetensors_files(folder)
    config_path = os.path.join(folder, "config.json")
    try:
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as err:
        raise HFError(f"checkpoint.initial_load_hf: cannot read {config_path} ({err})") from None
    adapter = state_dict_adapter(model_name, args)
    try:
        hf_args = adapter.args_from_hf_config(config, args)
    except (ValueError, TypeError, KeyError) as err:
        raise HFError(f"checkpoint.initial_load_hf: {config_path}: {err}") from None
    for name, value in hf_args.items():
        if name not in IGNORED_CONFIG_FIELDS and getattr(args, name) != value:
            raise HFError(f"checkpoint.initial_load_hf: {config_path} has {name} = {value!r} but the model has "
                          f"{getattr(args, name)!r}; set --model.overrides.{name}={value} or pick the matching flavor")
    for file in files:
        try:
            with safe_open(file, framework="pt"):
                pass
        except Exception as err:  # safetensors raises its own error types for bad headers
            raise HFError(f"checkpoint.initial_load_hf: {file} is not a readable safetensors file ({err})") from None


@torch.no_grad()
def _copy_full(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the full tensor ``full`` into ``param`` (this rank's shard when ``param`` is a DTensor)."""
    full = full.to(device=param.device, dtype=param.dtype)
    if isinstance(param, DTensor):
        local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
        param.to_local().copy_(local)
    else:
        param.copy_(full)


def import_hf(model: nn.Module, folder: str, adapter, *, allow_unexpected: bool = False,
              elsewhere: Collection[str] = ()) -> HFImport:
    """Load the HF safetensors of ``folder`` into ``model`` (plain or FSDP2-sharded); call on every rank.

    ``elsewhere``: our names of tensors other pipeline stages hold (``model`` is a rank's stages); the files'
    tensors of those names are skipped, neither loaded nor unexpected.

    Raises:
        HFError: a shape that differs from the model's, or unexpected tensors when not allowed (the
            message lists them and names ``checkpoint.initial_load_hf_allow_unexpected``).
    """
    tensors = dict(named_state_tensors(model))
    loaded: set[str] = set()
    unexpected: list[str] = []
    for file in safetensors_files(folder):
        with safe_open(file, framework="pt") as handle:
            for hf_name in handle.keys():
                name = adapter.our_name(hf_name)
                if name in elsewhere:
                    continue
                if name is None or name not in tensors:
                    unexpected.append(hf_name)
                    continue
                full = handle.get_tensor(hf_name)
                if tuple(full.shape) != tuple(tensors[name].shape):
                    raise HFError(f"{file}: {hf_name} has shape {tuple(full.shape)} but {name} has "
                                  f"{tuple(tensors[name].shape)}; the HF model and --model settings differ")
                _copy_full(tensors[name], full)
                loaded.add(name)
    if unexpected and not allow_unexpected:
        shown = ", ".join(sorted(unexpected)[:5]) + (", ..." if len(unexpected) > 5 else "")
        raise HFError(f"{folder}: {len(unexpected)} tensors have no place in the model ({shown}); check the model "
                      "settings, or set checkpoint.initial_load_hf_allow_unexpected=true to ignore them")
    groups: dict[int, list[str]] = {}
    for name, tensor in tensors.items():
        groups.setdefault(id(tensor), []).append(name)
    for names in groups.values():  # a tied tensor loaded under one name is loaded under all
        if loaded.intersection(names):
            loaded.update(names)
    missing = [name for name in tensors if name not in loaded]
    return HFImport(sorted(loaded), missing, sorted(unexpected))


def export_hf(model: nn.Module, folder: str, adapter, *, dtype: str = "float32", rank: int = 0) -> None:
    """Write ``model`` as an HF folder (``config.json`` + ``model.safetensors``); call on every rank.

    Raises:
        ValueError: an unknown ``dtype`` (see :data:`EXPORT_DTYPES`).
    """
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"checkpoint.export_hf_dtype must be one of {', '.join(EXPORT_DTYPES)}, got {dtype!r}")
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return
    folder = os.path.abspath(folder)
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    tensors = {adapter.hf_name(n): full[n].to(EXPORT_DTYPES[dtype]).contiguous() for n in adapter.hf_names_to_save()}
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(adapter.to_hf_config(dtype), handle, indent=2)
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.rename(tmp, folder)
