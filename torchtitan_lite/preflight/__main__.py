"""``python -m torchtitan_lite.preflight <args>``: validate the configuration and exit 0 silently,
or print one ``config error: ...`` line and exit 2 (``--help`` and ``--job.print_config`` print and
exit 0). With the environment variable ``TORCHTITAN_LITE_WORLD_SIZE`` (set by ``run_train.sh``) the
parallel degrees and the memory estimate are also checked for that world size; with
``TORCHTITAN_LITE_RESOLVED_CONFIG`` the resolved configuration is written to that file for the
workers (``preflight/resolved.py``).

The keys and types (a missing or unreadable file, an unknown key, a value of the wrong type or out
of bounds) are checked first with ``config/load.py`` alone, which imports no torch: those errors
come without the seconds of the torch import that the other checks need."""

import os
import sys

from torchtitan_lite.config.cli import ConfigError
from torchtitan_lite.config.load import read_config

if not {"--help", "-h"} & set(sys.argv[1:]):
    try:
        read_config(sys.argv[1:])
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)

# the imports below load torch: only after the light check above
from torchtitan_lite.preflight.checks import WORLD_SIZE_ENV, load_run_or_exit  # noqa: E402
from torchtitan_lite.preflight.resolved import RESOLVED_CONFIG_ENV, write_resolved  # noqa: E402

world_size = os.environ.get(WORLD_SIZE_ENV, "")
run = load_run_or_exit(sys.argv[1:], world_size=int(world_size) if world_size.isdigit() else None)
if os.environ.get(RESOLVED_CONFIG_ENV):
    write_resolved(run.config, os.environ[RESOLVED_CONFIG_ENV])
sys.exit(0)
