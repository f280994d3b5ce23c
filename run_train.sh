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
#   NNODES         nodes of the run (default 1; under srun, Slurm's SLURM_STEP_NUM_NODES); run the same command on
#                  every node, with:
#   NODE_RANK      this node's rank, 0..NNODES-1 (default 0; under srun SLURM_NODEID); its workers are the global
#                  ranks NODE_RANK x NGPU .. NODE_RANK x NGPU + NGPU-1
#   MASTER_ADDR    node 0's address, MASTER_PORT a free port there (defaults: under srun the first host of
#                  SLURM_STEP_NODELIST, else 127.0.0.1; 29500): torchrun's static rendezvous
#   RDZV_ENDPOINT  host:port of a c10d rendezvous instead of MASTER_ADDR/MASTER_PORT (torchrun numbers the nodes;
#                  NODE_RANK is not used), RDZV_ID its run id (default: Slurm's SLURM_JOB_ID, else torchtitan_lite)
#   RDZV_TIMEOUT   seconds the nodes wait for all of them to join (default 600); then one "input error" line, exit 2
#   TORCHRUN_ARGS  more torchrun arguments; one holding --nnodes replaces the five variables above, e.g.
#                  "--nnodes=2 --node-rank=0 --rdzv-backend=c10d --rdzv-endpoint=host0:29500"
#   PYTHON         the Python interpreter (default python)
#
# Stopping: SIGTERM or SIGINT (Ctrl-C) asks the workers to finish the current step (or the start-up phase), save
# and exit 0; they print one line saying what was saved. torchrun ignores both signals (it would SIGKILL the workers
# after TORCH_ELASTIC_SHUTDOWN_TIMEOUT and print a traceback): the request goes to the workers through the run's
# control folder (torchtitan_lite/components/faults.py). The launcher waits as long as the trainer says a stop
# needs (twice its longest step and save so far, plus 60 s), then kills the workers; a second signal kills them at
# once. If the launcher or torchrun is killed (kill -9 of the process group), the workers exit within seconds.
#
# Exit status (docs/checkpoints.md, "How a run ends": each case's last line): 0 on success, and on SIGTERM/SIGINT
# once the workers saved a checkpoint and stopped (or stopped before the first step, with nothing to save); 2 and one
# "config error: ..." line on bad configuration, parallel degrees that do not multiply to NGPU x nodes included
# (before torchrun starts), or one "input error: ..." line when a
# worker found bad input (data, tokenizer, checkpoint, a checkpoint folder in use by another run, HF folder,
# launch) before training; 1 and one "error: ..." line on a failure during training (non-finite loss, strict init
# check, a full disk while saving), when the workers had to be killed after a stop request, when a worker was killed
# (the line names its rank and signal), and on a bug (any other exception: the worker's traceback is above the
# final "error: training failed" line). A worker that fails exits non-zero, so torchrun stops the others at once
# (an error found on some ranks only does not leave the others waiting in a collective).
set -euo pipefail

NGPU=${NGPU:-1}
config_file_from=${CONFIG_FILE:+CONFIG_FILE}  # what --help and config errors call the file: CONFIG_FILE or its default
CONFIG_FILE=${CONFIG_FILE:-train_configs/qwen3_debug.toml}
LOG_RANK=${LOG_RANK:-0}
TORCHRUN_ARGS=${TORCHRUN_ARGS:-}
PYTHON=${PYTHON:-python}
# One OpenMP thread pool per process sized to its share of the cores (the trainer sets torch's threads the
# same way); set here so torchrun does not pick 1 and print its banner about it.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / NGPU > 0 ? $(nproc) / NGPU : 1 ))}

