"""Benchmark (not a test): time and peak memory of one attention layer's forward + backward per
backend, side by side with the dense reference, and tokens/s of greedy decoding with and without the
KV cache.

Attention shapes are the GPT-OSS debug model's (4 query heads, 2 key/value heads, head_dim 64, batch
1, fp32 on CPU): ``sliding`` = GPT-OSS's even layers (128-key window + sinks), ``full`` = its odd
layers (sinks), ``plain`` = Qwen3-style causal attention (no sinks). Backends: ``reference`` (dense
``(S, S + 1)`` mask through SDPA), ``blockwise`` (``models/common/blockwise.py``), ``sdpa``
(``is_causal``; with sinks the sink folded in as the first key,
``models/common/sink_attention.py``). Each measurement runs in its own process: ``peak`` is that
process's peak RSS above its RSS once the inputs exist (``ru_maxrss``), so it counts every transient
of forward and backward. The reference is skipped at a length where its peak, extrapolated as
``S^2`` from the previous length, would exceed ``--ref-limit-gib``.

    python benchmarks/bench_attention.py              # S = 1k, 4k, 16k, 32k; decoding of 256 tokens
    python benchmarks/bench_attention.py --seqlens 1024 4096
    python benchmarks/bench_attention.py --seqlens              # decoding only
"""

from __future__ import annotations

import benchmarks.threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

from benchmarks.machine_load import reported_load

CASES = {
    "sliding": (128, True),
    "full": (None, True),
    "plain": (None, False),
}  # name -> (window, sinks)
BACKENDS = {
    "sliding": ("reference", "blockwise"),
    "full": ("reference", "sdpa"),
    "plain": ("reference", "sdpa"),
}
N_HEADS, N_KV_HEADS, HEAD_DIM = 4, 2, 64  # models/gpt_oss/args.py debug flavor


def rss_bytes() -> int:
    """This process's resident set size now."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(case: str, backend: str, seqlen: int) -> dict:
    """One forward + backward (after one warm-up at ``seqlen <= 4096``) in this process: seconds and
    peak bytes."""
    from torchtitan_lite.models.common.attention_backends import attention

    window, with_sinks = CASES[case]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, seqlen, N_HEADS, HEAD_DIM, generator=gen, requires_grad=True)
    k = torch.randn(1, seqlen, N_KV_HEADS, HEAD_DIM, generator=gen, requires_grad=True)
    v = torch.randn(1, seqlen, N_KV_HEADS, HEAD_DIM, generator=gen, requires_grad=True)
    sinks = torch.randn(N_HEADS, generator=gen, requires_grad=True) if with_sinks else None
    grad = torch.randn(1, seqlen, N_HEADS, HEAD_DIM, generator=gen)
    name = "auto" if backend == "sdpa" else backend

    def step():
        attention(q, k, v, sinks=sinks, sliding_window=window, backend=name).backward(grad)

    base = rss_bytes()
    if seqlen <= 4096:
        step()
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base,
    }


def decode_tokens_per_s(new_tokens: int) -> tuple[float, float]:
    """Greedy tokens/s of the Qwen3 debug model (random init) for ``new_tokens`` after an 8-token
    prompt, with and without the KV cache."""
    from torchtitan_lite.components.generation import generate
    from torchtitan_lite.init.apply import init_weights, materialize
    from torchtitan_lite.models import get_model_spec

    spec = get_model_spec("qwen3")
    args = spec.flavors["debug"]
    with torch.device("meta"):
        model = spec.model_cls(args)
    materialize(model, "cpu")
    init_weights(model, spec.init_plan(args), seed=0, buffer_device="cpu")
    model.eval()
    rates = []
    for use_cache in (True, False):
        start = time.perf_counter()
        ids = generate(model, list(range(1, 9)), new_tokens, device="cpu", use_cache=use_cache)
        rates.append(len(ids) / (time.perf_counter() - start))
    return rates[0], rates[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqlens", type=int, nargs="*", default=[1024, 4096, 16384, 32768])
    parser.add_argument("--ref-limit-gib", type=float, default=6.0)
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        case, backend, seqlen = options.child
        print(json.dumps(measure(case, backend, int(seqlen))))
        return
    torch.set_num_threads(1)
    with reported_load():
        if options.seqlens:
            print(
                f"one attention layer fwd+bwd, bs 1, {N_HEADS} heads / {N_KV_HEADS} kv heads, "
                f"head_dim {HEAD_DIM}, fp32 CPU, 1 thread"
            )
            print(
                f"{'case':8} {'S':>6}  "
                + "  ".join(f"{b:>24}" for b in ("reference s / GiB", "backend s / GiB"))
                + "  speed-up  memory ratio"
            )
        ref_peak: dict[str, tuple[int, int]] = {}
        for seqlen in options.seqlens:
            for case, (ref_name, name) in BACKENDS.items():
                results = {}
                for backend in (ref_name, name):
                    if backend == "reference" and case in ref_peak:
                        last_s, last_peak = ref_peak[case]
                        if last_peak * (seqlen / last_s) ** 2 > options.ref_limit_gib * 2**30:
                            continue
                    run = subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "benchmarks.bench_attention",
                            "--child",
                            case,
                            backend,
                            str(seqlen),
                        ],
                        capture_output=True,
                        text=True,
                        check=True,
                        env={**os.environ, "OMP_NUM_THREADS": "1"},
                    )
                    results[backend] = json.loads(run.stdout)
                if "reference" in results:
                    ref_peak[case] = (seqlen, results["reference"]["peak"])
                cells = [
                    f"{r['seconds']:10.3f} s {r['peak'] / 2**30:7.3f} GiB"
                    if r
                    else f"{'skipped':>24}"
                    for r in (results.get(ref_name), results[name])
                ]
                ratio = ""
                if ref_name in results:
                    ref, new = results[ref_name], results[name]
                    ratio = (
                        f"  {ref['seconds'] / new['seconds']:7.1f}x  "
                        f"{ref['peak'] / max(new['peak'], 1):11.1f}x"
                    )
                print(f"{case:8} {seqlen:6}  {cells[0]}  {cells[1]} ({name}){ratio}", flush=True)
        cached, recompute = decode_tokens_per_s(options.decode_tokens)
        print(
            f"decoding {options.decode_tokens} new tokens (qwen3 debug, greedy): {cached:.1f} "
            "tokens/s with the KV "
            f"cache, {recompute:.1f} tokens/s recomputing ({cached / recompute:.1f}x)"
        )


if __name__ == "__main__":
    main()
