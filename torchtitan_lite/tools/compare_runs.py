"""Compare the TensorBoard curves of two or more runs: ``python -m torchtitan_lite.tools.compare_runs RUN_A RUN_B ...``.

Options: see ``--help``. Each RUN is a run folder (event files found below it) or an event folder; every run
is compared with the first: per step the value and the difference, then the max absolute difference over the
common steps and the first step beyond ``--atol``. Exit status: 0 (1 only with ``--assert-equal``), 2 on bad
input.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

EVENT_GLOB = "events.out.tfevents.*"


class CompareError(ValueError):
    """Bad input: a run without event files, several event folders in one run, or a missing tag."""


def event_folder(run: str | Path) -> Path:
    """The one folder under ``run`` (``run`` itself included) that holds TensorBoard event files.

    Raises:
        CompareError: none, or more than one (the message lists them: pass one).
    """
    run = Path(run)
    if not run.is_dir():
        raise CompareError(f"{run}: not a folder; pass a run folder (job.dump_folder/<run>) or its tb/ folder")
    folders = sorted({p.parent for p in run.rglob(EVENT_GLOB)})
    if not folders:
        raise CompareError(f"{run}: no TensorBoard event files ({EVENT_GLOB}) in it or below; was "
                           "metrics.enable_tensorboard on?")
    if len(folders) > 1:
        raise CompareError(f"{run}: event files in {len(folders)} folders ({', '.join(map(str, folders))}); "
                           "pass one of them")
    return folders[0]


def load_scalars(run: str | Path, tag: str) -> dict[int, float]:
    """``step -> value`` of scalar ``tag`` in the run's events (all of them; a later write of a step wins).

    Raises:
        CompareError: see :func:`event_folder`, or ``tag`` is not in the events (the message lists the tags).
    """
    folder = event_folder(run)
    events = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    events.Reload()
    tags = events.Tags()[SCALARS]
    if tag not in tags:
        raise CompareError(f"{run}: no scalar {tag!r} in {folder}; scalars there: {', '.join(sorted(tags))}")
    return {e.step: e.value for e in events.Scalars(tag)}


@dataclass(frozen=True)
class Comparison:
    """One run against the reference (the first run).

    Attributes:
        steps: steps both runs logged, ascending.
        diffs: ``value - reference`` at each of ``steps``.
        max_abs: the largest ``|diff|`` (``nan`` when a value is NaN, 0.0 when no common step).
        first_beyond: first step with ``|diff| > atol`` (NaN counts as beyond), or ``None``.
        missing: steps logged by only one of the two runs.
    """

    steps: list[int]
    diffs: list[float]
    max_abs: float
    first_beyond: int | None
    missing: list[int]


def compare(reference: dict[int, float], other: dict[int, float], atol: float) -> Comparison:
    """Per-step differences of ``other`` against ``reference`` (``step -> value`` maps).

    Raises:
        ValueError: ``atol`` is negative or not finite.
    """
    if not 0 <= atol < math.inf:
        raise ValueError(f"atol must be finite and >= 0, got {atol}")
    steps = sorted(reference.keys() & other.keys())
    diffs = [other[s] - reference[s] for s in steps]
    beyond = [s for s, d in zip(steps, diffs) if not abs(d) <= atol]
    max_abs = max((abs(d) if not math.isnan(d) else math.inf for d in diffs), default=0.0)
    missing = sorted(reference.keys() ^ other.keys())
    return Comparison(steps, diffs, math.nan if max_abs == math.inf else max_abs, beyond[0] if beyond else None,
                      missing)


def plot_curves(series: dict[str, dict[int, float]], tag: str, path: str | Path) -> None:
    """Save a PNG of one curve per run (label: the run's folder name) of ``tag`` against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (label, values), style in zip(series.items(), ["-", "--", ":", "-."] * len(series)):
        steps = sorted(values)
        ax.plot(steps, [values[s] for s in steps], style, marker=".", label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(tag)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m torchtitan_lite.tools.compare_runs", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders (or event folders); the first is the reference")
    parser.add_argument("--tag", default="loss/train", help="scalar tag to compare (default loss/train)")
    parser.add_argument("--atol", type=float, default=0.0, help="tolerance, in the tag's units (default 0)")
    parser.add_argument("--assert-equal", action="store_true", help="exit 1 if any run differs beyond --atol")
    parser.add_argument("--plot", help="save a PNG of the curves to this path")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        parser.error("give at least two runs")
    return args


def _label(run: str) -> str:
    path = Path(run).resolve()
    return path.parent.name if path.name == "tb" else path.name


def main(argv: list[str] | None = None) -> int:
    """Print the comparison; return 0, 1 (``--assert-equal`` failed) or 2 (bad input)."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        series = {run: load_scalars(run, args.tag) for run in args.runs}
        reference = series[args.runs[0]]
        results = {run: compare(reference, series[run], args.atol) for run in args.runs[1:]}
    except (CompareError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    labels = [_label(run) for run in args.runs]
    if len(set(labels)) < len(labels):
        labels = list(args.runs)
    print(f"{args.tag} of run 0 (the reference): {labels[0]}, " + ", ".join(
        f"run {i}: {label}" for i, label in enumerate(labels) if i))
    print(f"{'step':>6}  {'run 0':>14}" + "".join(f"  {f'run {i}':>14}  {'diff':>10}" for i in range(1, len(labels))))
    for step in sorted(reference):
        row = f"{step:>6}  {reference[step]:>14.8g}"
        for run in args.runs[1:]:
            value = series[run].get(step)
            row += (f"  {'-':>14}  {'-':>10}" if value is None
                    else f"  {value:>14.8g}  {value - reference[step]:>10.3g}")
        print(row)
    failed = False
    for run, label in zip(args.runs[1:], labels[1:]):
        result = results[run]
        verdict = ("equal within atol" if result.first_beyond is None
                   else f"first step beyond atol: {result.first_beyond}")
        extra = f"; steps in only one run: {result.missing}" if result.missing else ""
        print(f"{label} vs {labels[0]}: {len(result.steps)} common steps, max |diff| {result.max_abs:.6g} "
              f"(atol {args.atol:g}), {verdict}{extra}")
        failed |= result.first_beyond is not None or bool(result.missing) or not result.steps
    if args.plot:
        plot_curves(dict(zip(labels, series.values())), args.tag, args.plot)
        print(f"plot: {args.plot}")
    if args.assert_equal and failed:
        print("error: --assert-equal: the runs differ (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
