"""Benchmark of :func:`torchtitan_lite.init.sampling.trunc_normal_` (not a test).

Prints median times on one 16M-element fp32 tensor, as ratios to ``tensor.normal_`` and to
``torch.nn.init.trunc_normal_``, for the issue's regimes, on the plain (``generator``) path and the keyed
(``key=InitKey``, the tensor viewed as 4096 x 4096) path with compiled kernels (what ``init_weights`` uses for a
large model); then a whole-model line: a 12-layer dim-768 vocab-32000 model built on meta, ``init_weights`` vs
filling the same tensors with ``normal_``. Compile seconds (the first call of each compiled kernel: compiling, or
loading inductor's cache) are printed apart and excluded from the ratios.

Usage: ``python benchmarks/bench_init.py [--reps 5] [--threads 1]`` from the repo root.
Targets on a CPU (issue 2): <= 1.3x ``normal_`` at +-100 sigma and +-3 sigma, <= 1.6x at +-2 sigma,
<= 10x in the tail regime (mean 0, std 1, a=2, b=4).
"""

import argparse
import statistics
import time

import torch
from machine_load import reported_load
from torch import nn

from torchtitan_lite.init import draw
from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.init.keyed import InitKey
from torchtitan_lite.init.sampling import trunc_normal_
from torchtitan_lite.init.spec import InitPlan, ones, trunc_normal

REGIMES = [  # (label, mean, std, a, b)
    ("+-100 sigma", 0.0, 1.0, -100.0, 100.0),
    ("std .02, [-2, 2]", 0.0, 0.02, -2.0, 2.0),
    ("+-3 sigma", 0.0, 1.0, -3.0, 3.0),
    ("+-2 sigma", 0.0, 1.0, -2.0, 2.0),
    ("[-1, +3] sigma", 0.0, 1.0, -1.0, 3.0),
    ("tail [2, 4] sigma", 0.0, 1.0, 2.0, 4.0),
]


def median_time(fn, reps: int, warmup: bool = True) -> float:
    """Median wall time of ``fn()`` in seconds over ``reps`` runs (after one warm-up run)."""
    if warmup:
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_ratio(fn, baseline, reps: int) -> tuple[float, float]:
    """``(median time of fn, median of time(fn) / time(baseline))`` with the two timed back to back
    in each repetition, so that the ratio survives a machine whose load changes (shared CPUs)."""
    fn()
    times, ratios = [], []
    for _ in range(reps):
        t_base = median_time(baseline, 1, warmup=False)
        t_fn = median_time(fn, 1, warmup=False)
        times.append(t_fn)
        ratios.append(t_fn / t_base)
    return statistics.median(times), statistics.median(ratios)


class Layer(nn.Module):
    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(dim, ffn_dim, bias=False), nn.Linear(dim, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)
        self.attention_norm, self.ffn_norm = nn.Parameter(torch.empty(dim)), nn.Parameter(torch.empty(dim))


class Model(nn.Module):
    """A 12-layer dim-768 vocab-32000 decoder's parameters (ffn 3072, untied), for timing only."""

    def __init__(self, n_layers: int = 12, dim: int = 768, vocab_size: int = 32000):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleDict({str(i): Layer(dim, 4 * dim) for i in range(n_layers)})
        self.norm = nn.Parameter(torch.empty(dim))
        self.output = nn.Linear(dim, vocab_size, bias=False)


PLAN = InitPlan("bench", (
    ("tok_embeddings.weight", trunc_normal(1.0)),
    ("layers.*.w*.weight", trunc_normal(0.02)),
    ("layers.*_norm", ones()),
    ("norm", ones()),
    ("output.weight", trunc_normal(768**-0.5)),
))


def timing_args(doc: str, script: str, reps: int) -> argparse.Namespace:
    """``--reps`` (default ``reps``) and ``--threads`` (default 1) of a timing benchmark: sets torch's threads and
    prints the command line."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"command: python benchmarks/{script} --reps {args.reps} --threads {args.threads}")
    return args


def main() -> None:
    args = timing_args(__doc__, "bench_init.py", reps=5)
    x = torch.empty(2**24)
    matrix = x.view(4096, 4096)
    gen = torch.Generator().manual_seed(0)
    base = lambda: x.normal_(generator=gen)  # noqa: E731
    print(f"16M fp32, {args.threads} thread(s): normal_ {median_time(base, args.reps) * 1e3:.1f} ms; "
          f"ratios are medians over {args.reps} back-to-back pairs (torch's tail regime: 1 pair)")
    print(f"{'regime':<20} {'torch ms':>9} {'plain ms':>9} {'keyed ms':>9} {'torch/normal_':>14} "
          f"{'plain/normal_':>14} {'keyed/normal_':>14} {'plain/torch':>12}")
    for label, mean, std, a, b in REGIMES:
        torch_reps = 1 if label.startswith("tail") else args.reps
        t_torch, r_torch = median_ratio(lambda: torch.nn.init.trunc_normal_(x, mean, std, a, b, generator=gen),
                                        base, torch_reps)
        t_plain, r_plain = median_ratio(lambda: trunc_normal_(x, mean, std, a, b, generator=gen), base, args.reps)
        t_keyed, r_keyed = median_ratio(lambda: trunc_normal_(matrix, mean, std, a, b, key=InitKey(0, "w"),
                                                              compiled=True), base, args.reps)
        print(f"{label:<20} {t_torch * 1e3:>9.1f} {t_plain * 1e3:>9.1f} {t_keyed * 1e3:>9.1f} "
              f"{r_torch:>14.2f} {r_plain:>14.2f} {r_keyed:>14.2f} {r_plain / r_torch:>12.3f}")

    with torch.device("meta"):
        model = Model()
    materialize(model, "cpu")
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)

    def fill_normal():
        with torch.no_grad():
            for p in params:
                p.normal_(generator=gen)

    t_init, r_init = median_ratio(lambda: init_weights(model, PLAN, seed=0), fill_normal, max(1, args.reps // 2))
    print(f"whole model (12 layers, dim 768, vocab 32000, {numel / 1e6:.0f}M params, on meta then CPU): "
          f"init_weights {t_init:.2f} s, {r_init:.2f}x filling the same tensors with normal_")
    print(f"compile: {draw.compile_seconds():.1f} s in all (first calls of the compiled kernels, not in the ratios)")


if __name__ == "__main__":
    with reported_load():
        main()
