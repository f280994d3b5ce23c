"""A corpus prepared on many machines: a **set** of ``N`` prepared folders (shards) that training
reads as one corpus.

``prepare --num_shards N --shard_index i --output SET`` writes shard ``i`` as the prepared folder
``SET/shard-0000i-of-0000N`` (names and ``num_shards``/``index`` as ``datasets.Dataset.shard``; the
file names as the hub's ``train-00000-of-00003``). The input's documents, in the order one prepare
reads them, are split into ``N`` contiguous runs, so the shards one after another are the documents
of one prepare of the whole input:

- **by file** when the input has at least ``N`` files: shard ``i`` takes the sorted files
  :func:`contiguous_range` ``(n_files, N, i)``; nothing but the file list is read first;
- **by document** otherwise (one big file): the documents are counted (one pass reading the input,
  no tokenizing), and shard ``i`` takes documents :func:`contiguous_range` ``(n_documents, N, i)``;
- a hub dataset is split by its files (``datasets.IterableDataset.shard(contiguous=True)``), which
  needs at least ``N`` of them.

Each shard's manifest records ``shard``: its ``index``, ``count``, how it was split (``by``) and
``input``, a hash of the whole input's files (paths and sizes) or hub name, so a set made from
different inputs is refused. :func:`check_set` reads manifests and file sizes only (no numpy/torch
import beyond ``prepared``'s).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from torchtitan_lite.data.prepared import Manifest, check_files, is_prepared
from torchtitan_lite.errors import InputError

_SHARD = re.compile(r"^shard-(\d{5})-of-(\d{5})$")


def shard_name(index: int, count: int) -> str:
    """The folder of shard ``index`` of ``count`` inside a set, e.g. ``shard-00001-of-00003``."""
    return f"shard-{index:05d}-of-{count:05d}"


def contiguous_range(n: int, count: int, index: int) -> tuple[int, int]:
    """``(begin, end)`` of part ``index`` of ``n`` items cut into ``count`` contiguous parts whose
    sizes differ by at most one, the first ``n % count`` one larger
    (``datasets.Dataset.shard(contiguous=True)``'s rule)."""
    div, mod = divmod(n, count)
    begin = index * div + min(index, mod)
    return begin, begin + div + (index < mod)


def check_shard_args(num_shards: int, shard_index: int | None) -> None:
    """``num_shards >= 1`` and, with more than one shard, ``0 <= shard_index < num_shards``.

    Raises:
        InputError: naming the flag and the fix.
    """
    if num_shards < 1:
        raise InputError(f"--num_shards must be >= 1, got {num_shards}")
    if num_shards > 1 and (shard_index is None or not 0 <= shard_index < num_shards):
        raise InputError(
            f"--num_shards {num_shards} needs --shard_index in 0..{num_shards - 1}, got "
            f"{shard_index} (on a Slurm array: --shard_index $SLURM_ARRAY_TASK_ID)"
        )


def input_hash(identity: object) -> str:
    """A short sha256 of the whole input's identity (its ``[{"path", "size"}]`` files, or a hub
    dataset's name, config and split), recorded by every shard of a set."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def is_prepared_set(path: str | Path) -> bool:
    """Whether ``path`` is a folder without a manifest holding at least one ``shard-*-of-*``
    folder."""
    p = Path(path)
    return (
        p.is_dir()
        and not is_prepared(p)
        and any(_SHARD.match(c.name) for c in p.iterdir() if c.is_dir())
    )


def check_set(path: str | Path) -> list[tuple[Path, Manifest]]:
    """The shards of the set at ``path`` in order, ``[(folder, manifest)]``, after checking that
    every shard of one count is present and whole (:func:`prepared.check_files`), each manifest
    names its own place, and all were made from one input with one tokenizer (same sha256 and EOS
    id).

    Raises:
        InputError: the first problem, naming the shard and the fix.
    """
    path = Path(path)
    found = {}
    for child in sorted(path.iterdir()):
        if child.is_dir() and (m := _SHARD.match(child.name)):
            found[int(m.group(1)), int(m.group(2))] = child
    counts = sorted({count for _, count in found})
    if not counts:
        raise InputError(
            f"{path} holds no shard-*-of-* folder; prepare its shards with --num_shards N "
            "--shard_index i"
        )
    if len(counts) > 1:
        raise InputError(
            f"{path} holds shards of sets of {' and '.join(map(str, counts))}; keep one set per "
            "folder"
        )
    count = counts[0]
    missing = [i for i in range(count) if (i, count) not in found]
    if missing:
        raise InputError(
            f"{path} misses {len(missing)} of its {count} shards ({shard_name(missing[0], count)} "
            f"first); run prepare with --num_shards {count} --shard_index {missing[0]} (and each "
            "other missing index)"
        )
    shards = [(found[i, count], check_files(found[i, count])) for i in range(count)]
    first_folder, first = shards[0]
    for i, (folder, m) in enumerate(shards):
        if not m.shard or (m.shard.get("index"), m.shard.get("count")) != (i, count):
            raise InputError(
                f"{folder / 'manifest.json'} records shard {m.shard and m.shard.get('index')} of "
                f"{m.shard and m.shard.get('count')}, not {i} of {count} (a folder renamed or "
                "copied in); prepare it again in place"
            )
        tok, tok0 = m.tokenizer, first.tokenizer
        if (tok.get("sha256"), tok.get("eos_id")) != (tok0.get("sha256"), tok0.get("eos_id")):
            raise InputError(
                f"{folder} was prepared with tokenizer {tok.get('path')} (sha256 "
                f"{str(tok.get('sha256'))[:12]}, eos {tok.get('eos_id')}), {first_folder.name} "
                f"with {tok0.get('path')} (sha256 {str(tok0.get('sha256'))[:12]}, eos "
                f"{tok0.get('eos_id')}); prepare every shard with the same --tokenizer"
            )
        if m.shard.get("input") != first.shard.get("input"):
            raise InputError(
                f"{folder} was prepared from another input than {first_folder.name} (input hash "
                f"{m.shard.get('input')} vs {first.shard.get('input')}); prepare every shard from "
                "the same --input"
            )
    return shards


def checked_folders(path: str | Path) -> list[tuple[Path, Manifest]]:
    """``[(folder, manifest)]`` of ``path`` in stream order after checking that each is whole:
    itself for a prepared folder, its shards for a set (:func:`check_set`)."""
    if is_prepared(path):
        return [(Path(path), check_files(path))]
    return check_set(path)


def prepared_folders(path: str | Path) -> list[Path]:
    """The prepared folders of ``path`` in stream order (:func:`checked_folders`)."""
    return [folder for folder, _ in checked_folders(path)]
