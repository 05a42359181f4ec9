"""What runs inside a rank of a pool (see harness.py): initialize, then serve tasks.

A rank receives a pickled ``("run", fn, args, kwargs, timeout)``, calls ``fn(*args, **kwargs)``
and answers ``("ok", value)`` or ``("err", type_name, message, traceback_text)``; ``("exit",)``
ends it.  Its first answer reports the initialization (``("ok", pid)`` or an error).

Safety, so that no rank outlives the test session or hangs it: ``SIGALRM`` is armed for each
task's timeout plus ``CHILD_GRACE_S``; the rank dies with the test process (``PR_SET_PDEATHSIG``
for a forked child, a pidfd watch under mpiexec); ``SIGUSR1`` makes faulthandler write the
rank's Python stack to its stack file, and a crash writes there too.
"""
from __future__ import annotations

import ctypes
import dataclasses
import datetime
import faulthandler
import math
import os
import pickle
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

CHILD_GRACE_S = 30
"""A rank outlives its task's timeout by this much before its own alarm ends it."""

ENV_ADDR = "ZEROCOMM_POOL_ADDR"
ENV_TOKEN = "ZEROCOMM_POOL_TOKEN"
ENV_SYSPATH = "ZEROCOMM_POOL_SYSPATH"
ENV_PARENT = "ZEROCOMM_POOL_PARENT_PID"
"""Environment of an mpiexec rank: where to connect, the token to show, the parent's sys.path and pid."""


def name_of(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


@dataclasses.dataclass(frozen=True)
class RankSetup:
    """What a rank knows when its pool asks it to initialize (passed to ``init``)."""

    rank: int
    world_size: int
    backend: str
    timeout: datetime.timedelta
    """The default group's operation timeout."""
    store: Any = None
    """A ``torch.distributed.FileStore`` for forked ranks; ``None`` under mpiexec."""


def init_default_group(setup: RankSetup) -> None:
    """The default ``init``: ``dist.init_process_group`` with the tests' ``dist`` module."""
    from .dist import dist  # imported in the rank, so that the test process stays light

    if setup.store is None:
        dist.init_process_group(setup.backend, timeout=setup.timeout)
    else:
        dist.init_process_group(setup.backend, store=setup.store, rank=setup.rank,
                                world_size=setup.world_size, timeout=setup.timeout)


def _error_reply(exc: BaseException, context: str = "") -> tuple:
    text = traceback.format_exc()
    message = f"{context}{exc}" if context else str(exc)
    return ("err", type(exc).__name__, message, text)


def _serve(channel, setup: RankSetup, init: Callable[[RankSetup], None], init_timeout_s: float) -> None:
    """Initialize, then answer tasks until ``("exit",)`` or the parent's end closes."""
    signal.alarm(math.ceil(init_timeout_s) + CHILD_GRACE_S)
    try:
        init(setup)
        reply = ("ok", os.getpid())
    except BaseException as exc:  # the parent reports it; this rank is then killed
        reply = _error_reply(exc, "init failed: ")
    signal.alarm(0)
    channel.send_bytes(pickle.dumps(reply))
    if reply[0] == "err":
        return
    while True:
        try:
            data = channel.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            message = pickle.loads(data)
        except BaseException as exc:  # e.g. the test module is not importable in this rank
            channel.send_bytes(pickle.dumps(_error_reply(exc, "cannot unpickle the task: ")))
            continue
        if message[0] == "exit":
            return
        _, fn, args, kwargs, timeout = message
        signal.alarm(math.ceil(timeout) + CHILD_GRACE_S)
        try:
            reply = ("ok", fn(*args, **kwargs))
        except BaseException as exc:  # reported to the parent, which decides
            reply = _error_reply(exc)
        signal.alarm(0)
        try:
            data = pickle.dumps(reply)
        except BaseException as exc:
            data = pickle.dumps(_error_reply(exc, f"the result of {name_of(fn)} cannot be pickled: "))
        channel.send_bytes(data)


def _prepare_rank_process(parent_pid: int, stack_path: Path) -> None:
    """Signals and safety for a fresh rank: default SIGALRM/SIGINT, stacks on SIGUSR1, die with the parent."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a forked child inherits pytest-timeout's handler
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    stack_file = open(stack_path, "w")  # noqa: SIM115 - must stay open for faulthandler
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable(file=stack_file, all_threads=True)  # a crash leaves its stack for the report
    _prepare_rank_process.stack_file = stack_file
    _exit_with_parent(parent_pid)


def _exit_with_parent(parent_pid: int) -> None:
    """Ends this process when ``parent_pid`` exits, also while it is stuck in a collective."""
    if os.getppid() == parent_pid:
        try:  # the kernel's way for a direct child: SIGKILL when the parent dies
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0:  # PR_SET_PDEATHSIG
                if os.getppid() != parent_pid:
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    try:
        fd = os.pidfd_open(parent_pid)
    except (OSError, AttributeError):
        while _alive(parent_pid):
            time.sleep(1.0)
        os._exit(1)
    select = selectors.DefaultSelector()
    select.register(fd, selectors.EVENT_READ)
    select.select()  # blocks until the parent exits
    os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fork_child(rank, world_size, conn, other_conns, store_path, backend, op_timeout_s,
                init, init_timeout_s, stack_path, parent_pid):
    for other in other_conns:  # parent ends inherited by fork; closing them keeps EOFs honest
        other.close()
    _prepare_rank_process(parent_pid, stack_path)
    import torch
    import torch.distributed

    torch.set_num_threads(1)  # N ranks share 2 cores
    store = torch.distributed.FileStore(str(store_path), world_size)
    setup = RankSetup(rank=rank, world_size=world_size, backend=backend,
                      timeout=datetime.timedelta(seconds=op_timeout_s), store=store)
    _serve(conn, setup, init, init_timeout_s)


class SocketChannel:
    """``send_bytes``/``recv_bytes`` over a stream socket: an 8-byte length, then the bytes."""

    _HEADER = struct.Struct("!Q")

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(self._HEADER.pack(len(data)) + data)

    def recv_bytes(self) -> bytes:
        (size,) = self._HEADER.unpack(self._recv_exactly(self._HEADER.size))
        return self._recv_exactly(size)

    def _recv_exactly(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise EOFError("the peer closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self.sock.close()


def _rank_from_env() -> tuple[int, int]:
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMIX_RANK", "PMIX_SIZE")):
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    raise RuntimeError("not started by mpiexec: no PMI_RANK/OMPI_COMM_WORLD_RANK in the environment")


def mpi_worker_main() -> None:
    """Body of one mpiexec rank: connect to the parent, then serve (``python -m support.mpi_worker``)."""
    parent_paths = [p for p in os.environ.get(ENV_SYSPATH, "").split(os.pathsep) if p]
    sys.path[:] = parent_paths + [p for p in sys.path if p not in parent_paths]
    rank, world_size = _rank_from_env()
    host, port = os.environ[ENV_ADDR].rsplit(":", 1)
    channel = SocketChannel(socket.create_connection((host, int(port))))
    channel.send_bytes(pickle.dumps(("hello", os.environ[ENV_TOKEN], rank, world_size, os.getpid())))
    backend, op_timeout_s, init, init_timeout_s, stack_path = pickle.loads(channel.recv_bytes())
    _prepare_rank_process(int(os.environ[ENV_PARENT]), Path(stack_path))
    setup = RankSetup(rank=rank, world_size=world_size, backend=backend,
                      timeout=datetime.timedelta(seconds=op_timeout_s))
    _serve(channel, setup, init, init_timeout_s)
    channel.close()
