"""A local Hugging Face folder as published checkpoints and transformers write it.

``config.json`` names the architecture (:func:`read_config`, :func:`family_of`). The weights are one
``model.safetensors`` or several files listed by ``model.safetensors.index.json`` (its
``weight_map``: tensor name -> file); without an index every ``*.safetensors`` file of the folder is
read. :class:`SafetensorsFolder` reads a box of a tensor with safetensors' ``get_slice`` (the file
is memory-mapped and only the bytes of the box are copied), dequantizing MXFP4 and FP8 tensors
(:mod:`.quant`), and counts the bytes it copies.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import torch
from safetensors import safe_open

from torchtitan_lite.components.hf.quant import (
    Box,
    Quantization,
    mxfp4_shape,
    quantization,
    read_fp8,
    read_mxfp4,
)
from torchtitan_lite.errors import UserError
from torchtitan_lite.models import get_model_spec, hf_family, model_names

INDEX_FILE = "model.safetensors.index.json"


class HFError(UserError, ValueError):
    """An HF folder that cannot be imported or written: one line naming the file or key and what to
    do."""


def read_config(folder: str) -> dict[str, Any]:
    """``folder/config.json`` as a dict.

    Raises:
        HFError: no such folder, no ``config.json``, or not a JSON object.
    """
    if not os.path.isdir(folder):
        raise HFError(
            f"no such folder {folder!r}; point it at a local HF model folder (config.json + "
            "*.safetensors)"
        )
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except FileNotFoundError:
        raise HFError(
            f"{folder} has no config.json; an HF model folder holds config.json and *.safetensors"
        ) from None
    except (OSError, ValueError) as err:
        raise HFError(f"cannot read {path} ({err})") from None
    if not isinstance(config, dict):
        raise HFError(f"{path} is not a JSON object")
    return config


def family_of(config: dict[str, Any], folder: str) -> str:
    """Our model family for a ``config.json`` (its ``model_type``, else its first ``architectures``
    entry).

    Raises:
        HFError: no family reads it (the message lists the model types we read).
    """
    model_type, architectures = config.get("model_type"), config.get("architectures")
    family = hf_family(model_type, architectures)
    if family is None:
        known = [
            get_model_spec(n).state_dict_adapter.model_type
            for n in model_names()
            if get_model_spec(n).state_dict_adapter is not None
        ]
        raise HFError(
            f"{os.path.join(folder, 'config.json')}: model_type {model_type!r} (architectures "
            f"{architectures!r}) is not a family this trainer builds; known model types: "
            f"{', '.join(known)}"
        )
    return family


def folder_quantization(config: dict[str, Any], folder: str) -> Quantization | None:
    """The checked ``quantization_config`` of the folder's ``config.json``
    (:func:`~.quant.quantization`).

    Raises:
        HFError: one the loader cannot dequantize, naming the key.
    """
    try:
        return quantization(config)
    except ValueError as err:
        raise HFError(f"{os.path.join(folder, 'config.json')}: {err}") from None


class SafetensorsFolder:
    """The tensors of an HF folder, read by boxes.

    Args:
        folder: the HF folder.
        quant: the checkpoint's quantization (:func:`~.quant.quantization`), or ``None``.

    Attributes:
        bytes_read: bytes copied out of the files so far.

    Raises:
        HFError: no safetensors file, an index that is not JSON or names a file the folder lacks, or
            a tensor name found in two files.
    """

    def __init__(self, folder: str, quant: Quantization | None = None):
        self.folder, self.quant, self.bytes_read = folder, quant, 0
        self._handles: dict[str, Any] = {}
        index = os.path.join(folder, INDEX_FILE)
        if os.path.exists(index):
            try:
                with open(index, encoding="utf-8") as handle:
                    weight_map = json.load(handle)["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise HFError(
                    f"cannot read the weight_map of {index} ({type(err).__name__}: {err})"
                ) from None
            for name, file in sorted(weight_map.items()):
                if not os.path.isfile(os.path.join(folder, file)):
                    raise HFError(
                        f"{index} puts {name} in {file}, which {folder} does not hold; copy the "
                        "file or fix the index"
                    )
            self._file_of = {name: os.path.join(folder, file) for name, file in weight_map.items()}
            return
        files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
        if not files:
            raise HFError(f"{folder} holds no *.safetensors file")
        self._file_of = {}
        for file in files:
            for name in self._handle(file).keys():
                if name in self._file_of:
                    raise HFError(f"{name} is in both {self._file_of[name]} and {file}; keep one")
                self._file_of[name] = file

    def _handle(self, file: str):
        if file not in self._handles:
            try:
                self._handles[file] = safe_open(file, framework="pt")
            except Exception as err:  # safetensors raises its own error types for bad headers
                raise HFError(f"{file} is not a readable safetensors file ({err})") from None
        return self._handles[file]

    def _slice(self, name: str):
        file = self._file_of[name]
        try:
            return self._handle(file).get_slice(name)
        except Exception as err:  # a name the index lists but the file lacks
            raise HFError(
                f"{file} holds no tensor {name} ({type(err).__name__}), though the index names it"
            ) from None

    def stored_names(self) -> list[str]:
        """The names as stored (quantized parts separately), sorted."""
        return sorted(self._file_of)

    def names(self) -> dict[str, tuple[int, ...]]:
        """Logical tensor name -> shape: a quantized tensor once, under the name and shape of the HF
        parameter it dequantizes to (MXFP4 ``X_blocks`` + ``X_scales`` -> ``X``; FP8 ``X`` +
        ``X_scale_inv`` -> ``X``)."""
        stored = set(self._file_of)
        shapes = {}
        for name in sorted(stored):
            if (
                self.quant is not None
                and self.quant.method == "mxfp4"
                and name.endswith("_blocks")
                and name.removesuffix("_blocks") + "_scales" in stored
            ):
                shapes[name.removesuffix("_blocks")] = mxfp4_shape(
                    tuple(self._slice(name).get_shape())
                )
            elif not self._quant_part(name, stored):
                shapes[name] = tuple(self._slice(name).get_shape())
        return shapes

    def _quant_part(self, name: str, stored: set[str]) -> bool:
        """``name`` is the blocks, scales or scale_inv part of a quantized tensor."""
        if self.quant is None:
            return False
        if self.quant.method == "mxfp4":
            return (
                name.endswith("_blocks") and name.removesuffix("_blocks") + "_scales" in stored
            ) or (name.endswith("_scales") and name.removesuffix("_scales") + "_blocks" in stored)
        return name.endswith("_scale_inv") and name.removesuffix("_scale_inv") in stored

    def _read_stored(self, name: str, box: Box) -> torch.Tensor:
        """The stored values of ``box`` of ``name`` (as many bytes copied as the box holds)."""
        values = self._slice(name)[tuple(slice(a, b) for a, b in box)]
        self.bytes_read += values.numel() * values.element_size()
        return values

    def read(self, name: str, box: Box) -> torch.Tensor:
        """The values of ``box`` (``(start, stop)`` per dimension) of the logical tensor ``name``:
        as stored, or fp32 when dequantized."""
        if self.quant is not None and name not in self._file_of and self.quant.method == "mxfp4":
            return read_mxfp4(self._read_stored, name, box)
        if (
            self.quant is not None
            and self.quant.method == "fp8"
            and f"{name}_scale_inv" in self._file_of
        ):
            return read_fp8(self._read_stored, name, box, self.quant.block)
        return self._read_stored(name, box)
