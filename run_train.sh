#!/usr/bin/env bash
# Train a model: check the configuration in one plain process, then start the workers with torchrun.
#
#   [NGPU=2] [CONFIG_FILE=train_configs/qwen3_debug.toml] ./run_train.sh [--section.key=value ...]
#   ./run_train.sh --help                 every key, its type, default and meaning
#   ./run_train.sh --job.print_config     the resolved configuration, without training
#
# Environment:
#   NGPU           processes on this node, one per device (default 1; on a CPU, processes
#                  sharing its cores)
#   CONFIG_FILE    TOML file (default train_configs/qwen3_debug.toml)
#   LOG_RANK       local rank whose output is shown (default 0); every rank's output also goes
#                  to <run folder>/logs/rank<N>.log (written by the trainer)
#   NNODES         nodes of the run (default 1; under srun, Slurm's SLURM_STEP_NUM_NODES); run
#                  the same command on every node, with:
#   NODE_RANK      this node's rank, 0..NNODES-1 (default 0; under srun SLURM_NODEID); its
#                  workers are the global ranks NODE_RANK x NGPU .. NODE_RANK x NGPU + NGPU-1
#   MASTER_ADDR    node 0's address, MASTER_PORT a free port there (defaults: under srun the
#                  first host of SLURM_STEP_NODELIST, else 127.0.0.1; 29500): static rendezvous
#   RDZV_ENDPOINT  host:port of a c10d rendezvous instead of MASTER_ADDR/MASTER_PORT (torchrun
#                  numbers the nodes; NODE_RANK is not used), RDZV_ID its run id (default:
#                  SLURM_JOB_ID, else torchtitan_lite)
#   RDZV_TIMEOUT   seconds the nodes wait for all of them to join (default 600); then one
#                  "input error" line, exit 2
#   TORCHRUN_ARGS  more torchrun arguments; one holding --nnodes replaces the five variables
#                  above, e.g. "--nnodes=2 --node-rank=0 --rdzv-backend=c10d
#                  --rdzv-endpoint=host0:29500"
#   PYTHON         the Python interpreter (default python)
#   OMP_NUM_THREADS, OMP_WAIT_POLICY  default: the cores / NGPU, PASSIVE (idle OpenMP threads sleep
#                  instead of holding a core another thread needs; docs/running.md, "A busy machine")
#
# Stopping: SIGTERM or SIGINT (Ctrl-C) asks the workers to finish the current step (or start-up
# phase), save and exit 0, with one line saying what was saved. The launcher waits as long as the
# workers say a stop needs (twice their longest step and save so far, plus 60 s), then kills them;
# a second signal kills them at once. If the launcher is killed (kill -9 of the process group), the
# workers exit within seconds.
#
# Exit status and last line (docs/checkpoints.md, "How a run ends"): 0 on success, and after a stop
# once the workers saved (or stopped before the first step); 2 and one "config error: ..." or
# "input error: ..." line on bad configuration or input found before training; 1 and one
# "error: ..." line on a failure during training, a killed worker (its rank and signal) or a bug
# (the worker's traceback above it).
#
# The launcher is Python: torchtitan_lite/launch/ (the config check, torchrun's agent, stop
# requests, the last line).
exec "${PYTHON:-python}" -m torchtitan_lite.launch "$@"
