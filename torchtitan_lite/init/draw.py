"""Keyed draws of one law: the kernels that turn counters into values (native, compiled or eager
torch ops), and the rejection loop.

A rank fills exactly its local elements (:func:`fill_local`): its box of the global tensor is a set
of runs of consecutive global indices (:func:`torchtitan_lite.init.keyed.element_runs`); runs that
start and end on multiples of 4 are drawn a Philox block (four normals) at a time, other runs
element by element (each element computes its own block: the same values, 4x the Philox work). Both
are cut into chunks, so temporaries stay bounded whatever the shard.

Notes in docs/design.md: "on exact truncation per element", "on where values are computed".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from torchtitan_lite.init import counter, native

MIN_REJECTION_MASS = 0.3
"""Below this in-bounds mass, candidates come from a proposal (Robert 1995) instead of the
normal."""
COMPILE_MIN_ELEMENTS = 2**25
"""Off the CPU: a draw of at least this many elements (one call of ``init_weights``) uses compiled
kernels; below it eager torch ops, whose cost stays under a compile's start-up."""
COMPILED_MIN_LOCAL = 2**14
"""Off the CPU, tensors with fewer local elements stay eager even in a compiled draw (a compiled
call computes a whole chunk)."""
BLOCK_CHUNK = {True: 2**18, False: 2**16}
"""Philox blocks per call (4 elements each), compiled / eager torch ops: one static shape for
compiled kernels; a cache-sized chunk for eager ops."""
NATIVE_BLOCK_CHUNK = 2**20
"""Philox blocks per call of the CPU kernels: few calls, so that threads meet rarely (each call
splits over them)."""
ELEMENT_CHUNK = {True: 2**16, False: 2**16}
"""Elements per call of the element path, compiled / eager."""
MAX_ATTEMPTS = 10_000
"""Candidates per element before giving up (with mass >= 0.3 the chance of reaching it is below
1e-1500)."""

_COMPILED: dict[tuple[str, str], Callable] = {}
_STATE = {"eager_only": False, "compile_seconds": 0.0}


class Law(NamedTuple):
    """``N(mean, std^2)`` truncated to ``[lo, hi]``, values in ``dtype`` (float32 or float64;
    ``lo``/``hi`` representable in it, infinite for no bound), with the standardized bounds
    ``alpha``, ``beta`` of the requested interval and its normal mass."""

    mean: float
    std: float
    lo: float
    hi: float
    alpha: float
    beta: float
    mass: float
    dtype: torch.dtype


def draw_device(device: torch.device) -> torch.device:
    """Where the values of a tensor on ``device`` are computed (see the note on where values are
    computed)."""
    return device if device.type in ("cpu", "cuda", "xpu") else torch.device("cpu")


def compile_seconds() -> float:
    """Seconds this process spent building :mod:`native` kernels and in the first call of each
    ``torch.compile``-d kernel (compiling or loading inductor's cache)."""
    return _STATE["compile_seconds"] + native.build_seconds()


def compile_note() -> str:
    """``"init kernels built/compiled in 0.5 s"`` when this process spent time on that
    (:func:`compile_seconds`), else ``""``: for the init line."""
    seconds = compile_seconds()
    return f"init kernels built/compiled in {seconds:.1f} s" if seconds > 0 else ""


