"""The gloo backend: CPU tensors over torch's ``ProcessGroupGloo``.

zerocomm builds its own ``ProcessGroupGloo`` from the store instead of calling
``torch.distributed.init_process_group``, so torch's global default group stays
free for the user (torch DDP beside zerocomm in one process works).

Point-to-point moves raw bytes (every dtype views as uint8), so rings and trees
run on any dtype.  Native collectives are torch's gloo ones; the few cells gloo
lacks are composed here and the table says how.
"""
from __future__ import annotations

import ctypes
import datetime
import os
import threading
import time
from typing import List, Optional, Sequence

import torch
import torch.distributed as td

from ...ops.flatten import as_chunks
from ...ops.reduce import finalize_
from ..environment import gloo_socket_interfaces
from ..transport import Backend, PeerFailure, Request, members_arrive
from .gloo_exits import PeerExit, release as release_exit, watch as watch_exit

_C = torch._C._distributed_c10d

#: A failure this close to the wait's end is its timeout (gloo's clock and ours differ by rounding).
_CLOCK_SLACK_S = 5e-3

_TORCH_OPS = {
    "sum": td.ReduceOp.SUM, "product": td.ReduceOp.PRODUCT, "min": td.ReduceOp.MIN,
    "max": td.ReduceOp.MAX, "band": td.ReduceOp.BAND, "bor": td.ReduceOp.BOR, "bxor": td.ReduceOp.BXOR,
}

#: What gloo itself does for each collective, and what zerocomm adds (see ``native_table``).
NATIVE_TABLE = {
    "broadcast": "native",
    "scatter": "native",
    "reduce": "native (non-root inputs are protected by a copy: gloo overwrites them)",
    "all_reduce": "native (AVG on floats: gloo SUM, then divide)",
    "gather": "native",
    "all_gather": "native",
    "reduce_scatter": "composed by torch's gloo: a full all_reduce, then a copy of the rank's chunk",
    "all_to_all": "native",
    "barrier": "native",
    "send/recv": "native (tagged unbound buffers)",
}


class GlooRequest(Request):
    """A torch gloo ``Work`` with a bounded wait; ``what`` names it in errors, ``peer`` is the other side.

    torch raises the same ``RuntimeError`` for a timeout and for a peer that went away, so the
    two are told apart by the clock, not by the text: a wait that fails once its time is up
    timed out; one that fails earlier was ended by the transport (a closed connection).
    """

    __slots__ = ("_work", "_what", "_keep", "_peer", "_exit")

    def __init__(self, work, what: str, keep_alive=None, peer: Optional[int] = None,
                 peer_exit: Optional[PeerExit] = None):
        self._work = work
        self._what = what
        self._keep = keep_alive  # tensors gloo reads or writes until completion
        self._peer = peer
        self._exit = peer_exit  # the peer's process, where it runs on this machine: its exit ends the wait

    def test(self) -> bool:
        return self._work.is_completed()

    def wait(self, timeout_s: Optional[float] = None) -> None:
        peer_exit = self._exit
        if peer_exit is None:
            _wait(self._work, self._what, timeout_s, self._peer)
            return
        # [Note: waits on the dead] (gloo_exits.py)  gloo leaves a transfer it had begun with a peer that died
        # waiting until the deadline: the wait is registered with the peer's process, whose exit aborts it.
        work, waiting = self._work, peer_exit.waiting
        waiting[id(work)] = work
        try:
            if peer_exit.exited or _wait(work, self._what, timeout_s, self._peer) is False:
                _after_exit(work, self._what, timeout_s, self._peer)
        finally:
            waiting.pop(id(work), None)

    def source(self) -> int:
        """The sender's rank (receives from any source)."""
        return self._work._source_rank()


def _posted(post, buffers: list, *args, what, peer: Optional[int] = None,
            peer_exit: Optional[PeerExit] = None) -> GlooRequest:
    """``post(buffers, *args)`` (a ``ProcessGroupGloo`` send/recv) as a request.  gloo raises while posting
    on a pair that failed since the last call (a peer that died): the peer's failure, as in :func:`_wait`."""
    try:
        work = post(buffers, *args)
    except RuntimeError as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise PeerFailure(f"{what[0].format(*what[1:])}: {first_line}", peer) from None
    return GlooRequest(work, what, buffers[0], peer, peer_exit)


