"""``python -m torchtitan_lite.config <args>``: validate the configuration and exit 0 silently, or print one
``config error: ...`` line and exit 2 (``--help`` and ``--job.print_config`` print and exit 0)."""

import sys

from torchtitan_lite.config.preflight import load_config_or_exit

load_config_or_exit(sys.argv[1:])
sys.exit(0)
