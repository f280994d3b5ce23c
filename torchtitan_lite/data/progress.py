"""Progress of long phases outside the training loop, e.g. tokenizing: a ``tqdm`` bar (as ``datasets`` shows) on a
terminal, else lines (torchrun sends a worker's output through a pipe, where a bar would never show)."""

from __future__ import annotations

import os
import sys
import time
from typing import Callable

from tqdm import tqdm


class ProgressLines:
    """Prints ``tokenizing: 30% (11 of 37 documents), 6.2 s`` each time another ``every_percent`` of ``total`` is
    done, once ``after_s`` seconds have passed (a short phase prints nothing), and a last line at 100%, each
    followed by the status of :meth:`set_postfix_str` if one was set (``..., 6.2 s, 55,970 tokens/s``).
    Used like a ``tqdm`` bar: ``with ProgressLines(...) as bar: bar.update(k)``. ``clock`` gives the time in
    seconds (``time.perf_counter``).

    Raises:
        ValueError: ``total < 0`` or ``every_percent`` not in ``(0, 100]``.
    """

    def __init__(self, total: int, desc: str, unit: str, *, every_percent: float = 10.0, after_s: float = 5.0,
                 clock: Callable[[], float] = time.perf_counter):
        if total < 0 or not 0 < every_percent <= 100:
            raise ValueError(f"ProgressLines: need total >= 0 and every_percent in (0, 100], got {total}, "
                             f"{every_percent}")
        self.total, self.desc, self.unit = total, desc, unit
        self.every_percent, self.after_s = every_percent, after_s
        self.done, self._printed_percent, self._printed, self._postfix = 0, 0.0, False, ""
        self._clock = clock
        self._start = clock()

    def update(self, n: int = 1) -> None:
        """``n`` more units are done."""
        self.done += n
        percent = 100.0 * self.done / self.total if self.total else 100.0
        seconds = self._clock() - self._start
        if seconds >= self.after_s and (percent >= self._printed_percent + self.every_percent or
                                        (percent >= 100 and self._printed)):
            plural = self.unit + ("es" if self.unit.endswith(("s", "sh", "ch", "x")) else "s")  # batch: batches
            print(f"{self.desc}: {percent:.0f}% ({self.done:,} of {self.total:,} {plural}), {seconds:.1f} s"
                  f"{', ' + self._postfix if self._postfix else ''}", flush=True)
            self._printed_percent, self._printed = percent - percent % self.every_percent, True

    def set_postfix_str(self, status: str, refresh: bool = True) -> None:
        """Show ``status`` after the next lines (``tqdm.set_postfix_str``'s signature; ``refresh`` is unused: a line
        is printed only at the next ``every_percent``)."""
        self._postfix = status

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *exc) -> None:
        return None


def progress(total: int, desc: str, unit: str = "it") -> tqdm | ProgressLines:
    """The progress of ``total`` units, e.g. ``with progress(n, "tokenizing", "document") as bar: ... bar.update(k)``:
    on rank 0 (``RANK``, set by torchrun) a ``tqdm`` bar when standard error is a terminal, else
    :class:`ProgressLines` (a line per 10% once 5 s have passed); on other ranks a disabled bar (no output)."""
    if os.environ.get("RANK", "0") != "0":
        return tqdm(total=total, disable=True)
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True)
    return ProgressLines(total, desc, unit)
