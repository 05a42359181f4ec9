"""Kill sweep: a rank killed at a random moment of a call, and what every survivor did.

    zerocomm-bench kills                         # 200 kills, gloo, 3 ranks
    zerocomm-bench kills --kills 24 --seed 7     # a short version

Each kill is one fresh world of ``--nprocs`` forked gloo ranks (a FileStore in a temporary folder).
The ranks make one kind of call in a loop, the kinds drawn in turn (``KINDS``): all_reduce by each
algorithm -- ring, tree, recursive doubling, shm, native, hierarchical (the last over pretend hosts,
``ZEROCOMM_HOST``) --, every other collective and list form with the algorithm left to auto, the
point-to-point calls (a ring of ``isend``/``irecv``, and ``send``/``recv`` pairs), and a ZeRO-3 training
step; a collective on a tensor of a drawn size.  Once every rank has finished a warm-up call, this
process waits a random 0-20 ms and sends ``SIGKILL`` to a random rank.  Every survivor must raise a
typed error (a ``CommError`` of ``zerocomm.comm.errors``: ``PeerError`` for a peer gone,
``CommTimeoutError``; or a ``ZeroError`` of ``zerocomm.zero.errors``) within ``--bound`` seconds of the
kill; one that answers later is "late", one that has not answered by the group's deadline plus a grace
is "hung" (then killed), one that raised anything else is "untyped".  Every completed call's result is
checked: a wrong one counts as "wrong".  The table gives, per kind, the kills, typed errors, untyped,
wrong, late and hung survivors and the worst time from the kill to a survivor's error.  Exit status 1
when a survivor was hung, late, wrong or raised an untyped error.
"""
from __future__ import annotations

import collections
import datetime
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time

HELP = "kill a rank at random moments of collectives; every survivor must raise a typed error in time"

DESCRIPTION = """\
Kills one rank at a random moment of a call -- all_reduce by each algorithm (ring, tree, recursive
doubling, shm, native, hierarchical), every other collective, send/recv, isend/irecv, a ZeRO-3 step --
in a fresh world of forked gloo ranks per kill, and checks that every survivor raises a typed zerocomm
error (PeerError, CommTimeoutError, a ZeroError) within --bound seconds, never hangs, never returns a
wrong result.  Exit status 1 when a survivor hung, was late or wrong or raised an untyped error.

Examples:
  zerocomm-bench kills
  zerocomm-bench kills --kills 24 --nprocs 3 --seed 7
"""

