#!/usr/bin/env bash
# GPU check: train Qwen3-0.6B (train_configs/qwen3_0.6b.toml) on ONE GPU (or NGPU, with tensor parallelism TP,
# pipeline parallelism PP and, for an MoE config, expert parallelism EP)
# for a few dozen steps with bf16 compute and torch.compile, then print tokens/s, MFU and peak memory per device.
# About 5 minutes on an H100/H200 (compile takes the first minute or two); exits non-zero on any failure.
#
# From a fresh checkout, on Linux x86_64 with an NVIDIA driver (the PyPI torch wheel for Linux is a CUDA
# build; for another CUDA version add --index-url https://download.pytorch.org/whl/cu<version>):
#   python -m venv .venv && source .venv/bin/activate
#   pip install torch==2.13.0 && pip install -e .
#   bash benchmarks/gpu_check.sh
#   NGPU=2 TP=2 bash benchmarks/gpu_check.sh      # the tensor-parallel variant on a machine with 2 GPUs
#   NGPU=2 PP=2 bash benchmarks/gpu_check.sh      # the pipeline-parallel variant
#   NGPU=2 CP=2 EXTRA_ARGS="--training.seq_len=32768 --model.overrides.max_seq_len=32768 \
#     --training.local_batch_size=1" bash benchmarks/gpu_check.sh   # context parallel: 32k windows over 2 GPUs
#   NGPU=8 EP=8 CONFIG_FILE=train_configs/deepseek_v3_16b.toml bash benchmarks/gpu_check.sh   # expert parallel
#     (8 GPUs of 80 GB: 16B parameters x 16 B / 8 = 32 GB of model state per GPU; not yet run on GPUs here)
#
# Needs no network: it trains on the bundled Shakespeare text with the bundled 2048-token tokenizer (the
# model keeps Qwen3's 151,936-row vocabulary: same FLOPs and memory as with Qwen3's own tokenizer), 4
# sequences of 4096 tokens per step per data-parallel rank, the config's full activation checkpointing.
#
# Environment (for dry runs and variants):
#   CONFIG_FILE  training config (default train_configs/qwen3_0.6b.toml)
#   STEPS        training steps (default 40); the summary's tokens/s is the median after the first quarter
#   NGPU         GPUs (processes), default 1
#   TP           tensor-parallel degree, default 1 (NGPU / (TP * PP) ranks are FSDP2 data-parallel ranks)
#   PP           pipeline-parallel degree, default 1; PP=2 NGPU=2 is the pipeline variant: two 1F1B stages of
#                14 layers, 4 micro-batches of one sequence per step, untied embeddings (a pipeline needs them)
#   CP           context-parallel degree, default 1: each window's positions split over CP ranks (keys and values
#                all-gathered, FlexAttention with the queries offset; docs/parallel.md), NGPU / (TP * PP * CP)
#                data-parallel ranks; seq_len must be a multiple of 2 * CP
#   EP           expert-parallel degree (MoE configs), default 1; borrowed from the FSDP x TP ranks, it divides
#                NGPU / PP. With EP > 1 compile is off (EP under torch.compile is not checked yet; EXTRA_ARGS
#                "--compile.enable=true" turns it on)
#   EXTRA_ARGS   more config overrides, applied last, e.g. "--training.seq_len=2048"
#   FLOAT8       1: the float8 variant (needs torchao: pip install -e ".[float8]"; compute capability >= 8.9): a
#                Llama 3 8B-shaped model (--model.name=llama3 --model.flavor=8b) cut to 4 layers, trained twice in one
#                run, bf16 then float8 (tensorwise, float8 FSDP all-gather with precomputed scales), same config and
#                batches, then a side-by-side table of tokens/s and MFU (and their ratio). Float8 runs only the
#                matmuls of the blocks' linear layers in float8 (docs/performance.md, "Float8 training")
#   FLEX_GPT_OSS 1: the attention variant instead: a GPT-OSS-20B-shaped model (train_configs/gpt_oss_20b.toml: 64
#                query / 8 key-value heads, 128-key sliding windows with sinks on even layers) cut to 2 layers, at
#                seq_len 8192, one sequence per step, through FlexAttention (model.attn_backend = "flex", sinks from
#                the log-sum-exp; models/common/flex.py): ~45 GB of model state, no 8192^2 mask
#   INIT         1: the init check instead: benchmarks/bench_init_device.py draws CONFIG_FILE's init on the GPU and on
#                the CPU, prints both fingerprints (they must be equal) and the GPU's init seconds against a CUDA
#                normal_ fill of the same tensors (compile seconds apart); exits 1 when the fingerprints differ
#   REQUIRE_GPU  1 (default) fails without CUDA; 0 runs anywhere, e.g. a CPU dry run of the parsing:
#                REQUIRE_GPU=0 CONFIG_FILE=train_configs/qwen3_debug.toml STEPS=12 \
#                  EXTRA_ARGS="--compile.enable=false --training.compute_dtype=auto --training.seq_len=256" \
#                  bash benchmarks/gpu_check.sh
#                (add NGPU=2 PP=2 for the pipeline's CPU dry run, NGPU=2 CP=2 for context parallelism's, or NGPU=2 EP=2
#                CONFIG_FILE=train_configs/qwen3_moe_debug.toml for expert parallelism's)
set -euo pipefail
cd "$(dirname "$0")/.."

