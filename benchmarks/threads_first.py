"""Imported first by every benchmark: the launcher's thread environment for one process
(``torchtitan_lite.threads.thread_env``) before torch loads its OpenMP runtime (docs/design.md,
"Note: threads of the entry points")."""

import os

from torchtitan_lite.threads import thread_env

thread_env(os.environ, "1")
