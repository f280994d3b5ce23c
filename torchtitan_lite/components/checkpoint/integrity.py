"""Checkpoint integrity: the size and checksum of every file of a step folder, recorded in
``meta.json`` when it is saved and verified before any tensor is read.

The checksum is XXH3-128 (xxHash, https://xxhash.com): a non-cryptographic hash that runs at memory
speed and catches accidental damage (zeroed blocks, flipped bytes, truncation, a file from another
save); it is no defence against deliberate tampering. ``meta.json`` also carries a checksum of its
own content (``meta_xxh3_128``). :func:`read_meta` does the cheap checks (``meta.json``, the sizes
of all files, the checksum of DCP's small ``.metadata``) and runs before launch and at load;
:func:`verify_files` reads every data file once, each rank a share of the files, and runs at load
before ``dcp.load``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import xxhash

from torchtitan_lite.components.checkpoint.storage import META_FILE, CheckpointError, others_hint

ALGORITHM = "xxh3_128"
"""The checksum of each file recorded in ``meta.json["files"]``."""
FORMAT_VERSION = 5
"""Version of the step-folder layout, stored in ``meta.json`` (2: the map-style loader state is
``windows_consumed``; 3: ``layout`` in ``meta.json``, data loader states keyed by data-parallel
rank, RNG states by global rank; 4: the optimizer state flattened per parameter; 5: ``files`` with
sizes and checksums, ``meta_xxh3_128``, ``config`` and ``lr_schedule``)."""
_SEAL = "meta_xxh3_128"
_CHUNK = 8 << 20  # bytes per read


def file_digest(path: str, algorithm: Callable[[], Any] = xxhash.xxh3_128) -> str:
    """The checksum of the bytes of the file ``path`` (read in 8 MiB chunks) as hex digits: XXH3-128
    (32 digits), or ``algorithm()``'s, any ``hashlib``-like object (for comparisons)."""
    digest = algorithm()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


def describe_files(folder: str, names: list[str]) -> dict[str, dict[str, Any]]:
    """``{name: {"size": bytes, "xxh3_128": hex}}`` of the files ``names`` in ``folder``."""
    return {
        name: {
            "size": os.path.getsize(os.path.join(folder, name)),
            ALGORITHM: file_digest(os.path.join(folder, name)),
        }
        for name in names
    }


def _canonical(meta: dict[str, Any]) -> bytes:
    return json.dumps(
        {k: v for k, v in meta.items() if k != _SEAL}, sort_keys=True, separators=(",", ":")
    ).encode()


def seal(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with the checksum of its own content added (checked by :func:`read_meta`)."""
    return {**meta, _SEAL: xxhash.xxh3_128_hexdigest(_canonical(meta))}


def read_meta(path: str) -> dict[str, Any]:
    """``meta.json`` of the checkpoint at ``path``, after the cheap checks: it parses, has this
    format and matches its own checksum; every file it lists exists with the size recorded; DCP's
    ``.metadata`` matches its checksum. Reads no tensor (:func:`verify_files` checks the data files'
    checksums).

    Raises:
        CheckpointError: the first problem found, one line naming the file and what to do.
    """
    meta_path = os.path.join(path, META_FILE)
    try:
        with open(meta_path, encoding="utf-8") as handle:
            meta = json.load(handle)
    except FileNotFoundError:
        raise CheckpointError(
            f"checkpoint {path}: no {META_FILE}, so it is incomplete or not a checkpoint; "
            "point checkpoint.load_path at a step-N folder written by this trainer"
        ) from None
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"checkpoint {meta_path} is corrupt ({err}); {others_hint(path)}"
        ) from None
    found = meta.get("format") if isinstance(meta, dict) else meta
    if found != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {meta_path}: format {found!r} is not {FORMAT_VERSION}; it was not "
            "written by this version of the trainer"
        )
    if meta.get(_SEAL) != xxhash.xxh3_128_hexdigest(_canonical(meta)):
        raise CheckpointError(
            f"checkpoint {meta_path} is corrupt (its content does not match the checksum it was "
            f"saved with); {others_hint(path)}"
        )
    for name, recorded in sorted(meta["files"].items()):
        _check_size(path, name, recorded["size"])
    if ".metadata" not in meta["files"]:
        raise CheckpointError(
            f"checkpoint {meta_path} lists no .metadata file; it is corrupt: {others_hint(path)}"
        )
    _check_digest(path, ".metadata", meta["files"][".metadata"][ALGORITHM])
    return meta


def _check_size(path: str, name: str, size: int) -> None:
    file = os.path.join(path, name)
    actual = os.path.getsize(file) if os.path.isfile(file) else None
    if actual != size:
        found = (
            "missing (deleted)"
            if actual is None
            else f"{actual} bytes, expected {size} (truncated or overwritten)"
        )
        raise CheckpointError(f"checkpoint file {file} is {found}; {others_hint(path)}")


def _check_digest(path: str, name: str, recorded: str) -> None:
    file = os.path.join(path, name)
    found = file_digest(file)
    if found != recorded:
        raise CheckpointError(
            f"checkpoint file {file} does not match the {ALGORITHM} checksum recorded when it was "
            f"saved ({recorded[:12]}..., now {found[:12]}...): the file is corrupt; "
            f"{others_hint(path)}"
        )


def verify_files(path: str, meta: dict[str, Any], rank: int, world_size: int) -> None:
    """Check the size and checksum of every file in ``meta["files"]`` (from :func:`read_meta`); rank
    ``r`` reads every ``world_size``-th file from the ``r``-th, and the ranks agree
    (``all_gather_object`` on the default group, a collective; one process without a process group
    checks every file alone). Modifies nothing.

    Raises:
        CheckpointError: on every rank, the first bad file by name.
    """
    problem = None
    for name in sorted(meta["files"])[rank::world_size]:
        try:
            _check_size(path, name, meta["files"][name]["size"])
            _check_digest(path, name, meta["files"][name][ALGORITHM])
        except CheckpointError as err:
            problem = (name, str(err))
            break
    problems: list[tuple[str, str] | None] = [problem]
    if dist.is_initialized():
        problems = [None] * world_size
        dist.all_gather_object(problems, problem)
    found = sorted(p for p in problems if p is not None)
    if found:
        raise CheckpointError(found[0][1])
