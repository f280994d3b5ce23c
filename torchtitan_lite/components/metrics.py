"""Training metrics: one log line per ``log_freq`` steps, TensorBoard scalars, the ETA, start-up
phase times, the run folder.

Tokens/s and TFLOPs are PER DEVICE (torchtitan's convention); MFU = achieved FLOP/s / the device's
peak FLOP/s (PaLM, arXiv 2204.02311, App. B), from ``ModelSpec.num_flops_per_token``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

GIB = 2**30


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` (hours unbounded), rounded half up to a second, e.g. ``190.5 -> "0:03:11"``.

    Raises:
        ValueError: ``seconds`` is negative or not finite.
    """
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"duration must be finite and >= 0 seconds, got {seconds}")
    total = int(seconds + 0.5)
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"


def format_step_line(
    step: int,
    *,
    loss: float,
    grad_norm: float,
    lr: float,
    tps: float,
    tflops: float,
    mfu: float | None,
    memory_bytes: int | None,
    data_wait_s: float,
    elapsed_s: float,
    eta_s: float,
    cpu_hint: str = "",
) -> str:
    """The log line of one step, e.g.
    ``step  12  loss  6.1234  grad_norm 1.234  lr 3.0e-03  tps 2,345  tflops 0.12  mfu n/a  mem
    1.23GiB  data_wait 0.05ms  elapsed 0:00:42  eta
    0:03:10`` (one line), ``cpu_hint`` (:func:`cpu_share_hint`) at its end when not empty.

    Units: ``tps`` tokens/s and ``tflops`` 1e12 FLOP/s per device; ``mfu`` a fraction (printed in
    percent) or ``None`` (``n/a``); ``memory_bytes`` bytes (printed in GiB) or ``None``;
    ``data_wait_s`` seconds per step (printed in ms); ``elapsed_s``/``eta_s`` seconds.
    """
    mfu_text = "n/a" if mfu is None else f"{100 * mfu:.2f}%"
    mem_text = "n/a" if memory_bytes is None else f"{memory_bytes / GIB:.2f}GiB"
    return (
        f"step {step:>3}  loss {loss:7.4f}  grad_norm {grad_norm:.3f}  lr {lr:.1e}  tps {tps:,.0f} "
        " "
        f"tflops {tflops:.2f}  mfu {mfu_text}  mem {mem_text}  data_wait {1e3 * data_wait_s:.2f}ms "
        f" elapsed {format_duration(elapsed_s)}  eta {format_duration(eta_s)}"
        + (f"  {cpu_hint}" if cpu_hint else "")
    )


def process_cpu_s() -> float:
    """CPU seconds this process has used so far, all its threads, user and system (``os.times``)."""
    times = os.times()
    return times.user + times.system


CPU_SHARE_HINT_BELOW = 0.5
"""The step line names the CPU share when a window's CPU seconds per wall second fall below this
fraction of the process's compute threads: a CPU step keeps its threads busy, so a lower share means
they were waiting (for cores that other processes hold, or for other ranks)."""


def cpu_share_hint(cpu_s: float, wall_s: float, threads: int, load: float | None = None) -> str:
    """``cpu 0.4/2 load 5.2``: the CPU seconds per wall second (``cpu_s / wall_s``) of this process
    against its ``threads``, and the machine's 1-minute load average (``load``, default
    ``os.getloadavg()``; left out where the OS has none); ``""`` when the share is at least
    :data:`CPU_SHARE_HINT_BELOW` of ``threads``.

    Raises:
        ValueError: ``threads < 1``, ``wall_s <= 0`` or ``cpu_s < 0``.
    """
    if threads < 1 or not wall_s > 0 or cpu_s < 0:
        raise ValueError(
            f"cpu_share_hint: need threads >= 1, wall_s > 0, cpu_s >= 0; got {threads}, {wall_s}, "
            f"{cpu_s}"
        )
    share = cpu_s / wall_s
    if share >= CPU_SHARE_HINT_BELOW * threads:
        return ""
    if load is None and hasattr(os, "getloadavg"):
        load = os.getloadavg()[0]
    return f"cpu {share:.1f}/{threads}" + ("" if load is None else f" load {load:.1f}")


