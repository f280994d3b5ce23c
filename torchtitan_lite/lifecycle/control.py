"""The run's control folder: the names the launcher (``torchtitan_lite.launch``) and workers share.

One folder per node, made by the launcher and removed when it ends. The launcher writes
:data:`STOP_FILE` on SIGTERM/SIGINT (the signal's name); local rank 0 writes :data:`BUDGET_FILE`
(the seconds a stop may take); each worker writes ``outcome.<local rank>`` (its exit status and
line); torchrun's agent writes :data:`FAILURES_FILE` (the failed workers, from torchrun's report)
and its log :data:`AGENT_LOG`. Torch-free: the launcher imports it before anything else.
"""

CONTROL_ENV = "TORCHTITAN_LITE_CONTROL"
"""Environment variable naming the run's control folder (set by the launcher for torchrun's agent
and the workers)."""
LAUNCHER_PID_ENV = "TORCHTITAN_LITE_LAUNCHER_PID"
"""Environment variable with the PID of the launcher; the workers exit when that process is gone."""
STOP_FILE = "stop"
BUDGET_FILE = "stop_within_s"
OUTCOME_PREFIX = "outcome."
FAILURES_FILE = "failures.json"
AGENT_LOG = "torchrun.log"
TORCHRUN_LOG_DIR = "torchrun"
"""torchrun's ``--log-dir``: each worker's ``stdout.log``, ``stderr.log`` and ``error.json``."""
LOST_PEER = "lost a peer: "
"""How the line (and error file) of a worker that ended because another rank's process is gone
begins."""
