"""Soak: thousands of randomized collectives, every result checked against numpy, resident memory recorded.

    zerocomm-bench soak                          # gloo, 2 forked ranks, 10000 calls
    zerocomm-bench soak --backend mpi --nprocs 3 --calls 10000

Every rank draws the same sequence of calls from one seeded generator: a random collective,
reduction op, element count (0 to 64 Ki), algorithm (native, auto, or one of zerocomm's that serves
the collective) and whether it runs async (up to 8 async calls in flight, waited in random
order).  Each rank's input for call ``i`` is a function of ``(seed, i, rank)``, integer-valued, so
every rank recomputes the exact expected result with numpy and compares it bit for bit.  A drawn
cell that zerocomm does not serve (``UnsupportedError`` on every rank) is counted as refused.  The
resident set (``VmRSS``) is sampled every 100 calls; growth is measured from the end of the
warm-up (the first 10 % of calls) to the end.  Rank 0 prints the summary; the exit status is 1 if
any result was wrong or a call raised.
"""
from __future__ import annotations

import os
import sys
import time

HELP = "randomized collectives, each verified against numpy; resident-memory growth after warm-up"

DESCRIPTION = """\
Runs thousands of randomly drawn collectives (op, size 0 to 64 Ki elements, algorithm, blocking or
async with up to 8 in flight) and checks every result bit for bit against numpy; samples the
resident memory every 100 calls and reports its growth after the warm-up (the first 10% of calls).
Exit status 1 when a result was wrong or a call raised.

Examples:
  zerocomm-bench soak
  zerocomm-bench soak --backend mpi --nprocs 3 --calls 10000
"""

SIZES = (0, 1, 3, 8, 61, 1000, 4096, 65536)
OPS = ("sum", "max", "min", "product")
#: Drawn for every collective; a cell zerocomm does not serve raises UnsupportedError on every rank alike
#: before anything moves, and the call is counted as refused (only the public API is used here).
ALGORITHM_CHOICES = ("native", "auto", "ring", "tree", "recursive_doubling", "shm")
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter", "reduce_scatter",
               "all_to_all", "barrier")


def add_arguments(parser) -> None:
    parser.add_argument("--backend", default="gloo", choices=("gloo", "mpi"), help="backend (default: gloo)")
    parser.add_argument("--nprocs", type=int, default=2, metavar="N", help="ranks (default: 2)")
    parser.add_argument("--calls", type=int, default=10000, metavar="N", help="collectives to run (default: 10000)")
    parser.add_argument("--seed", type=int, default=1, metavar="N", help="seed of the call sequence (default: 1)")


def _rss() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _data(seed: int, index: int, rank: int, numel: int, op: str):
    import numpy as np
    rng = np.random.default_rng([seed, index, rank])
    low, high = (1, 3) if op == "product" else (-4, 5)  # exact in float32 at any order of reduction
    return rng.integers(low, high, size=numel).astype(np.float32)


def _reduce(arrays, op: str):
    import numpy as np
    fn = {"sum": np.sum, "max": np.max, "min": np.min, "product": np.prod}[op]
    return fn(np.stack(arrays), axis=0).astype(np.float32)


def _plan(rng, n: int):
    """One random call: (collective, op, numel per rank, root, algorithm, async)."""
    collective = COLLECTIVES[rng.integers(len(COLLECTIVES))]
    op = OPS[rng.integers(len(OPS))]
    numel = int(SIZES[rng.integers(len(SIZES))])
    root = int(rng.integers(n))
    choices = ALGORITHM_CHOICES
    algorithm = choices[rng.integers(len(choices))]
    return collective, op, numel, root, algorithm, bool(rng.random() < 0.3)