def process_age_s() -> float | None:
    """Seconds since this process started (Linux ``/proc``: its start time in clock ticks since boot
    against the uptime), or ``None`` where that is not available."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started = int(stat.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
            return max(float(uptime.read().split()[0]) - started, 0.0)
    except (OSError, ValueError, IndexError):
        return None


class StartupLog:
    """The start-up lines of a run: one per phase (config, process group, data, model, parallelize,
    load, init) with its seconds, printed as the phase ends (a long start is never silent), and kept
    for TensorBoard.

    :meth:`phase` prints ``<phase> (<seconds> s): <detail>``, the seconds since the previous phase
    ended (or the log was made) unless given; :meth:`note` prints a line that is no phase.
    ``import_s`` is how long the process ran before the log was made (its imports), or ``None``
    where unknown (:func:`process_age_s`).
    """

    def __init__(self) -> None:
        self.import_s = process_age_s()
        self._start = self._last = time.perf_counter()
        self.lines: list[str] = []

    def phase(self, name: str, detail: str, *, seconds: float | None = None) -> str:
        """End phase ``name`` now; print and return its line, e.g.
        ``data (2.3 s): shakespeare: ...``."""
        now = time.perf_counter()
        seconds, self._last = now - self._last if seconds is None else seconds, now
        return self.note(f"{name} ({seconds:.1f} s): {detail}")

    def note(self, line: str) -> str:
        """Print and keep ``line``."""
        print(line, flush=True)
        self.lines.append(line)
        return line

    def total_s(self) -> float:
        """Seconds since the log was made."""
        return time.perf_counter() - self._start


def format_bytes(n: int) -> str:
    """``1536 -> "1.5 KiB"``: B, KiB, MiB, GiB, TiB, 3 significant digits."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{n} B" if unit == "B" else f"{value:.3g} {unit}"


