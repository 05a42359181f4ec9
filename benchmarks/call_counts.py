"""Host cost of one call: Python function calls per collective call, per kind, against torch's own.

    zerocomm-bench call-counts                          # gloo, 2 forked ranks
    zerocomm-bench call-counts --backend mpi            # MPI, under mpiexec -n 2
    zerocomm-bench call-counts --backend nccl-standin   # the NCCL backend's path, without a GPU

On a GPU the host path is a call's cost, so the count of Python function calls one call makes
(cProfile, builtins included) is the figure this machine gives without one.  Each kind runs
``--warmup`` calls, then ``--calls`` calls under the profiler on the calling thread; the table gives
calls per call, the largest over ranks.  On gloo, torch's own ``torch.distributed`` call on a gloo
group of the same ranks stands beside each kind (torch's default group is zerocomm's world, so the
peer runs on a group made with ``new_group(backend="gloo")``).  Work done on a group's executor
thread is not on the calling thread and is not counted: the last column says whether the kind
started one.

``--backend nccl-standin`` counts the NCCL backend's path where no GPU is: the world runs on
``NcclHostStandIn``, the NCCL backend's own class and methods (its ``NATIVE`` and ``ISSUE`` tables, its
``reduce_stage``) with torch's ``ProcessGroupGloo`` and CPU tensors in place of ``ProcessGroupNCCL`` and CUDA
tensors, planned and checked as an NCCL group is (the mismatch check through ``Backend.reduce_stage``, never a
shared-memory round).  The six native kinds are counted with the check on and with it off
(``configure(check=False)``, as ``ZEROCOMM_CHECK=0``), beside torch's own call on a gloo group.  torch's
Python is the same for an NCCL group: ``torch.distributed``'s ``all_reduce``, ``all_gather_single`` and
``reduce_scatter_single`` (``distributed_c10d.py``) branch on no backend and end in one call into the
process group; only ``broadcast`` differs, asking ``torch.cuda.get_device_capability`` of a CUDA tensor
(FP8 on older GPUs), so torch's NCCL broadcast makes more calls than its count here (over a dozen more, by
that function's source: device properties, lazy initialization, the device index).  These are
host-side Python calls only: what a call costs on the device, and in host time, must be measured on a GPU
(``zerocomm-bench gpu --sections calls``).
"""
from __future__ import annotations

import cProfile
import pstats
import sys

HELP = "Python function calls per collective call, per kind, beside torch's own"

DESCRIPTION = """\
Counts the Python function calls (cProfile, builtins included) one collective call makes on the calling
thread, after a warm-up, for each kind: all_reduce of 8 bytes (SUM, MAX, async + wait),
all_gather_into_tensor, reduce_scatter_tensor and broadcast with algorithm="native", and the default
algorithm on all_reduce of 256 KiB and all_gather. On gloo, torch's own call stands beside each kind.

--backend nccl-standin counts the NCCL backend's own Python (its methods, the mismatch check it gets, the
one planned path) over gloo's process group and CPU tensors, with the check on and off, beside torch's
call: host-side Python calls only; device time must be measured on a GPU (zerocomm-bench gpu).

Examples:
  zerocomm-bench call-counts
  zerocomm-bench call-counts --backend mpi --calls 200
  zerocomm-bench call-counts --backend nccl-standin
"""

#: The stand-in of the NCCL backend: its own methods over gloo's process group (``NcclHostStandIn``).
NCCL_STANDIN = "nccl-standin"


def add_arguments(parser) -> None:
    parser.add_argument("--backend", default="gloo", choices=("gloo", "mpi", NCCL_STANDIN),
                        help=f"backend (default: gloo); {NCCL_STANDIN}: the NCCL backend's Python over gloo")
    parser.add_argument("--nprocs", type=int, default=2, metavar="N", help="ranks (default: 2)")
    parser.add_argument("--calls", type=int, default=100, metavar="N", help="profiled calls per kind (default: 100)")
    parser.add_argument("--warmup", type=int, default=20, metavar="N", help="calls before profiling (default: 20)")


def _kinds(dist, torch, n: int):
    """(name, zerocomm call, torch's call on ``peer`` or None): each a function of the torch group."""
    small = torch.ones(2)
    big = torch.ones(64 << 10)
    shard, full = torch.ones(4), torch.empty(4 * n)
    native = {"algorithm": "native"}

    return [
        ("all_reduce 8 B SUM", lambda: dist.all_reduce(small, **native),
         lambda td, g: td.all_reduce(small, group=g)),
        ("all_reduce 8 B MAX", lambda: dist.all_reduce(small, op=dist.ReduceOp.MAX, **native),
         lambda td, g: td.all_reduce(small, op=td.ReduceOp.MAX, group=g)),
        ("all_reduce async + wait", lambda: dist.all_reduce(small, async_op=True, **native).wait(),
         lambda td, g: td.all_reduce(small, group=g, async_op=True).wait()),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(full, shard, **native),
         lambda td, g: getattr(td, "all_gather_single", td.all_gather_into_tensor)(full, shard, group=g)),
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(shard, full, **native),
         lambda td, g: getattr(td, "reduce_scatter_single", td.reduce_scatter_tensor)(shard, full, group=g)),
        ("broadcast", lambda: dist.broadcast(small, 0, **native),
         lambda td, g: td.broadcast(small, 0, group=g)),
        ("default algorithm: all_reduce 256 KiB", lambda: dist.all_reduce(big), None),
        ("default algorithm: all_gather", lambda: dist.all_gather_into_tensor(full, shard), None),
    ]


