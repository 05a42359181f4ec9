"""The collective microbenchmark's measurement: one rank's side of a sweep.

Every rank of an initialized default group calls :func:`run_sweep` with the same
:class:`SweepConfig`; it uses only the public, ``torch.distributed``-shaped API of the
module it is given (``zerocomm.comm``, or ``torch.distributed`` as a stand-in).

Timing follows nccl-tests: for each cell (collective, size, algorithm) the rank makes
``warmup`` calls, enters a barrier, then times ``iters`` back-to-back blocking calls
together and divides by ``iters``.  The reported time is the maximum of that average
over ranks (a collective is done when its slowest rank is), gathered with
``all_gather_into_tensor``.  Each call of the loop is also timed on its own (no barrier
between calls, so the loop is unchanged), giving the min / median / max per call, each
the maximum over ranks.  Algorithms of one (collective, size) run one after the
other, so drift on a shared machine affects their comparison as little as possible.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from . import reference
from .target import algorithm_kwargs, unsupported_errors
from .units import COLLECTIVES, SIZELESS, Layout, algbw_gbps, busbw_gbps, op_layout

TORCH_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepConfig:
    """What one run measures; identical on every rank."""

    collectives: tuple[str, ...] = COLLECTIVES
    """Collectives to measure, in this order (canonical names from ``units.COLLECTIVES``)."""
    algorithms: tuple[str, ...] = ("native",)
    """Algorithms compared for each (collective, size); ``"native"`` is the backend's own."""
    sizes: tuple[int, ...] = (8,)
    """Requested S in bytes (see ``units``); each row reports the S actually used."""
    dtype: str = "float32"
    """Element type, a key of ``TORCH_DTYPES``."""
    op: str = "sum"
    """Reduction op of reduce, all_reduce and reduce_scatter (lower-case, e.g. ``"sum"``)."""
    root: int = 0
    """Root rank of broadcast, scatter, reduce and gather."""
    warmup: int = 5
    """Untimed calls before the barrier that starts the timed ones."""
    iters: int = 20
    """Back-to-back calls timed together; the reported time is their average."""
    check: bool = False
    """Fill inputs with ``reference`` patterns and count wrong elements after the first call."""
    device: str = "cpu"
    """Device of every buffer (``"cpu"``, or ``"cuda"`` for NCCL)."""
    in_place: bool = False
    """all_gather: the input is this rank's chunk of the output; reduce_scatter: the output is this
    rank's chunk of the input (nccl-tests' in-place).  broadcast, reduce and all_reduce are always in
    place, as in torch; the other collectives have no in-place form."""

    def __post_init__(self) -> None:
        unknown = [c for c in self.collectives if c not in COLLECTIVES + SIZELESS]
        if unknown or not self.collectives:
            raise ValueError(f"collectives {list(self.collectives)} must be a non-empty subset of "
                             f"{list(COLLECTIVES + SIZELESS)}")
        if not self.algorithms or len(set(self.algorithms)) != len(self.algorithms):
            raise ValueError(f"algorithms {list(self.algorithms)} must be non-empty and distinct")
        if not self.sizes or min(self.sizes) < 1:
            raise ValueError(f"sizes {list(self.sizes)} must be non-empty and each >= 1 byte")
        if self.dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(TORCH_DTYPES)}")
        if self.op not in reference.REDUCE_OPS:
            raise ValueError(f"op {self.op!r} is not one of {', '.join(reference.REDUCE_OPS)}")
        if self.warmup < 0 or self.iters < 1:
            raise ValueError(f"warmup ({self.warmup}) must be >= 0 and iters ({self.iters}) >= 1")

    @property
    def itemsize(self) -> int:
        """Bytes per element of ``dtype``."""
        return torch.empty((), dtype=TORCH_DTYPES[self.dtype]).element_size()


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """The measurement of one cell, the same on every rank."""

    collective: str
    algorithm: str
    size: int
    """S in bytes actually used (nccl-tests' ``size``)."""
    count: int
    """Elements of one rank's share (nccl-tests' ``count``)."""
    time_us: Optional[float]
    """Average time per call, maximum over ranks, in µs; ``None`` when unsupported."""
    algbw: Optional[float]
    """S / time in GB/s (1e9 bytes)."""
    busbw: Optional[float]
    """algbw x bus factor of the group size, in GB/s."""
    wrong: Optional[int]
    """Wrong elements summed over ranks; ``None`` when not checked or unsupported."""
    time_min_us: Optional[float] = None
    """Fastest single call (each rank's), maximum over ranks, in µs."""
    time_median_us: Optional[float] = None
    """Median single call, maximum over ranks, in µs."""
    time_max_us: Optional[float] = None
    """Slowest single call, maximum over ranks, in µs."""
    rank_times_us: tuple[float, ...] = ()
    """Each rank's average time per call, by rank, in µs."""
    note: str = ""
    """Why the cell has no numbers (the unsupported-error message), else empty."""


