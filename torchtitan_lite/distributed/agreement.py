"""The nodes of a run agree on what they run: the same resolved configuration and the same code.

Each node's launcher checks and resolves the configuration on its own (``run_train.sh``), so a node
started with another ``CONFIG_FILE``, other overrides or another checkout would train a different
model or data order with no error until the collectives' shapes disagree, or silently.
:func:`check_nodes_agree` compares one digest per rank right after the process group starts and,
when they differ, names the keys and files that do.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from torchtitan_lite.config.cli import ConfigError, config_dict
from torchtitan_lite.config.schema import JobConfig

_SHOWN = 5
"""Differences named in the error; the rest are counted."""


def code_digests() -> dict[str, str]:
    """``relative path -> sha256`` (16 hex digits) of every ``.py`` file of the ``torchtitan_lite``
    and ``torchtitan_lite.models`` packages this process imports, and ``torch`` -> torch's
    version."""
    digests = {"torch": torch.__version__}
    for package in ("torchtitan_lite", "torchtitan_lite.models"):
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            continue
        root = Path(spec.origin).parent
        for path in sorted(root.rglob("*.py")):
            digests[f"{package}/{path.relative_to(root)}"] = hashlib.sha256(
                path.read_bytes()
            ).hexdigest()[:16]
    return digests


def run_identity(config: JobConfig) -> dict[str, dict[str, Any]]:
    """``{"config": {"section.key": value}, "code": code_digests()}``: what every node must
    share."""
    flat = {
        f"{section}.{key}": value
        for section, keys in config_dict(config).items()
        for key, value in keys.items()
    }
    return {"config": flat, "code": code_digests()}


def _ranks_text(ranks: list[int]) -> str:
    """``rank 2`` or ``ranks 2-3`` (consecutive) or ``ranks 1, 3``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def differences(
    reference: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]]
) -> list[str]:
    """What ``other`` (a :func:`run_identity`) changes from ``reference``:
    ``key value (rank 0: value)`` per config key, then ``code: path, ...`` for the files that differ
    or exist on one side only, then the torch version."""
    config_a, config_b = reference["config"], other["config"]
    found = [
        f"{key} {config_b.get(key)!r} (rank 0: {config_a.get(key)!r})"
        for key in sorted(set(config_a) | set(config_b))
        if config_a.get(key) != config_b.get(key)
    ]
    code_a, code_b = reference["code"], other["code"]
    if code_a["torch"] != code_b["torch"]:
        found.append(f"torch {code_b['torch']} (rank 0: {code_a['torch']})")
    files = [
        path
        for path in sorted(set(code_a) | set(code_b))
        if path != "torch" and code_a.get(path) != code_b.get(path)
    ]
    if files:
        found.append(
            "code files "
            + ", ".join(files[:_SHOWN])
            + (f" and {len(files) - _SHOWN} more" if len(files) > _SHOWN else "")
        )
    return found


def check_nodes_agree(config: JobConfig, group: dist.ProcessGroup | None = None) -> None:
    """Refuse a run whose ranks do not share rank 0's configuration and code (:func:`run_identity`):
    one ``all_gather_object`` of a digest and the host name on ``group`` (a gloo group; ``None`` =
    the default), and only when they differ a second one of the identities themselves. Call on every
    rank.

    Raises:
        ConfigError: on every rank, naming the first ranks that differ from rank 0, their host, and
            up to :data:`_SHOWN` differing keys and files.
    """
    identity = run_identity(config)
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=repr).encode()).hexdigest()
    world = dist.get_world_size(group)
    seen: list[Any] = [None] * world
    dist.all_gather_object(seen, (digest, socket.gethostname()), group=group)
    if all(d == seen[0][0] for d, _ in seen):
        return
    identities: list[Any] = [None] * world
    dist.all_gather_object(identities, identity, group=group)
    first = next(rank for rank, (d, _) in enumerate(seen) if d != seen[0][0])
    ranks = [rank for rank, (d, _) in enumerate(seen) if d == seen[first][0]]
    found = differences(identities[0], identities[first])
    shown = "; ".join(found[:_SHOWN]) + (
        f"; and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
    )
    others = sum(1 for d, _ in seen if d not in (seen[0][0], seen[first][0]))
    raise ConfigError(
        f"the nodes do not run the same config and code: {_ranks_text(ranks)} (host "
        f"{seen[first][1]}) differ from rank 0 (host {seen[0][1]}) in {shown}"
        + (f"; {others} more ranks differ otherwise" if others else "")
        + "; start every node with the same CONFIG_FILE, overrides and code version"
    )
