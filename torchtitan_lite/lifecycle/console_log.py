"""The console output of one rank, also kept in the run folder as ``logs/rank<N>.log``."""

from __future__ import annotations

import sys
import threading
import traceback
from pathlib import Path
from typing import TextIO


class _Tee:
    """A text stream that writes to ``stream`` and hands the same text to ``log``."""

    def __init__(self, stream: TextIO, log: ConsoleLog):
        self.stream, self._log = stream, log

    def write(self, text: str) -> int:
        written = self.stream.write(text)
        self._log.copy(text)
        return written

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: those of the console stream
        return getattr(self.stream, name)


class ConsoleLog:
    """Copies what this process writes to ``sys.stdout`` and ``sys.stderr`` into one file, in order.

    Made at the start of a worker: ``sys.stdout``/``sys.stderr`` are wrapped at once and the text is
    kept in memory until :meth:`open` names the file (the run folder exists only once the inputs are
    checked; a run that never opens it writes nothing). Each piece is written through, so the file
    is complete at any exit. A terminal redraw (text holding a carriage return: a progress bar) goes
    to the console only. Text written below Python (a C++ library's warnings on file descriptor 2)
    is not copied. :meth:`close` restores the streams.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[str] | None = []
        self._file: TextIO | None = None
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = _Tee(sys.stdout, self), _Tee(sys.stderr, self)

    def copy(self, text: str) -> None:
        """Keep ``text`` (written to the console) for the file."""
        if "\r" in text:
            return
        with self._lock:
            if self._file is not None:
                self._file.write(text)
                self._file.flush()
            elif self._pending is not None:
                self._pending.append(text)

    def open(self, path: str | Path) -> Path:
        """Write what was kept to ``path`` (its folders made) and everything after it; returns
        ``path``.

        Raises:
            OSError: the file cannot be created.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._file = open(path, "w", encoding="utf-8")
            self._file.write("".join(self._pending or ()))
            self._file.flush()
            self._pending = None
        return path

    def copy_exception(self) -> None:
        """Write the exception being handled, with its traceback, to the file only (the interpreter
        prints it to the console when it propagates)."""
        with self._lock:
            if self._file is not None:
                self._file.write(traceback.format_exc())
                self._file.flush()

    def close(self) -> None:
        """Restore ``sys.stdout``/``sys.stderr`` and close the file."""
        sys.stdout, sys.stderr = self._streams
        with self._lock:
            if self._file is not None:
                self._file.close()
            self._file, self._pending = None, None