def _scaled(
    z: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``z std + mean`` in the dtype of ``mean`` and ``std`` (the law's: float32, or float64 for
    float64 tensors)."""
    return (z.to(std.dtype) * std + mean).to(dtype)


def _normal_blocks(block, attempt, k0, k1, salt, mean, std, dtype: torch.dtype):
    """Values of the four elements of each block: ``(v0, v1, v2, v3)``. (Out-of-bounds flags are
    computed from them outside: as extra outputs of the compiled kernel, inductor recomputes the
    whole transform for them.)"""
    return [
        _scaled(z, mean, std, dtype) for z in counter.block_normals(block, attempt, k0, k1, salt)
    ]


def _normal_elements(index, attempt, k0, k1, salt, mean, std, dtype: torch.dtype):
    """Values of candidate ``attempt`` of the elements at ``index`` (a one-element list)."""
    return [_scaled(counter.element_normals(index, attempt, k0, k1, salt), mean, std, dtype)]


def _proposal_elements(
    index,
    attempt,
    k0,
    k1,
    salt,
    mean,
    std,
    lo,
    hi,
    alpha,
    beta,
    rate,
    peak,
    dtype: torch.dtype,
    exponential: bool,
    flip: bool,
):
    """Values and rejection flags of candidate ``attempt`` from the proposal on standardized
    ``[alpha, beta]`` (``alpha >= 0`` or containing 0; mirrored back when ``flip``): exponential
    with ``rate``, else uniform with the density's peak ``peak`` (``alpha`` or 0) on the interval.
    Values are clamped into ``[lo, hi]`` after rounding."""
    w0, w1 = counter.element_words(index, attempt, k0, k1, salt)
    log_u = counter.log_word_uniform(w1)
    if exponential:
        z = alpha - counter.log_word_uniform(w0) / rate
        reject = (z > beta) | (log_u > (z - rate) * (z - rate) * -0.5)
    else:
        z = alpha + (beta - alpha) * counter.unit_uniform(w0)
        reject = log_u > (peak * peak - z * z) * 0.5
    if flip:
        z = -z
    return _scaled(z, mean, std, dtype).clamp(lo, hi), reject


def _compiled(fn: Callable, device: torch.device) -> Callable | None:
    """``fn`` compiled for ``device`` with :data:`counter.EXACT_COMPILE_OPTIONS`, or ``None`` for
    eager (after a failed compile, with one warning)."""
    if _STATE["eager_only"]:
        return None
    key = (fn.__name__, device.type)
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(fn, dynamic=False, options=counter.EXACT_COMPILE_OPTIONS)
    return _COMPILED[key]


def _call(
    fn: Callable, compiled: bool, chunk: int, x: torch.Tensor, *args, **static
) -> list[torch.Tensor]:
    """``fn(x, *args, **static)``, compiled on ``x`` padded to ``chunk`` elements when
    ``compiled``."""
    kernel = _compiled(fn, x.device) if compiled else None
    if kernel is None:
        return list(fn(x, *args, **static))
    n = x.numel()
    padded = x if n == chunk else torch.cat([x, x.new_zeros(chunk - n)])
    first = getattr(kernel, "_tt_first_done", False)
    begin = time.perf_counter()
    try:
        out = kernel(padded, *args, **static)
    except Exception as err:  # noqa: BLE001 - any compiler failure: draw eagerly instead (same values)
        _STATE["eager_only"] = True
        print(
            "warning: init: torch.compile of the keyed init kernels failed "
            f"({type(err).__name__}); drawing with eager ops (the same values, slower)",
            flush=True,
        )
        return list(fn(x, *args, **static))
    if not first:
        _STATE["compile_seconds"] += time.perf_counter() - begin
        kernel._tt_first_done = True
    return [o[:n] for o in out]


def _scalars(
    law: Law, key_words: tuple[int, int, int], device: torch.device
) -> dict[str, torch.Tensor]:
    as_law = lambda v: torch.tensor(v, dtype=law.dtype, device=device)  # noqa: E731
    k0, k1, salt = (
        torch.tensor(counter.as_word32(w), dtype=torch.int32, device=device) for w in key_words
    )
    return {
        "k0": k0,
        "k1": k1,
        "salt": salt,
        "mean": as_law(law.mean),
        "std": as_law(law.std),
        "lo": torch.tensor(law.lo, dtype=law.dtype, device=device),
        "hi": torch.tensor(law.hi, dtype=law.dtype, device=device),
    }


def _proposal(law: Law) -> tuple[dict[str, float], bool, bool]:
    """``(parameters, exponential, flip)`` of the proposal for a law with little in-bounds mass
    (Robert 1995)."""
    flip = law.alpha + law.beta < 0  # put the interval at alpha >= 0 (or around 0)
    alpha, beta = (-law.beta, -law.alpha) if flip else (law.alpha, law.beta)
    peak = max(alpha, 0.0)
    rate = (alpha + math.sqrt(alpha * alpha + 4.0)) / 2.0
    # log acceptance rates less ln(mass / sqrt(2 pi)), which both share (the mass underflows far out
    # in a tail)
    log_uniform = 0.5 * peak * peak - math.log(beta - alpha) if math.isfinite(beta) else -math.inf
    log_exponential = math.log(rate) + rate * alpha - 0.5 * rate * rate if alpha > 0 else -math.inf
    return (
        {"alpha": alpha, "beta": beta, "rate": rate, "peak": peak},
        log_exponential > log_uniform,
        flip,
    )


def _index_chunks(starts: list[int], length: int, cap: int, device: torch.device):
    """``(position, indices)``: consecutive pieces of at most ``cap`` of the concatenated runs
    ``range(s, s + length)`` for ``s`` in ``starts``; ``position`` is the piece's offset in that
    concatenation."""
    if length >= cap:
        for r, s in enumerate(starts):
            for j in range(0, length, cap):
                yield r * length + j, torch.arange(s + j, s + min(length, j + cap), device=device)
        return
    per = cap // length
    ramp = torch.arange(length, device=device)
    for r0 in range(0, len(starts), per):
        part = torch.tensor(starts[r0 : r0 + per], dtype=torch.int64, device=device)
        yield r0 * length, (part[:, None] + ramp).view(-1)


def _normals(
    kind: str,
    index: torch.Tensor,
    attempt: int,
    key_words: tuple[int, int, int],
    law: Law,
    scal: dict[str, torch.Tensor],
    compiled: bool | None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, bad)``: candidate ``attempt`` of the normals at ``index`` (``kind`` ``"blocks"``:
    four values per Philox block, in element order; ``"elements"``: one per global index) in
    ``law.dtype``, and the sorted positions of the values outside ``[lo, hi]``. On the CPU by
    :mod:`native` unless ``compiled`` is ``False`` (or it cannot be built; then into ``out`` when
    given), elsewhere by torch ops, compiled when ``compiled``."""
    device = index.device
    lib = native.library() if device.type == "cpu" and compiled is not False else None
    if lib is not None:
        return native.draw(
            kind, index, (attempt, *key_words), law.mean, law.std, law.lo, law.hi, law.dtype, out
        )
    step = torch.tensor(counter.as_word32(attempt), dtype=torch.int32, device=device)
    base = (step, scal["k0"], scal["k1"], scal["salt"], scal["mean"], scal["std"])
    use_compiled = bool(compiled) and device.type != "cpu"
    if kind == "blocks":
        chunk = BLOCK_CHUNK[use_compiled]
        values = torch.stack(
            _call(_normal_blocks, use_compiled, chunk, index, *base, dtype=law.dtype), dim=1
        )
        values = values.view(-1)
    else:
        chunk = ELEMENT_CHUNK[use_compiled]
        values = _call(_normal_elements, use_compiled, chunk, index, *base, dtype=law.dtype)[0]
    if not (math.isfinite(law.lo) or math.isfinite(law.hi)):
        return values, values.new_empty(0, dtype=torch.int64)
    return values, ((values < scal["lo"]) | (values > scal["hi"])).nonzero().squeeze(1)


def fill_local(
    flat: torch.Tensor,
    starts: list[int],
    length: int,
    key_words: tuple[int, int, int],
    law: Law,
    cast: Callable[[torch.Tensor], torch.Tensor],
    compiled: bool | None,
) -> int:
    """Fill the contiguous 1-D ``flat`` (a rank's local elements in order) with the keyed values of
    ``law``.

    Args:
        flat: the local elements, whose global row-major indices are the runs
            ``range(s, s + length)``, ``s`` in ``starts``, concatenated.
        key_words: :func:`counter.stream_words` of the stream.
        law: the distribution (:class:`Law`).
        cast: rounds work-dtype values to ``flat``'s dtype (and keeps them in bounds).
        compiled: ``True``: native kernels (:mod:`native` on the CPU, ``torch.compile`` elsewhere);
            ``None``: native on the CPU, eager torch ops elsewhere; ``False``: eager torch ops (the
                same values in every case).

    Returns:
        The number of elements drawn (first pass): ``flat.numel()``.

    Raises:
        RuntimeError: an element found no candidate in bounds in :data:`MAX_ATTEMPTS` tries.
    """
    device = draw_device(flat.device)
    scal = _scalars(law, key_words, device)
    proposal = law.mass < MIN_REJECTION_MASS
    if proposal:
        params, exponential, flip = _proposal(law)
        extra = (scal["mean"], scal["std"], scal["lo"], scal["hi"]) + tuple(
            torch.tensor(params[k], dtype=torch.float64, device=device)
            for k in ("alpha", "beta", "rate", "peak")
        )
        static = {"dtype": law.dtype, "exponential": exponential, "flip": flip}
        use_compiled = bool(compiled) and device.type != "cpu"
        chunk = ELEMENT_CHUNK[use_compiled]
        lib = native.library() if device.type == "cpu" and compiled is not False else None
        native_args = tuple(params[k] for k in ("alpha", "beta", "rate", "peak")) + (
            int(exponential),
            int(flip),
        )

        def candidates(index: torch.Tensor, attempt: int) -> tuple[torch.Tensor, torch.Tensor]:
            if lib is not None:
                return native.draw(
                    "proposal",
                    index,
                    (attempt, *key_words),
                    law.mean,
                    law.std,
                    law.lo,
                    law.hi,
                    law.dtype,
                    proposal=native_args,
                )
            step = torch.tensor(counter.as_word32(attempt), dtype=torch.int32, device=device)
            keys = (step, scal["k0"], scal["k1"], scal["salt"])
            values, bad = (
                torch.cat(parts)
                for parts in zip(
                    *(
                        _call(
                            _proposal_elements,
                            use_compiled and index.numel() >= COMPILED_MIN_LOCAL,
                            chunk,
                            index[s : s + chunk],
                            *keys,
                            *extra,
                            **static,
                        )
                        for s in range(0, index.numel(), chunk)
                    ),
                    strict=True,
                )
            )
            return values, bad.nonzero().squeeze(1)
    else:
        chunk = ELEMENT_CHUNK[bool(compiled)]

        def candidates(index: torch.Tensor, attempt: int) -> tuple[torch.Tensor, torch.Tensor]:
            mode = compiled if compiled is False or index.numel() >= COMPILED_MIN_LOCAL else None
            parts = [
                _normals("elements", index[s : s + chunk], attempt, key_words, law, scal, mode)
                for s in range(0, index.numel(), chunk)
            ]
            return torch.cat([v for v, _ in parts]), torch.cat(
                [b + s for (_, b), s in zip(parts, range(0, index.numel(), chunk), strict=True)]
            )

    # The native kernels write into flat itself where it is a plain CPU tensor of the work dtype (a
    # wrapper subclass, e.g. torchao's float8 all-gather weight, has no storage of its own).
    direct = type(flat) is torch.Tensor and flat.dtype == law.dtype and flat.device.type == "cpu"

    def put(lo: int, values: torch.Tensor) -> None:
        if not (direct and values.data_ptr() == flat[lo:].data_ptr()):
            flat[lo : lo + values.numel()].copy_(cast(values).to(flat.device))

    drawn, pending_pos, pending_idx = 0, [], []
    if not proposal and length % 4 == 0 and all(s % 4 == 0 for s in starts):
        on_cpu = device.type == "cpu" and compiled is not False and native.library() is not None
        cap = NATIVE_BLOCK_CHUNK if on_cpu else BLOCK_CHUNK[bool(compiled)]
        for pos, blocks in _index_chunks([s // 4 for s in starts], length // 4, cap, device):
            target = flat[4 * pos : 4 * (pos + blocks.numel())] if direct else None
            values, bad = _normals("blocks", blocks, 0, key_words, law, scal, compiled, target)
            put(4 * pos, values)
            drawn += values.numel()
            if bad.numel():
                pending_pos.append(bad + 4 * pos)
                pending_idx.append(blocks[bad >> 2] * 4 + (bad & 3))
    else:
        for pos, index in _index_chunks(starts, length, chunk, device):
            values, bad = candidates(index, 0)
            put(pos, values)
            drawn += index.numel()
            if bad.numel():
                pending_pos.append(bad + pos)
                pending_idx.append(index[bad])
    if not pending_pos:
        return drawn
    pos, index = torch.cat(pending_pos), torch.cat(pending_idx)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        values, bad = candidates(index, attempt)
        flat.index_copy_(
            0, pos.to(flat.device), cast(values).to(flat.device)
        )  # the rejected ones are redrawn
        pos, index = pos[bad], index[bad]
        if not pos.numel():
            return drawn
    raise RuntimeError(
        f"init: {pos.numel()} elements found no value in [{law.lo}, {law.hi}] in {MAX_ATTEMPTS} "
        "candidates each"
    )