def _count(call, calls: int, warmup: int) -> float:
    for _ in range(warmup):
        call()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    return pstats.Stats(profile).total_calls / calls


def _body(spec, args) -> int:
    import threading

    import torch
    import torch.distributed as td

    import zerocomm.comm as dist

    torch.set_num_threads(1)
    dist.init_process_group(**spec.kwargs())
    n = dist.get_world_size()
    standin = args.backend == NCCL_STANDIN
    peer = td.new_group(backend="gloo") if args.backend != "mpi" and td.is_initialized() else None
    # The stand-in counts the native kinds only: an NCCL group has no shared-memory default to count.
    kinds = [kind for kind in _kinds(dist, torch, n) if not standin or kind[2] is not None]
    rows = []
    if standin:
        dist.configure(check=True)  # the first column with the check on, whatever ZEROCOMM_CHECK says
    for name, ours, theirs in kinds:
        before = threading.active_count()
        mine = _count(ours, args.calls, args.warmup)
        started = threading.active_count() > before
        torch_count = _count(lambda: theirs(td, peer), args.calls, args.warmup) if peer and theirs else None
        rows.append([mine, -1.0 if torch_count is None else torch_count, float(started)])
    if standin:
        dist.configure(check=False)  # every plan is made again, without the check
        for row, (name, ours, _) in zip(rows, kinds):
            before = threading.active_count()
            row.append(_count(ours, args.calls, args.warmup))
            row[2] = max(row[2], float(threading.active_count() > before))
        dist.configure(check=True)
    table = torch.tensor(rows, dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        import os
        print(f"# Python function calls per call on the calling thread (cProfile, builtins included), after "
              f"{args.warmup} warm-up calls, mean of {args.calls}, worst rank; {dist.get_backend()}, {n} ranks; "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(_standin_table(kinds, table.tolist()) if standin else _table(kinds, table.tolist()))
    if peer is not None:
        td.destroy_process_group(peer)
    dist.destroy_process_group()
    return 0


def _table(kinds, rows) -> str:
    from tabulate import tabulate
    lines = []
    for (name, _, _), (mine, theirs, started) in zip(kinds, rows):
        lines.append([name, f"{mine:.0f}", "" if theirs < 0 else f"{theirs:.0f}",
                      "" if theirs <= 0 else f"{mine / theirs:.2f}", "yes" if started else ""])
    return tabulate(lines, headers=["call", "zerocomm", "torch", "× torch", "executor thread started"])


def _standin_table(kinds, rows) -> str:
    from tabulate import tabulate
    lines = []
    for (name, _, _), (checked, theirs, started, unchecked) in zip(kinds, rows):
        lines.append([name, f"{checked:.0f}", f"{unchecked:.0f}", "" if theirs < 0 else f"{theirs:.0f}",
                      "" if theirs <= 0 else f"{checked / theirs:.2f}",
                      "" if theirs <= 0 else f"{unchecked / theirs:.2f}", "yes" if started else ""])
    return ("# the NCCL backend's own methods over gloo's ProcessGroupGloo and CPU tensors (NcclHostStandIn), "
            "checked through Backend.reduce_stage;\n"
            "# torch: torch.distributed's call on a gloo group (the same Python as on an NCCL group, but for "
            "broadcast, whose CUDA capability query adds over a dozen calls on a GPU).\n"
            "# Host-side Python calls only: device time must be measured on a GPU (zerocomm-bench gpu --sections "
            "calls).\n"
            + tabulate(lines, headers=["call", "zerocomm, check on", "check off", "torch", "× torch (on)",
                                       "× torch (off)", "executor thread started"]))


def run(args) -> int:
    from .launch import run_world
    from .options import UsageError
    if args.calls < 1 or args.warmup < 0 or args.nprocs < 1:
        raise UsageError(f"--calls must be at least 1, --warmup at least 0 and --nprocs at least 1, got "
                         f"{args.calls}, {args.warmup}, {args.nprocs}")
    return run_world("call-counts", args, lambda spec: _body(spec, args))


def main(argv=None) -> int:
    from .launch import module_main
    return module_main(sys.modules[__name__], argv)
