"""The CPU kernels of the keyed draw (``kernels.c``): built once per machine with the system C
compiler (about half a second, no torch headers), loaded with ctypes, run on threads (ctypes
releases the GIL).

The library lives in :func:`cache_dir` under a name that hashes the source, the compiler (its
resolved path, size and modification time), the flags, the machine and, for ``-march=native``,
:func:`cpu_identity`: nodes of different CPUs that share one home never load each other's build, and
a cached start runs no compiler. The ranks of a machine build under a lock, to a temporary name
renamed into place (atomic); a failed build leaves a ``.failed`` marker of the same name, so each
build is tried once per machine. No C compiler (or a failed build): :func:`library` is ``None`` and
the draw uses eager torch ops (the same values), with one warning. Design notes: docs/design.md,
"why a C file" and "the kernel cache on a shared home".
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("kernels.c")
FLAGS = ("-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math", "-shared", "-fPIC")
"""``-ffp-contract=off``: no multiply-add is fused, so every operation rounds as the torch ops do;
``-fno-trapping-math`` lets selects vectorize on AVX2 (it changes no value)."""
ISA_FLAGS = {"default": (), "avx2": ("-mavx2",)}
"""Vector ISA by ``ATEN_CPU_CAPABILITY`` (as torch's kernels and inductor pick theirs); otherwise
``-march=native`` where :func:`cpu_identity` is known, or no ISA flag where it is not or the
compiler rejects it (the same IEEE results)."""
ISA_NEEDS = {"avx2": "avx2"}
"""The ``/proc/cpuinfo`` flag that each ``ISA_FLAGS`` build executes."""
CPU_FIELDS = (
    "vendor_id",
    "cpu family",
    "model",
    "flags",
    "CPU implementer",
    "CPU architecture",
    "CPU variant",
    "CPU part",
    "Features",
)
"""The ``/proc/cpuinfo`` fields of :func:`cpu_identity`: what ``-march=native`` resolves from
(x86: vendor, family, model, feature flags; Arm: implementer, architecture, variant, part,
features)."""
CACHE_ENV = "TORCHTITAN_LITE_KERNEL_CACHE"
"""Environment variable naming the kernels' folder (default
``~/.cache/torchtitan_lite/kernels``)."""
MIN_PART = 2**14
"""Fewest values per thread: smaller calls run on one thread."""

_STATE: dict = {
    "library": None,
    "path": None,
    "tried": False,
    "build_seconds": 0.0,
    "pool": None,
    "workers": 0,
}
_U32, _I64 = ctypes.c_uint32, ctypes.c_int64


def cache_dir() -> Path:
    """``$TORCHTITAN_LITE_KERNEL_CACHE``, else ``~/.cache/torchtitan_lite/kernels``."""
    folder = os.environ.get(CACHE_ENV)
    return Path(folder) if folder else Path.home() / ".cache" / "torchtitan_lite" / "kernels"


def cpu_identity() -> str | None:
    """The distinct :data:`CPU_FIELDS` lines of ``/proc/cpuinfo`` over all processors, sorted;
    ``None`` where that file is missing or has none of them."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    lines = {" ".join(line.split()) for line in text.splitlines()}
    return "\n".join(sorted(line for line in lines if line.split(" :")[0] in CPU_FIELDS)) or None


def _cpu_flags(identity: str) -> set[str]:
    """The feature flags of a :func:`cpu_identity` (its ``flags`` and ``Features`` lines)."""
    return {
        word
        for line in identity.splitlines()
        if line.split(" :")[0] in ("flags", "Features")
        for word in line.split(":", 1)[1].split()
    }


def _compiler() -> tuple[str, str] | None:
    """``(command, identity)`` of the first of ``$CC``, ``cc``, ``gcc``, ``clang`` on PATH; the
    identity is its resolved path, size and modification time (read without running it)."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        found = shutil.which(name) if name else None
        if found:
            real = os.path.realpath(found)
            stat = os.stat(real)
            return found, f"{real} {stat.st_size} {stat.st_mtime_ns}"
    return None


def _warn(text: str) -> None:
    """One line ``warning: <text>`` on stdout (no source line, as a ``UserWarning`` prints)."""
    print(f"warning: {text}", flush=True)


def _isa(identity: str | None) -> tuple[str, ...]:
    """The vector ISA flags of this process's build (:data:`ISA_FLAGS`); an ``ATEN_CPU_CAPABILITY``
    build whose instructions this CPU lacks is replaced by none, with one warning."""
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "")
    if capability not in ISA_FLAGS:
        return ("-march=native",) if identity is not None else ()
    need = ISA_NEEDS.get(capability)
    if need is not None and identity is not None and need not in _cpu_flags(identity):
        _warn(
            f"init: ATEN_CPU_CAPABILITY={capability} but this CPU has no {need} (/proc/cpuinfo); "
            "the init kernels are built without vector ISA flags (the same values)"
        )
        return ()
    return ISA_FLAGS[capability]


def _first_error(stderr: str) -> str:
    """The compiler's first line that names an error (else its first line)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()] or ["no output"]
    return next((line for line in lines if "error" in line), lines[0])


def _cached(path: Path) -> tuple[bool, str | None]:
    """``(found, error)``: whether the cache holds ``path`` (``error`` ``None``) or its ``.failed``
    marker (``error``: the marker's line)."""
    if path.exists():
        return True, None
    failed = path.with_suffix(".failed")
    if failed.exists():
        return True, f"{failed.read_text().strip()} (an earlier build; delete {failed} to retry)"
    return False, None