def _issue(dist, torch, seed: int, index: int, rank: int, n: int, plan):
    """Start call ``index``; return (work or None, verify()) where verify() -> bool."""
    import numpy as np
    collective, op, numel, root, algorithm, async_op = plan
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
           "product": dist.ReduceOp.PRODUCT}
    kw = {"async_op": async_op, "algorithm": algorithm}
    mine = _data(seed, index, rank, numel, op)
    everyone = [_data(seed, index, r, numel, op) for r in range(n)]
    x = torch.from_numpy(mine.copy())
    if collective == "all_reduce":
        work = dist.all_reduce(x, op=ops[op], **kw)
        return work, lambda: np.array_equal(x.numpy(), _reduce(everyone, op))
    if collective == "broadcast":
        work = dist.broadcast(x, src=root, **kw)
        return work, lambda: np.array_equal(x.numpy(), everyone[root])
    if collective == "reduce":
        work = dist.reduce(x, dst=root, op=ops[op], **kw)
        return work, lambda: rank != root or np.array_equal(x.numpy(), _reduce(everyone, op))
    if collective == "all_gather":
        out = torch.empty(n * numel)
        work = dist.all_gather_into_tensor(out, x, **kw)
        return work, lambda: np.array_equal(out.numpy(), np.concatenate(everyone))
    if collective == "gather":
        outs = [torch.empty(numel) for _ in range(n)] if rank == root else None
        work = dist.gather(x, outs, dst=root, **kw)
        return work, lambda: rank != root or all(np.array_equal(o.numpy(), e) for o, e in zip(outs, everyone))
    if collective == "scatter":
        parts = [torch.from_numpy(_data(seed, index, 1000 + r, numel, op)) for r in range(n)] if rank == root else None
        out = torch.empty(numel)
        work = dist.scatter(out, parts, src=root, **kw)
        return work, lambda: np.array_equal(out.numpy(), _data(seed, index, 1000 + rank, numel, op))
    if collective == "reduce_scatter":
        big = [_data(seed, index, r, n * numel, op) for r in range(n)]
        out = torch.empty(numel)
        work = dist.reduce_scatter_tensor(out, torch.from_numpy(big[rank].copy()), op=ops[op], **kw)
        return work, lambda: np.array_equal(out.numpy(), _reduce(big, op)[rank * numel:(rank + 1) * numel])
    if collective == "all_to_all":
        big = [_data(seed, index, r, n * numel, op) for r in range(n)]
        out = torch.empty(n * numel)
        work = dist.all_to_all_single(out, torch.from_numpy(big[rank].copy()), **kw)
        expected = np.concatenate([big[r][rank * numel:(rank + 1) * numel] for r in range(n)])
        return work, lambda: np.array_equal(out.numpy(), expected)
    work = dist.barrier(async_op=async_op, algorithm=algorithm)
    return work, lambda: True


def soak(dist, calls: int, seed: int) -> dict:
    """Run ``calls`` random collectives on the initialized default group; this rank's counts and RSS samples."""
    import numpy as np
    import torch
    rank, n = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(seed)
    pending, wrong, refused, errors, samples = [], 0, 0, [], []
    warm = max(1, calls // 10)
    start = time.monotonic()
    index, ran = -1, 0
    while ran < calls:  # ``calls`` collectives run; refused draws do not count
        index += 1
        plan = _plan(rng, n)
        try:
            work, verify = _issue(dist, torch, seed, index, rank, n, plan)
        except dist.UnsupportedError:
            refused += 1
            continue
        except Exception as error:  # any other error is a failure, reported by name
            errors.append(f"call {index} {plan}: {type(error).__name__}: {error}")
            break
        ran += 1
        if work is None:
            wrong += not verify()
        else:
            pending.append((work, verify))
        if len(pending) >= 8 or (pending and rng.random() < 0.2):
            order = rng.permutation(len(pending))
            for position in order:
                work, verify = pending[position]
                work.wait()
                wrong += not verify()
            pending = []
        if ran % 100 == 0 or ran == warm:
            samples.append((ran, _rss()))
    for work, verify in pending:
        work.wait()
        wrong += not verify()
    samples.append((calls, _rss()))
    return {"rank": rank, "wrong": int(wrong), "refused": refused, "errors": errors, "seconds": time.monotonic() - start,
            "samples": samples, "warm": warm}


def _summary(result: dict, backend: str, n: int, calls: int) -> str:
    samples = dict(result["samples"])
    warm_rss = samples.get(result["warm"]) or result["samples"][0][1]
    end_rss = result["samples"][-1][1]
    growth = (end_rss - warm_rss) / warm_rss * 100 if warm_rss else float("nan")
    load = os.getloadavg()
    return (f"soak: backend {backend}, {n} ranks, {calls} calls run ({result['refused']} more draws refused "
            f"as unsupported cells) in {result['seconds']:.1f} s; wrong results "
            f"(all ranks): {result['wrong']}; errors: {len(result['errors'])}\n"
            f"rank 0 RSS: {warm_rss / 2**20:.1f} MiB after warm-up (call {result['warm']}), {end_rss / 2**20:.1f} MiB "
            f"at the end: growth {growth:+.2f} %\n"
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)")


def _body(spec, calls: int, seed: int) -> int:
    import torch

    import zerocomm.comm as dist
    dist.init_process_group(**spec.kwargs())
    result = soak(dist, calls, seed)
    totals = torch.tensor([result["wrong"], len(result["errors"])], dtype=torch.int64)
    dist.all_reduce(totals)
    for line in result["errors"][:3]:
        print(f"[rank {result['rank']}] {line}", file=sys.stderr)
    if result["rank"] == 0:
        result["wrong"] = int(totals[0])
        result["errors"] = ["x"] * int(totals[1])
        print(_summary(result, dist.get_backend(), dist.get_world_size(), calls), flush=True)
    dist.destroy_process_group()
    return 1 if int(totals[0]) or int(totals[1]) else 0


def run(args) -> int:
    from .launch import run_world
    from .options import UsageError
    if args.calls < 10 or args.nprocs < 1:
        raise UsageError(f"--calls must be at least 10 and --nprocs at least 1, got {args.calls}, {args.nprocs}")
    return run_world("soak", args, lambda spec: _body(spec, args.calls, args.seed))


def main(argv=None) -> int:
    from .launch import module_main
    return module_main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
