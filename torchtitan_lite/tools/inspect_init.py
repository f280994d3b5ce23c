"""Inspect a model's initialization without training:
``python -m torchtitan_lite.tools.inspect_init --job.config_file X``.

Builds the configured model on meta, materializes it on the CPU in this one process (no torchrun, no
FSDP: the keyed sampler gives the values any world size would), applies the family's init plan with
``training.seed`` and prints the expected step-1 loss (the trainer's line, for the step-1 batch of
one process, then every term of it) and the init report: a summary per plan pattern (tensors,
elements, spec, the range of measured stds, flags), then per tensor its spec, measured std vs
expected, min/max, mass at the bounds, excess kurtosis, tied/loaded and flags, in aligned columns.
Each phase (init, report, fingerprint) prints a line when it starts and its seconds when it ends;
the report shows its progress (``torchtitan_lite.data.progress``: a bar on a terminal, else a line
per 10% after 5 s).

Options (before or among the usual ``--section.key=value`` overrides):
  ``--layers N``   build only the first N blocks. The plan is that of the FULL model (residual stds
                   depend on ``n_layers``) and values are keyed by name, so these layers get exactly
                   the values of the full model's first N.
  ``--meta`` no sampling: the resolved plan (spec, shape, expected std and kurtosis per tensor).
  ``--max-gib G`` memory budget of this process (default 8): without ``--layers``, a model that
  needs
                   more is cut to the most blocks that fit, or reported on meta when even one block
                   does not fit (the published large flavors). The output says which was done, and
                   ends with the peak memory the process used.
  ``--out DIR``    also write ``init_report.json`` and ``init_report.csv`` into DIR.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from torchtitan_lite.builder import build_local_model, build_meta_model
from torchtitan_lite.data.loader import build_dataloaders
from torchtitan_lite.data.progress import progress
from torchtitan_lite.data.tokenizer import build_tokenizer
from torchtitan_lite.distributed.checks import micro_batches
from torchtitan_lite.distributed.devices import peak_memory_bytes
from torchtitan_lite.errors import UserError
from torchtitan_lite.init import draw
from torchtitan_lite.init.apply import resolve_plan
from torchtitan_lite.init.fingerprint import model_fingerprint
from torchtitan_lite.init.report import (
    init_report,
    init_report_summary,
    pattern_summary,
    text_table,
    truncated_normal_moments,
    write_init_report,
)
from torchtitan_lite.init.step1 import expected_step1_loss
from torchtitan_lite.lifecycle.startup import step1_expectation, step1_line
from torchtitan_lite.preflight.checks import load_run_or_exit
from torchtitan_lite.preflight.run import ResolvedRun

GIB = 2**30
_HELD_BYTES_PER_ELEMENT = 5
"""Per element of the model: its fp32 value, and a byte for the part of init's sampling work space
that the C allocator keeps for reuse (``docs/design.md``, "inspect_init: the memory budget")."""
_WORK_BYTES = 64 * 2**20
"""What the report and the fingerprint hold beside the model, whatever its size: their float64 and
int64 work chunks (``init/report.py``'s and ``init/fingerprint.py``'s ``_CHUNK``), a few MiB, with a
margin (same note)."""


def _sizes(spec, args, n_layers: int) -> list[int]:
    """Element counts of every parameter and buffer of the model with ``n_layers`` blocks (built on
    meta)."""
    with torch.device("meta"):
        model = spec.model_cls(dataclasses.replace(args, n_layers=n_layers))
    return [p.numel() for p in model.parameters()] + [b.numel() for b in model.buffers()]


def _peak_bytes(elements: int) -> int:
    """Memory of materialize + init + report + fingerprint for a model of ``elements`` fp32 values:
    what init leaves held, plus the report's and the fingerprint's work chunks."""
    return _HELD_BYTES_PER_ELEMENT * elements + _WORK_BYTES


def choose_layers(
    spec, args, requested: int | None, max_bytes: int, in_use: int = 0
) -> tuple[int | None, str]:
    """``(blocks to build, or None for a meta report; the line saying which)``.

    The most blocks ``L`` whose memory (:func:`_peak_bytes` of ``base + L * per_block`` elements,
    counted on meta with 1 and 2 blocks) fits in ``max_bytes`` beside the ``in_use`` bytes that this
    process already holds.

    Raises:
        ValueError: ``requested`` is not in ``1..n_layers``.
    """
    total = args.n_layers
    same = "plan of the full model, same values as its first blocks"
    if requested is not None:
        if not 1 <= requested <= total:
            raise ValueError(f"--layers {requested}: the model has {total} blocks; pass 1..{total}")
        cut = "" if requested == total else f" (--layers; {same})"
        return requested, f"initialized on CPU: blocks 0..{requested - 1} of {total}{cut}"
    one = sum(_sizes(spec, args, 1))
    per_block = sum(_sizes(spec, args, 2)) - one if total > 1 else 0
    base = one - per_block
    layers = 0
    while layers < total and in_use + _peak_bytes(base + (layers + 1) * per_block) <= max_bytes:
        layers += 1
    if layers == 0:
        need = in_use + _peak_bytes(base + per_block)
        return None, (
            f"on meta, nothing sampled: even one block needs {need / GIB:.1f} GiB > --max-gib "
            f"{max_bytes / GIB:g}; expected values only"
        )
    cut = (
        ""
        if layers == total
        else f" (the full model needs more than --max-gib {max_bytes / GIB:g}; {same})"
    )
    return layers, f"initialized on CPU: blocks 0..{layers - 1} of {total}{cut}"


@contextmanager
def _phase(name: str, text: str) -> Iterator[None]:
    """Print ``name: text ...`` when a phase starts and ``name: done in 1.2 s`` when it ends (a
    progress bar or progress lines can come between)."""
    print(f"{name}: {text} ...", flush=True)
    start = time.perf_counter()
    yield
    print(f"{name}: done in {time.perf_counter() - start:.1f} s", flush=True)


def plan_table(model: torch.nn.Module, plan) -> str:
    """The resolved plan of a (meta) model: per plan pattern a summary line
    (:func:`pattern_summary`), then per tensor its name, spec, shape, status, expected std and
    kurtosis, in aligned columns."""
    summary, rows = [], []
    for entry, tensor in resolve_plan(model, plan):
        spec = entry.spec
        if spec.kind == "trunc_normal":
            _, factor, kurt = truncated_normal_moments(-spec.cutoff, spec.cutoff)
            std, kurt_text = spec.std * factor, f"{kurt:.3f}"
        else:
            std, kurt_text = (spec.std, f"{0.0:.3f}") if spec.kind == "normal" else (0.0, "-")
        status = "tied" if entry.tied else "init"
        summary.append((entry.pattern, spec.describe(), tensor.numel(), status, None, std, ()))
        rows.append(
            [
                " = ".join(entry.names),
                spec.describe(),
                "x".join(map(str, tensor.shape)),
                status,
                f"{std:.4g}",
                kurt_text,
            ]
        )
    return (
        pattern_summary(summary)
        + "\n\n"
        + text_table(
            ["name", "spec", "shape", "status", "exp std", "exp ex.kurt"], rows, right=(4, 5)
        )
    )


def _step1_lines(run: ResolvedRun, model: torch.nn.Module, plan) -> list[str]:
    """The trainer's expected step-1 loss line (:func:`step1_expectation`, the step-1 batch of one
    process read from the configured training data when it is local and tied outputs need it), then
    every term of it (``Step1Expectation.describe``), and why the batch was not read when it was
    not."""
    config = run.config
    global_batch, _ = micro_batches(config, 1)
    dataset, why_not = None, ""
    if expected_step1_loss(model, plan).tied and not config.training.streaming:
        t = config.training
        try:
            dataset = build_dataloaders(
                validation=config.validation.enable,
                min_val_windows=global_batch,
                dataset=t.dataset,
                dataset_path=t.dataset_path,
                dataset_paths=t.dataset_paths,
                dataset_weights=t.dataset_weights,
                hf_dataset_name=t.hf_dataset_name,
                hf_dataset_config=t.hf_dataset_config,
                text_column=t.text_column,
                tokenizer=build_tokenizer(run.tokenizer_path),
                seq_len=t.seq_len,
                local_batch_size=t.local_batch_size,
                seed=t.seed,
                documents=t.document_masking,
            ).train.dataset
        except UserError as err:
            why_not = f"the step-1 batch was not read: {err}"
    expected = step1_expectation(model, plan, dataset, global_batch)
    return [
        step1_line(expected, dataset is not None, terms="every term: the next line"),
        expected.describe(),
    ] + ([why_not] if why_not else [])


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m torchtitan_lite.tools.inspect_init", add_help=False
    )
    parser.add_argument("--layers", type=int)
    parser.add_argument("--meta", action="store_true")
    parser.add_argument("--max-gib", type=float, default=8.0)
    parser.add_argument("--out")
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Print the init report of the configured model; returns 0, or 2 on a bad option."""
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        return 0
    options, rest = _parse(argv)
    run = load_run_or_exit(rest)
    config, spec, args = run.config, run.spec, run.model_args
    torch.set_num_threads(config.training.num_threads or torch.get_num_threads())
    plan = spec.init_plan(args)
    full = build_meta_model(run)
    n_params = sum(p.numel() for p in full.parameters())
    print(
        f"model {config.model.name} flavor {config.model.flavor}: {n_params:,} parameters, "
        f"{args.n_layers} blocks, seed {config.training.seed}"
    )
    for line in _step1_lines(run, full, plan):
        print(line)
    cpu = torch.device("cpu")
    try:
        layers, how = (
            (None, "on meta, nothing sampled (--meta); expected values only")
            if options.meta
            else choose_layers(
                spec,
                args,
                options.layers,
                int(options.max_gib * GIB),
                in_use=peak_memory_bytes(cpu),
            )
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(how)
    if layers is None:
        print(plan_table(full, plan))
        return 0
    model = build_meta_model(run, n_layers=layers)
    tensors = [tensor for _, tensor in resolve_plan(model, plan)]
    elements = sum(t.numel() for t in tensors)
    count = f"{len(tensors)} tensors ({elements:,} elements)"
    with _phase("init", f"materializing and sampling {count} on CPU"):
        local = build_local_model(run, cpu, n_layers=layers)
        model, result = local.model, local.init
    if draw.compile_note():
        print(f"init: {draw.compile_note()}")
    with (
        _phase("report", f"statistics of {count} in float64"),
        progress(elements, "report", "element") as bar,
    ):
        report = init_report(model, plan, result, progress=bar.update)
    with _phase("fingerprint", f"hashing {count}"):
        fingerprint = model_fingerprint(model)
    print(report.by_pattern())
    print()
    print(report)
    print(init_report_summary(report))
    print(f"fingerprint of what was initialized: {fingerprint}")
    if options.out:
        Path(options.out).mkdir(parents=True, exist_ok=True)
        for path in write_init_report(report, options.out):
            print(f"wrote {path}")
    print(
        f"peak memory of this process: {peak_memory_bytes(cpu) / GIB:.2f} GiB"
        + ("" if options.layers else f" (--max-gib {options.max_gib:g})")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