ALGORITHMS = ("ring", "tree", "recursive_doubling", "shm", "native", "hierarchical")
#: The kinds of call, drawn in turn: all_reduce by each algorithm, then every other call with auto.
KINDS = tuple(f"all_reduce/{a}" for a in ALGORITHMS) + (
    "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "gather", "scatter", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "send_recv", "isend_irecv", "zero3_step")
#: float32 elements: small (one message), a few segments, and a call that lasts milliseconds.
SIZES = (8, 65536, 1 << 20)
#: Segments small enough that the larger sizes run many pipelined steps.
SEGMENT_BYTES = 64 << 10
#: The group's deadline: far above the bound, so a survivor stuck until its deadline shows as late.
GROUP_TIMEOUT_S = 30.0
HANG_GRACE_S = 5.0
#: Where a typed error's class lives.
TYPED_MODULES = ("zerocomm.comm.errors", "zerocomm.zero.errors")


def add_arguments(parser) -> None:
    parser.add_argument("--kills", type=int, default=200, metavar="N", help="kills, one world each (default: 200)")
    parser.add_argument("--nprocs", type=int, default=3, metavar="N", help="ranks per world, at least 2 (default: 3)")
    parser.add_argument("--bound", type=float, default=5.0, metavar="S",
                        help="seconds from the kill within which every survivor must raise (default: 5)")
    parser.add_argument("--seed", type=int, default=1, metavar="N", help="seed of the draws (default: 1)")


def _caller(kind: str, rank: int, n: int, numel: int):
    """One call of ``kind`` (every rank makes it, in turn): a function making it, returning whether it was right."""
    import torch

    import zerocomm.comm as dist
    total = float(n * (n + 1) // 2)
    mine = torch.full((numel,), float(rank + 1))
    ramp = torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(numel)
    if kind.startswith("all_reduce/"):
        algorithm = kind.split("/")[1]
        tensor = torch.empty(numel)

        def call() -> bool:
            tensor.fill_(rank + 1)
            dist.all_reduce(tensor, algorithm=algorithm)
            return bool((tensor == total).all())
        return call
    if kind == "broadcast":
        tensor = torch.empty(numel)

        def call() -> bool:
            tensor.fill_(rank + 1)
            dist.broadcast(tensor, src=0)
            return bool((tensor == 1).all())
        return call
    if kind == "reduce":
        tensor = torch.empty(numel)

        def call() -> bool:
            tensor.fill_(rank + 1)
            dist.reduce(tensor, dst=0)
            return rank != 0 or bool((tensor == total).all())
        return call
    if kind == "all_gather":
        outs = [torch.empty(numel) for _ in range(n)]
        return lambda: (dist.all_gather(outs, mine), torch.equal(torch.cat(outs), ramp))[1]
    if kind == "all_gather_into_tensor":
        out = torch.empty(n * numel)
        return lambda: (dist.all_gather_into_tensor(out, mine), torch.equal(out, ramp))[1]
    if kind == "gather":
        outs = [torch.empty(numel) for _ in range(n)] if rank == 0 else None
        return lambda: (dist.gather(mine, outs, dst=0), rank != 0 or torch.equal(torch.cat(outs), ramp))[1]
    if kind == "scatter":
        parts = list(ramp.chunk(n)) if rank == 0 else None
        out = torch.empty(numel)
        return lambda: (dist.scatter(out, parts, src=0), bool((out == rank + 1).all()))[1]
    if kind == "reduce_scatter":
        out, parts = torch.empty(numel), [mine] * n
        return lambda: (dist.reduce_scatter(out, parts), bool((out == total).all()))[1]
    if kind == "reduce_scatter_tensor":
        out, whole = torch.empty(numel), mine.repeat(n)
        return lambda: (dist.reduce_scatter_tensor(out, whole), bool((out == total).all()))[1]
    if kind == "all_to_all":
        outs, parts = [torch.empty(numel) for _ in range(n)], [mine] * n
        return lambda: (dist.all_to_all(outs, parts), torch.equal(torch.cat(outs), ramp))[1]
    if kind == "all_to_all_single":
        out, whole = torch.empty(n * numel), mine.repeat(n)
        return lambda: (dist.all_to_all_single(out, whole), torch.equal(out, ramp))[1]
    if kind == "barrier":
        return lambda: (dist.barrier(), True)[1]
    if kind == "isend_irecv":  # a ring: to the next rank, from the one before
        got, before, after = torch.empty(numel), (rank - 1) % n, (rank + 1) % n

        def call() -> bool:
            works = [dist.irecv(got, before), dist.isend(mine, after)]
            for work in works:
                work.wait()
            return bool((got == before + 1).all())
        return call
    if kind == "send_recv":  # pairs (0, 1), (2, 3), ...; with an odd count the last rank exchanges with rank 0
        got, extra = torch.empty(numel), torch.empty(numel)
        alone = n % 2 == 1 and rank == n - 1
        peer = 0 if alone else rank ^ 1

        def call() -> bool:
            if rank % 2 == 0 and not alone:  # sends first
                dist.send(mine, peer)
                dist.recv(got, peer)
                if rank == 0 and n % 2 == 1:
                    dist.send(mine, n - 1)
                    dist.recv(extra, n - 1)
            else:  # receives first
                dist.recv(got, peer)
                dist.send(mine, peer)
            return bool((got == peer + 1).all()) and (rank != 0 or n % 2 == 0 or bool((extra == n).all()))
        return call
    if kind == "zero3_step":
        return _zero3_step(rank)
    raise ValueError(f"no call for {kind!r}")


def _zero3_step(rank: int):
    """A ZeRO-3 training step of a small MLP (every rank): True when the loss is a number."""
    import torch

    from zerocomm.zero import ZeroConfig, initialize
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))
    model, optimizer = initialize(model, lambda params: torch.optim.SGD(params, lr=0.01),
                                  ZeroConfig(stage=3, stage3_param_persistence_threshold=0))
    generator = torch.Generator().manual_seed(rank)
    x, y = torch.randn(8, 64, generator=generator), torch.randn(8, 16, generator=generator)

    def call() -> bool:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return bool(torch.isfinite(loss))
    return call


