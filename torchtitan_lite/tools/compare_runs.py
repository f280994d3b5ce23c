"""Compare the TensorBoard curves of two or more runs:
``python -m torchtitan_lite.tools.compare_runs RUN_A RUN_B ...``.

Options: see ``--help``. Each RUN is a run folder (event files found below it) or an event folder;
every run is compared with the first: per step the value and the difference, then, over the steps
both logged (a resumed run against a full one: the steps after the resume), the max absolute
difference and the first step beyond ``--atol``, with the step ranges of each run. Runs are labelled
by ``--names`` or by the settings that differ between them (``NGPU=2``, from each run folder's
``run.json``), in one order everywhere. Exit status: 0 (1 only with ``--assert-equal``), 2 on bad
input.
"""

from __future__ import annotations

import argparse
import json
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
        raise CompareError(
            f"{run}: not a folder; pass a run folder (job.dump_folder/<run>) or its tb/ folder"
        )
    folders = sorted({p.parent for p in run.rglob(EVENT_GLOB)})
    if not folders:
        raise CompareError(
            f"{run}: no TensorBoard event files ({EVENT_GLOB}) in it or below; was "
            "metrics.enable_tensorboard on?"
        )
    if len(folders) > 1:
        raise CompareError(
            f"{run}: event files in {len(folders)} folders ({', '.join(map(str, folders))}); "
            "pass one of them"
        )
    return folders[0]


def load_scalars(run: str | Path, tag: str) -> dict[int, float]:
    """``step -> value`` of scalar ``tag`` in the run's events (all of them; a later write of a step
    wins).

    Raises:
        CompareError: see :func:`event_folder`, or ``tag`` is not in the events (the message lists
            the tags).
    """
    folder = event_folder(run)
    events = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    events.Reload()
    tags = events.Tags()[SCALARS]
    if tag not in tags:
        raise CompareError(
            f"{run}: no scalar {tag!r} in {folder}; scalars there: {', '.join(sorted(tags))}"
        )
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
    beyond = [s for s, d in zip(steps, diffs, strict=True) if not abs(d) <= atol]
    max_abs = max((abs(d) if not math.isnan(d) else math.inf for d in diffs), default=0.0)
    missing = sorted(reference.keys() ^ other.keys())
    return Comparison(
        steps,
        diffs,
        math.nan if max_abs == math.inf else max_abs,
        beyond[0] if beyond else None,
        missing,
    )


def step_ranges(steps: list[int]) -> str:
    """Ascending steps as ranges, e.g. ``[1, 2, 3, 5, 7, 8] -> "1-3, 5, 7-8"`` (``"none"`` when
    empty)."""
    parts, begin = [], None
    for i, step in enumerate(steps):
        begin = step if begin is None else begin
        if i + 1 == len(steps) or steps[i + 1] != step + 1:
            parts.append(str(step) if begin == step else f"{begin}-{step}")
            begin = None
    return ", ".join(parts) or "none"


def run_settings(run: str | Path) -> dict[str, object] | None:
    """What a run was launched with, from its ``run.json`` (written by the trainer in the run
    folder; looked up in ``run`` and, for an event folder, its parent): ``NGPU`` (ranks per node),
    ``world size`` and every config key as ``section.key`` (tables as ``section.table.name``);
    ``None`` without a ``run.json``."""
    run = Path(run)
    path = next((p / "run.json" for p in (run, run.parent) if (p / "run.json").is_file()), None)
    if path is None:
        return None
    meta = json.loads(path.read_text())
    settings: dict[str, object] = {
        "NGPU": meta["local_world_size"],
        "world size": meta["world_size"],
    }
    for section, values in meta["config"].items():
        for key, value in values.items():
            items = value.items() if isinstance(value, dict) else [(None, value)]
            settings.update(
                {".".join(filter(None, (section, key, name))): item for name, item in items}
            )
    return settings


IGNORED_SETTINGS = ("job.dump_folder",)
"""Settings that differ between runs without making them different runs."""
MAX_LABEL_SETTINGS = 3


def labels_of(runs: list[str], names: list[str] | None = None) -> list[str]:
    """A label per run: ``names`` when given, else the settings that differ between the runs
    (:func:`run_settings`, e.g. ``NGPU=2``, ``training.steps=20``; at most 3, then ``+N more``),
    else the run folders' names (whole paths when those repeat).

    Raises:
        CompareError: ``names`` not one per run, or repeated.
    """
    if names is not None:
        if len(names) != len(runs) or len(set(names)) != len(names):
            raise CompareError(
                f"--names: give one distinct name per run ({len(runs)}), got {', '.join(names)}"
            )
        return list(names)
    settings = [run_settings(run) for run in runs]
    if all(settings):
        keys = sorted({k for s in settings for k in s} - set(IGNORED_SETTINGS))
        differ = [k for k in keys if len({json.dumps(s.get(k)) for s in settings}) > 1]
        if "NGPU" in differ and "world size" in differ:
            differ.remove("world size")  # one node: the same difference
        if differ:
            labels = []
            for s in settings:
                shown = [f"{k}={s.get(k)}" for k in differ[:MAX_LABEL_SETTINGS]]
                more = len(differ) - MAX_LABEL_SETTINGS
                labels.append(", ".join(shown) + (f" +{more} more" if more > 0 else ""))
            if len(set(labels)) == len(labels):
                return labels
    labels = [_folder_name(run) for run in runs]
    return labels if len(set(labels)) == len(labels) else list(runs)


