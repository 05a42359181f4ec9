"""One host: the "shm" all_reduce side by side with its peers and with the copy bound.

    zerocomm-bench shm                              # n = 2 and 4, float32, 8 B and 16 MiB
    zerocomm-bench shm --nprocs 2 --json docs/bench/shm.json

Each world runs under ``mpiexec -n N``; in the same processes, interleaved round by round
(A B C ... A B C ...), so a load change touches every variant alike:

* MPICH: mpi4py ``Allreduce`` in place on the tensor's memory;
* torch gloo: ``torch.distributed.all_reduce`` on torch's own gloo group (a FileStore);
* zerocomm ``algorithm="shm"``, ``"ring"`` and ``"native"`` (over its MPI backend), through the public API;
* zerocomm shm zero-copy: the tensor comes from ``zerocomm.comm.shared_empty``;
* the copy bound: one ``copy_`` of S bytes on every rank at once.  An all_reduce must read every
  rank's input and write every rank's output at least once, so it moves at least what this copy
  moves; "of bound" is the bound's time over the variant's (1 = at the bound).

Then a 16 MiB broadcast and all_gather (S as nccl-tests counts it: the gathered output) the same way:
MPICH (``Bcast``, ``Allgather``), torch gloo, zerocomm ``algorithm="shm"`` and the same copy bound (every
rank's S bytes of output must be written once; what is read into them comes from a peer).

Times are per call: ``iters`` calls back to back after warm-up, averaged (nccl-tests' way), the
median over rounds, the slowest rank.  Timings, not assertions: compare within one run only.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = (8, 16 << 20)
VARIANTS = ("MPICH (mpi4py Allreduce)", "torch gloo", "zerocomm native (mpi)", "zerocomm ring", "zerocomm shm",
            "zerocomm shm zero-copy", "copy bound (copy_)")
#: The data-movement collectives measured beside the copy bound, at the largest size.
MOVEMENT = ("broadcast", "all_gather")
MOVEMENT_VARIANTS = ("MPICH", "torch gloo", "zerocomm shm", "copy bound (copy_)")


def _schedule(nbytes: int) -> tuple[int, int]:
    """(calls per round, rounds) for a message size."""
    return (200, 15) if nbytes <= 4096 else (4, 7)


def _timed(variants: dict, per_round: int, rounds: int, barrier) -> dict:
    """Median seconds per call of each variant, interleaved round by round (after 3 warm-up calls each)."""
    times = {name: [] for name in variants}
    for call in variants.values():  # warm-up: arenas, connections, caches
        for _ in range(3):
            call()
    for _ in range(rounds):
        for name, call in variants.items():
            barrier()
            start = time.perf_counter()
            for _ in range(per_round):
                call()
            times[name].append((time.perf_counter() - start) / per_round)
    return {name: statistics.median(values) for name, values in times.items()}


def _movement_variants(td, dist, raw, rank: int, n: int, nbytes: int) -> dict:
    """``{collective: {variant: call}}`` of the 16 MiB data movement (S = the broadcast buffer, the gathered output)."""
    import torch
    numel = nbytes // 4
    source, target = torch.ones(numel), torch.empty(numel)
    buffer = torch.ones(numel)
    mine, gathered = torch.full((numel // n,), float(rank)), torch.empty(numel // n * n)
    bound = {"copy bound (copy_)": lambda: target.copy_(source)}
    return {
        "broadcast": {"MPICH": lambda: raw.Bcast(buffer.numpy(), root=0), "torch gloo": lambda: td.broadcast(buffer, 0),
                      "zerocomm shm": lambda: dist.broadcast(buffer, 0, algorithm="shm"), **bound},
        "all_gather": {"MPICH": lambda: raw.Allgather(mine.numpy(), gathered.numpy()),
                       "torch gloo": lambda: td.all_gather_into_tensor(gathered, mine),
                       "zerocomm shm": lambda: dist.all_gather_into_tensor(gathered, mine, algorithm="shm"), **bound},
    }


def worker(folder: str, out_path: str) -> None:
    import datetime

    import torch
    import torch.distributed as td
    from mpi4py import MPI

    import zerocomm.comm as dist

    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    # torch's own gloo group first: a program that made torch's default group keeps it (zerocomm's world would
    # otherwise become torch's default group, and torch's gloo is the peer measured here).
    td.init_process_group("gloo", init_method=f"file://{folder}/torch", rank=rank, world_size=n,
                          timeout=datetime.timedelta(seconds=300))
    dist.init_process_group("mpi")
    raw = world.Dup()
    results = {}
    for nbytes in SIZES:
        numel = max(1, nbytes // 4)
        tensor = torch.ones(numel)
        shared = dist.shared_empty(numel, torch.float32)
        shared.fill_(1.0)
        source, target = torch.ones(numel), torch.empty(numel)
        array = tensor.numpy()
        variants = {
            "MPICH (mpi4py Allreduce)": lambda: raw.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM),
            "torch gloo": lambda: td.all_reduce(tensor),
            "zerocomm native (mpi)": lambda: dist.all_reduce(tensor, algorithm="native"),
            "zerocomm ring": lambda: dist.all_reduce(tensor, algorithm="ring"),
            "zerocomm shm": lambda: dist.all_reduce(tensor, algorithm="shm"),
            "zerocomm shm zero-copy": lambda: dist.all_reduce(shared, algorithm="shm"),
            "copy bound (copy_)": lambda: target.copy_(source),
        }
        mine = _timed(variants, *_schedule(nbytes), raw.Barrier)
        every = raw.gather(mine, root=0)
        if rank == 0:
            results[str(nbytes)] = {name: max(r[name] for r in every) for name in variants}
    nbytes = SIZES[-1]
    for collective, variants in _movement_variants(td, dist, raw, rank, n, nbytes).items():
        every = raw.gather(_timed(variants, *_schedule(nbytes), raw.Barrier), root=0)
        if rank == 0:
            results[f"{collective} {nbytes}"] = {name: max(r[name] for r in every) for name in variants}
    raw.Barrier()
    td.destroy_process_group()
    dist.destroy_process_group()
    if rank == 0:
        with open(out_path, "w") as handle:
            json.dump(results, handle)


def _run_world(n: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "out.json")
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        subprocess.run([mpiexec if os.path.exists(mpiexec) else "mpiexec", "-n", str(n), sys.executable, "-m",
                        "zerocomm.benchmarks.shm_bench", "--worker", folder, "--out", path], check=True, timeout=900)
        with open(path) as handle:
            return json.load(handle)


def _label(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes} B"


def table(results: dict) -> str:
    """The side-by-side tables: µs per call, × faster than gloo and MPICH, fraction of the copy bound."""
    from tabulate import tabulate
    lines = []
    for n, by_size in results.items():
        for size, times in by_size.items():
            if " " in size:  # "<collective> <bytes>": the data movement, below
                continue
            bound = times["copy bound (copy_)"]
            rows = []
            for name in VARIANTS:
                seconds = times[name]
                rows.append([name, f"{seconds * 1e6:.1f}", f"{times['torch gloo'] / seconds:.2f}",
                             f"{times['MPICH (mpi4py Allreduce)'] / seconds:.2f}", f"{bound / seconds:.2f}"])
            lines.append(f"n={n}, float32 all_reduce of {_label(int(size))} (µs per call, slowest rank)")
            lines.append(tabulate(rows, headers=["variant", "µs", "× faster than gloo", "× faster than MPICH",
                                                 "of copy bound"], disable_numparse=True))
            lines.append("")
        for key, times in by_size.items():
            if " " not in key:
                continue
            collective, size = key.split()
            bound = times["copy bound (copy_)"]
            rows = [[name, f"{times[name] * 1e6:.1f}", f"{times['torch gloo'] / times[name]:.2f}",
                     f"{times['MPICH'] / times[name]:.2f}", f"{bound / times[name]:.2f}"] for name in MOVEMENT_VARIANTS]
            lines.append(f"n={n}, float32 {collective} of {_label(int(size))} (µs per call, slowest rank)")
            lines.append(tabulate(rows, headers=["variant", "µs", "× faster than gloo", "× faster than MPICH",
                                                 "of copy bound"], disable_numparse=True))
            lines.append("")
    return "\n".join(lines)


HELP = ("one host: shm all_reduce beside ring, torch gloo and MPICH, with the copy bound (8 B, 16 MiB); 16 MiB broadcast "
        "and all_gather beside the same bound")

DESCRIPTION = """\
On one host, an 8 B and a 16 MiB float32 all_reduce under mpiexec, every variant in the same
processes, interleaved round by round:

  MPICH (mpi4py Allreduce), torch gloo, zerocomm native (over MPI), ring, shm, and shm zero-copy
  (the tensor from zerocomm.comm.shared_empty); and the copy bound, one copy of S bytes on every
  rank at once, which no all_reduce can beat ("of bound": 1 = at the bound)