# The rendezvous of a multi-node run (docs/running.md, "Many nodes"), from the variables above unless TORCHRUN_ARGS
# gives its own.
if [[ -n "${SLURM_STEP_NUM_NODES:-}" ]]; then
    if [[ "${SLURM_STEP_NUM_TASKS:-$SLURM_STEP_NUM_NODES}" != "$SLURM_STEP_NUM_NODES" ]]; then
        echo "config error: srun started ${SLURM_STEP_NUM_TASKS} tasks on $SLURM_STEP_NUM_NODES nodes, but" \
            "run_train.sh runs once per node (it starts NGPU workers): use srun --ntasks-per-node=1" >&2
        exit 2
    fi
    NNODES=${NNODES:-$SLURM_STEP_NUM_NODES}
    NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-0}}
    if [[ -z "${MASTER_ADDR:-}" && -z "${RDZV_ENDPOINT:-}" ]] && command -v scontrol > /dev/null; then
        MASTER_ADDR=$(scontrol show hostnames "${SLURM_STEP_NODELIST:-}" | head -n 1)
    fi
fi
NNODES=${NNODES:-1}
rdzv_timeout=${RDZV_TIMEOUT:-600}
rdzv_args=""
rdzv_where="of TORCHRUN_ARGS in time"
if [[ ! " $TORCHRUN_ARGS" =~ \ --nnodes ]]; then
    for name in NNODES NODE_RANK MASTER_PORT RDZV_TIMEOUT; do
        if [[ -n "${!name:-}" && ! "${!name}" =~ ^[0-9]+$ ]]; then
            echo "config error: $name=${!name} is not a whole number; set it to one" >&2
            exit 2
        fi
    done
    if (( NNODES < 1 )) || (( ${NODE_RANK:-0} >= NNODES )); then
        echo "config error: NODE_RANK=${NODE_RANK:-0} with NNODES=$NNODES: give each of the NNODES nodes" \
            "(NNODES >= 1) its own NODE_RANK, 0..$(( NNODES > 1 ? NNODES - 1 : 0 ))" >&2
        exit 2
    fi
    if (( NNODES > 1 )); then
        if [[ -n "${RDZV_ENDPOINT:-}" ]]; then
            rdzv_args="--nnodes=$NNODES --rdzv-backend=c10d --rdzv-endpoint=$RDZV_ENDPOINT"
            rdzv_args+=" --rdzv-id=${RDZV_ID:-${SLURM_JOB_ID:-torchtitan_lite}} --rdzv-conf=join_timeout=$rdzv_timeout"
        else
            rdzv_args="--nnodes=$NNODES --node-rank=${NODE_RANK:-0} --master-addr=${MASTER_ADDR:-127.0.0.1}"
            rdzv_args+=" --master-port=${MASTER_PORT:-29500} --rdzv-conf=timeout=$rdzv_timeout"
        fi
        TORCHRUN_ARGS="$rdzv_args $TORCHRUN_ARGS"
        rdzv_where="${RDZV_ENDPOINT:-${MASTER_ADDR:-127.0.0.1}:${MASTER_PORT:-29500}}"
        rdzv_where+=" within RDZV_TIMEOUT=$rdzv_timeout s"
    fi
fi

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

