"""Per-call overhead: what zerocomm adds to a small blocking collective, side by side with its peers.

    zerocomm-bench overhead                       # MPI and gloo, 2 ranks, 8 B float32 all_reduce
    zerocomm-bench overhead --iters 20000 --json out.json

Two worlds of 2 ranks run one after the other; within each, every variant runs in the same
processes, interleaved round by round (A B C A B C ...), so a load change on the machine touches
all of them alike:

* MPI (``mpiexec -n 2``): raw mpi4py ``Allreduce`` on the tensor's own memory, then zerocomm's
  ``all_reduce`` on the same tensor with ``algorithm=`` native, recursive_doubling, tree, ring.
* gloo (2 forked processes): torch.distributed's own gloo ``all_reduce``, then zerocomm's
  with the same algorithms.
* In both, zerocomm native once more with ``group=dist.group.WORLD`` (the torch ``ProcessGroup`` that
  stands for the default group) instead of ``group=None``: the cost of resolving a group handle.
* Then, in both, the peer and zerocomm's native, recursive_doubling and tree calls again with the
  per-call mismatch check off (``configure(check=False)``, what ``ZEROCOMM_CHECK=0`` sets): what the
  check costs each of them.  Its rounds run after the first ones, so its ratios are to the peer of
  its own rounds.

Each call is timed on its own (OSU style: per-call latency, the median over calls and ranks'
worst); ratios are to the peer (raw MPI, torch gloo) and to zerocomm native.  The last table
is the ring's memory: the peak extra resident memory of one 64 MiB float32 all_reduce at 2 ranks
(``VmHWM`` reset through ``/proc/self/clear_refs``), against the segment size, with the backend's
native all_reduce beside it.  Results are timings, not assertions: compare them within one run.
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

ALGORITHMS = ("native", "recursive_doubling", "tree", "ring")
#: The algorithms measured again with the mismatch check off (the ring's cost is its schedule, not the check).
UNCHECKED = ("native", "recursive_doubling", "tree")
RSS_BYTES = 64 << 20


def _peak_extra_rss(run) -> float:
    """MiB by which the resident set's peak exceeds the current resident set while ``run()`` runs."""
    def field(name: str) -> int:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(name):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {name} in /proc/self/status")

    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # resets VmHWM to the current VmRSS
    before = field("VmRSS:")
    run()
    return (field("VmHWM:") - before) / 2**20


def _waiting_cpu(dist, rank: int, late_s: float = 2.0) -> float:
    """Percent of a core rank 0 burns while waiting ``late_s`` in an all_reduce for a late rank 1."""
    import resource

    import torch
    tensor = torch.ones(4)
    if rank != 0:
        time.sleep(late_s)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    dist.all_reduce(tensor, algorithm="native")
    after, waited = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - start
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return 100.0 * cpu / waited if rank == 0 else 0.0


#: The native call with the group given as the torch ProcessGroup ``group.WORLD`` returns, not as None.
HANDLE_VARIANT = "zerocomm native, group=group.WORLD"


def _through_handle(dist, tensor):
    world = dist.group.WORLD
    return lambda: dist.all_reduce(tensor, group=world, algorithm="native")


def _rounds(variants: dict, iters: int, barrier) -> dict:
    """Per-call seconds of each variant, interleaved in rounds of 100 calls."""
    times = {name: [] for name in variants}
    for name, call in variants.items():  # warm-up: first calls set up buffers, caches, connections
        for _ in range(50):
            call()
    done = 0
    while done < iters:
        for name, call in variants.items():
            barrier()
            bucket = times[name]
            for _ in range(100):
                start = time.perf_counter()
                call()
                bucket.append(time.perf_counter() - start)
        done += 100
    return times


def _summary(times: dict) -> dict:
    return {name: statistics.median(values) * 1e6 for name, values in times.items()}


