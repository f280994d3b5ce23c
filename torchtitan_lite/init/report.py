"""The init report (``debug.init_report``): per-tensor measured vs expected moments and anomaly
flags.

Moments of a truncated normal (Johnson, Kotz & Balakrishnan, *Continuous Univariate Distributions*
vol. 1, ch. 13): for the standard normal truncated to ``[alpha, beta]`` with mass
``Z = Phi(beta) - Phi(alpha)``, the raw moments follow
``m_k = (k - 1) m_{k-2} + (alpha^(k-1) phi(alpha) - beta^(k-1) phi(beta)) / Z`` with ``m_0 = 1``,
``m_1 = (phi(alpha) - phi(beta)) / Z``. For +-3 sigma this gives std factor 0.98658 and excess
kurtosis -0.1711; for +-2 sigma 0.87963 and -0.6345.

:func:`init_report` gathers each DTensor whole with ``full_tensor()``, one tensor at a time, in the
same order on every rank (a collective: call it on all ranks); the trainer runs it only when
``debug.init_report`` is set.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from torchtitan_lite.init.apply import InitResult, tensor_groups
from torchtitan_lite.init.sampling import normal_mass
from torchtitan_lite.init.spec import InitPlan

_STD_TOLERANCE = 0.05
_MIN_NUMEL_STD_CHECK = 10_000
_KURTOSIS_TOLERANCE = 0.1
_MIN_NUMEL_KURTOSIS_CHECK = 100_000
_CHUNK = 1 << 16
"""Elements per float64 work chunk of :func:`tensor_stats`: its temporaries are a few times 512 KiB
whatever the size of the tensor, and stay in a CPU core's cache."""


def truncated_normal_moments(alpha: float, beta: float) -> tuple[float, float, float]:
    """``(mean, std, excess kurtosis)`` of the standard normal truncated to ``[alpha, beta]``.

    Bounds may be infinite (``(-inf, inf)`` gives ``(0, 1, 0)``). Raises ValueError if
    ``alpha >= beta``.
    """
    if not alpha < beta:
        raise ValueError(f"truncated_normal_moments: need alpha < beta, got {alpha}, {beta}")
    mass = normal_mass(alpha, beta)

    def edge(x: float, k: int) -> float:
        return 0.0 if math.isinf(x) else x**k * math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)

    raw = [1.0, (edge(alpha, 0) - edge(beta, 0)) / mass]
    for k in range(2, 5):
        raw.append((k - 1) * raw[k - 2] + (edge(alpha, k - 1) - edge(beta, k - 1)) / mass)
    m1, m2, m3, m4 = raw[1:]
    var = m2 - m1 * m1
    central4 = m4 - 4 * m1 * m3 + 6 * m1 * m1 * m2 - 3 * m1**4
    return m1, math.sqrt(var), central4 / (var * var) - 3.0


def text_table(
    header: Sequence[str], rows: Iterable[Sequence[str]], *, right: Collection[int] = ()
) -> str:
    """``rows`` of cells under ``header`` as aligned columns: each as wide as its widest cell, two
    spaces apart, the columns whose index is in ``right`` right-aligned (numbers), trailing spaces
    removed."""
    table = [list(header), *map(list, rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    right = set(right)
    return "\n".join(
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=False))
        ).rstrip()
        for row in table
    )


