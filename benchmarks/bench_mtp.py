"""Benchmark (not a test): what multi-token prediction costs a training step, MTP off vs
``mtp_num_layers`` = 1.

Builds the DeepSeek-V3 ``debug`` model (or ``--flavor``) twice on CPU from the same init plan and
seed, without and with one MTP module, and runs bare steps (forward with labels, summed
cross-entropy, backward, AdamW) on the same random batches, interleaved; reports per variant the
median step seconds, the parameters (model, optimizer state: AdamW keeps two fp32 moments per
parameter) and the activation peak of one forward + backward
(:class:`torchtitan_lite.components.activation_memory.ActivationMemory`), and the ratios MTP / off.

    python benchmarks/bench_mtp.py               # debug flavor, 8 x 256 tokens, 10 timed steps each
    python benchmarks/bench_mtp.py --steps 5 --batch 4
"""

from __future__ import annotations

import threads_first  # noqa: F401  (first: the launcher's threads before torch loads)

# isort: split
import argparse
import dataclasses
import statistics
import time

import torch
from machine_load import reported_load

from torchtitan_lite.components.activation_memory import ActivationMemory
from torchtitan_lite.components.loss import cross_entropy_sum
from torchtitan_lite.init.apply import init_weights, materialize
from torchtitan_lite.models import get_model_spec

GIB = 2**30


def build(spec, args) -> torch.nn.Module:
    with torch.device("meta"):
        model = spec.model_cls(args)
    materialize(model, "cpu")
    init_weights(model, spec.init_plan(args), 42, buffer_device="cpu")
    return model.train()


def step(model, opt, tokens, labels) -> None:
    loss = cross_entropy_sum(model(tokens, labels=labels), labels) / labels.numel()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flavor", default="debug")
    parser.add_argument("--steps", type=int, default=10, help="timed steps of each variant")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    cli = parser.parse_args()
    torch.manual_seed(0)
    spec = get_model_spec("deepseek_v3")
    base = spec.flavors[cli.flavor]
    variants = {
        "off": dataclasses.replace(base, mtp_num_layers=0),
        "mtp1": dataclasses.replace(base, mtp_num_layers=1),
    }
    models = {name: build(spec, args) for name, args in variants.items()}
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    batches = [
        torch.randint(0, base.vocab_size, (cli.batch, cli.seq_len + 1))
        for _ in range(cli.warmup + cli.steps)
    ]
    times = {name: [] for name in models}
    with reported_load():
        for i, batch in enumerate(batches):
            for name, model in models.items():
                start = time.perf_counter()
                step(model, opts[name], batch[:, :-1], batch[:, 1:])
                if i >= cli.warmup:
                    times[name].append(time.perf_counter() - start)
        results = {}
        for name, model in models.items():
            with ActivationMemory() as mem:
                loss = cross_entropy_sum(
                    model(batches[0][:, :-1], labels=batches[0][:, 1:]), batches[0][:, 1:]
                )
                loss.backward()
            model.zero_grad(set_to_none=True)
            params = sum(p.numel() for p in model.parameters())
            results[name] = (statistics.median(times[name]), params, mem.peak)
    for name, (seconds, params, peak) in results.items():
        print(
            f"{name:5s} step {seconds:.3f} s (median of {cli.steps}), {params:,} parameters "
            f"({16 * params / GIB:.3f} GiB fp32 weights + grads + AdamW moments), activation peak "
            f"{peak / GIB:.3f} GiB"
        )
    (t0, p0, a0), (t1, p1, a1) = results["off"], results["mtp1"]
    print(
        f"mtp1 / off: step time {t1 / t0:.3f}x, parameters {p1 / p0:.3f}x, activation peak "
        f"{a1 / a0:.3f}x ({cli.batch} x {cli.seq_len} tokens, flavor {cli.flavor})"
    )


if __name__ == "__main__":
    main()
