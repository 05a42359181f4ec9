"""1-bit compressed vs uncompressed all_reduce: time and bytes moved, per size, world size and backend.

``python -m zerocomm.benchmarks.compression`` starts, for each backend of ``--backends`` and each
world size of ``--nprocs``, that many local ranks (gloo: forked; MPI: the same command re-run under
``mpiexec``, see ``launch``) and prints one table of every world's rows.  Under ``torchrun`` or
``mpiexec`` the launcher's ranks run one world and rank 0 prints its rows.

For each size S (the float32 buffer, as nccl-tests' all_reduce ``size``) and each algorithm of
``--algorithms`` it measures ``all_reduce(AVG)`` and ``compressed_all_reduce`` (the mean, 1-bit
with error feedback) of the same buffer:

* time: nccl-tests' convention (``report.TIMING_CONVENTION``): ``warmup`` calls, a barrier,
  ``iters`` back-to-back blocking calls timed together; per call, the maximum over ranks;
* bytes: one more, untimed call under ``count_bytes()``; the bytes this rank sent, maximum over
  ranks.  zerocomm's ring and tree are counted message by message; a native collective's bytes are
  the optimal schedule's estimate (the "bytes" column says which).

The default sweep is 1 MiB to 64 MiB (a x4 step); ``--large`` extends it to 256 MiB.  After the
table a summary puts, per backend, world size and size, fp32 native, fp32 ring and 1-bit side by
side; the machine's load (``uptime``) is printed before and after, since timings on a shared machine
move by tens of percent.

``--kernels`` instead times the local 1-bit kernels alone in this process (no communication), per
size: the worker step (encode with error feedback), the server step and the final decode of the fused
codec, beside the unfused per-tensor functions the schedule used before (``compensate_and_compress``
and ``decompress``) and a plain ``copy_`` of the same buffer (what memory alone costs); GB/s are of
float32 input.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from . import launch
from .options import UsageError, require
from .report import TIMING_CONVENTION
from .target import check_cuda
from .units import format_size, size_sweep

DEFAULT_SIZES = "1MiB:64MiB"
LARGE_SIZES = "1MiB:256MiB"
ROWS_ENV = "ZEROCOMM_COMPRESSION_ROWS"
"""Where rank 0 of a relaunched (mpiexec) world writes its rows for the parent."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """One (backend, world size, size, algorithm) cell, the same on every rank."""

    backend: str
    world_size: int
    size: int
    """S in bytes: the float32 buffer reduced."""
    algorithm: str
    fp32_us: float
    """all_reduce(AVG): time per call, maximum over ranks, in µs."""
    onebit_us: float
    """compressed_all_reduce: time per call, maximum over ranks, in µs."""
    fp32_bytes: int
    """Bytes one rank sent in one all_reduce (maximum over ranks)."""
    onebit_bytes: int
    """Bytes one rank sent in one compressed_all_reduce (maximum over ranks)."""
    counted: bool
    """True when both byte counts were measured message by message, False when estimated (native)."""


HELP = "1-bit compressed vs fp32 all_reduce: time and bytes sent"

DESCRIPTION = """\
For each backend, world size and size S (a float32 buffer), times all_reduce(AVG) and
compressed_all_reduce (1-bit with error feedback) of the same buffer, with each algorithm of
--algorithms underneath, and counts the bytes one rank sends.  Times follow nccl-tests (warm-up,
a barrier, back-to-back calls averaged; the slowest rank); bytes are counted message by message
for zerocomm's ring and tree and estimated for a backend's own collective (the "bytes" column
says which).  A summary then puts fp32 native, fp32 ring and 1-bit side by side, with the load
(uptime) before and after.