@dataclass(slots=True)
class _Case:
    """One collective ready to call: ``run()`` makes one call; ``result`` is checked after it."""

    run: Callable[[], None]
    result: Optional[torch.Tensor]
    expected: Optional[np.ndarray] = field(default=None)


def _tensor(values: np.ndarray, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values)).to(device=device, dtype=dtype)


def _build_case(dist: ModuleType, collective: str, layout: Layout, rank: int, n: int,
                cfg: SweepConfig, algorithm: str) -> _Case:
    """Allocate the buffers of one (collective, size, algorithm) cell on this rank.

    With ``cfg.check`` inputs are ``reference`` patterns, else ones (so repeated
    in-place reductions stay finite for many calls and never produce denormals).
    """
    dtype, device, root, chunk = TORCH_DTYPES[cfg.dtype], cfg.device, cfg.root, layout.chunk
    kw = algorithm_kwargs(dist, algorithm)
    reduce_op = getattr(dist.ReduceOp, cfg.op.upper())

    def source(owner: int) -> torch.Tensor:
        """The input buffer of rank ``owner`` (root's send buffer for scatter)."""
        if cfg.check:
            return _tensor(reference.rank_input(collective, owner, n, chunk, cfg.dtype, cfg.op), dtype, device)
        length = n * chunk if collective in ("scatter", "reduce_scatter", "all_to_all") else chunk
        return torch.ones(length, dtype=dtype, device=device)

    def empty(length: int) -> torch.Tensor:
        return torch.zeros(length, dtype=dtype, device=device)

    if collective == "broadcast":
        buf = source(rank) if rank == root or not cfg.check else empty(chunk)
        case = _Case(lambda: dist.broadcast(buf, src=root, **kw), buf)
    elif collective == "scatter":
        out = empty(chunk)
        parts = list(source(rank).split(chunk)) if rank == root else None
        case = _Case(lambda: dist.scatter(out, scatter_list=parts, src=root, **kw), out)
    elif collective == "reduce":
        buf = source(rank)
        case = _Case(lambda: dist.reduce(buf, dst=root, op=reduce_op, **kw), buf if rank == root else None)
    elif collective == "all_reduce":
        buf = source(rank)
        case = _Case(lambda: dist.all_reduce(buf, op=reduce_op, **kw), buf)
    elif collective == "gather":
        inp, recv = source(rank), (empty(n * chunk) if rank == root else None)
        parts = list(recv.split(chunk)) if recv is not None else None
        case = _Case(lambda: dist.gather(inp, gather_list=parts, dst=root, **kw), recv)
    elif collective == "all_gather":
        out = empty(n * chunk)
        inp = out[rank * chunk:(rank + 1) * chunk] if cfg.in_place else source(rank)
        if cfg.in_place:
            inp.copy_(source(rank))
        case = _Case(lambda: dist.all_gather_into_tensor(out, inp, **kw), out)
    elif collective == "reduce_scatter":
        inp = source(rank)
        out = inp[rank * chunk:(rank + 1) * chunk] if cfg.in_place else empty(chunk)
        case = _Case(lambda: dist.reduce_scatter_tensor(out, inp, op=reduce_op, **kw), out)
    elif collective == "all_to_all":
        inp, out = source(rank), empty(n * chunk)
        case = _Case(lambda: dist.all_to_all_single(out, inp, **kw), out)
    elif collective == "barrier":
        case = _Case(lambda: dist.barrier(**kw), None)
    else:
        raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")
    if cfg.check and case.result is not None:
        case.expected = reference.expected_output(collective, rank, n, root, chunk, cfg.dtype, cfg.op)
    return case


def _count_wrong(case: _Case, cfg: SweepConfig, n: int) -> int:
    if case.result is None or case.expected is None:
        return 0
    actual = case.result.detach().to("cpu")
    if actual.dtype == torch.bfloat16:
        actual = actual.to(torch.float32)  # numpy has no bfloat16; float32 holds every bfloat16 exactly
    return reference.count_wrong(actual.numpy(), case.expected, cfg.dtype, n)