def _wait(work, what, timeout_s: Optional[float], peer: Optional[int] = None) -> bool:
    """Wait for a gloo ``Work`` at most ``timeout_s`` seconds (``None``: gloo's own bound); ``what`` is a string or
    a ``(format, *args)`` tuple formatted only on failure.  False: the wait was aborted (``gloo_exits.abort``)."""
    return _wait_until(work, what, None if timeout_s is None else _monotonic() + timeout_s, peer)


def _wait_until(work, what, deadline: Optional[float], peer: Optional[int] = None) -> bool:
    """:func:`_wait` by a ``deadline`` (``time.monotonic()`` seconds): a collective's wait, one clock read."""
    try:
        if deadline is None:
            return work.wait()
        else:
            # gloo counts whole milliseconds: round up, so its timeout never comes before ours.  torch treats
            # a zero timedelta as "no timeout": never pass it.  (Arithmetic, not math.ceil: this runs per call.)
            milliseconds = (deadline - _monotonic()) * 1000.0
            return work.wait(_timedelta(milliseconds=int(milliseconds) + 1 if milliseconds > 0.0 else 1))
    except RuntimeError as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        what = what if isinstance(what, str) else what[0].format(*what[1:])
        if deadline is not None and _monotonic() + _CLOCK_SLACK_S >= deadline:
            raise TimeoutError(f"{what} ({first_line})") from None
        raise PeerFailure(f"{what}: {first_line}", peer) from None


#: How long a wait on a peer whose process has exited still waits for its transfer (see :func:`_after_exit`).
_AFTER_EXIT_S = 0.25


def _after_exit(work, what, timeout_s: Optional[float], peer: int) -> None:
    """The wait on ``work`` with ``peer``, whose process has exited (its wait was aborted, or it began after the
    exit): a transfer already complete returns at once (an abort hides completion: the aborted wait answers
    False whatever happened, and gloo's works say nothing of completion outside ``wait``); one that never will
    complete raises :class:`PeerFailure` within ``_AFTER_EXIT_S``.  That short wait's timeout closes every pair of
    the communicator, which is failing anyway: its other ranks then see this one go and fail sooner."""
    seconds = _AFTER_EXIT_S if timeout_s is None else min(timeout_s, _AFTER_EXIT_S)
    start = _monotonic()
    try:
        if work.wait(_timedelta(milliseconds=max(1, int(seconds * 1000.0)))):
            return
        reason = "its wait was aborted"
    except RuntimeError as error:
        if _monotonic() + _CLOCK_SLACK_S >= start + seconds:
            reason = "the transfer under way with it was cut off"
        else:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    what = what if isinstance(what, str) else what[0].format(*what[1:])
    raise PeerFailure(f"{what}: rank {peer}'s process has exited ({reason})", peer) from None


_monotonic = time.monotonic
_timedelta = datetime.timedelta


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A uint8 view of a contiguous tensor's bytes (gloo p2p moves bytes, not values)."""
    numel = tensor.numel()
    if numel <= 1:  # an empty tensor may have any strides, which view() rejects, and so may one of one element
        return torch.empty(0, dtype=torch.uint8) if numel == 0 else tensor.as_strided((1,), (1,)).view(torch.uint8)
    return tensor.reshape(-1).view(torch.uint8)


def _as_sent(tensor: torch.Tensor) -> torch.Tensor:
    """The user's contiguous tensor as it is, or its bytes where gloo would refuse it (empty tensors)."""
    return tensor if tensor.numel() else _bytes(tensor)


def make_devices(interfaces: Sequence[str]) -> list:
    """gloo transport devices as torch's own ``ProcessGroupGloo`` makes them: one per interface named in
    ``GLOO_SOCKET_IFNAME`` (``config.gloo_socket_interfaces``), in its order, else one bound to the address this
    host's name resolves to.  On a cluster whose host names do not resolve to the link's address (several NICs,
    containers), the named interface is the only way gloo binds an address its peers can reach."""
    if not interfaces:
        return [td.ProcessGroupGloo.create_default_device()]
    return [td.ProcessGroupGloo.create_device(interface=name) for name in interfaces]


