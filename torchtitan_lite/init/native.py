"""The CPU kernels of the keyed draw (``kernels.c``): built once per machine with the system C
compiler (about half a second, no torch headers), loaded with ctypes, run on threads (ctypes
releases the GIL).

The library lives in :func:`cache_dir` under a name that hashes the source, the compiler's version
and the flags, so the ranks of a node share one build and a changed source builds anew; a build goes
to a temporary name and is renamed into place (atomic), so ranks that race each build it or load a
whole one. No C compiler (or a failed build): :func:`library` is ``None`` and the draw uses eager
torch ops (the same values), with one warning. Design note: docs/design.md, "why a C file".
"""

from __future__ import annotations

import ctypes
import hashlib
import os
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
``-march=native``, or no ISA flag where the compiler rejects it (the same IEEE results)."""
CACHE_ENV = "TORCHTITAN_LITE_KERNEL_CACHE"
"""Environment variable naming the kernels' folder (default
``~/.cache/torchtitan_lite/kernels``)."""
MIN_PART = 2**14
"""Fewest values per thread: smaller calls run on one thread."""

_STATE: dict = {"library": None, "tried": False, "build_seconds": 0.0, "pool": None, "workers": 0}
_U32, _I64 = ctypes.c_uint32, ctypes.c_int64


def cache_dir() -> Path:
    """``$TORCHTITAN_LITE_KERNEL_CACHE``, else ``~/.cache/torchtitan_lite/kernels``."""
    folder = os.environ.get(CACHE_ENV)
    return Path(folder) if folder else Path.home() / ".cache" / "torchtitan_lite" / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _compile(cc: str, flags: tuple[str, ...], path: Path, last: bool) -> bool:
    """Build ``path`` with ``flags`` (to a temporary name, then renamed: atomic); ``False`` on a
    compiler error unless ``last`` (then it raises)."""
    begin = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        subprocess.run(
            [cc, *flags, str(SOURCE), "-o", tmp], capture_output=True, text=True, check=True
        )
        os.replace(tmp, path)
    except subprocess.CalledProcessError:
        if last:
            raise
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        _STATE["build_seconds"] += time.perf_counter() - begin
    return True


def _build() -> ctypes.CDLL:
    """Load the library, building it first if the cache has none (raises on any failure)."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    isa = ISA_FLAGS.get(os.environ.get("ATEN_CPU_CAPABILITY", ""), ("-march=native",))
    for flags in dict.fromkeys((FLAGS + isa, FLAGS)):
        key = SOURCE.read_bytes() + version.encode() + " ".join(flags).encode()
        path = cache_dir() / f"init_kernels_{hashlib.blake2b(key, digest_size=8).hexdigest()}.so"
        if path.exists() or _compile(cc, flags, path, last=flags == FLAGS):
            break
    lib = ctypes.CDLL(str(path))
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
        except (OSError, RuntimeError, subprocess.CalledProcessError) as err:
            text = str(getattr(err, "stderr", "") or err).strip()
            detail = text.splitlines()[0] if text else type(err).__name__
            print(
                f"warning: init: the CPU kernels could not be built ({detail}); drawing with eager "
                "torch ops (the same values, slower)",
                flush=True,
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