Then a 16 MiB broadcast and all_gather (S: the buffer, the gathered output): MPICH, torch gloo and
zerocomm shm beside the same copy bound.

Times are per call (back-to-back calls averaged, the median over rounds, the slowest rank).

Examples:
  zerocomm-bench shm
  zerocomm-bench shm --nprocs 2 --json shm.json
"""


def add_arguments(parser) -> None:
    parser.add_argument("--nprocs", default="2,4", metavar="N[,N...]", help="world sizes, at least 2 (default: 2,4)")
    parser.add_argument("--json", metavar="PATH", help="also write the results and the load as JSON")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)


def run(args) -> int:
    from .options import UsageError
    if args.worker:
        worker(args.worker, args.out)
        return 0
    try:
        sizes = [int(x) for x in args.nprocs.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--nprocs must be comma-separated integers, got {args.nprocs!r}") from None
    if not sizes or min(sizes) < 2:
        raise UsageError(f"--nprocs: world sizes of at least 2, got {args.nprocs!r}")
    before = os.getloadavg()
    results = {str(n): _run_world(n) for n in sizes}
    after = os.getloadavg()
    print(table(results))
    print(f"load average before: {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, after: {after[0]:.2f} "
          f"{after[1]:.2f} {after[2]:.2f} ({os.cpu_count()} cores)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"results": results, "loadavg_before": before, "loadavg_after": after,
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, handle, indent=1)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerocomm.benchmarks.shm_bench", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