# The run's control folder: the stop request, the workers' outcomes, the seconds a stop may take, the console log.
control=$(mktemp -d "${TMPDIR:-/tmp}/run_train.XXXXXX")
trap 'rm -rf "$control"' EXIT
pid=""
signalled=""
stop_time=0
killed=""
deadline=""
on_signal() {  # $1: TERM or INT
    if [[ -n "$signalled" ]]; then
        killed="a second SIG$1"
        if [[ -n "$pid" ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
        return
    fi
    signalled="SIG$1"
    stop_time=$SECONDS
    printf '%s\n' "$signalled" > "$control/stop"
    if [[ -f "$control/stop_within_s" ]]; then deadline=$(( SECONDS + $(cat "$control/stop_within_s") )); fi
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

wait_for_pid() {  # wait until $pid exits, its status in $status; after a stop request poll, and kill $pid at the
    status=0      # deadline (at once with the argument "now")
    while true; do
        if [[ -n "$signalled" ]] && kill -0 "$pid" 2>/dev/null; then
            if [[ -z "$killed" && ( "${1:-}" == now || ( -n "$deadline" && $SECONDS -ge $deadline ) ) ]]; then
                killed="no stop within $(( SECONDS - stop_time )) s"
                kill -KILL "$pid" 2>/dev/null || true
            fi
            sleep 1 || true
            continue
        fi
        status=0
        wait "$pid" || status=$?
        kill -0 "$pid" 2>/dev/null || return 0
    done
}

# Validation prints nothing on a valid config; anything on stdout is --help or --job.print_config output. It writes
# the resolved config to the control folder, which the workers read instead of checking again. It ignores
# SIGTERM/SIGINT (no traceback of an interrupted import); a stop request ends it at once.
( trap '' INT TERM; TORCHTITAN_LITE_WORLD_SIZE="$world_size" TORCHTITAN_LITE_RESOLVED_CONFIG="$control/config.json" \
    TORCHTITAN_LITE_CONFIG_FILE_FROM="${config_file_from:-CONFIG_FILE default of run_train.sh}" \
    exec "$PYTHON" -m torchtitan_lite.preflight \
    --job.config_file "$CONFIG_FILE" "$@" ) > "$control/printed" &
pid=$!
wait_for_pid now
if [[ -n "$signalled" ]]; then
    echo "stopped by a signal ($signalled) before the first step; nothing to save"
    exit 0
fi
if [[ $status -ne 0 ]]; then
    exit "$status"
fi
if [[ -s "$control/printed" ]]; then
    cat "$control/printed"
    exit 0
fi

# --tee 3 prefixes each worker line with [rank<local rank>]: and --local-ranks-filter keeps LOG_RANK's lines
# on the console; torchrun's own lines (its report of a failed worker) go only to the log, which holds the full
# output, to find an error line below. torchrun, tee and grep ignore SIGTERM/SIGINT (Ctrl-C reaches the whole
# foreground process group): see "Stopping" above.
# shellcheck disable=SC2086  # TORCHRUN_ARGS is a list of words
( trap '' INT TERM; TORCHTITAN_LITE_CONTROL="$control" TORCHTITAN_LITE_LAUNCHER_PID=$$ \
    TORCHTITAN_LITE_RESOLVED_CONFIG="$control/config.json" exec "$PYTHON" \
    -m torch.distributed.run --nproc_per_node="$NGPU" --local-ranks-filter "$LOG_RANK" --role rank --tee 3 \
    --log-dir "$control/torchrun" --signals-to-handle=SIGHUP,SIGQUIT $TORCHRUN_ARGS -m torchtitan_lite.train --job.config_file "$CONFIG_FILE" "$@" \
    ) > >(trap '' INT TERM; tee "$control/log" | grep --line-buffered -E '^\[rank[0-9]+\]:') 2>&1 &
pid=$!
wait_for_pid
wait  # the tee of the process substitution: the log is complete
if [[ -n "$killed" ]]; then
    echo "error: the workers did not stop after $signalled and were killed ($killed); the last complete" \
        "checkpoint is kept" >&2
    exit 1
fi

# A worker that printed a user error or a stop line also wrote its status and line to the control folder (and a
# failed one exited with that status, so torchrun stopped the others): repeat the worst one, the shown rank's if it
# has it, as the final line.
code=0
line=""
for rank_file in "$control/outcome.$LOG_RANK" "$control"/outcome.*; do
    if [[ -f "$rank_file" ]] && (( $(head -n 1 "$rank_file") > code )); then
        code=$(head -n 1 "$rank_file")
        line=$(sed -n 2p "$rank_file")
    fi
done
if [[ $code -ne 0 ]]; then
    echo "$line" >&2
    exit "$code"
fi
if [[ $status -eq 0 ]]; then
    exit 0
fi
# A bug, a killed worker (or one that ended itself, e.g. after its launcher died): the worker's traceback or
# "error: ..." line is above; repeat the shown rank's last error line (or any rank's) as the final line, else name
# the worker torchrun saw fail first (its "Root Cause" report), else show torchrun's own output.
strip='s/^\[rank[0-9]+\]:[[:space:]]*//'
line=$(grep -E "^\[rank${LOG_RANK}\]:[[:space:]]*error: " "$control/log" | tail -n 1 | sed -E "$strip" || true)
if [[ -z "$line" ]]; then
    line=$(grep -E '^\[rank[0-9]+\]:[[:space:]]*error: ' "$control/log" | tail -n 1 | sed -E "$strip" || true)
fi
# A node that never joined: torchrun's rendezvous timed out (static: node 0 waited for the others, or the others
# could not reach node 0; c10d: RendezvousTimeoutError).
torchrun_says=$(grep -v -E '^\[rank[0-9]+\]:' "$control/log" || true)
joined=$(grep -o -E '[0-9]+/[0-9]+ clients joined|while trying to connect to|RendezvousTimeoutError' \
    <<< "$torchrun_says" | tail -n 1 || true)
if [[ -z "$line" && -n "$joined" ]]; then
    case "$joined" in
        *clients\ joined) joined="${joined% clients joined} nodes joined" ;;
        *connect\ to) joined="node 0 was not reachable" ;;
        *) joined="torchrun's RendezvousTimeoutError" ;;
    esac
    echo "input error: not all $nnodes nodes joined the rendezvous at $rdzv_where ($joined): start" \
        "./run_train.sh on every node with the same NNODES and MASTER_ADDR/MASTER_PORT (or RDZV_ENDPOINT) and" \
        "a NODE_RANK each, or raise RDZV_TIMEOUT" >&2
    exit 2
