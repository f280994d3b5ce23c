"""Export the model as an HF folder that ``transformers.AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load.

The full state is gathered to rank 0 (``get_model_state_dict`` with ``full_state_dict``, CPU
offload), turned into the HF tensors by the adapter (published layouts: one tensor per expert,
DeepSeek's interleaved RoPE rows), cast to the chosen dtype (state buffers such as DeepSeek's
``e_score_correction_bias`` stay fp32, as HF keeps them) and written as ``model.safetensors`` (or
``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json`` above ``max_shard_bytes``),
with ``config.json`` (the adapter's, ``torch_dtype`` and the tokenizer's bos/eos ids),
``tokenizer.json`` and ``tokenizer_config.json``, into ``<folder>.tmp``, renamed to ``<folder>``
when complete (an existing export is replaced). Files get the mode the umask gives (0644 usually),
like every other file written.

Tokenizer: when the run's tokenizer is the ``tokenizer.json`` of its HF source folder, that folder's
tokenizer files (``tokenizer_config.json``, ``special_tokens_map.json``, ``generation_config.json``)
and special ids are kept; otherwise ``tokenizer_config.json`` names the tokenizer's end-of-text
token as bos and eos (the bundled BPE has no other special token).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from torchtitan_lite.components.hf.folder import INDEX_FILE, HFError, read_config
from torchtitan_lite.data.tokenizer import Tokenizer
from torchtitan_lite.distributed.float8 import high_precision
from torchtitan_lite.init.apply import canonical_name

EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""Values of ``checkpoint.export_hf_dtype``."""
SOURCE_TOKENIZER_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)
"""Files copied from the HF source folder along with its ``tokenizer.json``."""
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _umask_mode() -> int:
    """The mode ``open()`` gives a new file: 0o666 less the process umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def hf_tensors(
    full: dict[str, torch.Tensor], adapter, dtype: torch.dtype, fp32_names: set[str]
) -> dict[str, torch.Tensor]:
    """HF name -> contiguous tensor, from our full state ``full`` through ``adapter.tensors``;
    ``fp32_names`` (our state buffers) stay float32."""
    out = {}
    for name, kind in adapter.tensors.items():
        target = torch.float32 if name in fp32_names else dtype
        for hf_name, tensor in kind.to_hf(full[name]).items():
            out[hf_name] = tensor.to(target).contiguous()
    return out


def _shards(
    tensors: dict[str, torch.Tensor], max_shard_bytes: int
) -> list[dict[str, torch.Tensor]]:
    """``tensors`` split in order into groups of at most ``max_shard_bytes`` (a bigger tensor
    alone)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def write_safetensors(
    tensors: dict[str, torch.Tensor], folder: str, max_shard_bytes: int
) -> list[str]:
    """Write ``tensors`` into ``folder`` as one file or as shards with an index; the file names."""
    shards = _shards(tensors, max_shard_bytes)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    weight_map = {}
    for name, shard in zip(names, shards, strict=True):
        save_file(shard, os.path.join(folder, name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    if len(shards) > 1:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        _write_json(
            os.path.join(folder, INDEX_FILE),
            {"metadata": {"total_size": total}, "weight_map": weight_map},
        )
        names.append(INDEX_FILE)
    return names


def _write_json(path: str, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2)
        handle.write("\n")


def tokenizer_files(
    tokenizer: Tokenizer, source_folder: str | None, max_seq_len: int, folder: str
) -> dict[str, Any]:
    """Write the tokenizer files into ``folder`` (module docstring); the special ids for
    ``config.json``."""
    shutil.copyfile(tokenizer.path, os.path.join(folder, "tokenizer.json"))
    from_source = source_folder is not None and os.path.samefile(
        os.path.dirname(os.path.abspath(tokenizer.path)), source_folder
    )
    if from_source and os.path.isfile(os.path.join(source_folder, "tokenizer_config.json")):
        for name in SOURCE_TOKENIZER_FILES:
            if os.path.isfile(os.path.join(source_folder, name)):
                shutil.copyfile(os.path.join(source_folder, name), os.path.join(folder, name))
        source = read_config(source_folder)
        return {key: source[key] for key in SPECIAL_IDS if source.get(key) is not None}
    eos = tokenizer.decode([tokenizer.eos_id])
    _write_json(
        os.path.join(folder, "tokenizer_config.json"),
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": eos,
            "eos_token": eos,
            "model_max_length": max_seq_len,
            "clean_up_tokenization_spaces": False,
        },
    )
    return {"bos_token_id": tokenizer.eos_id, "eos_token_id": tokenizer.eos_id}


def export_hf(
    model: nn.Module,
    folder: str,
    adapter,
    tokenizer: Tokenizer,
    *,
    dtype: str = "float32",
    rank: int = 0,
    source_folder: str | None = None,
    max_shard_bytes: int = 5 * 2**30,
) -> None:
    """Write ``model`` as an HF folder (module docstring); call on every rank (rank 0 writes).

    Args:
        model: the model (plain or FSDP2-sharded).
        folder: where to write.
        adapter: the family's state-dict adapter for the model's args.
        tokenizer: the run's tokenizer.
        dtype: a key of :data:`EXPORT_DTYPES`.
        rank: this process's rank.
        source_folder: the HF folder the run started from (``checkpoint.initial_load_hf``), or
            ``None``.
        max_shard_bytes: largest safetensors file before the weights are split over several.

    Raises:
        HFError: an unknown ``dtype``.
    """
    if dtype not in EXPORT_DTYPES:
        raise HFError(
            f"checkpoint.export_hf_dtype must be one of {', '.join(EXPORT_DTYPES)}, got {dtype!r}"
        )
    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    full = {
        name: high_precision(tensor) for name, tensor in full.items()
    }  # float8 all-gather's weight wrapper
    if rank != 0:
        return
    buffers = {canonical_name(name) for name, _ in model.named_buffers()}
    folder = os.path.abspath(folder)
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    written = write_safetensors(
        hf_tensors(full, adapter, EXPORT_DTYPES[dtype], buffers), tmp, max_shard_bytes
    )
    special = tokenizer_files(tokenizer, source_folder, adapter.args.max_seq_len, tmp)
    _write_json(
        os.path.join(tmp, "config.json"),
        {**adapter.to_hf_config(), "torch_dtype": dtype, **special},
    )
    mode = _umask_mode()
    for name in written:
        os.chmod(os.path.join(tmp, name), mode)
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.rename(tmp, folder)