def pattern_summary(
    tensors: Iterable[tuple[str, str, int, str, float | None, float, Sequence[str]]],
) -> str:
    """One line per plan pattern over
    ``(pattern, spec, elements, status, measured std or None, expected std, flags)`` per tensor:
    pattern, tensor count, elements, spec, statuses, the range of the measured stds (``-`` on meta),
    expected std and each flag with the number of tensors that raised it (``std off x2``)."""
    groups: dict[str, list[tuple]] = {}
    for item in tensors:
        groups.setdefault(item[0], []).append(item)
    rows = []
    for pattern, items in groups.items():
        stds = [std for *_, std, _, _ in items if std is not None and math.isfinite(std)]
        measured = (
            "-"
            if not stds
            else f"{min(stds):.4g}" + ("" if min(stds) == max(stds) else f"..{max(stds):.4g}")
        )
        statuses = sorted({status for _, _, _, status, *_ in items})
        flags = Counter(flag for *_, item_flags in items for flag in item_flags)
        rows.append(
            [
                pattern,
                str(len(items)),
                f"{sum(n for _, _, n, *_ in items):,}",
                items[0][1],
                ",".join(statuses),
                measured,
                f"{items[0][5]:.4g}",
                ", ".join(f"{f} x{c}" if c > 1 else f for f, c in flags.items()),
            ]
        )
    return text_table(
        ["pattern", "tensors", "elements", "spec", "status", "std (measured)", "exp std", "flags"],
        rows,
        right=(1, 2, 5, 6),
    )


@dataclass
class InitReportRow:
    """One tensor of the report. Statistics are over the full (gathered) tensor, in float64.

    ``at_bound`` is the fraction of values within ``1e-6 * std`` of a bound (``trunc_normal`` only);
    ``status`` is ``init``, ``tied`` (initialized, several names) or ``loaded`` (skipped);
    ``pattern`` is the plan entry that gave ``spec``.
    """

    name: str
    names: list[str]
    spec: str
    pattern: str
    shape: list[int]
    dtype: str
    status: str
    mean: float
    std: float
    min: float
    max: float
    at_bound: float
    excess_kurtosis: float
    expected_mean: float
    expected_std: float
    expected_excess_kurtosis: float
    flags: list[str] = field(default_factory=list)


@dataclass
class InitReport:
    """Rows of :func:`init_report`; ``str()`` gives a table, :meth:`write_json` a file."""

    rows: list[InitReportRow]

    def __str__(self) -> str:
        header = [
            "name",
            "spec",
            "shape",
            "status",
            "mean",
            "std",
            "exp std",
            "min",
            "max",
            "at bound",
            "ex.kurt",
            "exp",
            "flags",
        ]
        rows = [
            [
                r.name,
                r.spec,
                "x".join(map(str, r.shape)),
                r.status,
                f"{r.mean:.3g}",
                f"{r.std:.4g}",
                f"{r.expected_std:.4g}",
                f"{r.min:.3g}",
                f"{r.max:.3g}",
                f"{r.at_bound:.2g}",
                f"{r.excess_kurtosis:.3f}",
                f"{r.expected_excess_kurtosis:.3f}",
                ",".join(r.flags),
            ]
            for r in self.rows
        ]
        return text_table(header, rows, right=range(4, 12))

    def by_pattern(self) -> str:
        """:func:`pattern_summary` of the rows: one line per plan entry, before the per-tensor
        rows."""
        return pattern_summary(
            (r.pattern, r.spec, math.prod(r.shape), r.status, r.std, r.expected_std, r.flags)
            for r in self.rows
        )

    def write_json(self, path: str) -> None:
        """Write the rows as a JSON list (non-finite numbers as ``null``)."""

        def clean(value):
            if isinstance(value, float) and not math.isfinite(value):
                return None
            return value

        rows = [{k: clean(v) for k, v in asdict(r).items()} for r in self.rows]
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


@dataclass(frozen=True)
class TensorStats:
    """Statistics of the finite values of a tensor (:func:`tensor_stats`), in float64; ``nan`` where
    none is finite (``excess_kurtosis`` also when all are equal). ``std`` is the population one
    (divides by ``finite``); ``at_bounds`` counts the values within ``tol`` of ``a`` plus those
    within ``tol`` of ``b``."""

    finite: int
    mean: float
    std: float
    min: float
    max: float
    excess_kurtosis: float
    at_bounds: int