fi
if [[ -z "$line" ]]; then
    root=$(grep -v -E '^\[rank[0-9]+\]:' "$control/log" | sed -n '/Root Cause/,$p' || true)
    failed_rank=$(sed -n -E 's/^ *rank *: ([0-9]+).*/\1/p' <<< "$root" | head -n 1)
    failed_code=$(sed -n -E 's/^ *exitcode *: (-?[0-9]+).*/\1/p' <<< "$root" | head -n 1)
    # A worker of this node killed by a signal is the cause, even when a peer that lost it ended first (torchrun's
    # "first observed failure"): the first such "rank / exitcode" pair of torchrun's whole failure report.
    report=$(grep -v -E '^\[rank[0-9]+\]:' "$control/log" | sed -n '/^Failures:/,$p' || true)
    killed=$(paste -d ' ' <(sed -n -E 's/^ *rank *: ([0-9]+).*/\1/p' <<< "$report") \
        <(sed -n -E 's/^ *exitcode *: (-?[0-9]+).*/\1/p' <<< "$report") | awk '$2 < 0 {print; exit}')
    if [[ -n "$killed" ]]; then
        read -r failed_rank failed_code <<< "$killed"
    fi
    if [[ -n "$failed_rank" && -n "$failed_code" ]]; then
        if (( failed_code > 0 )) && grep -q -E "^\[rank[0-9]+\]:lost a peer: rank $failed_rank's " "$control/log"; then
            line="error: training failed (torchrun exit status $status): a worker on another node failed or was"
            line+=" killed (rank $failed_rank here lost its connection to it; that node's last line names it); the"
            line+=" last complete checkpoint is kept"
        elif (( failed_code < 0 )); then
            signal_name="SIG$(kill -l $(( -failed_code )) 2>/dev/null || echo $(( -failed_code )))"
            line="error: training failed (torchrun exit status $status): rank $failed_rank was killed by"
            line+=" $signal_name; the last complete checkpoint is kept"
        else
            line="error: training failed (torchrun exit status $status): rank $failed_rank exited with status"
            line+=" $failed_code; see the output above"
        fi
    else
        grep -v -E '^\[rank[0-9]+\]:' "$control/log" | tail -n 20 >&2 || true
    fi
fi
echo "${line:-error: training failed (torchrun exit status $status); see the output above}" >&2
exit 1