def folder_bytes(path: str | Path) -> int:
    """Total size of the files under ``path``, in bytes (0 for a missing folder)."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


class StepTimeAverage:
    """Mean seconds per training step over the last ``window`` or more steps: the ETA's basis.

    The steps between two log lines come as one sample ``(steps, seconds)``, their wall time without
    the pauses of the trainer (validation, checkpoint saves). The first sample of a run (its first
    step: allocator and kernel warm-up, compile) is used only until a second one exists. The oldest
    samples are dropped while the others still cover ``window`` steps.

    Raises:
        ValueError: ``window < 1``, or a sample with ``steps < 1`` or negative ``seconds``.
    """

    def __init__(self, window: int):
        if window < 1:
            raise ValueError(f"StepTimeAverage: window must be >= 1 step, got {window}")
        self.window = window
        self._samples: list[tuple[int, float]] = []
        self._first: tuple[int, float] | None = None

    def add(self, steps: int, seconds: float) -> None:
        """Add the time of ``steps`` consecutive steps."""
        if steps < 1 or not seconds >= 0:
            raise ValueError(
                f"StepTimeAverage.add: need steps >= 1 and seconds >= 0, got {steps}, {seconds}"
            )
        if self._first is None:
            self._first = (steps, seconds)
            return
        self._samples.append((steps, seconds))
        while len(self._samples) > 1 and sum(n for n, _ in self._samples[1:]) >= self.window:
            self._samples.pop(0)

    def seconds_per_step(self) -> float | None:
        """The mean over the kept samples (the first sample alone until another exists); ``None``
        before any."""
        samples = self._samples or ([self._first] if self._first else [])
        if not samples:
            return None
        return sum(s for _, s in samples) / sum(n for n, _ in samples)


def make_run_folder(dump_folder: str | Path, model_name: str, flavor: str) -> Path:
    """Create and return ``<dump_folder>/<model_name>-<flavor>-<YYYYmmdd-HHMMSS>`` (local time;
    ``-2``, ``-3``,
    ... when taken). Call on rank 0 and broadcast the path.

    Raises:
        OSError: ``dump_folder`` cannot be created or written.
    """
    base = f"{model_name}-{flavor}-{time.strftime('%Y%m%d-%H%M%S')}"
    Path(dump_folder).mkdir(parents=True, exist_ok=True)
    suffix = 1
    while True:
        path = Path(dump_folder) / (base if suffix == 1 else f"{base}-{suffix}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            suffix += 1


class MetricsLogger:
    """Prints the step log line every ``log_freq`` steps and writes TensorBoard scalars on rank 0.

    A line is due (:meth:`due`) on the first, every ``log_freq``-th and the last step (the trainer
    reads values on the host only then); throughput and data wait cover the window since the
    previous line, less the trainer's pauses in it (:meth:`paused`: validation, checkpoint saves);
    the ETA is the remaining steps times the mean step time of the last ``eta_window`` steps
    (:class:`StepTimeAverage`). Every rank prints; rank 0 writes TensorBoard into
    ``<run_folder>/<tb_subfolder>``: ``loss/train``, ``loss/validation`` (nats/token),
    ``grad_norm``, ``lr``, ``tps``, ``tflops``, ``mfu`` (percent, known peak only), ``memory_gib``,
    ``data_wait_ms`` (per step), ``tokens_seen`` (``step * tokens_per_step * world_size``).
    Throughput is per device (``tps``, ``tflops``, ``mfu``): the tokens of a data-parallel rank are
    shared by its ``tp * pp`` devices (torchtitan divides by the non-data-parallel size), and each
    does that share of the FLOPs.

    Args:
        world_size: devices (ranks) of the run, for ``tokens_seen``.
        num_flops_per_token: training FLOPs per token (forward + backward), > 0.
        peak_flops: the device's peak FLOP/s at the compute dtype, or ``None`` (unknown: MFU
            ``n/a``).
        eta_window: steps the ETA's mean step time covers (at least).
        cpu_threads: the compute threads of a CPU run, for the step line's CPU share hint
            (:func:`cpu_share_hint`, given ``cpu_s`` in :meth:`log_step`); ``None``: no hint
            (accelerators).

    Raises:
        ValueError: ``log_freq``, ``total_steps``, ``world_size``, ``eta_window`` or
            ``num_flops_per_token`` out of range, or ``peak_flops`` not ``None`` and not > 0.
    """

    def __init__(
        self,
        run_folder: str | Path,
        *,
        enable_tensorboard: bool,
        tb_subfolder: str,
        rank: int,
        log_freq: int,
        total_steps: int,
        world_size: int,
        num_flops_per_token: float,
        peak_flops: float | None,
        eta_window: int = 20,
        cpu_threads: int | None = None,
    ):
        for name, value in (
            ("log_freq", log_freq),
            ("total_steps", total_steps),
            ("world_size", world_size),
        ):
            if value < 1:
                raise ValueError(f"MetricsLogger: {name} must be >= 1, got {value}")
        if not num_flops_per_token > 0:
            raise ValueError(
                f"MetricsLogger: num_flops_per_token must be > 0, got {num_flops_per_token}"
            )
        if peak_flops is not None and not peak_flops > 0:
            raise ValueError(
                f"MetricsLogger: peak_flops must be > 0 or None (unknown), got {peak_flops}"
            )
        self.log_freq = log_freq
        self.total_steps = total_steps
        self.world_size = world_size
        self.num_flops_per_token = num_flops_per_token
        self.peak_flops = peak_flops
        self.writer = (
            SummaryWriter(log_dir=str(Path(run_folder) / tb_subfolder))
            if enable_tensorboard and rank == 0
            else None
        )
        self._window_start_step: int | None = None
        self._window_start_s = 0.0
        self._paused_s = 0.0
        self._step_times = StepTimeAverage(eta_window)
        self.cpu_threads = cpu_threads
        self._window_start_cpu_s = 0.0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside is a pause (validation, a checkpoint save): left out of throughput and
        ETA."""
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.add_pause(time.perf_counter() - begin)

    def add_pause(self, seconds: float) -> None:
        """Leave ``seconds`` of the current window out of its throughput and the ETA."""
        self._paused_s += seconds

    def due(self, step: int) -> bool:
        """Whether step ``step`` (1-based) gets a line: the run's first step, every ``log_freq``-th,
        the last."""
        return (
            self._window_start_step is None or step % self.log_freq == 0 or step >= self.total_steps
        )

    def log_step(
        self,
        step: int,
        *,
        loss: float,
        grad_norm: float,
        lr: float,
        tokens_per_step: int,
        elapsed_s: float,
        memory_bytes: int | None,
        data_wait_s: float,
        cpu_s: float | None = None,
    ) -> str:
        """Print, write to TensorBoard and return the line of step ``step``, which must be
        :meth:`due`.

        Args:
            loss: the step's global mean token loss; ``grad_norm``: before clipping.
            tokens_per_step: this device's share of the step's tokens (all micro-batches): the
                global batch's tokens / ``world_size``.
            elapsed_s: wall seconds since the loop started, read after the device finished the step
                (pauses included: :meth:`paused` takes them out).
            memory_bytes: peak memory (``devices.peak_memory_bytes``) or ``None``.
            data_wait_s: seconds this rank waited for batches since the previous line.
            cpu_s: CPU seconds of this process since the loop started (:func:`process_cpu_s` then
                and now), for the CPU share hint over the window's wall time, pauses included (with
                ``cpu_threads``).

        Raises:
            ValueError: the step is not due (the window arithmetic would be wrong).
        """
        if not self.due(step):
            raise ValueError(
                f"MetricsLogger.log_step: step {step} is not due (log_freq {self.log_freq})"
            )
        if self._window_start_step is None:
            self._window_start_step = step - 1
        steps = step - self._window_start_step
        window_s = max(elapsed_s - self._window_start_s - self._paused_s, 1e-9)
        self._step_times.add(steps, window_s)
        tps = tokens_per_step * steps / window_s
        flops = self.num_flops_per_token * tps
        mfu = None if self.peak_flops is None else flops / self.peak_flops
        eta_s = self._step_times.seconds_per_step() * max(self.total_steps - step, 0)
        hint = ""
        if self.cpu_threads is not None and cpu_s is not None and elapsed_s > self._window_start_s:
            hint = cpu_share_hint(
                max(cpu_s - self._window_start_cpu_s, 0.0),
                elapsed_s - self._window_start_s,
                self.cpu_threads,
            )
            self._window_start_cpu_s = cpu_s
        line = format_step_line(
            step,
            loss=loss,
            grad_norm=grad_norm,
            lr=lr,
            tps=tps,
            tflops=flops / 1e12,
            mfu=mfu,
            memory_bytes=memory_bytes,
            data_wait_s=data_wait_s / steps,
            elapsed_s=elapsed_s,
            eta_s=eta_s,
            cpu_hint=hint,
        )
        print(line, flush=True)
        if self.writer is not None:
            scalars = {
                "loss/train": loss,
                "grad_norm": grad_norm,
                "lr": lr,
                "tps": tps,
                "tflops": flops / 1e12,
                "data_wait_ms": 1e3 * data_wait_s / steps,
                "tokens_seen": step * tokens_per_step * self.world_size,
            }
            if mfu is not None:
                scalars["mfu"] = 100 * mfu
            if memory_bytes is not None:
                scalars["memory_gib"] = memory_bytes / GIB
            for tag, value in scalars.items():
                self.writer.add_scalar(tag, value, step)
        self._window_start_step = step
        self._window_start_s = elapsed_s
        self._paused_s = 0.0
        return line

    def log_source_tokens(self, step: int, tokens: dict[str, int], *, echo: bool = True) -> None:
        """Write each of ``tokens`` as TensorBoard ``tokens_seen/<source>`` and, if ``echo``,
        print ``step  12  tokens per source: /data/web 71,680 (70.0%), /data/code 30,720 (30.0%)``;
        nothing for an empty ``tokens`` (one source)."""
        if not tokens:
            return
        total = max(sum(tokens.values()), 1)
        parts = ", ".join(f"{name} {n:,} ({100 * n / total:.1f}%)" for name, n in tokens.items())
        if echo:
            print(f"step {step:>3}  tokens per source: {parts}", flush=True)
        if self.writer is not None:
            for name, n in tokens.items():
                self.writer.add_scalar(f"tokens_seen/{name}", n, step)

    def log_validation(self, step: int, loss: float, tokens: int) -> str:
        """Print, write (``loss/validation``) and return
        ``step  12  validation loss  5.4321  (8,192 tokens)``: the mean token cross-entropy over
        ``tokens`` validation tokens."""
        line = f"step {step:>3}  validation loss {loss:7.4f}  ({tokens:,} tokens)"
        print(line, flush=True)
        if self.writer is not None:
            self.writer.add_scalar("loss/validation", loss, step)
        return line

    def log_sample(self, step: int, prompt: str, continuation: str) -> str:
        """Print, write (TensorBoard text ``validation/sample``) and return
        ``step  12  sample: <prompt> -> <text>`` (``repr`` quoting, so newlines stay on the
        line)."""
        line = f"step {step:>3}  sample: {prompt!r} -> {continuation!r}"
        print(line, flush=True)
        if self.writer is not None:
            self.writer.add_text("validation/sample", f"**{prompt}**{continuation}", step)
        return line

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        """Write ``scalars`` (TensorBoard tag -> value, e.g. from a model's training hooks) at
        ``step`` (rank 0)."""
        if self.writer is not None:
            for tag, value in scalars.items():
                self.writer.add_scalar(tag, value, step)

    def log_line(self, line: str) -> None:
        """Print one line of the run's output (e.g. a model's summary of a step)."""
        print(line, flush=True)

    def log_text(self, lines: Iterable[str], *, echo: bool = True) -> None:
        """Print ``lines`` (unless ``echo`` is false: printed already) and store them as TensorBoard
        text ``run/header``."""
        lines = list(lines)
        for line in lines if echo else ():
            print(line, flush=True)
        if self.writer is not None:
            self.writer.add_text("run/header", "\n".join("    " + line for line in lines))

    def close(self) -> None:
        """Flush and close the TensorBoard writer (a no-op without one)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
