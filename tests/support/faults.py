"""Fault injection: fresh ranks that may be killed, and the case bodies every rank runs.

A case that kills a rank, or keeps one from joining, cannot run on a pooled world (the pool
would be broken for the next test), so each case starts its own ranks:

* :func:`fork_world` forks ``n`` gloo ranks that meet in a ``FileStore``; each runs a case
  body and sends back what it saw over a pipe; the parent waits with a deadline and reports
  each rank's answer, death or silence, and whether its process exited;
* :func:`mpi_world` runs ``python -m support.faults CASE ...`` under ``mpiexec`` (every rank
  writes its answer to a JSON file).  MPICH's launcher ends the whole job when one rank dies
  (its fault-tolerance mode fails MPI_Init in this build), so under MPI the survivors of a
  killed rank do not raise: the job ends, and the test asserts that it ends in time.

A case body ``body(rank, n, *args)`` returns a small picklable/JSON value; survivors report the
error they raised as ``[type name, seconds waited, message]`` (:func:`caught`).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

#: Seconds a case's group waits (init and calls): small, so that the suite stays fast.
CASE_TIMEOUT_S = 3.0

#: What every survivor must stay within: its deadline, plus this.
GRACE_S = 5.0


def caught(call) -> list:
    """``[type name, seconds, message]`` of the zerocomm error ``call()`` raised, or ``["none", seconds, ""]``."""
    import zerocomm.comm as dist
    start = time.monotonic()
    try:
        call()
    except dist.CommError as error:
        return [type(error).__name__, time.monotonic() - start, str(error)]
    return ["none", time.monotonic() - start, ""]


# -- case bodies (every rank runs one) ---------------------------------------------------------------

def _inputs(collective: str, rank: int, n: int, numel: int):
    """A call of ``collective`` with integer-valued data, as (function, kwargs, check) — check() verifies."""
    import zerocomm.comm as dist
    x = torch.full((numel,), float(rank + 1))
    total = float(n * (n + 1) // 2)
    if collective == "all_reduce":
        return lambda **kw: dist.all_reduce(x, **kw), lambda: bool((x == total).all())
    if collective == "broadcast":
        return lambda **kw: dist.broadcast(x, src=0, **kw), lambda: bool((x == 1.0).all())
    if collective == "reduce":
        return lambda **kw: dist.reduce(x, dst=0, **kw), lambda: rank != 0 or bool((x == total).all())
    if collective == "all_gather":
        out = torch.empty(n * numel)
        expected = torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(numel)
        return (lambda **kw: dist.all_gather_into_tensor(out, x, **kw)), lambda: torch.equal(out, expected)
    if collective == "gather":
        outs = [torch.empty(numel) for _ in range(n)] if rank == 0 else None
        return (lambda **kw: dist.gather(x, outs, dst=0, **kw),
                lambda: rank != 0 or all(bool((o == r + 1).all()) for r, o in enumerate(outs)))
    if collective == "scatter":
        parts = [torch.full((numel,), float(r + 1)) for r in range(n)] if rank == 0 else None
        return (lambda **kw: dist.scatter(x, parts, src=0, **kw)), lambda: bool((x == rank + 1).all())
    if collective == "reduce_scatter":
        big = torch.full((n * numel,), float(rank + 1))
        return (lambda **kw: dist.reduce_scatter_tensor(x, big, **kw)), lambda: bool((x == total).all())
    if collective == "all_to_all":
        send = torch.full((n * numel,), float(rank + 1))
        recv = torch.empty(n * numel)
        expected = torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(numel)
        return (lambda **kw: dist.all_to_all_single(recv, send, **kw)), lambda: torch.equal(recv, expected)
    if collective == "barrier":
        return (lambda **kw: dist.barrier(**kw)), lambda: True
    raise ValueError(f"no case for {collective!r}")


def killed_mid_collective(rank: int, n: int, collective: str, algorithm: str, numel: int = 1 << 16):
    """The last rank kills itself (SIGKILL) while every rank repeats ``collective``; the others must raise.

    The victim arms a timer and joins the loop, so the kill lands inside some call of it (in the
    mismatch check or in the data phase).  Each completed call's result is verified: until the kill,
    no garbage.  Survivors return ``[first error, error of the call after it, calls done, wrong results]``.
    """
    import threading

    import zerocomm.comm as dist
    if rank == n - 1:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    call, check = _inputs(collective, rank, n, numel)
    kwargs = {} if algorithm == "native-default" else {"algorithm": algorithm}
    done = wrong = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        call, check = _inputs(collective, rank, n, numel)
        outcome = caught(lambda: call(**kwargs))
        if outcome[0] != "none":
            again = caught(lambda: dist.all_reduce(torch.ones(1)))  # the group is poisoned: at once
            dist.destroy_process_group()
            return [outcome, again, done, wrong]
        done += 1
        wrong += not check()
    return [["none", 60.0, "the victim never died"], None, done, wrong]


def never_joins_a_call(rank: int, n: int):
    """The last rank stays alive but never makes the call (a stalled rank); the others time out."""
    import zerocomm.comm as dist
    if rank == n - 1:
        time.sleep(CASE_TIMEOUT_S + 1.0)
        return None
    outcome = caught(lambda: dist.all_reduce(torch.ones(4)))
    return [outcome, caught(lambda: dist.all_reduce(torch.ones(4)))]


def mismatched(rank: int, n: int, kind: str, algorithm: str):
    """Every rank calls one collective, the last rank with something different (``kind``); every rank must
    raise ``CollectiveMismatchError`` naming both sides, and the group must still work after it."""
    import zerocomm.comm as dist
    odd = rank == n - 1
    kw = {"algorithm": algorithm}
    if kind == "op":
        call = lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM, **kw)
    elif kind == "dtype":
        call = lambda: dist.all_reduce(torch.ones(4, dtype=torch.float64 if odd else torch.float32), **kw)
    elif kind == "shape":
        call = lambda: dist.all_reduce(torch.ones(5 if odd else 4), **kw)
    elif kind == "empty":
        call = lambda: dist.all_reduce(torch.ones(0 if odd else 4), **kw)
    elif kind == "root":
        call = lambda: dist.broadcast(torch.ones(4), src=1 if odd else 0, **kw)
    elif kind == "algorithm":  # the last rank runs another algorithm: native, or recursive doubling against native
        other = "recursive_doubling" if algorithm == "native" else "native"
        call = lambda: dist.all_reduce(torch.ones(4), algorithm=other if odd else algorithm)
    elif kind == "order":  # the last rank calls broadcast first, the others all_reduce first
        def call():
            first, second = (dist.broadcast, dist.all_reduce) if odd else (dist.all_reduce, dist.broadcast)
            first(torch.ones(4), **kw) if first is dist.all_reduce else first(torch.ones(4), src=0, **kw)
            second(torch.ones(4), **kw) if second is dist.all_reduce else second(torch.ones(4), src=0, **kw)
    else:
        raise ValueError(kind)
    outcome = caught(call)
    check = torch.ones(2)
    after = caught(lambda: dist.all_reduce(check))
    return [outcome, after, check.tolist()]


#: The mismatches ``mismatches_in_turn`` runs under MPI: every kind with native, ring and shm; the all_reduce
#: kinds with recursive doubling (whose check rides in its own messages there, answered by ranks checking in
#: MPI's collective); one algorithm against another where both check through MPI (an shm call checks
#: through the segment instead: against a native one it waits out the deadline, see docs/failures.md).
MPI_MISMATCHES = ([(kind, algorithm) for kind in ("op", "dtype", "shape", "empty", "root", "order")
                   for algorithm in ("native", "ring", "shm")] +
                  [(kind, "recursive_doubling") for kind in ("op", "dtype", "shape", "empty", "algorithm")] +
                  [("algorithm", "native"), ("algorithm", "ring")])


def mismatches_in_turn(rank: int, n: int) -> dict:
    """Every mismatch of ``MPI_MISMATCHES`` (:func:`mismatched`), one after the other on one group."""
    return {f"{kind}-{algorithm}": mismatched(rank, n, kind, algorithm) for kind, algorithm in MPI_MISMATCHES}


def bad_timeouts(rank: int, n: int) -> list:
    """``barrier(timeout=-1)`` and ``Work.wait(timeout=-5)`` raise before anything moves; the group still works."""
    import zerocomm.comm as dist
    work = dist.all_reduce(torch.ones(1), async_op=True)
    outcomes = [caught(lambda: dist.barrier(timeout=-1)), caught(lambda: work.wait(timeout=-5))]
    work.wait()
    outcomes.append(caught(lambda: dist.barrier()))
    return outcomes


def wait_in_callback(rank: int, n: int):
    """``Work.wait`` inside a future callback while the last rank never makes the awaited call: the wait
    ends by the deadline with a typed error instead of deadlocking the executor."""
    import zerocomm.comm as dist
    if rank == n - 1:
        dist.all_reduce(torch.ones(1), async_op=True).wait()
        time.sleep(CASE_TIMEOUT_S + 1.0)
        return None
    seen = []
    work1 = dist.all_reduce(torch.ones(1), async_op=True)
    work2 = dist.all_reduce(torch.ones(1), async_op=True)

    def callback(fut):
        seen.append(caught(work2.wait))
        return None

    work1.get_future().then(callback).wait()
    return seen[0] if seen else ["none", 0.0, "the callback did not run"]


def uncaught_under_mpi(rank: int, n: int):
    """Rank 0 raises an uncaught exception; the others wait in a barrier.  The abort hook must end the job."""
    import zerocomm.comm as dist
    if rank == 0:
        raise RuntimeError("an uncaught error on rank 0, on purpose")
    dist.barrier()
    return "the barrier returned"


CASES = {f.__name__: f for f in (killed_mid_collective, never_joins_a_call, mismatched, mismatches_in_turn,
                                 bad_timeouts, wait_in_callback, uncaught_under_mpi)}


# -- gloo: forked ranks --------------------------------------------------------------------------------

def _fork_child(rank, n, store_path, body, args, conn, join):
    import datetime

    import zerocomm.comm as dist
    try:
        if join:
            dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=n,
                                    timeout=datetime.timedelta(seconds=CASE_TIMEOUT_S))
            answer = ("ok", body(rank, n, *args))
        else:
            time.sleep(CASE_TIMEOUT_S + 1.0)  # never joins
            answer = ("ok", None)
    except BaseException as error:  # reported, judged by the test
        answer = ("raised", [type(error).__name__, 0.0, str(error)])
    conn.send(answer)
    conn.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def fork_world(n: int, body, *args, limit_s: float = 60.0, absent=()) -> list:
    """Run ``body(rank, n, *args)`` on ``n`` forked gloo ranks; ranks in ``absent`` never call init.

    Returns one dict per rank: ``answer`` (``("ok", value)``, ``("raised", [...])`` or ``None`` if it
    sent nothing), ``exitcode`` (``None`` if still running at the limit: then it is killed) and
    ``seconds`` (from start to its answer).
    """
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="zerocomm-fault-") as folder:
        store = os.path.join(folder, "store")
        ranks = []
        start = time.monotonic()
        for rank in range(n):
            parent, child = context.Pipe(duplex=False)
            process = context.Process(target=_fork_child, args=(rank, n, store, body, args, child,
                                                                 rank not in absent), daemon=True)
            process.start()
            child.close()
            ranks.append((process, parent))
        results = []
        for process, conn in ranks:
            left = max(0.0, start + limit_s - time.monotonic())
            answer = None
            if conn.poll(left):
                try:
                    answer = conn.recv()
                except EOFError:
                    answer = None
            seconds = time.monotonic() - start
            process.join(max(0.1, start + limit_s - time.monotonic()))
            exitcode = process.exitcode
            if process.is_alive():
                process.kill()
                process.join(5)
            results.append({"answer": answer, "exitcode": exitcode, "seconds": seconds})
        return results


# -- MPI: mpiexec --------------------------------------------------------------------------------------

def mpi_world(n: int, case: str, *args, limit_s: float = 90.0, absent=(), env=None) -> dict:
    """Run the case named ``case`` on ``n`` MPI ranks under mpiexec; ranks in ``absent`` never init.

    Returns ``{"answers": {rank: answer}, "returncode": int | None, "seconds": float, "output": str}``;
    a rank that wrote nothing (killed, or aborted by the job) has no answer.
    """
    mpiexec = Path(sys.executable).parent / "mpiexec"
    tests = str(Path(__file__).resolve().parents[1])
    with tempfile.TemporaryDirectory(prefix="zerocomm-fault-mpi-") as folder:
        command = [str(mpiexec), "-n", str(n), sys.executable, "-m", "support.faults",
                   folder, json.dumps([case, list(args), list(absent)])]
        full_env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(
            [tests] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        start = time.monotonic()
        process = subprocess.Popen(command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            output, _ = process.communicate(timeout=limit_s)
            code = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            code = None
        seconds = time.monotonic() - start
        answers = {}
        for path in Path(folder).glob("rank*.json"):
            answers[int(path.stem[4:])] = json.loads(path.read_text())
        return {"answers": answers, "returncode": code, "seconds": seconds,
                "output": output.decode(errors="replace")[-3000:]}


def _mpi_main(folder: str, spec: str) -> None:
    import datetime
    case, args, absent = json.loads(spec)
    rank, n = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    if rank in absent:
        time.sleep(CASE_TIMEOUT_S + 2.0)  # never starts MPI
        return
    import zerocomm.comm as dist
    start = time.monotonic()
    try:
        dist.init_process_group("mpi", timeout=datetime.timedelta(seconds=CASE_TIMEOUT_S))
    except dist.CommError as error:
        answer = ("raised", [type(error).__name__, time.monotonic() - start, str(error)])
    else:
        if case == "uncaught_under_mpi" and rank == 0:
            CASES[case](rank, n, *args)  # raises, uncaught: sys.excepthook must abort the job
        answer = ("ok", CASES[case](rank, n, *args))
    # Written whole, then renamed: a rank ended by a peer's MPI_Abort while writing leaves no half-written answer.
    partial = Path(folder, f".partial-rank{rank}")
    partial.write_text(json.dumps(answer))
    os.replace(partial, Path(folder, f"rank{rank}.json"))
    sys.stdout.flush()
    os._exit(0)  # a survivor of a killed peer must not wait in MPI_Finalize for it


if __name__ == "__main__":
    _mpi_main(sys.argv[1], sys.argv[2])
