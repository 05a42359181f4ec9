"""The backend protocol: what a backend implements, written down once.

A backend is one communicator: ``size`` processes numbered ``0..size-1`` (group ranks),
of which this process is ``rank``.  It has three parts:

* **point to point** (:class:`Transport`): ``isend``/``irecv`` of the bytes of contiguous
  tensors, matched by ``(peer, tag)`` (and ``exchange``, the two at once with one peer); messages with the same ``(peer, tag)`` are received
  in the order they were sent (MPI's non-overtaking rule, gloo's per-slot FIFO).  That is
  everything zerocomm's own algorithms (ring, tree, 1-bit) need, so one schedule serves
  every backend, the test fakes included.
* **native collectives** (:class:`Backend`): ``NATIVE``, a class-level table
  ``{collective: function}``; each function has the algorithms' signature
  ``f(backend, *buffers, tag, deadline, segment_bytes)`` and runs the collective on the
  backend's own implementation, blocking until done or ``deadline``.
* **what it supports**, answered at class level so the capability matrix can ask without
  starting anything: ``native_support(collective, dtype, op)`` and ``can_move(dtype)``
  (``None`` = served, else a sentence saying why not), ``native_table()`` (how each
  collective is done, for the docs).

Failures a backend reports while waiting:

* ``TimeoutError`` (the builtin) when the wait's time runs out; its text names what was
  awaited ("recv from rank 1 (tag 1048577)").
* :class:`PeerFailure` when the transport says a peer went away or failed.

Anything else raised is a local error (a bad buffer, a bug) and stays what it is; the
group turns only these two into ``CommTimeoutError`` and ``PeerError``.
"""
from __future__ import annotations

import abc
import dataclasses
import functools
import time
import zlib
from typing import Any, Callable, ClassVar, List, Mapping, Optional, Sequence

import torch

#: Tags at or above this value are reserved for collectives; user send/recv tags
#: must be below it.  MPI guarantees at least 32767 tags, MPICH gives 2**29 - 1.
USER_TAG_LIMIT = 1 << 20
#: Tags from here to ``2**29`` (below MPICH's bound) are ``split``'s arrival handshakes (:func:`members_arrive`);
#: collectives stay below it.
SPLIT_TAG = 1 << 28


class PeerFailure(Exception):
    """A peer failed or went away while this rank waited on it.

    Attributes:
        peer: the peer's rank in the communicator, or ``None`` when the backend cannot say
            which one (a native collective over several peers).
        abandoned: where the peer marked the call abandoned before leaving it (``shm.Arena.abandon``), the
            code it left (the group decodes it: which call, and why); else ``None``.
    """

    def __init__(self, what: str, peer: Optional[int] = None, abandoned: Optional[int] = None):
        super().__init__(what)
        self.peer = peer
        self.abandoned = abandoned


class Request(abc.ABC):
    """One posted operation (send, recv or native collective).

    ``wait(timeout_s)`` returns when done; raises ``TimeoutError`` when ``timeout_s``
    seconds pass first (``None``: no limit) or :class:`PeerFailure` when the peer failed.
    """

    STREAM_ORDERED: ClassVar[bool] = False
    """True where ``wait()`` only orders the caller's device stream after the operation and is bounded by the
    backend's own watchdog, not by ``timeout_s`` (NCCL): an issued call's ``Work`` then waits on it directly,
    with no deadline arithmetic of its own."""

    #: A stream-ordered request's torch ``Work`` (an object whose C ``wait()`` is that wait), where it has one: an
    #: issued call's ``Work`` waits on it with no Python frame between (``None``: call :meth:`wait`).
    stream_work = None

    @abc.abstractmethod
    def test(self) -> bool:
        """True once the operation has completed (drives progress where the backend needs it)."""

    @abc.abstractmethod
    def wait(self, timeout_s: Optional[float] = None) -> None:
        """Block, without burning a core, until done or ``timeout_s`` seconds pass."""


@dataclasses.dataclass
class Attached:
    """What the layers above a communicator learn about it once and keep with it (``Transport.local``).

    Declared here, in one place, so that no module stores attributes of its own on a backend object.
    """

    hosts: Optional[tuple] = None
    """Every rank's host name, index = rank (``topology.hosts``)."""
    one_host: Optional[bool] = None
    """Whether every rank is on one host; ``None`` until the hosts are known."""
    no_segment: bool = False
    """The ranks report one host but cannot share a segment (``shm.probe_shared_memory``, ``shm.arena``)."""
    arena: Any = None
    """The shared-memory arena of the communicator, once made (``shm.arena``)."""
    heaps: List[Any] = dataclasses.field(default_factory=list)
    """Shared heaps of ``shared_empty`` tensors (``shm_heap``)."""
    hierarchy: Any = None
    """The hierarchical algorithms' host layout and sub-communicators (``algorithms.hierarchical``)."""
    host_segments: bool = False
    """The ranks span hosts and every host's ranks share a segment, as the mismatch check's first round across
    hosts found (``MismatchCheck.across_hosts``); where they do not, that round sets ``no_segment`` instead."""
    made_s: float = dataclasses.field(default_factory=time.time)
    """Wall-clock seconds when this record was made (as the communicator's hosts were learnt, at its creation): a
    note left in the store before it is an earlier communicator's (``abandon.notes``)."""


