"""Random kill -9 soak of ``./run_train.sh`` (not a test, not CI).

Each of N trials launches the same run (a tiny 1-block model on 2 ranks, a constant LR, a checkpoint
after every step and ``keep_latest_k = 2``, so a kill often lands in a save or in the deletion of an
old checkpoint), waits for its first step, then SIGKILLs the launcher's whole process group at a
random moment up to ``--max-delay`` seconds later and checks that no process of the run is left 10 s
later. The next trial is the resume. Printed at the end:

* ``trials``: kills done; ``mid-save``: kills that left a ``step-N.tmp`` (a save in progress);
* ``resumed``: runs after a kill (the next trial's, and a final one) that resumed from the latest
  complete checkpoint the kill left, its checksums verified on load;
* ``lost``: runs that could not resume from it (a damaged or missing checkpoint; should be 0);
  ``orphans``: trials that left a process running after 10 s (should be 0);
* ``bitwise``: whether the run's state after all trials, one step further, equals that of an
  uninterrupted run of as many steps (the checksums of the DCP data files of both checkpoints).

Usage: ``python scripts/soak_kill.py [--trials 20] [--max-delay 4] [--folder /tmp/soak] [--seed 0]``
from the repo root. It launches runs with the helpers of the fault-injection tests
(``tests/fault_helpers.py``).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from ckpt_helpers import TINY_MODEL, TINY_RUN, text_file  # noqa: E402 (needs the sys.path above)
from fault_helpers import (  # noqa: E402 (needs the sys.path above)
    CONSTANT_LR,
    Run,
    alive,
    descendants,
    shard_digests,
)

from torchtitan_lite.components.checkpoint.storage import complete_steps  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument(
        "--max-delay", type=float, default=4.0, help="seconds after the first step, at most"
    )
    parser.add_argument("--folder", type=Path, default=Path("/tmp/soak"))
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args()
    rng = random.Random(opts.seed)
    shutil.rmtree(opts.folder, ignore_errors=True)
    opts.folder.mkdir(parents=True)
    text_file(opts.folder, n_plays=1)
    base = [
        *TINY_MODEL,
        *TINY_RUN,
        *CONSTANT_LR,
        f"--training.dataset_path={opts.folder / 'data.txt'}",
    ]
    run = [
        *base,
        f"--job.dump_folder={opts.folder / 'run'}",
        "--checkpoint.interval=1",
        "--checkpoint.keep_latest_k=2",
    ]
    checkpoints = opts.folder / "run" / "checkpoint"
    counts = dict(mid_save=0, resumed=0, lost=0, orphans=0)

    def check_resume(lines: list[str], before: list[int], label: str) -> None:
        """Count the run as resumed from the latest complete checkpoint before it, or as lost."""
        found = [
            int(m.group(1))
            for line in lines
            if (m := re.search(r"resumed at step (\d+) from ", line))
        ]
        start = found[0] if found else 0
        if before and start == before[-1]:
            counts["resumed"] += 1
        elif before:
            counts["lost"] += 1
            print(
                f"{label}: did not resume from step-{before[-1]}: " + " | ".join(lines[-3:]),
                flush=True,
            )

    for trial in range(1, opts.trials + 1):
        before = complete_steps(str(checkpoints))
        launched = Run([*run, "--training.steps=100000"], nproc=2)
        launched.wait_for(r"^\[rank0\]:step +\d+ ", timeout=600)
        check_resume(launched.lines, before, f"trial {trial}")
        time.sleep(rng.uniform(0, opts.max_delay))
        pids = descendants(launched.proc.pid)
        os.killpg(launched.proc.pid, signal.SIGKILL)
        launched.finish()
        deadline = time.monotonic() + 10
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        counts["orphans"] += bool(alive(pids))
        left = sorted(p.name for p in checkpoints.glob("*.tmp"))
        counts["mid_save"] += any(re.fullmatch(r"step-\d+\.tmp", name) for name in left)
        print(
            f"trial {trial}: killed; complete {complete_steps(str(checkpoints))}, left {left}",
            flush=True,
        )
    before = complete_steps(str(checkpoints))
    final = before[-1] + 1
    code, lines = Run([*run, f"--training.steps={final}"], nproc=2).finish(timeout=600)
    check_resume(lines, before, "final resume")
    reference = opts.folder / "reference"
    ref_code, _ = Run(
        [
            *base,
            f"--job.dump_folder={reference}",
            f"--training.steps={final}",
            "--checkpoint.interval=100000",
        ],
        nproc=2,
    ).finish(timeout=600)
    bitwise = (
        code == 0
        and ref_code == 0
        and shard_digests(checkpoints / f"step-{final}")
        == shard_digests(reference / "checkpoint" / f"step-{final}")
    )
    print(
        f"trials {opts.trials}, mid-save {counts['mid_save']}, resumed {counts['resumed']}, lost "
        f"{counts['lost']}, "
        f"orphans {counts['orphans']}; step {final}: bitwise equal to an uninterrupted run: "
        f"{bitwise}"
    )


if __name__ == "__main__":
    main()