CONFIG_FILE=${CONFIG_FILE:-train_configs/qwen3_0.6b.toml}
STEPS=${STEPS:-40}
NGPU=${NGPU:-1}
TP=${TP:-1}
PP=${PP:-1}
EP=${EP:-1}
CP=${CP:-1}
REQUIRE_GPU=${REQUIRE_GPU:-1}
PYTHON=${PYTHON:-python}
read -r -a extra <<< "${EXTRA_ARGS:-}"
if [[ "${INIT:-0}" == 1 ]]; then
    exec "$PYTHON" benchmarks/bench_init_device.py --device cuda --config "$CONFIG_FILE"
fi
FLOAT8=${FLOAT8:-0}
if [[ "$FLOAT8" == 1 ]]; then
    extra=(--model.name=llama3 --model.flavor=8b --model.overrides.n_layers=4 "${extra[@]}")
fi
if [[ "${FLEX_GPT_OSS:-0}" == 1 ]]; then
    CONFIG_FILE=train_configs/gpt_oss_20b.toml
    extra=(--model.overrides.n_layers=2 --model.overrides.max_seq_len=8192 --training.seq_len=8192
           --training.local_batch_size=1 --training.global_batch_size="$NGPU" --model.attn_backend=flex "${extra[@]}")
fi
layout=()
if [[ "$PP" != 1 ]]; then
    layout=(--parallelism.pipeline_parallel_degree="$PP" --model.tie_embeddings=false)
fi

if [[ "$REQUIRE_GPU" == 1 ]]; then
    nvidia-smi
fi
if (( NGPU % (TP * PP * CP) )); then
    echo "gpu_check: TP=$TP x PP=$PP x CP=$CP does not divide NGPU=$NGPU" >&2
    exit 2
fi
if [[ "$CP" != 1 ]]; then
    layout+=(--parallelism.context_parallel_degree="$CP")
fi
compile=true
if [[ "$EP" != 1 ]]; then
    if (( (NGPU / PP) % EP )); then
        echo "gpu_check: EP=$EP does not divide NGPU / PP = $(( NGPU / PP )) (expert parallelism borrows those ranks)" >&2
        exit 2
    fi
    layout+=(--parallelism.expert_parallel_degree="$EP")
    compile=false
fi
REQUIRE_GPU=$REQUIRE_GPU NGPU=$NGPU "$PYTHON" - <<'EOF'
import os
import sys

import torch

