"""What the mismatch check costs a small blocking all_reduce: off, the default (hash), the full check (debug).

    zerocomm-bench check-cost                     # gloo, 2 forked ranks, 8 B float32
    zerocomm-bench check-cost --backend mpi

The three variants run in the same processes, interleaved round by round (off, hash, full,
off, ...), so a load change touches all of them alike; each round times ``--iters`` back-to-back
calls after 200 untimed ones, and the table gives the median over rounds of microseconds per
call on rank 0, and the cost over "off".  Timings, not assertions: compare within one run.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

HELP = "cost of the per-call mismatch check on a small all_reduce (off / default hash / full debug check)"

DESCRIPTION = """\
What the cross-rank mismatch check costs a small blocking all_reduce, in three variants run in
the same processes, interleaved round by round:

  off   ZEROCOMM_CHECK=0
  hash  the default: every call's signature checked across ranks
  full  ZEROCOMM_DEBUG=1: the full fingerprint, with a readable message on a mismatch

and prints the median over rounds of µs per call on rank 0, and the cost over "off".

Examples:
  zerocomm-bench check-cost
  zerocomm-bench check-cost --backend mpi --bytes 4096
"""
VARIANTS = {"off": {"check": False, "debug": False}, "hash": {"check": True, "debug": False},
            "full": {"check": True, "debug": True}}


def add_arguments(parser) -> None:
    parser.add_argument("--backend", default="gloo", choices=("gloo", "mpi"), help="backend (default: gloo)")
    parser.add_argument("--nprocs", type=int, default=2, metavar="N", help="ranks (default: 2)")
    parser.add_argument("--iters", type=int, default=2000, metavar="N", help="timed calls per round (default: 2000)")
    parser.add_argument("--rounds", type=int, default=3, metavar="N", help="rounds (default: 3)")
    parser.add_argument("--bytes", type=int, default=8, metavar="S",
                        help="message size in bytes, float32 (default: 8)")


def _body(spec, args) -> int:
    import torch

    import zerocomm.comm as dist
    dist.init_process_group(**spec.kwargs())
    tensor = torch.ones(max(1, args.bytes // 4))
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, fields in VARIANTS.items():
            dist.configure(**fields)
            for _ in range(200):
                dist.all_reduce(tensor)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                dist.all_reduce(tensor)
            times[name].append((time.perf_counter() - start) / args.iters * 1e6)
    if dist.get_rank() == 0:
        off = statistics.median(times["off"])
        print(f"# mismatch check cost: {dist.get_backend()}, {dist.get_world_size()} ranks, {tensor.numel() * 4} B "
              f"float32 all_reduce, median of {args.rounds} rounds x {args.iters} calls")
        print(f"{'variant':>8} {'us/call':>10} {'vs off':>8}")
        for name in VARIANTS:
            value = statistics.median(times[name])
            print(f"{name:>8} {value:>10.1f} {100 * (value / off - 1):>+7.0f}%")
        load = os.getloadavg()
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)", flush=True)
    dist.destroy_process_group()
    return 0


def run(args) -> int:
    from .launch import run_world
    from .options import UsageError
    if args.iters < 10 or args.rounds < 1 or args.nprocs < 2 or args.bytes < 1:
        raise UsageError("--iters >= 10, --rounds >= 1, --nprocs >= 2 and --bytes >= 1 are needed")
    return run_world("check-cost", args, lambda spec: _body(spec, args))


def main(argv=None) -> int:
    from .launch import module_main
    return module_main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