Examples:
  zerocomm-bench compression --backends gloo --nprocs 2,4
  zerocomm-bench compression --large            # up to 256 MiB (several GB per rank)
  zerocomm-bench compression --kernels          # the local 1-bit kernels alone, no communication
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", default="gloo,mpi", metavar="B[,B...]",
                        help="backends: gloo, mpi, nccl (default: gloo,mpi)")
    parser.add_argument("--nprocs", default="2,4", metavar="N[,N...]", help="world sizes (default: 2,4)")
    parser.add_argument("--sizes", default=None, metavar="SPEC",
                        help=f"sizes S, ranges lo:hi and single sizes (default: {DEFAULT_SIZES})")
    parser.add_argument("--factor", type=int, default=4, metavar="F", help="step factor of size ranges (default: 4)")
    parser.add_argument("--large", action="store_true", help=f"sweep {LARGE_SIZES} (several GB per rank)")
    parser.add_argument("--algorithms", default="native,ring", metavar="ALG[,ALG...]",
                        help="what runs the collectives underneath: native, ring, tree (default: native,ring)")
    parser.add_argument("--warmup", type=int, default=1, metavar="N", help="untimed calls per cell (default: 1)")
    parser.add_argument("--iters", type=int, default=5, metavar="N", help="timed calls per cell (default: 5)")
    parser.add_argument("--threads", type=int, default=1, metavar="N", help="torch threads per rank (default: 1)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="process group timeout in seconds (default: 600)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument("--kernels", action="store_true",
                        help="time the local 1-bit kernels alone (one process, no communication) instead")


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


# --- one rank --------------------------------------------------------------------------------------

def _sync(device: str) -> None:
    if device.startswith("cuda"):  # the timing must cover the kernels, not their launch
        import torch

        torch.cuda.synchronize()


def _time_calls(dist, call, warmup: int, iters: int, device: str) -> float:
    for _ in range(warmup):
        call()
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    _sync(device)
    return (time.perf_counter() - start) / iters


def _measure(dist, call, op_name: str, warmup: int, iters: int, device: str) -> tuple[float, int, bool]:
    """(seconds per call, bytes sent, counted) on this rank."""
    with dist.count_bytes() as counter:
        call()
    traffic = counter.per_op[op_name]
    return _time_calls(dist, call, warmup, iters, device), traffic.bytes_sent, traffic.measured


def run_world(args: argparse.Namespace, sizes: Sequence[int], spec: launch.InitSpec) -> list[Row]:
    """Every rank of one world: join, measure every (size, algorithm), leave; the rows (all ranks)."""
    import torch

    import zerocomm.comm as dist
    from zerocomm.ops import ErrorFeedback

    torch.set_num_threads(args.threads)
    device = "cpu"
    if spec.backend == "nccl":  # one GPU per rank, by local rank
        device = f"cuda:{spec.local_rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    dist.init_process_group(**spec.kwargs(), timeout=datetime.timedelta(seconds=args.timeout))
    try:
        rank, n, backend = dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
        rows = []
        for size in sizes:
            numel = max(1, size // 4)
            generator = torch.Generator().manual_seed(rank)
            data = torch.randn(numel, generator=generator).to(device)  # gradient-like values
            for algorithm in _csv(args.algorithms):
                state = ErrorFeedback(f"{size} B")
                fp32 = _measure(dist, lambda: dist.all_reduce(data, op=dist.ReduceOp.AVG, algorithm=algorithm),
                                "all_reduce", args.warmup, args.iters, device)
                onebit = _measure(dist, lambda: dist.compressed_all_reduce(data, state, algorithm=algorithm),
                                  "compressed_all_reduce", args.warmup, args.iters, device)
                mine = torch.tensor([fp32[0], onebit[0], fp32[1], onebit[1], float(fp32[2] and onebit[2])],
                                    dtype=torch.float64, device=device)
                every = torch.empty(n * 5, dtype=torch.float64, device=device)
                dist.all_gather_into_tensor(every, mine, algorithm="native")
                per_rank = every.view(n, 5).cpu()
                worst = per_rank.max(dim=0).values.tolist()
                rows.append(Row(backend=backend, world_size=n, size=numel * 4, algorithm=algorithm,
                                fp32_us=worst[0] * 1e6, onebit_us=worst[1] * 1e6, fp32_bytes=int(worst[2]),
                                onebit_bytes=int(worst[3]), counted=bool(per_rank[:, 4].min().item())))
                if rank == 0:
                    print(f"# {backend} n={n} {format_size(numel * 4)} {algorithm}: done", file=sys.stderr, flush=True)
        return rows
    finally:
        dist.destroy_process_group()


# --- the table -------------------------------------------------------------------------------------

def format_rows(rows: Sequence[Row]) -> str:
    from tabulate import tabulate

    table = []
    for row in rows:
        table.append([row.backend, row.world_size, format_size(row.size), row.algorithm,
                      f"{row.fp32_us / 1e3:.2f}", f"{row.onebit_us / 1e3:.2f}", f"{row.fp32_us / row.onebit_us:.2f}",
                      row.fp32_bytes, row.onebit_bytes,
                      f"{row.fp32_bytes / row.onebit_bytes:.1f}" if row.onebit_bytes else "-",
                      "counted" if row.counted else "estimated"])
    headers = ["backend", "n", "size", "algorithm", "fp32 ms", "1-bit ms", "speedup", "fp32 B sent/rank",
               "1-bit B sent/rank", "bytes ratio", "bytes"]
    return tabulate(table, headers=headers, disable_numparse=True, stralign="right")


def summary_rows(rows: Sequence[Row]) -> str:
    """Per (backend, n, size): fp32 native, fp32 ring and the 1-bit times side by side (ms)."""
    from tabulate import tabulate

    cells: dict = {}
    for row in rows:
        cells.setdefault((row.backend, row.world_size, row.size), {})[row.algorithm] = row
    table = []
    for (backend, n, size), by_algorithm in cells.items():
        native, ring = by_algorithm.get("native"), by_algorithm.get("ring")
        onebit = min(r.onebit_us for r in by_algorithm.values())
        table.append([backend, n, format_size(size),
                      f"{native.fp32_us / 1e3:.2f}" if native else "-", f"{ring.fp32_us / 1e3:.2f}" if ring else "-",
                      f"{native.onebit_us / 1e3:.2f}" if native else "-", f"{ring.onebit_us / 1e3:.2f}" if ring else "-",
                      f"{ring.fp32_us / onebit:.2f}" if ring else "-"])
    headers = ["backend", "n", "size", "fp32 native ms", "fp32 ring ms", "1-bit/native ms", "1-bit/ring ms",
               "fp32 ring / best 1-bit"]
    return tabulate(table, headers=headers, disable_numparse=True, stralign="right")


def load_line() -> str:
    """The machine's load, as ``uptime`` prints it (or the load averages where it is missing)."""
    if shutil.which("uptime"):
        done = subprocess.run(["uptime"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip():
            return f"# uptime: {done.stdout.strip()}"
    return "# load average: " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def header_lines(args: argparse.Namespace) -> list[str]:
    return [
        "# zerocomm compression benchmark: all_reduce(AVG) in float32 vs compressed_all_reduce (1-bit signs + "
        "a scale per segment, error feedback; the result is the mean)",
        f"# timing ({TIMING_CONVENTION}): {args.warmup} warm-up call(s), a barrier, {args.iters} timed calls; "
        "ms per call, maximum over ranks",
        "# B sent/rank: one call's bytes sent by a rank (maximum over ranks); counted = zerocomm's ring/tree "
        "messages, estimated = a native collective's optimal-schedule bytes",
        "# speedup = fp32 ms / 1-bit ms; bytes ratio = fp32 B / 1-bit B",
        f"# 1-bit codec on CPU: {codec_path()}",
    ]


def codec_path() -> str:
    """Which kernels run the 1-bit codec on CPU in this installation."""
    from zerocomm.ops import onebit_kernels

    if onebit_kernels.NATIVE is not None:
        return "the C kernels (zerocomm.ops._onebit)"
    return "numpy (the C extension zerocomm.ops._onebit is not built)"


# --- starting the worlds ---------------------------------------------------------------------------

def _write_rows(path: str, rows: Sequence[Row]) -> None:
    with open(path, "w") as out:
        json.dump([asdict(row) for row in rows], out)


def _read_rows(path: str) -> list[Row]:
    with open(path) as source:
        return [Row(**item) for item in json.load(source)]


def _one_world(args: argparse.Namespace, sizes: Sequence[int], backend: str, nprocs: int,
               argv: Sequence[str], rows_path: str) -> int:
    """Run one world on local ranks; rank 0 writes its rows to ``rows_path``.  The worst exit status."""
    if backend == "mpi":
        return launch.relaunch_under_mpiexec(nprocs, [*argv, "--backends", "mpi"],
                                             module="zerocomm.benchmarks.compression", env={ROWS_ENV: rows_path})

    def body(spec: launch.InitSpec) -> int:
        rows = run_world(args, sizes, spec)
        if spec.rank == 0:
            _write_rows(rows_path, rows)
        return 0

    return launch.run_forked(nprocs, backend, body)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m zerocomm.benchmarks.compression`` (what ``zerocomm-bench compression`` runs)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m zerocomm.benchmarks.compression",
                                     description=HELP)
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        return run(args)
    except UsageError as exc:
        parser.error(str(exc))


def run(args: argparse.Namespace) -> int:
    """The ``compression`` subcommand; ``args.argv`` is its command line (relaunched under mpiexec)."""
    argv = list(args.argv)
    try:
        sizes = size_sweep(args.sizes or (LARGE_SIZES if args.large else DEFAULT_SIZES), args.factor)
        backends, world_sizes = _csv(args.backends), [int(n) for n in _csv(args.nprocs)]
        launched = launch.detect_launcher(os.environ)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.kernels:  # one process, no world
        from .compression_kernels import run_kernels

        print("\n".join([load_line(), run_kernels(sizes, args.iters, args.threads), load_line()]), flush=True)
        return 0
    unknown = [b for b in backends if b not in ("gloo", "mpi", "nccl")]
    if unknown or not backends or any(n < 1 for n in world_sizes):
        raise UsageError(f"--backends {args.backends!r} must name gloo, mpi or nccl; --nprocs {args.nprocs!r} "
                         f"ints >= 1")
    if args.warmup < 0 or args.iters < 1 or args.threads < 1:
        raise UsageError(f"--warmup ({args.warmup}) must be >= 0, --iters ({args.iters}) and --threads "
                         f"({args.threads}) >= 1")
    from .target import check_algorithms, comm_module

    try:
        if not _csv(args.algorithms):
            raise ValueError("expected comma-separated algorithms, e.g. native,ring")
        check_algorithms(comm_module(), _csv(args.algorithms))
    except ValueError as exc:
        raise UsageError(f"--algorithms {args.algorithms!r}: {exc}") from None
    for backend in backends:
        if backend == "nccl":
            try:
                check_cuda("nccl", "cuda", max(world_sizes) if launched is None else 1)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        if backend == "mpi":
            require("mpi4py", "--backends mpi", "mpi")

    if launched is not None:  # one world, started by torchrun or mpiexec
        if len(backends) != 1:
            raise UsageError(f"under {launched.launcher} pass one backend, got --backends {args.backends!r}")
        rows = run_world(args, sizes, launch.launched_spec(launched, backends[0]))
        if launched.rank == 0:
            if os.environ.get(ROWS_ENV):
                _write_rows(os.environ[ROWS_ENV], rows)
            else:
                print("\n".join([*header_lines(args), format_rows(rows)]), flush=True)
        return 0

    rows, status = [], 0
    before = load_line()
    passthrough = [a for a in argv if a != "--large"] + (["--sizes", ",".join(map(str, sizes))])
    # the relaunched command must not repeat --backends/--nprocs lists: it runs one world
    passthrough = _drop_options(passthrough, ("--backends", "--nprocs", "--json"))
    with tempfile.TemporaryDirectory(prefix="zerocomm-compression-") as folder:
        for backend in backends:
            for nprocs in world_sizes:
                path = os.path.join(folder, f"{backend}-{nprocs}.json")
                code = _one_world(args, sizes, backend, nprocs, passthrough, path)
                if code != 0 or not os.path.exists(path):
                    print(f"# {backend} with {nprocs} ranks failed (exit status {code})", file=sys.stderr)
                    status = 1
                    continue
                rows.extend(_read_rows(path))
    print("\n".join([before, *header_lines(args), format_rows(rows), "", summary_rows(rows), load_line()]),
          flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": vars(args), "rows": [asdict(row) for row in rows]}, out, indent=1)
    return status


def _drop_options(argv: Sequence[str], names: Sequence[str]) -> list[str]:
    """``argv`` without ``names`` and their values (``--x v`` and ``--x=v`` forms)."""
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        if item in names:
            skip = True
            continue
        if any(item.startswith(name + "=") for name in names):
            continue
        kept.append(item)
    return kept


if __name__ == "__main__":
    sys.exit(main())