def _synchronize(device: str) -> None:
    """Wait for queued device work, so a CUDA timing covers the whole call, not its launch."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time_calls(dist: ModuleType, case: _Case, cfg: SweepConfig) -> tuple[float, float, float, float]:
    """(mean, min, median, max) seconds per call on this rank: ``warmup`` calls, a barrier, then
    ``iters`` back-to-back calls; the mean is their span over ``iters`` (nccl-tests), the others come
    from per-call stamps taken inside the same loop."""
    for _ in range(cfg.warmup):
        case.run()
    _synchronize(cfg.device)
    dist.barrier()
    stamps = [time.perf_counter()]
    for _ in range(cfg.iters):
        case.run()
        _synchronize(cfg.device)
        stamps.append(time.perf_counter())
    calls = sorted(b - a for a, b in zip(stamps, stamps[1:]))
    return (stamps[-1] - stamps[0]) / cfg.iters, calls[0], float(np.median(calls)), calls[-1]


def _measure_cell(dist: ModuleType, collective: str, layout: Layout, algorithm: str,
                  cfg: SweepConfig, rank: int, n: int) -> Row:
    """Run one cell on this rank and combine every rank's numbers into its :class:`Row`."""
    seconds, wrong, unsupported, note = (0.0, 0.0, 0.0, 0.0), 0, 0.0, ""
    try:
        case = _build_case(dist, collective, layout, rank, n, cfg, algorithm)
        if cfg.check:
            case.run()  # the checked call doubles as the first warm-up call
            _synchronize(cfg.device)
            wrong = _count_wrong(case, cfg, n)
        seconds = _time_calls(dist, case, cfg)
    except unsupported_errors(dist) as exc:
        # Raised alike on every rank before any byte moved (the error's contract), so all
        # ranks reach the exchange below together and the sweep goes on.
        unsupported, note = 1.0, str(exc)
    stats = torch.tensor([*seconds, float(wrong), unsupported], dtype=torch.float64, device=cfg.device)
    gathered = torch.empty(6 * n, dtype=torch.float64, device=cfg.device)
    # "native": the exchange must work whatever algorithm is under test or set as the default.
    dist.all_gather_into_tensor(gathered, stats, **algorithm_kwargs(dist, "native"))
    per_rank = gathered.to("cpu").view(n, 6)
    flags = per_rank[:, 5].tolist()
    if any(flags) and not all(flags):
        bad = [r for r, flag in enumerate(flags) if flag]
        raise RuntimeError(f"{collective} ({algorithm}, {layout.nbytes} B): ranks {bad} found it "
                           f"unsupported but the others ran it; the ranks disagree")
    count = layout.chunk
    if all(flags):
        return Row(collective=collective, algorithm=algorithm, size=layout.nbytes, count=count,
                   time_us=None, algbw=None, busbw=None, wrong=None, note=note or "unsupported")
    rank_seconds = per_rank[:, 0].tolist()
    slowest = max(rank_seconds)
    call_min, call_median, call_max = (float(per_rank[:, column].max()) * 1e6 for column in (1, 2, 3))
    return Row(
        collective=collective,
        algorithm=algorithm,
        size=layout.nbytes,
        count=count,
        time_us=slowest * 1e6,
        algbw=algbw_gbps(layout.nbytes, slowest),
        busbw=busbw_gbps(collective, layout.nbytes, slowest, n),
        wrong=int(per_rank[:, 4].sum().item()) if cfg.check else None,
        time_min_us=call_min,
        time_median_us=call_median,
        time_max_us=call_max,
        rank_times_us=tuple(s * 1e6 for s in rank_seconds),
    )


def sweep_plan(cfg: SweepConfig, n: int) -> list[tuple[str, Layout]]:
    """The (collective, layout) pairs a sweep on ``n`` ranks measures, in order.

    Requested sizes that round to the same S for a collective (tiny sizes of the
    partitioned ones) are measured once.  Each pair makes ``len(cfg.algorithms)`` rows.
    """
    plan: list[tuple[str, Layout]] = []
    for collective in cfg.collectives:
        seen: set[int] = set()
        for size in cfg.sizes:
            layout = op_layout(collective, size, n, cfg.itemsize)
            if layout.nbytes not in seen:
                seen.add(layout.nbytes)
                plan.append((collective, layout))
    return plan


def run_sweep(dist: ModuleType, cfg: SweepConfig,
              on_row: Optional[Callable[[Row], None]] = None) -> Iterator[Row]:
    """Measure every cell of ``cfg`` on the default group; called by every rank alike.

    Yields one :class:`Row` per (collective, size, algorithm) of :func:`sweep_plan`,
    algorithms innermost, identical on every rank.  ``on_row`` (e.g. a progress bar's
    update) is called after each.  Requires ``dist.init_process_group`` to have run;
    ``cfg.root`` must be a rank of the group.  Errors other than the module's
    ``UnsupportedError`` propagate.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    if not 0 <= cfg.root < n:
        raise ValueError(f"root {cfg.root} is not a rank of this group of {n} ranks")
    for collective, layout in sweep_plan(cfg, n):
        for algorithm in cfg.algorithms:
            row = _measure_cell(dist, collective, layout, algorithm, cfg, rank, n)
            if on_row is not None:
                on_row(row)
            yield row
