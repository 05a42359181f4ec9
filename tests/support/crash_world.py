"""A fresh world of forked gloo ranks in which one rank may die, and how every rank ended.

The pools of harness.py end a run at the first death (their ranks may be out of step afterwards).
Fault tests need the opposite: let a rank die or stall at an injected point and look at what every
*survivor* did.  ``run_world(fn, world_size, *args, group_timeout_s=..., deadline_s=...)`` forks
``world_size`` ranks, each initializing ``zerocomm.comm`` on gloo over a FileStore with the given
group timeout, calls ``fn(*args)`` and reports, per rank, an ``Outcome``: ``ok`` (with fn's return
value), ``raised``, ``died`` (no answer, process gone: the exit code or signal) or ``hung`` (no
answer by the deadline: killed).  A rank exits with ``os._exit`` right after answering: a survivor's
group is broken, and its teardown must not wait for the dead.

Costs one fork and one gloo rendezvous per call (about 0.1-0.5 s for 2-3 ranks on 2 cores).
"""
from __future__ import annotations

import dataclasses
import datetime
import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from .rank_loop import _exit_with_parent


@dataclasses.dataclass
class Outcome:
    rank: int
    status: str
    """"ok", "raised", "died" or "hung"."""
    value: Any = None
    """fn's return value when ``ok``; the traceback text when ``raised``."""
    error_type: str | None = None
    message: str = ""
    exitcode: int | None = None


def _child(rank: int, world_size: int, conn, store_path: str, group_timeout_s: float, alarm_s: int,
           parent_pid: int, fn: Callable, args: tuple) -> None:
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a forked child inherits pytest-timeout's handler
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.alarm(alarm_s)  # never outlive the test by much, whatever fn does
    _exit_with_parent(parent_pid)
    try:
        import torch
        import torch.distributed as td

        import zerocomm.comm as dist

        torch.set_num_threads(1)
        store = td.FileStore(store_path, world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=group_timeout_s))
        reply = ("ok", fn(*args))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        reply = ("raised", type(exc).__name__, str(exc), traceback.format_exc())
    try:
        conn.send(reply)
        conn.close()
    finally:
        os._exit(0)


def run_world(fn: Callable, world_size: int, *args, group_timeout_s: float = 3.0, deadline_s: float = 60.0) -> list:
    """Run ``fn(*args)`` on ``world_size`` fresh ranks; returns one ``Outcome`` per rank (index = rank).

    ``fn`` must be a module-level function; it runs after ``init_process_group``.  Ranks that have not
    answered ``deadline_s`` seconds after the start are killed and reported as ``hung``."""
    context = multiprocessing.get_context("fork")
    workdir = Path(tempfile.mkdtemp(prefix="zerocomm-crash-world-"))
    store_path = str(workdir / "store")
    procs, conns = [], []
    for rank in range(world_size):
        parent_end, child_end = context.Pipe(duplex=False)
        process = context.Process(target=_child, daemon=True, name=f"crash-world-rank{rank}",
                                  args=(rank, world_size, child_end, store_path, group_timeout_s,
                                        int(deadline_s) + 30, os.getpid(), fn, args))
        process.start()
        child_end.close()
        procs.append(process)
        conns.append(parent_end)
    outcomes: dict[int, Outcome] = {}
    deadline = time.monotonic() + deadline_s
    while len(outcomes) < world_size and time.monotonic() < deadline:
        waiting = {}
        for rank in set(range(world_size)) - set(outcomes):
            waiting[conns[rank]] = rank
            waiting[procs[rank].sentinel] = rank
        for ready in multiprocessing.connection.wait(list(waiting), deadline - time.monotonic()):
            rank = waiting[ready]
            if rank in outcomes:
                continue
            conn = conns[rank]
            try:  # a rank may have answered and then exited: read its answer first
                reply = conn.recv() if conn.poll() else None
            except (EOFError, OSError):
                reply = None
            if reply is None:
                procs[rank].join(1.0)
                outcomes[rank] = Outcome(rank, "died", exitcode=procs[rank].exitcode)
            elif reply[0] == "ok":
                outcomes[rank] = Outcome(rank, "ok", value=reply[1])
            else:
                outcomes[rank] = Outcome(rank, "raised", value=reply[3], error_type=reply[1], message=reply[2])
    for rank, process in enumerate(procs):
        if rank not in outcomes:
            outcomes[rank] = Outcome(rank, "hung")
        if process.is_alive():
            process.kill()
        process.join(5.0)
        conns[rank].close()
    for leftover in workdir.iterdir():
        leftover.unlink()
    workdir.rmdir()
    return [outcomes[rank] for rank in range(world_size)]