def _rank(rank: int, n: int, store_path: str, kind: str, numel: int, conn) -> None:
    """One rank: init, a warm-up call, "ready", then the kind's call until it raises (or returns a wrong result)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        if kind == "all_reduce/hierarchical":  # two pretend hosts: ranks 0.. on "a", the rest on "b"
            os.environ["ZEROCOMM_HOST"] = "a" if rank < (n + 1) // 2 else "b"
        import torch
        import torch.distributed as td

        import zerocomm.comm as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", store=td.FileStore(store_path, n), rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
        dist.configure(segment_bytes=SEGMENT_BYTES)
        call = _caller(kind, rank, n, numel)
        if not call():
            raise AssertionError(f"{kind}: a wrong result before the kill")
        conn.send(("ready",))
        while call():
            pass
        conn.send(("wrong", time.monotonic()))
    except BaseException as error:  # noqa: BLE001 - reported: what a survivor raised is the measurement
        from zerocomm.comm import CommError
        from zerocomm.zero.errors import ZeroError
        typed = isinstance(error, (CommError, ZeroError)) and type(error).__module__ in TYPED_MODULES
        conn.send(("raised", time.monotonic(), type(error).__name__, typed,
                   str(error).splitlines()[0][:300] if str(error) else ""))
    finally:
        conn.close()
        os._exit(0)  # a survivor's group is broken: its teardown must not wait for the dead


def one_kill(rng: random.Random, n: int, kind: str, bound_s: float) -> dict:
    """Start a world, kill a random rank at a random moment; the survivors' outcomes."""
    context = multiprocessing.get_context("fork")
    numel, victim = rng.choice(SIZES), rng.randrange(n)
    with tempfile.TemporaryDirectory(prefix="zerocomm-kills-") as folder:
        pipes = [context.Pipe(duplex=False) for _ in range(n)]
        procs = [context.Process(target=_rank, args=(r, n, os.path.join(folder, "store"), kind, numel,
                                                     pipes[r][1]), daemon=True) for r in range(n)]
        for proc in procs:
            proc.start()
        for _, sender in pipes:
            sender.close()
        result = {"kind": kind, "numel": numel, "victim": victim, "survivors": {}}
        try:
            start_deadline = time.monotonic() + 60
            for r, (receiver, _) in enumerate(pipes):
                if not receiver.poll(max(0.0, start_deadline - time.monotonic())):
                    result["setup"] = f"rank {r} did not start within 60 s"
                    return result
                message = receiver.recv()
                if message[0] != "ready":
                    result["setup"] = f"rank {r} failed before the kill: {message}"
                    return result
            time.sleep(rng.uniform(0.0, 0.02))
            killed_at = time.monotonic()
            os.kill(procs[victim].pid, signal.SIGKILL)
            deadline = killed_at + GROUP_TIMEOUT_S + HANG_GRACE_S
            for r, (receiver, _) in enumerate(pipes):
                if r == victim:
                    continue
                answered = receiver.poll(max(0.0, deadline - time.monotonic()))
                try:
                    message = receiver.recv() if answered else None
                except EOFError:  # it died without answering
                    message = ("died",)
                if message is None:
                    outcome = {"status": "hung"}
                elif message[0] == "wrong":
                    outcome = {"status": "wrong", "seconds": message[1] - killed_at}
                elif message[0] != "raised":
                    outcome = {"status": message[0]}
                else:
                    _, at, name, typed, text = message
                    seconds = at - killed_at
                    status = "late" if seconds > bound_s else ("typed" if typed else "untyped")
                    outcome = {"status": status, "seconds": seconds, "error": name, "message": text}
                result["survivors"][r] = outcome
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                proc.join(5)
        return result