def tensor_stats(
    x: torch.Tensor,
    bounds: tuple[float, float] | None = None,
    tol: float = 0.0,
    *,
    chunk: int = _CHUNK,
    progress: Callable[[int], object] | None = None,
) -> TensorStats:
    """:class:`TensorStats` of ``x`` (any shape, floating or integer dtype), in two passes over
    chunks of ``chunk`` elements: the float64 sum, the min and max and the values at
    ``bounds = (a, b)`` first, then the sums of the second and fourth powers of ``x - mean`` in
    float64. Only a chunk's float64 copy is held, never one of the whole tensor. ``progress(k)``,
    when given, is called as each ``k`` more elements are done (in the second pass)."""
    flat = x.detach().reshape(-1)
    starts = range(0, flat.numel(), chunk)
    nonfinite: set[int] = set()  # the starts of the chunks that hold a nan or an inf

    def values(start: int) -> torch.Tensor:
        """The finite values of the chunk at ``start``, as a new float64 tensor."""
        piece = flat[start : start + chunk].to(torch.float64, copy=True)
        return piece[torch.isfinite(piece)] if start in nonfinite else piece

    count, total, lo, hi, at_bounds = 0, 0.0, math.inf, -math.inf, 0
    for start in starts:
        piece = flat[start : start + chunk]
        piece_sum = torch.sum(
            piece, dtype=torch.float64
        ).item()  # finite unless the chunk holds a nan or an inf
        if not math.isfinite(piece_sum):
            nonfinite.add(start)
            piece = values(start)
            piece_sum = piece.sum().item()
        if not piece.numel():
            continue
        count, total = count + piece.numel(), total + piece_sum
        piece_lo, piece_hi = (float(v.item()) for v in torch.aminmax(piece))
        lo, hi = min(lo, piece_lo), max(hi, piece_hi)
        # float64 rounding is monotonic: no x in [piece_lo, piece_hi] has |x - bound| <= tol unless
        # one of these holds
        for bound in bounds if bounds is not None else ():
            if piece_lo - bound <= tol and piece_hi - bound >= -tol:
                at_bounds += int(((piece.to(torch.float64) - bound).abs() <= tol).sum())
    if not count:
        if progress is not None:
            progress(flat.numel())
        return TensorStats(0, math.nan, math.nan, math.nan, math.nan, math.nan, 0)
    mean = total / count
    squares, fourths = 0.0, 0.0
    for start in starts:
        powers = values(start).sub_(mean).square_()  # (x - mean)^2
        squares += powers.sum().item()
        fourths += powers.square_().sum().item()
        if progress is not None:
            progress(min(chunk, flat.numel() - start))
    var = squares / count
    kurt = fourths / count / (var * var) - 3.0 if var > 0 else math.nan
    return TensorStats(count, mean, math.sqrt(var), lo, hi, kurt, at_bounds)