def _compile(cc: str, flags: tuple[str, ...], path: Path) -> str | None:
    """Build ``path`` with ``flags`` unless the cache has it or a ``.failed`` marker of the same
    name; ``None`` on success, else the compiler's error line (written to the marker)."""
    found, error = _cached(path)
    if found:
        return error
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        # A file system without locks (NFS without lockd) builds unlocked: the rename is atomic.
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:
            pass
        found, error = _cached(path)  # built or failed while this process waited
        if found:
            return error
        begin = time.perf_counter()
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
        try:
            result = subprocess.run(
                [cc, *flags, str(SOURCE), "-o", tmp], capture_output=True, text=True
            )
            if result.returncode == 0:
                os.replace(tmp, path)
                return None
            error = _first_error(result.stderr)
            fd, note = tempfile.mkstemp(suffix=".failed", dir=path.parent)
            with os.fdopen(fd, "w") as file:
                file.write(f"{' '.join(flags)}: {error}\n")
            os.replace(note, path.with_suffix(".failed"))
            return error
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
            _STATE["build_seconds"] += time.perf_counter() - begin


def library_path(cc_identity: str, flags: tuple[str, ...], cpu: str | None) -> Path:
    """The cache file of a build: :func:`cache_dir` / ``init_kernels_<hash>.so``, the hash (blake2b,
    8 bytes) of the source, ``cc_identity``, ``flags``, the machine and, with ``-march=native``,
    ``cpu`` (:func:`cpu_identity`)."""
    native = (cpu or "") if "-march=native" in flags else ""
    key = "\0".join((cc_identity, " ".join(flags), platform.machine(), native))
    digest = hashlib.blake2b(SOURCE.read_bytes() + key.encode(), digest_size=8).hexdigest()
    return cache_dir() / f"init_kernels_{digest}.so"


def _build() -> ctypes.CDLL:
    """Load the library, building it first if the cache has none (raises on any failure)."""
    found = _compiler()
    if found is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    cc, cc_identity = found
    cpu = cpu_identity()
    for flags in dict.fromkeys((FLAGS + _isa(cpu), FLAGS)):
        path = library_path(cc_identity, flags, cpu)
        error = _compile(cc, flags, path)
        if error is None:
            break
    if error is not None:
        raise RuntimeError(error)
    lib = ctypes.CDLL(str(path))
    _STATE["path"] = path
    pointer, f64 = ctypes.c_void_p, ctypes.c_double
    for suffix, real in (("f32", ctypes.c_float), ("f64", f64)):
        head = [pointer, _I64, _U32, _U32, _U32, _U32, real, real, real, real]
        proposal = [f64, f64, f64, f64, ctypes.c_int, ctypes.c_int]
        for kind, extra in (("blocks", []), ("elements", []), ("proposal", proposal)):
            fn = getattr(lib, f"{kind}_{suffix}")
            fn.restype = _I64
            fn.argtypes = head + extra + [pointer, pointer]
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernels, built on first use; ``None`` where they cannot be built, after one line
    ``warning: init: the CPU kernels could not be built (<reason>); ...`` on stdout."""
    if not _STATE["tried"]:
        _STATE["tried"] = True
        try:
            _STATE["library"] = _build()
        except (OSError, RuntimeError) as err:
            _warn(
                f"init: the CPU kernels could not be built ({err}); drawing with eager "
                "torch ops (the same values, slower)"
            )
    return _STATE["library"]


def build_seconds() -> float:
    """Seconds this process spent building the kernels (0 when the cache had them)."""
    return _STATE["build_seconds"]


def draw(
    kind: str,
    index: torch.Tensor,
    words: tuple[int, int, int, int],
    mean: float,
    std: float,
    lo: float,
    hi: float,
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
    proposal: tuple = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, bad)`` of the keyed normals at int64 CPU ``index`` (``(n,)``, contiguous).

    Args:
        kind: ``"blocks"``: ``index`` holds Philox blocks, values ``(4 n,)`` (element ``4 b + j``
            at ``4 i + j``); ``"elements"``: global element indices, values ``(n,)``;
            ``"proposal"``: the same, candidates of the proposal ``proposal`` = ``(alpha, beta,
            rate, peak, exponential, flip)``, clamped into ``[lo, hi]``.
        words: ``(attempt, k0, k1, salt)``, each in ``[0, 2**32)``.
        mean, std: of the law, in ``dtype`` (float32 or float64) as the values are.
        lo, hi: bounds (infinite for none).
        out: where to write the values (contiguous, ``dtype``), or ``None`` for a new tensor.

    Returns:
        ``values`` (``dtype``) and ``bad``, the sorted int64 positions of the values outside
        ``[lo, hi]`` (of the rejected candidates for ``"proposal"``).
    """
    lib = library()
    per = 4 if kind == "blocks" else 1
    n = index.numel()
    values = torch.empty(per * n, dtype=dtype) if out is None else out
    bad = torch.empty(per * n, dtype=torch.int64)
    fn = getattr(lib, f"{kind}_{'f64' if dtype == torch.float64 else 'f32'}")
    threads = max(1, min(torch.get_num_threads(), n * per // MIN_PART))
    bounds = [n * t // threads for t in range(threads + 1)]

    def part(t: int) -> int:
        s, e = bounds[t], bounds[t + 1]
        out_at = values.data_ptr() + values.element_size() * per * s
        return fn(
            index.data_ptr() + 8 * s,
            e - s,
            *words,
            mean,
            std,
            lo,
            hi,
            *proposal,
            out_at,
            bad.data_ptr() + 8 * per * s,
        )

    if threads == 1:
        return values, bad[: part(0)]
    if _STATE["workers"] < threads:
        _STATE["pool"], _STATE["workers"] = ThreadPoolExecutor(threads), threads
    counts = list(_STATE["pool"].map(part, range(threads)))
    return values, torch.cat(
        [bad[per * bounds[t] : per * bounds[t] + c] + per * bounds[t] for t, c in enumerate(counts)]
    )