class Transport(abc.ABC):
    """Point to point over one communicator of ``size`` processes; this one is ``rank``.

    Attributes:
        name: backend name ("gloo", "mpi", "nccl", ...).
        rank: this process's rank within the communicator.
        size: number of processes in the communicator.
        device_type: the device whose tensors it moves ("cpu" or "cuda").
    """

    name: str
    rank: int
    size: int
    device_type: str = "cpu"
    #: The pid of each rank's process where it runs on this machine, in this pid namespace, else 0; learnt with
    #: the ranks' hosts (``topology.hosts``), None until then.  A backend may use it to tell a dead peer from a
    #: slow one where its own transport cannot.
    peer_pids: Optional[tuple] = None

    #: What the layers above release when a communicator closes (:meth:`on_close`), in the order registered.
    _close_hooks: ClassVar[List[Callable[["Transport", bool], None]]] = []

    @functools.cached_property
    def local(self) -> Attached:
        """What the layers above learnt about this communicator (see :class:`Attached`); made on first use."""
        return Attached()

    @staticmethod
    def on_close(hook: Callable[["Transport", bool], None]) -> Callable[["Transport", bool], None]:
        """Register ``hook(transport, abandon)`` to run whenever any communicator closes (every backend's
        ``close`` calls :meth:`release_attached` first), and return it.

        A layer above the backends that keeps something on a communicator (``shm``'s arena and heaps,
        ``algorithms.hierarchical``'s sub-communicators, both in :attr:`local`) registers its release here
        once, at import: backends learn what to release from this list and import none of those layers.
        ``abandon`` is ``close``'s (the group failed; release without waiting on peers)."""
        if hook not in Transport._close_hooks:
            Transport._close_hooks.append(hook)
        return hook

    def release_attached(self, abandon: bool = False) -> None:
        """Run every :meth:`on_close` hook on this communicator, in the order they were registered (a
        backend's ``close`` calls it before releasing its own resources)."""
        for hook in tuple(Transport._close_hooks):
            hook(self, abandon)

    @abc.abstractmethod
    def isend(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        """Post a send of the contiguous ``tensor`` to ``peer``; ``tensor`` must not change until done."""

    @abc.abstractmethod
    def irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        """Post a receive into the contiguous ``tensor`` from ``peer``; it must have the sender's byte size."""

    def exchange(self, send: torch.Tensor, recv: torch.Tensor, peer: int, tag: int, deadline: Optional[float]) -> None:
        """Send ``send`` to ``peer`` and receive ``recv`` (the same byte size) from it with one ``tag``;
        return when both are done, by ``deadline`` (``time.monotonic()`` seconds, or None).  The whole-buffer
        step of recursive doubling; this is ``irecv`` + ``isend`` and their waits, and a backend may do it in
        one call (MPI's C hot loop)."""
        incoming = self.irecv(recv, peer, tag)
        outgoing = self.isend(send, peer, tag)
        # The receive first: once it is done, the peer was alive and sending.  (A peer that dies ends the
        # operations queued for it when its connection closes; gloo leaves one already under way, a send or a
        # receive, waiting until that peer's process is seen to exit: [Note: waits on the dead], gloo_exits.py.)
        incoming.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        outgoing.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    @classmethod
    def can_move(cls, dtype: torch.dtype) -> Optional[str]:
        """``None`` if ``isend``/``irecv`` can move tensors of ``dtype``, else why not."""
        return None


#: A native collective: ``f(backend, *buffers, tag, deadline, segment_bytes) -> None``.
NativeCollective = Callable[..., None]
#: A native collective posted without waiting: ``f(backend, *buffers, tag, deadline, segment_bytes) -> (request, after)``.
IssuedCollective = Callable[..., tuple]


class Backend(Transport):
    """A transport that can also run collectives natively and create sub-communicators.

    ``NATIVE`` lists the collectives the backend runs itself; a collective missing from it
    has no native form on this backend.  Its functions take the same buffers as the
    algorithm registry (``comm.algorithms``) and ignore ``tag`` and ``segment_bytes``.
    """

    NATIVE: ClassVar[Mapping[str, NativeCollective]] = {}

    #: The native collectives the backend runs asynchronously by itself, so that an ``async_op`` call is issued
    #: to it directly (no executor thread; see ``Group.run``): ``{collective: f(backend, *buffers, tag, deadline,
    #: segment_bytes) -> (request, after)}``, the buffers of ``NATIVE``'s function.  ``f`` posts the collective
    #: and returns at once; ``request`` (a :class:`Request`, or ``None`` when nothing was to move) completes
    #: with it, and ``after`` (``None`` or a callable without arguments) runs once after it completed: what the
    #: blocking function does to the outputs after its wait (gloo's AVG divides the SUM).
    ISSUE: ClassVar[Mapping[str, IssuedCollective]] = {}

    @classmethod
    def native_support(cls, collective: str, dtype: torch.dtype, op: Optional[str]) -> Optional[str]:
        """``None`` if the backend's own ``collective`` serves (dtype, op); else why not."""
        if collective not in cls.NATIVE:
            return f"{cls.name} has no native {collective}"
        return None

    @classmethod
    def native_table(cls) -> dict:
        """``{collective: "native ..." | "composed: how"}`` for docs and the capability matrix."""
        return {}

    #: Whether :meth:`irecv_any` (receive from whichever peer sends) works on this backend.
    ANY_SOURCE: ClassVar[bool] = False

    #: Where the group's call sequence, and so its collective tags, starts: the same on every rank.  0 where a
    #: destroyed communicator's messages cannot reach a later one; MPI draws it at random (see ``MpiBackend``).
    tag_origin: int = 0

    def irecv_any(self, tensor: torch.Tensor, tag: int) -> Request:
        """Post a receive from whichever peer sends with ``tag``; the request's ``source()`` is its rank."""
        raise NotImplementedError(f"{self.name} cannot receive from any source")

    def user_isend(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        """``isend`` for the user's send/recv (a backend without tags keeps them apart from collectives)."""
        return self.isend(tensor, peer, tag)

    def user_irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        """``irecv`` for the user's send/recv; see :meth:`user_isend`."""
        return self.irecv(tensor, peer, tag)

    #: Whether a small all_reduce's payload may ride in the check's stage (``reduce_stage``): the backend's tensors
    #: live in host memory, beside the stage (gloo, MPI); not where they would cross to a device and back (NCCL).
    STAGE_RIDES: ClassVar[bool] = False

    def reduce_stage(self, stage: torch.Tensor, *, tag: int, deadline: Optional[float]) -> None:
        """SUM all_reduce, in place, of the mismatch check's ``stage`` (a contiguous float64 tensor in host memory
        of ``check.STAGE`` elements, the same size on every rank and every call): the one primitive the check
        asks of a backend (``check.MismatchCheck``; the stage's format is the check's).  Every rank calls it, in
        the collectives' order, before the collective it checks moves a byte; ``tag`` is that call's (a backend
        that matches by order may ignore it).  It must cost about one small
        native all_reduce and allocate nothing per call after the first; a stage that timed out is left to the
        request still posted (the group is unusable after).  Raises ``TimeoutError`` or :class:`PeerFailure`
        like a native collective."""
        raise NotImplementedError(f"{self.name} cannot reduce the mismatch check's stage")

    @classmethod
    def native_traffic_as(cls, collective: str) -> str:
        """The collective whose optimal schedule the native ``collective`` moves bytes like (for
        ``count_bytes``, which cannot see a backend's own messages): itself, unless the backend
        composes it from something bigger (gloo's reduce_scatter is a whole all_reduce)."""
        return collective

    def split(self, ranks: Sequence[int], key: str, deadline: Optional[float] = None) -> Optional["Backend"]:
        """A new communicator over ``ranks`` (ranks of this one, in order).

        Every member of *this* communicator calls it with the same ``ranks`` and ``key``;
        non-members get ``None``.  A member that never comes makes the others raise ``TimeoutError``
        by ``deadline`` (``time.monotonic()`` seconds; ``None``: the backend's own bound, if any).
        """
        raise NotImplementedError(f"{self.name} backend cannot split")

    def close(self, abandon: bool = False) -> None:
        """Release the communicator's resources.

        ``abandon``: the group failed (a timeout or a lost peer), so a peer may be unreachable.  A backend
        whose teardown would wait for such a peer must not block: it gives its handles up unreleased.
        """


def members_arrive(t: Transport, ranks: Sequence[int], key: str, deadline: Optional[float]) -> None:
    """Return once every rank in ``ranks`` (ranks of ``t``, this one among them) has called it with ``key``:
    each sends one byte to the first member and waits for one back, every wait bounded by ``deadline``
    (``TimeoutError`` past it).  For backends whose communicator creation has no deadline of its own (MPI's)
    or a looser one (gloo's store)."""
    tag = SPLIT_TAG + zlib.crc32(key.encode()) % SPLIT_TAG
    leader, others = ranks[0], list(ranks[1:])

    def left() -> Optional[float]:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    byte = torch.zeros(1, dtype=torch.uint8)
    if t.rank != leader:
        t.isend(byte, leader, tag).wait(left())
        t.irecv(torch.empty(1, dtype=torch.uint8), leader, tag).wait(left())
        return
    for p in others:
        t.irecv(torch.empty(1, dtype=torch.uint8), p, tag).wait(left())
    for send in [t.isend(byte, p, tag) for p in others]:
        send.wait(left())