def _full_cpu(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.device.type == "meta":
        raise ValueError("init report: tensor is on meta; materialize and initialize first")
    full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return full.detach().to("cpu").contiguous()


def _row(entry, tensor: torch.Tensor, progress: Callable[[int], object] | None) -> InitReportRow:
    spec = entry.spec
    x = _full_cpu(tensor)
    n = x.numel()
    trunc = spec.kind == "trunc_normal"
    tol = 1e-6 * spec.std if trunc else 0.0
    stats = tensor_stats(x, spec.bounds if trunc else None, tol, progress=progress)
    flags = [] if stats.finite == n else ["nan/inf"]
    nan = math.nan
    mean, std, kurt, lo, hi = stats.mean, stats.std, stats.excess_kurtosis, stats.min, stats.max
    at_bound = 0.0
    if trunc:
        a, b = spec.bounds
        alpha, beta = (a - spec.mean) / spec.std, (b - spec.mean) / spec.std
        m, s, expected_kurt = truncated_normal_moments(alpha, beta)
        expected_mean, expected_std = spec.mean + spec.std * m, spec.std * s
        count = stats.at_bounds
        at_bound = count / n if n else 0.0
        ulp = max(tol, torch.finfo(tensor.dtype).eps * max(abs(a), abs(b)))
        density = (
            (math.exp(-0.5 * alpha**2) + math.exp(-0.5 * beta**2))
            / math.sqrt(2 * math.pi)
            / normal_mass(alpha, beta)
        )
        if not entry.loaded and count > 10 * n * density * ulp / spec.std + 10:
            flags.append("mass at bounds")
    elif spec.kind == "normal":
        expected_mean, expected_std, expected_kurt = spec.mean, spec.std, 0.0
    else:
        expected_mean = {"zeros": 0.0, "ones": 1.0, "constant": spec.value}[spec.kind]
        expected_std, expected_kurt = 0.0, nan
        if (
            not entry.loaded
            and n
            and not (lo == hi == torch.tensor(expected_mean, dtype=tensor.dtype).item())
        ):
            flags.append("not constant")
    if not entry.loaded and spec.kind in ("normal", "trunc_normal"):
        if n > _MIN_NUMEL_STD_CHECK and abs(std / expected_std - 1.0) > _STD_TOLERANCE:
            flags.append("std off")
        if n > _MIN_NUMEL_KURTOSIS_CHECK and abs(kurt - expected_kurt) > _KURTOSIS_TOLERANCE:
            flags.append("kurtosis off")
    status = "loaded" if entry.loaded else ("tied" if entry.tied else "init")
    return InitReportRow(
        entry.name,
        list(entry.names),
        spec.describe(),
        entry.pattern,
        list(tensor.shape),
        str(tensor.dtype).removeprefix("torch."),
        status,
        mean,
        std,
        lo,
        hi,
        at_bound,
        kurt,
        expected_mean,
        expected_std,
        expected_kurt,
        flags,
    )


def init_report(
    model: nn.Module,
    plan: InitPlan,
    result: InitResult,
    *,
    progress: Callable[[int], object] | None = None,
) -> InitReport:
    """Per-tensor measured vs expected statistics of an initialized ``model``
    (:func:`tensor_stats`).

    ``result`` is what :func:`~torchtitan_lite.init.init_weights` returned for ``model`` and
    ``plan`` (its table gives each tensor's spec and status); ``progress(k)``, when given, is called
    as each ``k`` more elements are measured (e.g. a ``tqdm`` bar's ``update``). Flags: ``nan/inf``;
    ``std off`` (> 5% off, tensors over 10k elements); ``kurtosis off`` (> 0.1 off, over 100k
    elements); ``mass at bounds`` (more values within 1e-6 std of a bound than rounding can
    explain); ``not constant`` (a fill that is not).

    Raises:
        ValueError: ``result`` does not describe ``model`` (a tensor is missing from its table), or
            a tensor is still on meta.
    """
    rows = []
    by_names = {entry.names: entry for entry in result.table.values()}
    for names, tensor in tensor_groups(model):
        if names not in by_names:
            raise ValueError(
                f"init_report: tensor {' = '.join(names)} is not in the init result of plan "
                f"{plan.model}; pass the result of init_weights on this model"
            )
        rows.append(_row(by_names[names], tensor, progress))
    return InitReport(rows)


def write_init_report(report: InitReport, folder: str | Path) -> tuple[Path, Path]:
    """Write ``init_report.json`` and ``init_report.csv`` into ``folder``; returns both paths.

    CSV columns are the :class:`~torchtitan_lite.init.report.InitReportRow` fields; ``names`` are
    joined with `` = ``, ``shape`` with ``x``, ``flags`` with ``;``.
    """
    folder = Path(folder)
    json_path, csv_path = folder / "init_report.json", folder / "init_report.csv"
    report.write_json(str(json_path))
    rows = [asdict(r) for r in report.rows]
    joins = {"names": " = ", "shape": "x", "flags": ";"}
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {k: joins[k].join(map(str, v)) if k in joins else v for k, v in row.items()}
            )
    return json_path, csv_path


def init_report_summary(report: InitReport) -> str:
    """``init report: 46 tensors, none flagged`` or
    ``init report: 46 tensors, 1 flagged: output.weight (std off)``."""
    flagged = [f"{r.name} ({', '.join(r.flags)})" for r in report.rows if r.flags]
    return f"init report: {len(report.rows)} tensors, " + (
        f"{len(flagged)} flagged: {'; '.join(flagged)}" if flagged else "none flagged"
    )
