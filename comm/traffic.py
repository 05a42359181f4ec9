"""Observing collectives: a record per call, bytes counted per rank and per op.

When an observer is registered (``count_bytes()`` here, the profiler in
``benchmarks``), each collective produces a :class:`CallRecord`: op, group, algorithm,
backend, payload size, start and end times, and the bytes this rank sent and
received.  For zerocomm's own algorithms the bytes are *measured* — every
``isend``/``irecv`` goes through :class:`CountingTransport`.  A backend's native
collective moves bytes where zerocomm cannot see them, so its bytes are the
bandwidth-optimal schedule's (``bus factor × S``, nccl-tests' definition) and the
record says ``measured=False``.

With no observer registered nothing here runs: calls take no timestamps, wrap no
transport and never synchronize.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
from typing import Dict, Iterator, List, Optional

from .algorithms.compressed import onebit_message_bytes
from .transport import Request, Transport

#: nccl-tests' bus-bandwidth factors: bytes a rank moves per byte of S on an optimal schedule.
def bus_factor(collective: str, n: int) -> float:
    if n <= 1:
        return 0.0
    if collective in ("all_reduce", "compressed_all_reduce"):
        return 2.0 * (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return 1.0
    if collective in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    return 0.0


@dataclasses.dataclass
class CallRecord:
    op: str
    """The collective ("all_reduce", "all_gather", ...)."""
    group_ranks: List[int]
    algorithm: str
    backend: str
    size_bytes: int
    """S as nccl-tests defines it for this collective (the whole buffer)."""
    rank: int
    """This process's global rank."""
    issued_s: float = 0.0
    """``time.perf_counter()`` when the caller issued the call; ``start_s - issued_s`` is its time in the queue."""
    start_s: float = 0.0
    """``time.perf_counter()`` when the call started running (after any queueing)."""
    end_s: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    measured: bool = True
    """False when the bytes are the optimal schedule's estimate (native collectives)."""

    @property
    def group_size(self) -> int:
        return len(self.group_ranks)

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


class CountingTransport(Transport):
    """Delegates to ``inner``, adding each message's bytes to ``record``."""

    def __init__(self, inner: Transport, record: CallRecord):
        self._inner = inner
        self._record = record
        self._lock = threading.Lock()
        self.name, self.rank, self.size, self.device_type = inner.name, inner.rank, inner.size, inner.device_type

    def isend(self, tensor, peer: int, tag: int) -> Request:
        with self._lock:
            self._record.bytes_sent += tensor.numel() * tensor.element_size()
        return self._inner.isend(tensor, peer, tag)

    def irecv(self, tensor, peer: int, tag: int) -> Request:
        with self._lock:
            self._record.bytes_received += tensor.numel() * tensor.element_size()
        return self._inner.irecv(tensor, peer, tag)

    @property
    def local(self):
        """The real transport's: observed and unobserved calls share one arena and one topology."""
        return self._inner.local

    def __getattr__(self, name):  # native collectives and anything else: the real transport's
        return getattr(self._inner, name)


@dataclasses.dataclass
class OpTraffic:
    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    measured: bool = True
    """False if any call's bytes were estimated (a native collective)."""


class TrafficCounter:
    """Bytes this rank sent and received per op, while registered (see :func:`count_bytes`)."""

    def __init__(self) -> None:
        self.per_op: Dict[str, OpTraffic] = collections.defaultdict(OpTraffic)
        self._lock = threading.Lock()

    def on_start(self, record: CallRecord) -> None:
        pass

    def on_end(self, record: CallRecord) -> None:
        with self._lock:
            entry = self.per_op[record.op]
            entry.calls += 1
            entry.bytes_sent += record.bytes_sent
            entry.bytes_received += record.bytes_received
            entry.measured &= record.measured

    @property
    def bytes_sent(self) -> int:
        return sum(e.bytes_sent for e in self.per_op.values())

    @property
    def bytes_received(self) -> int:
        return sum(e.bytes_received for e in self.per_op.values())

    def reset(self) -> None:
        with self._lock:
            self.per_op.clear()


def run_observed(observers, call, tag: int, deadline: float, segment_bytes: int, issued_s: float,
                 ridden: bool = False) -> None:
    """Run ``call`` (a ``plan.Call``) with a :class:`CallRecord` for ``observers``: zerocomm's own
    algorithms through a :class:`CountingTransport`, native collectives estimated (see the module note), and so
    is a call that ``ridden`` in its mismatch check's round (``MismatchCheck.in_segment``: no message of its own)."""
    group = call.group
    # A compressed all_reduce is its own line in byte counts and profiles: it moves 1/32 of the bytes.
    op = "compressed_all_reduce" if call.algorithm == "onebit" else call.collective
    record = CallRecord(op=op, group_ranks=list(group.ranks), algorithm=call.algorithm,
                        backend=group.backend, size_bytes=call.nbytes, rank=group.my_global_rank)
    communicator = group.communicator
    estimated = call.algorithm == "native" or ridden
    transport = communicator if estimated else CountingTransport(communicator, record)
    record.start_s = now()
    record.issued_s = issued_s or record.start_s
    for observer in observers:
        observer.on_start(record)
    group.invoke(call, tag, deadline, segment_bytes, transport)
    record.end_s = now()
    if estimated:
        factor = bus_factor(communicator.native_traffic_as(call.collective), record.group_size)
        record.bytes_sent = record.bytes_received = int(round(factor * record.size_bytes))
        record.measured = False
    elif call.algorithm == "onebit" and call.options["inner"] == "native":
        # The two native sub-collectives' bytes are invisible: the schedule's 2 (n-1) compressed rows.
        row = onebit_message_bytes(call.numel, record.group_size, call.dtype)
        record.bytes_sent = record.bytes_received = 2 * (record.group_size - 1) * row
        record.measured = False
    for observer in observers:
        observer.on_end(record)


@contextlib.contextmanager
def observing(registry, observer) -> Iterator:
    registry.observers.append(observer)
    try:
        yield observer
    finally:
        registry.observers.remove(observer)


def now() -> float:
    return time.perf_counter()