class _SharedDevice:
    """This process's gloo transport devices, shared by every live communicator it makes, one set per value of
    ``GLOO_SOCKET_IFNAME`` (the interfaces they bind).

    A device runs one event-loop thread, which wakes every 10 ms even when idle; torch makes one per process
    group, so ZeRO++'s communicators (the world, the hosts, the partitions, hierarchical's halves) kept six
    loops per rank waking on two shared cores.  gloo's device serves any number of contexts (each communicator
    is one, with its own pairs).  A set is dropped with the last communicator using it, so a process that forks
    between worlds (a pool of test ranks) holds no loop thread then, as before; a forked child never uses its
    parent's (the thread does not exist there)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid, self._held = None, {}  # interfaces -> [devices, users]

    def acquire(self, interfaces: tuple) -> list:
        with self._lock:
            if self._pid != os.getpid():
                self._held, self._pid = {}, os.getpid()
            held = self._held.get(interfaces)
            if held is None:
                held = self._held[interfaces] = [make_devices(interfaces), 0]
            held[1] += 1
            return held[0]

    def release(self, interfaces: tuple) -> None:
        with self._lock:
            held = self._held.get(interfaces) if self._pid == os.getpid() else None
            if held is not None:
                held[1] -= 1
                if held[1] == 0:
                    del self._held[interfaces]


_shared_device = _SharedDevice()


def _connected(make, seconds: float, rank: int):
    """``make()`` (a ``ProcessGroupGloo``: gloo connects every pair) within ``seconds``, else ``TimeoutError``.

    gloo bounds the connections it makes by the options' timeout, but a rank whose peers failed to connect
    to it (they dialled an address it does not listen on, and gave up) can wait in gloo's rendezvous far
    longer (300 s and more, measured): the wait runs on a thread of its own, which releases the GIL, so this
    rank ends at its own deadline.  A thread left waiting then is given up (a daemon; the group is failing)."""
    made: dict = {}

    def connect() -> None:
        try:
            made["pg"] = make()
        except BaseException as error:  # handed to the caller's thread below
            made["error"] = error

    thread = threading.Thread(target=connect, name="zerocomm-gloo-connect", daemon=True)
    thread.start()
    thread.join(max(seconds, 0.0))
    if thread.is_alive():
        raise TimeoutError(f"rank {rank}: gloo did not connect to every peer within {max(seconds, 0.0):.1f} s "
                           "(a peer that cannot reach this host's address: is GLOO_SOCKET_IFNAME set to the "
                           "interface of the link between the hosts?)")
    if "error" in made:
        raise made["error"]
    return made["pg"]


class GlooBackend(Backend):
    """One gloo communicator; ``pg`` is the ``ProcessGroupGloo`` over its members."""

    name = "gloo"
    device_type = "cpu"
    ANY_SOURCE = True

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta, deadline: Optional[float] = None):
        self.store = store
        self.rank = rank
        self.size = size
        self.timeout = timeout
        # One worker thread: gloo then runs the collectives it is given one after another, in the order given,
        # as a stream does.  With two (torch's default), an asynchronous collective issued directly (``ISSUE``)
        # could run beside the next one and read a buffer that one writes: ZeRO-3's steps ended 6e-5 to 2e-4
        # off data parallel in 2 of 6 runs under load before this.
        options = td.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._threads = 1
        self._interfaces = gloo_socket_interfaces()
        options._devices = _shared_device.acquire(self._interfaces)
        try:
            self.pg = _connected(lambda: td.ProcessGroupGloo(store, rank, size, options),
                                 timeout.total_seconds() if deadline is None else deadline - _monotonic(), rank)
        except BaseException:
            _shared_device.release(self._interfaces)
            raise
        self._device_held = True
        self._exits: Optional[tuple] = None  # rank -> its process's PeerExit (see _exit_of), released with the backend
        # Made once: building the options object costs 2 µs of a small all_reduce's Python (gloo copies
        # what it needs from it at each call, so one object per op serves every call and thread).
        self._all_reduce_options = {op: _C.AllreduceOptions() for op in _TORCH_OPS}
        for op, options in self._all_reduce_options.items():
            options.reduceOp = _TORCH_OPS[op]
        self._all_reduce_options["avg"] = self._all_reduce_options["sum"]

    def _exit_of(self, rank: int) -> Optional[PeerExit]:
        """The watched exit of ``rank``'s process (``gloo_exits``), where it runs on this machine, in this pid
        namespace (``peer_pids``, learnt with the hosts); else None: its connection tells."""
        pids = self.peer_pids
        if pids is None or self.pg is None:
            return None
        if self._exits is None:
            self._exits = tuple(watch_exit(pid) if pid and r != self.rank else None for r, pid in enumerate(pids))
        return self._exits[rank]

    # -- point to point ---------------------------------------------------------------
    def isend(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        buf = _bytes(tensor)
        return _posted(self.pg.send, [buf], peer, tag, what=("send to rank {} (tag {})", peer, tag), peer=peer,
                       peer_exit=self._exits[peer] if self._exits is not None else self._exit_of(peer))

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        buf = _bytes(tensor)
        return _posted(self.pg.recv, [buf], peer, tag, what=("recv from rank {} (tag {})", peer, tag), peer=peer,
                       peer_exit=self._exits[peer] if self._exits is not None else self._exit_of(peer))

    # The user's send/recv hand gloo the tensor in its own shape and dtype (gloo moves its bytes all the
    # same): torch's profiler then records gloo's own "gloo:send"/"gloo:recv" event with the user's shape.
    def user_isend(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        buf = _as_sent(tensor)
        return _posted(self.pg.send, [buf], peer, tag, what=("send to rank {} (tag {})", peer, tag), peer=peer,
                       peer_exit=self._exits[peer] if self._exits is not None else self._exit_of(peer))

    def user_irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        buf = _as_sent(tensor)
        return _posted(self.pg.recv, [buf], peer, tag, what=("recv from rank {} (tag {})", peer, tag), peer=peer,
                       peer_exit=self._exits[peer] if self._exits is not None else self._exit_of(peer))

    def irecv_any(self, tensor: torch.Tensor, tag: int) -> Request:
        buf = _as_sent(tensor)
        return _posted(self.pg.recv_anysource, [buf], tag, what=("recv from any rank (tag {})", tag))

    def split(self, ranks: Sequence[int], key: str, deadline: Optional[float] = None) -> Optional["GlooBackend"]:
        if self.rank not in ranks:
            return None
        if deadline is not None:  # gloo's own rendezvous ends at its store's bound, not at the deadline
            members_arrive(self, list(ranks), key, deadline)
        store = td.PrefixStore(f"zerocomm/{key}/", self.store)
        return GlooBackend(store, list(ranks).index(self.rank), len(ranks), self.timeout, deadline)

    def close(self, abandon: bool = False) -> None:
        self.release_attached(abandon)  # what the layers above keep on it (Transport.on_close)
        exits, self._exits = self._exits, None
        for peer_exit in exits or ():
            if peer_exit is not None:
                release_exit(peer_exit)
        pg, self.pg = self.pg, None
        if self._device_held:
            self._device_held = False
            _shared_device.release(self._interfaces)
        if abandon and pg is not None:
            # ProcessGroupGloo's destructor waits for its connections to drain, and a peer whose link went
            # down (no reset, no close) never lets them: dropping the last reference would block this
            # process for good, holding the GIL.  A failed group's handle is given up instead: one leaked
            # reference, so the destructor never runs; the process still exits.
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(pg))

    # -- what gloo supports -----------------------------------------------------------
    @classmethod
    def native_support(cls, collective: str, dtype: torch.dtype, op: Optional[str]) -> Optional[str]:
        return None  # torch's gloo serves every dtype and op zerocomm admits (probed; see NATIVE_TABLE)

    @classmethod
    def native_table(cls) -> dict:
        return dict(NATIVE_TABLE)

    @classmethod
    def native_traffic_as(cls, collective: str) -> str:
        return "all_reduce" if collective == "reduce_scatter" else collective  # see NATIVE_TABLE

    STAGE_RIDES = True

    def reduce_stage(self, stage: torch.Tensor, *, tag: int, deadline: Optional[float]) -> None:
        # allreduce's own call, without its frames (the options are made once, below).
        _wait_until(self.pg.allreduce([stage], self._all_reduce_options["sum"]),
                    "every rank to reach the mismatch check", deadline)

    # -- native collectives: the algorithms' arguments, blocking until done or the deadline ----------
    def all_reduce(self, tensor, op, *, tag, deadline, segment_bytes) -> None:
        if tensor.nbytes:
            _wait_until(self.pg.allreduce([tensor], self._all_reduce_options[op]), "gloo allreduce", deadline)
            if op == "avg":
                finalize_(tensor, "avg", self.size)

    def broadcast(self, tensor, root, *, tag, deadline, segment_bytes) -> None:
        if tensor.nbytes:
            opts = _C.BroadcastOptions()
            opts.rootRank, opts.rootTensor = root, 0
            _wait_until(self.pg.broadcast([tensor], opts), "gloo broadcast", deadline)

    def reduce(self, tensor, op, root, *, tag, deadline, segment_bytes) -> None:
        if not tensor.nbytes:
            return
        opts = _C.ReduceOptions()
        opts.rootRank, opts.reduceOp = root, _TORCH_OPS["sum" if op == "avg" else op]
        work_tensor = tensor if self.rank == root else tensor.clone()
        _wait_until(self.pg.reduce([work_tensor], opts), "gloo reduce", deadline)
        if self.rank == root and op == "avg":
            finalize_(tensor, "avg", self.size)

    def all_gather(self, output, input, *, tag, deadline, segment_bytes) -> None:
        if input.nbytes:
            _wait_until(self.pg._allgather_base(output, input), "gloo allgather", deadline)

    def gather(self, output, input, root, *, tag, deadline, segment_bytes) -> None:
        if not input.nbytes:
            return
        opts = _C.GatherOptions()
        opts.rootRank = root
        outputs: List[List[torch.Tensor]] = [list(output.chunk(self.size))] if self.rank == root else []
        _wait_until(self.pg.gather(outputs, [input], opts), "gloo gather", deadline)

    def scatter(self, output, input, root, *, tag, deadline, segment_bytes) -> None:
        if not output.nbytes:
            return
        opts = _C.ScatterOptions()
        opts.rootRank = root
        inputs = [as_chunks(input, self.size)] if self.rank == root else []
        _wait_until(self.pg.scatter([output], inputs, opts), "gloo scatter", deadline)

    def reduce_scatter(self, output, input, op, *, tag, deadline, segment_bytes) -> None:
        if not output.nbytes:
            return
        opts = _C.ReduceScatterOptions()
        opts.reduceOp = _TORCH_OPS["sum" if op == "avg" else op]
        _wait_until(self.pg._reduce_scatter_base(output, input, opts), "gloo reduce_scatter", deadline)
        if op == "avg":
            finalize_(output, "avg", self.size)

    def all_to_all(self, output, input, out_counts, in_counts, *, tag, deadline, segment_bytes) -> None:
        # No early return for a rank that sends and receives nothing: gloo's alltoall is a collective of
        # every rank, and the others would wait for this one until their deadline.
        _wait_until(self.pg.alltoall_base(output, input, list(out_counts), list(in_counts), _C.AllToAllOptions()),
              "gloo alltoall", deadline)

    def barrier(self, *, tag, deadline, segment_bytes) -> None:
        _wait_until(self.pg.barrier(_C.BarrierOptions()), "gloo barrier", deadline)

    NATIVE = {"all_reduce": all_reduce, "broadcast": broadcast, "reduce": reduce, "all_gather": all_gather,
              "gather": gather, "scatter": scatter, "reduce_scatter": reduce_scatter, "all_to_all": all_to_all,
              "barrier": barrier}

    # -- the same, posted without waiting (``Backend.ISSUE``): gloo runs them on its own threads ----------
    def _avg_after(self, tensor, op):
        return (lambda: finalize_(tensor, "avg", self.size)) if op == "avg" else None

    def issue_all_reduce(self, tensor, op, *, tag, deadline, segment_bytes) -> tuple:
        if not tensor.nbytes:
            return None, None
        work = self.pg.allreduce([tensor], self._all_reduce_options[op])
        return GlooRequest(work, "gloo allreduce", tensor), self._avg_after(tensor, op)

    def issue_broadcast(self, tensor, root, *, tag, deadline, segment_bytes) -> tuple:
        if not tensor.nbytes:
            return None, None
        opts = _C.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        return GlooRequest(self.pg.broadcast([tensor], opts), "gloo broadcast", tensor), None

    def issue_reduce(self, tensor, op, root, *, tag, deadline, segment_bytes) -> tuple:
        if not tensor.nbytes:
            return None, None
        opts = _C.ReduceOptions()
        opts.rootRank, opts.reduceOp = root, _TORCH_OPS["sum" if op == "avg" else op]
        work_tensor = tensor if self.rank == root else tensor.clone()
        request = GlooRequest(self.pg.reduce([work_tensor], opts), "gloo reduce", work_tensor)
        return request, self._avg_after(tensor, op) if self.rank == root else None

    def issue_all_gather(self, output, input, *, tag, deadline, segment_bytes) -> tuple:
        if not input.nbytes:
            return None, None
        return GlooRequest(self.pg._allgather_base(output, input), "gloo allgather", (output, input)), None

    def issue_gather(self, output, input, root, *, tag, deadline, segment_bytes) -> tuple:
        if not input.nbytes:
            return None, None
        opts = _C.GatherOptions()
        opts.rootRank = root
        outputs: List[List[torch.Tensor]] = [list(output.chunk(self.size))] if self.rank == root else []
        return GlooRequest(self.pg.gather(outputs, [input], opts), "gloo gather", (outputs, input)), None

    def issue_scatter(self, output, input, root, *, tag, deadline, segment_bytes) -> tuple:
        if not output.nbytes:
            return None, None
        opts = _C.ScatterOptions()
        opts.rootRank = root
        inputs = [as_chunks(input, self.size)] if self.rank == root else []
        return GlooRequest(self.pg.scatter([output], inputs, opts), "gloo scatter", (output, inputs)), None

    def issue_reduce_scatter(self, output, input, op, *, tag, deadline, segment_bytes) -> tuple:
        # [Note: gloo's reduce_scatter Work]  torch composes gloo's reduce_scatter as an all_reduce of a clone
        # and a copy of this rank's chunk made inside ``wait()``: its Work never reports completion, and every
        # ``wait`` copies the chunk again (torch 2.13), so a second wait put the SUM back over an AVG already
        # divided.  Issued here as what it is: the all_reduce of a clone, with the copy in ``after``.
        if not output.nbytes:
            return None, None
        whole = input.clone()
        work = self.pg.allreduce([whole], self._all_reduce_options[op])
        mine = whole.view(self.size, -1)[self.rank].view(output.shape)

        def after() -> None:
            output.copy_(mine)
            if op == "avg":
                finalize_(output, "avg", self.size)

        return GlooRequest(work, "gloo reduce_scatter", (output, whole)), after

    def issue_all_to_all(self, output, input, out_counts, in_counts, *, tag, deadline, segment_bytes) -> tuple:
        work = self.pg.alltoall_base(output, input, list(out_counts), list(in_counts), _C.AllToAllOptions())
        return GlooRequest(work, "gloo alltoall", (output, input)), None

    def issue_barrier(self, *, tag, deadline, segment_bytes) -> tuple:
        return GlooRequest(self.pg.barrier(_C.BarrierOptions()), "gloo barrier"), None

    #: gloo's own asynchronous collectives, posted without waiting: gloo's one worker thread runs them in order.
    ISSUE = {"all_reduce": issue_all_reduce, "broadcast": issue_broadcast, "reduce": issue_reduce,
             "all_gather": issue_all_gather, "gather": issue_gather, "scatter": issue_scatter,
             "reduce_scatter": issue_reduce_scatter, "all_to_all": issue_all_to_all, "barrier": issue_barrier}