def _unchecked(dist, peer: str, call, tensor, iters: int, barrier) -> dict:
    """Per-call µs of the peer's ``call`` and of zerocomm's ``UNCHECKED`` algorithms with the mismatch check
    off (every rank switches it off, and back to what it was, at the same point)."""
    variants = {peer: call}
    for algorithm in UNCHECKED:
        variants[f"zerocomm {algorithm}"] = (lambda a=algorithm: dist.all_reduce(tensor, algorithm=a))
    checking = dist.configure().check
    dist.configure(check=False)
    try:
        return _summary(_rounds(variants, iters, barrier))
    finally:
        dist.configure(check=checking)


def mpi_worker(iters: int) -> dict:
    import torch
    from mpi4py import MPI

    import zerocomm.comm as dist
    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD.Dup()
    tensor = torch.ones(2)
    raw = tensor.numpy()
    variants = {"raw mpi4py Allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM)}
    for algorithm in ALGORITHMS:
        variants[f"zerocomm {algorithm}"] = (lambda a=algorithm: dist.all_reduce(tensor, algorithm=a))
    variants[HANDLE_VARIANT] = _through_handle(dist, tensor)
    result = _summary(_rounds(variants, iters, comm.Barrier))
    unchecked = _unchecked(dist, "raw mpi4py Allreduce", variants["raw mpi4py Allreduce"], tensor, iters, comm.Barrier)
    dist.configure(segment_bytes=4 << 20)
    big = torch.ones(RSS_BYTES // 4)
    rss = {algorithm: _peak_extra_rss(lambda a=algorithm: dist.all_reduce(big, algorithm=a))
           for algorithm in ("native", "ring", "ring")}  # ring twice: the second run is the steady state
    rss["waiting_cpu_percent"] = _waiting_cpu(dist, comm.Get_rank())
    both = comm.gather([result, rss, unchecked], root=0)
    dist.destroy_process_group()
    return _worst(both) if comm.Get_rank() == 0 else None


def _worst(per_rank: list) -> list:
    """Each figure's worst (largest) value over the ranks' ``[latency, rss, latency with the check off]``."""
    return [{key: max(rank[part][key] for rank in per_rank) for key in per_rank[0][part]}
            for part in range(len(per_rank[0]))]


def gloo_worker(rank: int, iters: int, folder: str, out) -> None:
    import datetime

    import torch
    import torch.distributed as td

    import zerocomm.comm as dist
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=120)
    td.init_process_group("gloo", init_method=f"file://{folder}/torch", rank=rank, world_size=2, timeout=timeout)
    dist.init_process_group("gloo", init_method=f"file://{folder}/zerocomm", rank=rank, world_size=2,
                            timeout=timeout)
    tensor = torch.ones(2)
    variants = {"torch.distributed gloo": lambda: td.all_reduce(tensor)}
    for algorithm in ALGORITHMS:
        variants[f"zerocomm {algorithm}"] = (lambda a=algorithm: dist.all_reduce(tensor, algorithm=a))
    variants[HANDLE_VARIANT] = _through_handle(dist, tensor)
    result = _summary(_rounds(variants, iters, td.barrier))
    unchecked = _unchecked(dist, "torch.distributed gloo", variants["torch.distributed gloo"], tensor, iters,
                           td.barrier)
    big = torch.ones(RSS_BYTES // 4)
    rss = {algorithm: _peak_extra_rss(lambda a=algorithm: dist.all_reduce(big, algorithm=a))
           for algorithm in ("native", "ring", "ring")}
    both = [None, None]
    td.all_gather_object(both, [result, rss, unchecked])
    dist.destroy_process_group()
    td.destroy_process_group()
    if rank == 0:
        out.write(json.dumps(_worst(both)))


def _run_mpi(iters: int) -> list:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "mpi.json")
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        subprocess.run([mpiexec if os.path.exists(mpiexec) else "mpiexec", "-n", "2", sys.executable, "-m",
                        "zerocomm.benchmarks.overhead", "--worker", "mpi", "--iters", str(iters), "--out", path],
                       check=True, timeout=600)
        with open(path) as handle:
            return json.load(handle)


def _run_gloo(iters: int) -> list:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "gloo.json")
        children = []
        for rank in range(2):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    with open(path if rank == 0 else os.devnull, "w") as out:
                        gloo_worker(rank, iters, folder, out)
                except BaseException:  # the parent reports the failed rank
                    import traceback
                    traceback.print_exc()
                    code = 1
                os._exit(code)
            children.append(pid)
        for pid in children:
            _, status = os.waitpid(pid, 0)
            if status != 0:
                raise RuntimeError(f"gloo rank (pid {pid}) failed with status {status}")
        with open(path) as handle:
            return json.load(handle)