print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()}")
if torch.cuda.is_available():
    print(f"devices: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
    if torch.cuda.device_count() < int(os.environ["NGPU"]):
        sys.exit(f"gpu_check: NGPU={os.environ['NGPU']} but torch sees {torch.cuda.device_count()} GPUs")
elif os.environ["REQUIRE_GPU"] == "1":
    sys.exit("gpu_check: no CUDA device visible to torch (install a CUDA build of torch, see the top of this file)")
EOF

log=$(mktemp "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
table=$(mktemp "${TMPDIR:-/tmp}/gpu_check_table.XXXXXX")
trap 'rm -f "$log" "$table"' EXIT

# One training run and its summary; $1 names it in the table, the rest are more config overrides.
train_and_summarize() {
local label=$1
shift
NGPU=$NGPU LOG_RANK=$(seq -s, 0 $((NGPU - 1))) CONFIG_FILE="$CONFIG_FILE" ./run_train.sh \
    --training.dataset=shakespeare --training.hf_dataset_name=none --training.hf_dataset_config=none \
    --training.streaming=false --training.local_batch_size=4 --training.global_batch_size=$(( 4 * NGPU / (TP * PP * CP) )) \
    --parallelism.tensor_parallel_degree="$TP" "${layout[@]}" \
    --training.steps="$STEPS" --lr_scheduler.warmup_steps=5 --validation.enable=false --checkpoint.enable=false \
    --metrics.enable_tensorboard=false --metrics.log_freq=1 --compile.enable=$compile --training.compute_dtype=bfloat16 \
    "${extra[@]}" "$@" 2>&1 | tee "$log"

"$PYTHON" - "$log" "$STEPS" "$label" "$table" <<'EOF'
import re
import statistics
import sys

text, steps = open(sys.argv[1]).read(), int(sys.argv[2])
found = re.findall(r"\[rank(\d+)\]:step\s+(\d+)\s+loss\s+(\S+).*?\btps ([\d,]+)\s+tflops (\S+)\s+mfu (\S+)\s+mem (\S+)",
                   text)
if not found:
    sys.exit("gpu_check: no step log line in the trainer's output")
by_rank = {}
for rank, s, loss, tps, tf, mfu, mem in found:
    by_rank.setdefault(int(rank), []).append((int(s), float(loss), float(tps.replace(",", "")), float(tf), mfu, mem))
rows = by_rank[0]
timed = [r for r in rows if r[0] > steps // 4] or rows
tps = statistics.median(r[2] for r in timed)
tflops = statistics.median(r[3] for r in timed)
mfus = [float(r[4].rstrip("%")) for r in timed if r[4] != "n/a"]
mems = [float(r[5].removesuffix("GiB")) for r in rows if r[5] != "n/a"]
print(f"\ngpu_check summary ({sys.argv[3]})")
print(f"  steps logged        {len(rows)} (last step {rows[-1][0]}, loss {rows[0][1]:.4f} -> {rows[-1][1]:.4f})")
print(f"  tokens/s per device {tps:,.0f}  (median of steps {timed[0][0]}..{timed[-1][0]})")
print(f"  TFLOP/s per device  {tflops:.2f}")
print(f"  MFU                 {'n/a (peak unknown for this device)' if not mfus else f'{statistics.median(mfus):.2f}%'}")
print(f"  peak memory         {'n/a' if not mems else f'{max(mems):.2f} GiB'}" + ("" if len(by_rank) == 1 else " (rank 0)"))
for rank, ranked in sorted(by_rank.items())[1:]:
    peak = [float(r[5].removesuffix("GiB")) for r in ranked if r[5] != "n/a"]
    print(f"  peak memory rank {rank:<2} {'n/a' if not peak else f'{max(peak):.2f} GiB'}")
with open(sys.argv[4], "a") as table:
    table.write(f"{sys.argv[3]}\t{tps}\t{statistics.median(mfus) if mfus else 'n/a'}\n")
if rows[-1][0] != steps:
    sys.exit(f"gpu_check: the last logged step is {rows[-1][0]}, expected {steps}")
EOF
}

if [[ "$FLOAT8" == 1 ]]; then
    train_and_summarize bf16
    train_and_summarize float8 --float8.enable=true --float8.enable_fsdp_float8_all_gather=true \
        --float8.precompute_float8_dynamic_scale_for_fsdp=true
    "$PYTHON" - "$table" <<'EOF'
import sys

rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines()]
(_, tps_bf16, _), (_, tps_f8, _) = rows
print("\ngpu_check float8 vs bf16 (same config, same batches; float8's MFU against the bf16/fp8 mixed peak)")
print("| run | tokens/s per device | MFU |")
print("|---|---|---|")
for name, tps, mfu in rows:
    print(f"| {name} | {float(tps):,.0f} | {mfu if mfu == 'n/a' else f'{float(mfu):.2f}%'} |")
print(f"| float8 / bf16 | {float(tps_f8) / float(tps_bf16):.3f}x | |")
EOF
else
    train_and_summarize "$(basename "$CONFIG_FILE" .toml)"
fi

