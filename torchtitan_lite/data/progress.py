"""Progress of long phases outside the training loop, e.g. tokenizing: a ``tqdm`` bar (as
``datasets`` shows) on a terminal, else lines (torchrun sends a worker's output through a pipe,
where a bar would never show)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from tqdm import tqdm

LINES_AFTER_S = 5.0
"""Seconds a phase runs before :class:`ProgressLines` prints its first line (a shorter phase prints
none)."""
UNKNOWN_TOTAL_EVERY_S = 30.0
"""Seconds between :class:`ProgressLines`' lines when the total is unknown (0), e.g. a streamed hub
dataset."""


class ProgressLines:
    """Prints ``tokenizing: 30% (11 of 37 documents), 6.2 s`` each time another ``every_percent`` of
    ``total`` is done, once ``after_s`` seconds (default :data:`LINES_AFTER_S`) have passed, each
    followed by the status of :meth:`set_postfix_str` if one was set
    (``..., 6.2 s, 55,970 tokens/s``), and a last line ``tokenizing: 100% (37 documents), 7.0 s``
    when the phase ends (the ``with`` block exits without an error) after ``after_s``. ``total`` may
    be an estimate: past it no line comes until the end's; 0 means unknown (a line of the count
    every :data:`UNKNOWN_TOTAL_EVERY_S`). Used like a ``tqdm`` bar:
    ``with ProgressLines(...) as bar: bar.update(k)``. ``clock`` gives the time in seconds
    (``time.perf_counter``).

    Raises:
        ValueError: ``total < 0`` or ``every_percent`` not in ``(0, 100]``.
    """

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str,
        *,
        every_percent: float = 10.0,
        after_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if total < 0 or not 0 < every_percent <= 100:
            raise ValueError(
                f"ProgressLines: need total >= 0 and every_percent in (0, 100], got {total}, "
                f"{every_percent}"
            )
        self.total, self.desc, self.unit = total, desc, unit
        self.every_percent = every_percent
        self.after_s = LINES_AFTER_S if after_s is None else after_s
        self.done, self._printed_percent, self._postfix, self._next_s = 0, 0.0, "", self.after_s
        self._clock = clock
        self._start = clock()

    def update(self, n: int = 1) -> None:
        """``n`` more units are done."""
        self.done += n
        seconds = self._clock() - self._start
        if (
            seconds < self.after_s or self.done > self.total > 0
        ):  # past an estimated total: the end's line says it
            return
        if not self.total:  # unknown size: a line every UNKNOWN_TOTAL_EVERY_S
            if seconds >= self._next_s:
                self._line(f"{self.done:,} {self._plural}", seconds)
                self._next_s = seconds + UNKNOWN_TOTAL_EVERY_S
            return
        percent = 100.0 * self.done / self.total
        if percent >= self._printed_percent + self.every_percent:
            self._line(f"{percent:.0f}% ({self.done:,} of {self.total:,} {self._plural})", seconds)
            self._printed_percent = (
                100.0 if percent >= 100 else percent - percent % self.every_percent
            )

    @property
    def _plural(self) -> str:
        return self.unit + (
            "es" if self.unit.endswith(("s", "sh", "ch", "x")) else "s"
        )  # batch: batches

    def _line(self, what: str, seconds: float) -> None:
        print(
            f"{self.desc}: {what}, {seconds:.1f} s{', ' + self._postfix if self._postfix else ''}",
            flush=True,
        )

    def set_postfix_str(self, status: str, refresh: bool = True) -> None:
        """Show ``status`` after the next lines (``tqdm.set_postfix_str``'s signature; ``refresh``
        is unused: a line is printed only at the next ``every_percent``)."""
        self._postfix = status

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        seconds = self._clock() - self._start
        if (
            exc_type is None
            and (self._printed_percent < 100 or not self.total)
            and seconds >= self.after_s
        ):
            self._line(f"100% ({self.done:,} {self._plural})", seconds)
        return None


def progress(total: int, desc: str, unit: str = "it") -> tqdm | ProgressLines:
    """The progress of ``total`` units, e.g.
    ``with progress(n, "tokenizing", "document") as bar: ... bar.update(k)``: on rank 0 (``RANK``,
    set by torchrun) a ``tqdm`` bar when standard error is a terminal, else :class:`ProgressLines`
    (a line per 10% once :data:`LINES_AFTER_S` have passed, and one at the end); on other ranks a
    disabled bar (no output)."""
    if os.environ.get("RANK", "0") != "0":
        return tqdm(total=total, disable=True)
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True)
    return ProgressLines(total, desc, unit)
