"""The resolved configuration the launcher hands its workers: ``run_train.sh`` checks and resolves
the config once (``python -m torchtitan_lite.preflight``) and writes it to a file named by
:data:`RESOLVED_CONFIG_ENV`; each worker reads it into its
:class:`~torchtitan_lite.preflight.run.ResolvedRun` (:func:`read_resolved`) instead of repeating the
checks."""

from __future__ import annotations

import dataclasses
import json
import os

from torchtitan_lite.config.schema import JobConfig
from torchtitan_lite.preflight.model_args import build_model_args, type_overrides
from torchtitan_lite.preflight.run import ResolvedRun, resolved_run

RESOLVED_CONFIG_ENV = "TORCHTITAN_LITE_RESOLVED_CONFIG"
"""Environment variable naming the file of the resolved configuration (set by ``run_train.sh`` for
both the check and the workers)."""


def write_resolved(config: JobConfig, path: str) -> None:
    """Write the checked and resolved ``config`` (every field, ``job.config_file`` included) to
    ``path`` as JSON, through a temporary file renamed into place."""
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(dataclasses.asdict(config), handle, indent=1)
    os.replace(path + ".tmp", path)


def read_resolved(path: str) -> ResolvedRun:
    """The run of the config that :func:`write_resolved` wrote to ``path``: the config equal to the
    one written (``model.overrides`` typed again,
    :func:`~torchtitan_lite.preflight.model_args.type_overrides`), its model args built once; not
    checked again.

    Raises:
        HFError, ValueError, TypeError: as
            :func:`~torchtitan_lite.preflight.model_args.build_model_args`.
    """
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    default = JobConfig()
    config = JobConfig(
        **{
            section.name: type(getattr(default, section.name))(**data[section.name])
            for section in dataclasses.fields(JobConfig)
        }
    )
    type_overrides(config)
    return resolved_run(config, build_model_args(config))