def _tables(results: dict) -> str:
    from tabulate import tabulate
    lines = []
    for backend, peer in (("mpi", "raw mpi4py Allreduce"), ("gloo", "torch.distributed gloo")):
        if backend not in results:
            continue
        latency, _, unchecked = results[backend]
        for title, figures in (("", latency), (", mismatch check off", unchecked)):
            native = figures["zerocomm native"]
            rows = [[name, f"{us:.1f}", f"{us / figures[peer]:.2f}", f"{us / native:.2f}"]
                    for name, us in figures.items()]
            lines.append(f"{backend}, 2 ranks, 8 B float32 all_reduce, blocking{title} "
                         f"(median per-call µs, worst rank)")
            lines.append(tabulate(rows, headers=["variant", "µs", f"× {peer}", "× zerocomm native"]))
            lines.append("")
    rows = []
    for backend in ("mpi", "gloo"):
        if backend in results:
            rss = results[backend][1]
            rows.append([backend, f"{rss['native']:.1f}", f"{rss['ring']:.1f}", "8.0"])
    lines.append("peak extra RSS of one 64 MiB float32 all_reduce, 2 ranks (MiB, worst rank; segments of 4 MiB)")
    lines.append(tabulate(rows, headers=["backend", "native", "ring", "2 segments"]))
    if "mpi" in results:
        lines.append(f"\nmpi: a rank waiting 2 s in all_reduce for a late peer used "
                     f"{results['mpi'][1]['waiting_cpu_percent']:.2f} % of a core")
    return "\n".join(lines)


HELP = "per-call overhead of a small blocking all_reduce against raw mpi4py and torch's gloo; the ring's memory"

DESCRIPTION = """\
What zerocomm adds to a small blocking collective: an 8 B float32 all_reduce at 2 ranks, timed
call by call (median per-call latency, the slowest rank), beside its peer in the same processes,
interleaved round by round so that load on the machine touches every variant alike:

  mpi   raw mpi4py Allreduce, then zerocomm's all_reduce (native, recursive_doubling, tree, ring)
  gloo  torch.distributed's own all_reduce, then zerocomm's with the same algorithms

then the same calls with the mismatch check off (ZEROCOMM_CHECK=0), and the ring's peak extra
memory for one 64 MiB all_reduce.  Compare numbers within one run only.

Examples:
  zerocomm-bench overhead
  zerocomm-bench overhead --backends gloo --iters 20000 --json overhead.json
"""


def add_arguments(parser) -> None:
    parser.add_argument("--iters", type=int, default=5000, metavar="N",
                        help="timed calls per variant, at least 100 (default: 5000)")
    parser.add_argument("--backends", default="mpi,gloo", metavar="B[,B...]", help="mpi, gloo (default: mpi,gloo)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--worker", choices=("mpi",), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)


def run(args) -> int:
    """Run the comparison (or, with ``--worker mpi``, one MPI rank of it); the exit status."""
    from .options import UsageError
    if args.iters < 100:
        raise UsageError(f"--iters must be at least 100, got {args.iters}")
    if args.worker == "mpi":
        result = mpi_worker(args.iters)
        from mpi4py import MPI
        if MPI.COMM_WORLD.Get_rank() == 0:
            with open(args.out, "w") as handle:
                json.dump(result, handle)
        return 0
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in ("mpi", "gloo")]
    if unknown:
        raise UsageError(f"--backends: unknown {unknown}; choose from mpi, gloo")
    results = {}
    if "mpi" in backends:
        results["mpi"] = _run_mpi(args.iters)
    if "gloo" in backends:
        results["gloo"] = _run_gloo(args.iters)
    load = os.getloadavg()
    print(_tables(results))
    print(f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"results": results, "loadavg": load}, handle, indent=1)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerocomm.benchmarks.overhead", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
