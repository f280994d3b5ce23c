#!/usr/bin/env bash
# Train a model: validate the configuration in one plain process, then start the trainer with torchrun.
#
#   [NGPU=2] [CONFIG_FILE=train_configs/qwen3_debug.toml] ./run_train.sh [--section.key=value ...]
#   ./run_train.sh --help                 every key, its type, default and meaning
#   ./run_train.sh --job.print_config     the resolved configuration, without training
#
# Environment:
#   NGPU           processes on this node, one per device (default 1; on a CPU, processes sharing its cores)
#   CONFIG_FILE    TOML file (default train_configs/qwen3_debug.toml)
#   LOG_RANK       local rank whose output is shown (default 0); every rank's output also goes to
#                  <run folder>/logs/rank<N>.log (written by the trainer)
#   TORCHRUN_ARGS  more torchrun arguments, e.g. for two nodes:
#                  "--nnodes=2 --node-rank=0 --rdzv-backend=c10d --rdzv-endpoint=host0:29500"
#   PYTHON         the Python interpreter (default python)
#
#   TORCH_ELASTIC_SHUTDOWN_TIMEOUT  seconds torchrun waits for the workers after forwarding SIGTERM/SIGINT
#                  before it SIGKILLs them (default 30): finishing a step and saving must fit in it
#
# Exit status: 2 and one "config error: ..." line on bad configuration, parallel degrees that do not multiply to
# NGPU x nodes included (before torchrun starts: torchrun would turn a worker's 2 into 1 and add a long
# traceback), or one "input error: ..." line when a worker
# found bad input (data, tokenizer, checkpoint, HF folder, launch) before training; 1 on a failure during
# training (non-finite loss, strict init check), with the worker's own "error: ..." line as the last line of
# output, and on a bug (any other exception: the worker's traceback is above the final "error: training
# failed" line); 0 on success, and on SIGTERM/SIGINT once the workers saved a checkpoint and stopped
# (torchrun itself then reports 1: the workers' "stopped by a signal" line decides).
set -euo pipefail

NGPU=${NGPU:-1}
CONFIG_FILE=${CONFIG_FILE:-train_configs/qwen3_debug.toml}
LOG_RANK=${LOG_RANK:-0}
TORCHRUN_ARGS=${TORCHRUN_ARGS:-}
PYTHON=${PYTHON:-python}
# One OpenMP thread pool per process sized to its share of the cores (the trainer sets torch's threads the
# same way); set here so torchrun does not pick 1 and print its banner about it.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / NGPU > 0 ? $(nproc) / NGPU : 1 ))}

# The world size torchrun will start: NGPU x --nnodes of TORCHRUN_ARGS (an elastic range "MIN:MAX" leaves it
# unknown: the workers check the parallel degrees against it when they start).
nnodes=1
read -r -a torchrun_words <<< "$TORCHRUN_ARGS"
for i in "${!torchrun_words[@]}"; do
    case "${torchrun_words[$i]}" in
        --nnodes=*) nnodes=${torchrun_words[$i]#--nnodes=} ;;
        --nnodes) nnodes=${torchrun_words[$((i + 1))]:-1} ;;
    esac
done
world_size=""
if [[ "$NGPU" =~ ^[0-9]+$ && "$nnodes" =~ ^[0-9]+$ ]]; then
    world_size=$(( NGPU * nnodes ))
fi

# Validation prints nothing on a valid config; anything on stdout is --help or --job.print_config output.
status=0
printed=$(TORCHTITAN_LITE_WORLD_SIZE="$world_size" "$PYTHON" -m torchtitan_lite.config \
    --job.config_file "$CONFIG_FILE" "$@") || status=$?
if [[ $status -ne 0 ]]; then
    exit "$status"
fi
if [[ -n "$printed" ]]; then
    printf '%s\n' "$printed"
    exit 0
fi

# torchrun's per-rank files (--tee writes through them) go to a temporary folder removed at exit, not to a
# torchelastic_* folder of its own that nothing removes.
logs=$(mktemp -d "${TMPDIR:-/tmp}/run_train.XXXXXX")
log=$logs/console.log
trap 'rm -rf "$logs"' EXIT
# SIGTERM/SIGINT: forward to torchrun, which forwards to the workers; they finish the step, save and exit 0.
pid=""
signalled=""
forward() {
    signalled=$1
    if [[ -n "$pid" ]]; then kill -s "$1" "$pid" 2>/dev/null || true; fi
}
trap 'forward TERM' TERM
trap 'forward INT' INT

# --tee 3 prefixes each worker line with [rank<local rank>]: and --local-ranks-filter keeps LOG_RANK's lines
# on the console; the full output of the launcher goes to $log as well, to find the error line below.
# shellcheck disable=SC2086  # TORCHRUN_ARGS is a list of words
"$PYTHON" -m torch.distributed.run --nproc_per_node="$NGPU" --local-ranks-filter "$LOG_RANK" \
    --role rank --tee 3 --log-dir "$logs/torchrun" $TORCHRUN_ARGS \
    -m torchtitan_lite.train --job.config_file "$CONFIG_FILE" "$@" > >(tee "$log") 2>&1 &
pid=$!
while true; do  # a trapped signal interrupts wait; wait again until torchrun has exited
    status=0
    wait "$pid" || status=$?
    kill -0 "$pid" 2>/dev/null || break
done
wait  # the tee of the process substitution: the log is complete
if [[ $status -eq 0 ]]; then
    exit 0
fi
if [[ -n "$signalled" ]] && grep -qE "^\[rank${LOG_RANK}\]:[[:space:]]*stopped by a signal after step" "$log"; then
    exit 0
fi

# The trainer reports a failure as one "error: <message>" line; repeat the shown rank's last one (or any
# rank's, if the shown rank was only stopped because another failed) as the final line.
strip='s/^\[rank[0-9]+\]:[[:space:]]*//'
line=$(grep -E "^\[rank${LOG_RANK}\]:[[:space:]]*(input )?error: " "$log" | tail -n 1 | sed -E "$strip" || true)
if [[ -z "$line" ]]; then
    line=$(grep -E '^\[rank[0-9]+\]:[[:space:]]*(input )?error: ' "$log" | tail -n 1 | sed -E "$strip" || true)
fi
echo "${line:-error: training failed (torchrun exit status $status); see the output above}" >&2
if [[ "$line" == "input error: "* ]]; then
    exit 2
fi
exit 1