def _folder_name(run: str) -> str:
    path = Path(run).resolve()
    return path.parent.name if path.name == "tb" else path.name


def curves_figure(series: dict[str, dict[int, float]], tag: str):
    """A matplotlib figure of ``tag`` against the step: one curve per run (``series``: label ->
    ``step -> value``, the first the reference) and, in a lower panel, each other run's difference
    to the reference at the common steps; integer step ticks; the title names the tag and the
    runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=(2, 1))
    labels = list(series)
    reference = series[labels[0]]
    for (label, values), style in zip(
        series.items(), ["-", "--", ":", "-."] * len(series), strict=False
    ):
        steps = sorted(values)
        top.plot(steps, [values[s] for s in steps], style, marker=".", label=label)
        if label != labels[0]:
            common = sorted(values.keys() & reference.keys())
            bottom.plot(
                common, [values[s] - reference[s] for s in common], style, marker=".", label=label
            )
    top.set_ylabel(tag)
    top.set_title(f"{tag}: " + ", ".join(labels[1:]) + f" vs {labels[0]}", fontsize=10)
    bottom.axhline(0.0, color="gray", linewidth=0.8)
    bottom.set_ylabel(f"difference to\n{labels[0]}", fontsize=9)
    bottom.set_xlabel("step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend()
    fig.tight_layout()
    return fig


def plot_curves(series: dict[str, dict[int, float]], tag: str, path: str | Path) -> None:
    """Save :func:`curves_figure` as a PNG at ``path`` (8 x 6 inches at 120 dpi)."""
    import matplotlib.pyplot as plt

    fig = curves_figure(series, tag)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m torchtitan_lite.tools.compare_runs", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "runs", nargs="+", help="run folders (or event folders); the first is the reference"
    )
    parser.add_argument(
        "--names",
        nargs="+",
        help="a label per run, in order (default: the settings that differ "
        "between the runs, from their run.json, e.g. NGPU=2)",
    )
    parser.add_argument(
        "--tag", default="loss/train", help="scalar tag to compare (default loss/train)"
    )
    parser.add_argument(
        "--atol", type=float, default=0.0, help="tolerance, in the tag's units (default 0)"
    )
    parser.add_argument(
        "--assert-equal",
        action="store_true",
        help="exit 1 if a run differs beyond --atol at a step both it and the reference logged, or "
        "shares no step with it",
    )
    parser.add_argument(
        "--plot", help="save a PNG of the curves and their differences to this path"
    )
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        parser.error("give at least two runs")
    return args


def main(argv: list[str] | None = None) -> int:
    """Print the comparison; return 0, 1 (``--assert-equal`` failed) or 2 (bad input)."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        labels = labels_of(args.runs, args.names)
        series = [load_scalars(run, args.tag) for run in args.runs]
        results = [compare(series[0], other, args.atol) for other in series[1:]]
    except (CompareError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{args.tag}; run 0 is the reference")
    for i, (run, label) in enumerate(zip(args.runs, labels, strict=True)):
        print(f"  run {i}: {label}  ({run}; steps {step_ranges(sorted(series[i]))})")
    print(
        f"{'step':>6}  {'run 0':>14}"
        + "".join(f"  {f'run {i}':>14}  {'diff':>10}" for i in range(1, len(labels)))
    )
    for step in sorted(set().union(*series)):
        ref = series[0].get(step)
        row = f"{step:>6}  {'-' if ref is None else f'{ref:.8g}':>14}"
        for values in series[1:]:
            value = values.get(step)
            diff = "-" if value is None or ref is None else f"{value - ref:.3g}"
            row += f"  {'-' if value is None else f'{value:.8g}':>14}  {diff:>10}"
        print(row)
    failed = False
    for i, result in enumerate(results, start=1):
        if result.steps:
            verdict = (
                "equal within atol"
                if result.first_beyond is None
                else f"first step beyond atol: {result.first_beyond}"
            )
            found = f"max |diff| {result.max_abs:.6g} (atol {args.atol:g}), {verdict}"
        else:
            found = "nothing to compare"
        only = (
            f"; steps in one of them only: {step_ranges(result.missing)}" if result.missing else ""
        )
        print(
            f"run {i} ({labels[i]}) vs run 0 ({labels[0]}): {len(result.steps)} common steps "
            f"({step_ranges(result.steps)}): {found}{only}"
        )
        failed |= result.first_beyond is not None or not result.steps
    if args.plot:
        plot_curves(dict(zip(labels, series, strict=True)), args.tag, args.plot)
        print(f"plot: {args.plot}")
    if args.assert_equal and failed:
        print(
            "error: --assert-equal: a run differs from run 0 beyond atol at a common step, or "
            "shares no step with it (see above)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
