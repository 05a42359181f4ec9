"""Kill sweep: a rank killed at a random moment of a collective, and what every survivor did.

    zerocomm-bench kills                         # 200 kills, gloo, 3 ranks
    zerocomm-bench kills --kills 24 --seed 7     # the short version the tests run

Each kill is one fresh world of ``--nprocs`` forked gloo ranks (a FileStore in a temporary folder).
The ranks call one algorithm's all_reduce in a loop -- ring, tree, recursive doubling, shm, native or
hierarchical (the last over pretend hosts, ``ZEROCOMM_HOST``), drawn in turn -- on a tensor of a
drawn size; once every rank has finished a warm-up call, this process waits a random 0-20 ms and
sends ``SIGKILL`` to a random rank.  Every survivor must raise a typed error (a ``CommError``:
``PeerError`` for a peer gone, ``CommTimeoutError``) within ``--bound`` seconds of the kill; one that
answers later is "late", one that has not answered by the group's deadline plus a grace is "hung"
(then killed).  The table gives, per algorithm, the kills, typed errors, late and hung survivors
and the worst time from the kill to a survivor's error.  Exit status 1 when a survivor was hung,
late or raised an untyped error.
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
Kills one rank at a random moment of an all_reduce (ring, tree, recursive doubling, shm, native,
hierarchical), in a fresh world of forked gloo ranks per kill, and checks that every survivor raises
a typed zerocomm error (PeerError, CommTimeoutError) within --bound seconds, never hangs.
Exit status 1 when a survivor hung, was late or raised an untyped error.

Examples:
  zerocomm-bench kills
  zerocomm-bench kills --kills 24 --nprocs 3 --seed 7
"""

ALGORITHMS = ("ring", "tree", "recursive_doubling", "shm", "native", "hierarchical")
#: float32 elements: small (one message), a few segments, and a call that lasts milliseconds.
SIZES = (8, 65536, 1 << 20)
#: Segments small enough that the larger sizes run many pipelined steps.
SEGMENT_BYTES = 64 << 10
#: The group's deadline: far above the bound, so a survivor stuck until its deadline shows as late.
GROUP_TIMEOUT_S = 30.0
HANG_GRACE_S = 5.0


def add_arguments(parser) -> None:
    parser.add_argument("--kills", type=int, default=200, metavar="N", help="kills, one world each (default: 200)")
    parser.add_argument("--nprocs", type=int, default=3, metavar="N", help="ranks per world, at least 2 (default: 3)")
    parser.add_argument("--bound", type=float, default=5.0, metavar="S",
                        help="seconds from the kill within which every survivor must raise (default: 5)")
    parser.add_argument("--seed", type=int, default=1, metavar="N", help="seed of the draws (default: 1)")


def _rank(rank: int, n: int, store_path: str, algorithm: str, numel: int, conn) -> None:
    """One rank: init, a warm-up call, "ready", then the algorithm's all_reduce until it raises."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        if algorithm == "hierarchical":  # two pretend hosts: ranks 0.. on "a", the rest on "b"
            os.environ["ZEROCOMM_HOST"] = "a" if rank < (n + 1) // 2 else "b"
        import torch
        import torch.distributed as td

        import zerocomm.comm as dist
        torch.set_num_threads(1)
        dist.init_process_group("gloo", store=td.FileStore(store_path, n), rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
        dist.configure(segment_bytes=SEGMENT_BYTES)
        tensor = torch.ones(numel)
        dist.all_reduce(tensor, algorithm=algorithm)
        conn.send(("ready",))
        while True:
            dist.all_reduce(tensor, algorithm=algorithm)
    except BaseException as error:  # noqa: BLE001 - reported: what a survivor raised is the measurement
        from zerocomm.comm import CommError
        conn.send(("raised", time.monotonic(), type(error).__name__, isinstance(error, CommError),
                   str(error).splitlines()[0][:300] if str(error) else ""))
    finally:
        conn.close()
        os._exit(0)  # a survivor's group is broken: its teardown must not wait for the dead


def one_kill(rng: random.Random, n: int, algorithm: str, bound_s: float) -> dict:
    """Start a world, kill a random rank at a random moment; the survivors' outcomes."""
    context = multiprocessing.get_context("fork")
    numel, victim = rng.choice(SIZES), rng.randrange(n)
    with tempfile.TemporaryDirectory(prefix="zerocomm-kills-") as folder:
        pipes = [context.Pipe(duplex=False) for _ in range(n)]
        procs = [context.Process(target=_rank, args=(r, n, os.path.join(folder, "store"), algorithm, numel,
                                                     pipes[r][1]), daemon=True) for r in range(n)]
        for proc in procs:
            proc.start()
        for _, sender in pipes:
            sender.close()
        result = {"algorithm": algorithm, "numel": numel, "victim": victim, "survivors": {}}
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


def sweep(kills: int, n: int, bound_s: float, seed: int) -> list:
    rng = random.Random(seed)
    return [one_kill(rng, n, ALGORITHMS[i % len(ALGORITHMS)], bound_s) for i in range(kills)]


def summarize(results: list, n: int, bound_s: float) -> tuple:
    """(the table's text, whether every survivor raised a typed error in time)."""
    rows = collections.OrderedDict((a, collections.Counter()) for a in ALGORITHMS)
    worst = collections.defaultdict(float)
    problems = []
    for result in results:
        row = rows[result["algorithm"]]
        row["kills"] += 1
        if "setup" in result:
            row["setup"] += 1
            problems.append(f"{result['algorithm']}: {result['setup']}")
            continue
        for r, outcome in result["survivors"].items():
            row[outcome["status"]] += 1
            if "seconds" in outcome:
                worst[result["algorithm"]] = max(worst[result["algorithm"]], outcome["seconds"])
            if outcome["status"] != "typed":
                problems.append(f"{result['algorithm']} {result['numel']} elements, rank {result['victim']} killed: "
                                f"rank {r} {outcome['status']} {outcome.get('error', '')} {outcome.get('message', '')}")
    lines = [f"# kill sweep: gloo, {n} ranks, a rank SIGKILLed 0-20 ms into a loop of all_reduce calls; "
             f"bound {bound_s:g} s, group deadline {GROUP_TIMEOUT_S:g} s",
             f"{'algorithm':<20}{'kills':>6}{'survivors':>10}{'typed':>7}{'untyped':>8}{'late':>6}{'hung':>6}"
             f"{'worst s':>9}"]
    for algorithm, row in rows.items():
        survivors = sum(row[k] for k in ("typed", "untyped", "late", "hung", "died"))
        lines.append(f"{algorithm:<20}{row['kills']:>6}{survivors:>10}{row['typed']:>7}{row['untyped']:>8}"
                     f"{row['late']:>6}{row['hung']:>6}{worst[algorithm]:>9.3f}")
    total = collections.Counter()
    for row in rows.values():
        total.update(row)
    lines.append(f"# {total['kills']} kills: {total['typed']} survivors raised a typed error in time, "
                 f"{total['untyped']} untyped, {total['late']} late, {total['hung']} hung; worst "
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