def sweep(kills: int, n: int, bound_s: float, seed: int, kinds=KINDS) -> list:
    rng = random.Random(seed)
    return [one_kill(rng, n, kinds[i % len(kinds)], bound_s) for i in range(kills)]


def summarize(results: list, n: int, bound_s: float) -> tuple:
    """(the table's text, whether every survivor raised a typed error in time)."""
    rows = collections.OrderedDict((k, collections.Counter()) for k in KINDS)
    worst = collections.defaultdict(float)
    problems = []
    for result in results:
        row = rows.setdefault(result["kind"], collections.Counter())
        row["kills"] += 1
        if "setup" in result:
            row["setup"] += 1
            problems.append(f"{result['kind']}: {result['setup']}")
            continue
        for r, outcome in result["survivors"].items():
            row[outcome["status"]] += 1
            if "seconds" in outcome:
                worst[result["kind"]] = max(worst[result["kind"]], outcome["seconds"])
            if outcome["status"] != "typed":
                problems.append(f"{result['kind']} {result['numel']} elements, rank {result['victim']} killed: "
                                f"rank {r} {outcome['status']} {outcome.get('error', '')} {outcome.get('message', '')}")
    lines = [f"# kill sweep: gloo, {n} ranks, a rank SIGKILLed 0-20 ms into a loop of calls of one kind; "
             f"bound {bound_s:g} s, group deadline {GROUP_TIMEOUT_S:g} s",
             f"{'call':<31}{'kills':>6}{'survivors':>10}{'typed':>7}{'untyped':>8}{'wrong':>6}{'late':>6}{'hung':>6}"
             f"{'worst s':>9}"]
    for kind, row in rows.items():
        if not row["kills"]:
            continue
        survivors = sum(row[k] for k in ("typed", "untyped", "wrong", "late", "hung", "died"))
        lines.append(f"{kind:<31}{row['kills']:>6}{survivors:>10}{row['typed']:>7}{row['untyped']:>8}"
                     f"{row['wrong']:>6}{row['late']:>6}{row['hung']:>6}{worst[kind]:>9.3f}")
    total = collections.Counter()
    for row in rows.values():
        total.update(row)
    lines.append(f"# {total['kills']} kills: {total['typed']} survivors raised a typed error in time, "
                 f"{total['untyped']} untyped, {total['wrong']} wrong, {total['late']} late, {total['hung']} hung; worst "
                 f"{max(worst.values(), default=0.0):.3f} s; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    lines += [f"# {p}" for p in problems[:20]]
    return "\n".join(lines), not problems


def run(args) -> int:
    from .options import UsageError
    if args.kills < 1 or args.nprocs < 2 or args.bound <= 0:
        raise UsageError(f"--kills must be at least 1, --nprocs at least 2 and --bound positive, got {args.kills}, "
                         f"{args.nprocs}, {args.bound}")
    text, ok = summarize(sweep(args.kills, args.nprocs, args.bound, args.seed), args.nprocs, args.bound)
    print(text, flush=True)
    return 0 if ok else 1


def main(argv=None) -> int:
    from .launch import module_main
    return module_main(sys.modules[__name__], argv)
