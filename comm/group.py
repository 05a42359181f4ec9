"""Groups: who takes part in a collective, over which communicator, with which timeout — and the
one place a checked call runs.

[Note: ordering]  All ranks must run a group's collectives in the same order, and a
backend's native collectives are matched by order, not by tag.  So every collective
of a group, whatever its algorithm, runs in the order the caller issued it: a call
takes its tag (a per-group sequence number) under the same lock that queues it.  A
blocking call made while nothing is queued or running runs inline on the caller's
thread, holding that lock (no thread hop).  An asynchronous call of a native collective that
the backend runs asynchronously by itself (``Backend.ISSUE``: gloo's and NCCL's) is issued to the
backend directly under the same condition, and its ``IssuedWork`` waits on the backend's own
request: the backend keeps the order of what it was given.  So does an asynchronous all_reduce
small enough to ride in its mismatch check's round (``MismatchCheck.in_segment``): done at issue.  Anything else -- a schedule written in Python, or any call while something is queued or
running -- goes to the group's executor thread, through a bounded queue (a caller that gets too
far ahead waits, within its deadline), so that no call overtakes one issued before it.
Point-to-point calls by the user do not go through here: they carry the user's tag, below
``USER_TAG_LIMIT``, and never match a collective's messages.
"""
from __future__ import annotations

import collections
import datetime
import re
import sys
import threading
import time
from concurrent.futures import Future
from threading import get_ident
from typing import Dict, List, Optional

import torch

from . import abandon, check, flight, shm
from .config import CommConfig
from .errors import CollectiveMismatchError, CommError, CommTimeoutError, NotInitializedError, PeerError
from .traffic import run_observed
from .transport import USER_TAG_LIMIT, Backend, PeerFailure
from .work import IssuedWork, Work

_monotonic = time.monotonic
_FLIGHT_MASK = flight.MASK

#: The deadline of a group created without one (``CommConfig.timeout_s``'s default; see docs/failures.md).
DEFAULT_TIMEOUT = datetime.timedelta(seconds=CommConfig().timeout_s)

#: Collective tags cycle through [USER_TAG_LIMIT, USER_TAG_LIMIT + _TAG_SPAN): far more
#: than could ever be in flight at once, and below MPICH's 2**29 - 1 tag bound.
_TAG_SPAN = (1 << 28) - USER_TAG_LIMIT


class Group:
    """A set of processes that run collectives together.

    Attributes:
        ranks: global ranks of the members, indexed by group rank.
        rank: this process's group rank.
        communicator: the backend's communicator over the members (group ranks); ``None`` once destroyed.
        backend: the backend's name; ``backend_type`` its class, ``device_type`` the device it moves.
        timeout: bound on every blocking wait of this group's calls.
        name: a name unique in the world, for messages and stores.
        handle: the torch c10d ``ProcessGroup`` that stands for this group in user code (``c10d.handle_of``).
    """

    #: Tags cycle through this many values (``flight.py`` orders a group's calls by them).
    TAG_SPAN = _TAG_SPAN

    def __init__(self, ranks: List[int], rank: int, communicator: Backend, timeout: datetime.timedelta,
                 backend: str, name: str):
        self.ranks = list(ranks)
        self.rank = rank
        self.communicator = communicator
        self.backend_type = type(communicator)
        self.device_type = communicator.device_type
        self.on_cpu = self.device_type == "cpu"
        self.timeout = timeout
        self._timeout_s = timeout.total_seconds()
        self.backend = backend
        #: What ``get_backend`` answers: ``backend``, or torch's device map ("cpu:gloo,cuda:nccl") for a group whose
        #: CUDA tensors go to a twin of another backend (``twin_backend``; ``staging.offer_nccl``).
        self.backend_string = backend
        self.twin_backend: Optional[str] = None
        self.name = name
        self.my_global_rank = self.ranks[rank]
        self.handle = None
        #: The plans of this group's cells (``plan.py``), by cell; emptied by :meth:`forget_plans`.
        self.plans: Dict[tuple, object] = {}
        #: The group's mismatch check (``check.py``): its plans' checkers are its methods.
        self.check = check.MismatchCheck(self)
        #: The checker whose check an "shm" call's own first sync runs, settled after the call if it never synced.
        self._arms_first_sync = self.check.in_first_sync
        #: The configuration's segment size, read once per configuration (``World.config``).
        self.segment_bytes = WORLD.config.segment_bytes
        #: The backend's native function -> its asynchronous form (``Backend.ISSUE``): an ``async_op`` call whose
        #: function is a key is issued directly (see ``run``).
        self.issuers: Dict = {self.backend_type.NATIVE[name]: issue for name, issue in self.backend_type.ISSUE.items()}
        self._seq = communicator.tag_origin
        #: The flight recorder's rings of this group's last calls -- each call's cell (``Call.check``) and size
        #: in bytes, at slot ``seq & flight.MASK`` -- and the tags of the call it started and of the last it
        #: completed (``flight.py``: a record's state derives from them).
        self.flight: Optional[list] = [None] * flight.RING
        self.flight_sizes: List[int] = [0] * flight.RING
        #: Each call's caller, ``(code, instruction offset)``, where ``ZEROCOMM_FLIGHT_CALLERS=1`` asks for them
        #: (``flight.callers_wanted``): then ``run`` is wrapped by the one that notes them (``_run_noting_caller``).
        self.flight_callers: Optional[list] = None
        if flight.callers_wanted():
            self.flight_callers = [None] * flight.RING
            self.run = self._run_noting_caller
        self._flight_origin = self._seq
        self._flight_started: Optional[int] = None
        self._flight_done: Optional[int] = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # the queue or the pending count changed
        self._pending = 0  # calls queued or running
        self._queue: collections.deque = collections.deque()
        self._worker: Optional[threading.Thread] = None
        self._worker_ident: Optional[int] = None
        self._closed = False
        #: The first timeout or peer failure: the group is unusable after it (see ``run``).
        self.failure: Optional[CommError] = None

    # -- identity -------------------------------------------------------------------
    def size(self) -> int:
        return len(self.ranks)

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank]

    def device(self) -> torch.device:
        """The device whose tensors this group moves (for NCCL, this rank's GPU)."""
        own = getattr(self.communicator, "device", None)
        if own is not None:
            return torch.device(own)
        if self.device_type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device(self.device_type)

    def describe(self) -> str:
        return f"group {self.name} (global ranks {self.ranks})"

    def peer_name(self, group_rank: Optional[int]) -> str:
        """A peer in the one rank space of messages: its global rank, the group rank in brackets."""
        if group_rank is None:
            return "a peer"
        return f"rank {self.ranks[group_rank]} [group rank {group_rank}]"

    def __repr__(self) -> str:
        return f"<zerocomm Group {self.name} ranks={self.ranks} backend={self.backend}>"

    def forget_plans(self) -> None:
        """Drop this group's plans (its configuration or topology changed, or it is destroyed): the next call of
        each cell takes the full checks and makes its plan again."""
        self.plans.clear()
        for key in [key for key, plan in WORLD.plans.items() if plan.group is self]:
            del WORLD.plans[key]

    # -- running checked calls -----------------------------------------------------------
    def run(self, call) -> Optional[Work]:
        """Run ``call`` (a ``plan.Call``) in this group's order; return a ``Work`` if ``call.async_op``."""
        # Observers (byte counters, the profiler) see the calls issued while they are registered.
        observers = WORLD.observers
        if observers:
            observers = tuple(observers)
            issued_s = time.perf_counter()  # an observed call's record shows its queueing
        else:
            observers, issued_s = (), 0.0
        with self._lock:
            if self._closed:
                raise CommError(f"rank {self.my_global_rank}: {call.collective}: {self.describe()} was destroyed")
            if self.failure is not None:
                # Peers are out of step after a failure (messages of the failed call may still arrive): a later
                # call would match the wrong messages.  It fails at once, naming the first failure.
                raise type(self.failure)(
                    f"rank {self.my_global_rank}: {call.collective}: {self.describe()} is unusable after an earlier "
                    f"failure; destroy it and create it again (destroy_process_group, then init_process_group or "
                    f"new_group). The first failure: {self.failure}")
            seq = self._seq + 1
            tag = USER_TAG_LIMIT + seq % _TAG_SPAN
            ring = self.flight
            if ring is not None:  # the flight recorder (flight.py): the call's cell and size, nothing more per call
                slot = seq & _FLIGHT_MASK
                ring[slot] = call[16]  # ``Call.check``: (collective, op, dtype, root, algorithm), made once per row
                self.flight_sizes[slot] = call[12]  # ``Call.nbytes``
            self._seq = seq  # after the record: a reader of ``seq`` (the publisher's thread) finds it written
            # Inline, under the lock: nothing is queued or running (so nothing can run beside it), and no
            # call issued after it can be queued before it ends.  A blocking call made on the executor
            # thread itself (from a Work's future callback) runs inline too: queueing it behind the task
            # that is making the call would wait forever.
            if not call.async_op and (self._pending == 0 or self._worker_ident == get_ident()):
                self.execute(call, tag, observers, issued_s)
                return None
            # A native call its backend runs asynchronously by itself is issued to it directly, here, when
            # nothing is queued or running (so it overtakes no call of this group): no executor thread.  So
            # is an all_reduce that rides in its check's round: done at issue.  Checked and posted by
            # ``execute``, under the lock; its errors come out of the Work's wait, as from the executor.
            if call.async_op and self._pending == 0 and not observers \
                    and (call.ride is not None or (call.issue is not None and call.options is None)):
                try:
                    posted = self.execute(call, tag, issue=call.issue if call.ride is None else None)
                except Exception as error:  # the caller sees it through Work.wait, as from the executor
                    return IssuedWork.failed(call, self, error)
                if posted is None:  # done at issue
                    return IssuedWork(call, self, None, None, 0.0, 0.0)
                return IssuedWork(call, self, *posted)
            future = self._enqueue(call, tag, self._worker_ident == get_ident(), observers, issued_s)
        work = Work(f"{call.collective} on {self.describe()}", future, call.outputs, self)
        if call.async_op:
            return work
        work.wait()
        return None

    def _run_noting_caller(self, call) -> Optional[Work]:
        """``run``, noting the caller's ``file:line`` in the record first (``ZEROCOMM_FLIGHT_CALLERS=1``): the
        first frame outside the library, a walk per call (its cost: docs/failures.md)."""
        frame = flight.outside(sys._getframe(1))
        # ``run`` numbers the call ``seq + 1``; a call from another thread in between (calls of one group made
        # from two threads at once) may take that number first: its caller then shows on this one's record.
        self.flight_callers[(self._seq + 1) & _FLIGHT_MASK] = (frame.f_code, frame.f_lasti)
        return Group.run(self, call)

    @property
    def seq(self) -> int:
        """The sequence number of the last call issued on this group (its tag is ``USER_TAG_LIMIT + seq %
        TAG_SPAN``); the communicator's ``tag_origin`` before the first."""
        return self._seq

    @property
    def flight_origin(self) -> int:
        """:attr:`seq` when the group was made: the flight recorder counts the group's calls from it."""
        return self._flight_origin

    @property
    def flight_started(self) -> Optional[int]:
        """The tag of the last call that started to run (``None``: none yet), for the flight recorder."""
        return self._flight_started

    @property
    def flight_done(self) -> Optional[int]:
        """The tag of the last call that completed (``None``: none yet), for the flight recorder."""
        return self._flight_done

    def watch(self, work: IssuedWork) -> None:
        """Have the executor wait for an issued ``work`` and settle it there (its future's callbacks then run on
        the executor, as every other ``Work``'s do).  Queued like a call: calls issued later wait behind it."""
        with self._lock:
            if self._closed:
                work.fail(CommError(f"rank {self.my_global_rank}: {work.collective} on {self.describe()} "
                                    f"was abandoned: the group was destroyed before it completed"))
                return
            self._queue.append((None, work, None, (), 0.0))
            self._pending += 1
            self._start_worker()
            self._changed.notify_all()

    def _start_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._serve, name=f"zerocomm-{self.name}", daemon=True)
            self._worker.start()
            self._worker_ident = self._worker.ident

    def _enqueue(self, call, tag: int, on_worker: bool, observers: tuple, issued_s: float) -> Future:
        """Queue ``call`` (the lock is held); wait while the queue is full, within the call's deadline."""
        limit = WORLD.config.max_queued
        if len(self._queue) >= limit and not on_worker:  # the worker itself must never wait on its own queue
            seconds = self._timeout_s if call.timeout is None else call.timeout
            if not self._changed.wait_for(lambda: len(self._queue) < limit or self._closed, seconds):
                raise CommTimeoutError(
                    f"rank {self.my_global_rank}: {call.collective} on {self.describe()}: {limit} calls were still "
                    f"queued after {seconds * 1000:.0f} ms (the executor is stuck on an earlier call)")
        future: Future = Future()
        self._queue.append((call, tag, future, observers, issued_s))
        self._pending += 1
        self._start_worker()
        self._changed.notify_all()
        return future

    def execute(self, call, tag: int, observers: tuple = (), issued_s: float = 0.0, issue=None) -> Optional[tuple]:
        """Run one checked call now: its waits end by its deadline; failures become typed errors.  Every way a call
        runs comes here: inline, on the executor, and issued.  With ``issue`` (the backend's asynchronous form of
        the call's function, ``Backend.ISSUE``) the checked call is posted instead of run: the result is then
        ``(request, after, start, seconds)`` for its ``IssuedWork``, or ``None`` when it was done at issue."""
        seconds = self._timeout_s if call.timeout is None else call.timeout
        start = _monotonic()
        deadline = start + seconds
        self._flight_started = tag
        posted = None
        try:
            # The mismatch check wraps the call (check.py): a round of its own before the call, or, for an "shm"
            # call, armed here and compared in the call's first sync (settled below if the call never synced).
            checker = call.checker
            if checker is not None and checker(call, tag, deadline):  # the all_reduce rode in the check
                if observers:  # they still see the call
                    run_observed(observers, call._replace(function=_already_done), tag, deadline, self.segment_bytes,
                                 issued_s, ridden=True)
            elif observers:
                run_observed(observers, call, tag, deadline, self.segment_bytes, issued_s)
            elif call.options is None:  # the common case, without a further Python call
                if issue is None:
                    call.function(self.communicator, *call.args, tag=tag, deadline=deadline,
                                  segment_bytes=self.segment_bytes)
                else:
                    posted = issue(self.communicator, *call.args, tag=tag, deadline=deadline,
                                   segment_bytes=self.segment_bytes)
            else:
                self.invoke(call, tag, deadline, self.segment_bytes)
            if checker is self._arms_first_sync:
                self.check.settle(call, deadline)
        except (TimeoutError, PeerFailure, shm.CallMismatch) as error:
            raise self._typed(call, error, deadline, seconds, start, tag) from None
        except CollectiveMismatchError as error:  # named by the check's all-gather: the peers' calls beside it
            raise CollectiveMismatchError(f"{error}{flight.note(self, call.collective, wait_s=1.5)}") from None
        if posted is not None:  # in flight: IssuedWork completes it
            return (*posted, start, seconds)
        self._flight_done = tag
        if call.copy_out is not None:
            call.copy_out()
        return None

    def _typed(self, call, error: Exception, deadline: float, seconds: float, start: float,
               tag: Optional[int] = None) -> CommError:
        """The typed error of ``call`` (its ``tag``), which failed with ``error``: ``TimeoutError`` ->
        ``CommTimeoutError``, ``PeerFailure`` -> ``PeerError``, a failed segment check (``CallMismatch``) ->
        ``CollectiveMismatchError`` naming the ranks that differ (``MismatchCheck.mismatch_error``)."""
        try:
            if isinstance(error, shm.CallMismatch):
                error = self.check.mismatch_error(call.collective, error, deadline)
                return CollectiveMismatchError(f"{error}{flight.note(self, call.collective, wait_s=1.5)}")
        except (TimeoutError, PeerFailure) as failure:  # the all-gather naming them: a peer had left
            error = failure
        if isinstance(error, TimeoutError):
            return self.timed_out(call.collective, seconds, error, start, tag)
        return self.peer_failed(call.collective, error, tag)

    def timed_out(self, collective: str, seconds: float, error: TimeoutError, start: float,
                  tag: Optional[int] = None) -> CommError:
        """The ``CommTimeoutError`` of ``collective`` (its ``tag``; ``None``: the last call issued), which waited
        from ``start`` (``time.monotonic()``) against a deadline of ``seconds`` and ended with ``error``; the group
        is marked failed (and the call abandoned, for its peers) as for every failure.  For the group's own runs
        and for an issued ``Work`` settled on the caller's thread (``work.IssuedWork``)."""
        # The time stated is the time this call waited, measured, with the deadline beside it.
        return self._failed(CommTimeoutError(
            f"rank {self.my_global_rank}: {collective} on {self.describe()} timed out after "
            f"{(time.monotonic() - start) * 1000:.0f} ms (deadline {seconds * 1000:.0f} ms: the timeout given to "
            f"init_process_group or new_group, or to this call) waiting for {self._in_rank_space(error)}"
            f"{abandon.notes(self, None) if self.failure is None else ''}."
            f"{flight.note(self, collective)}"), collective, tag, True)

    def peer_failed(self, collective: str, failure: PeerFailure, tag: Optional[int] = None) -> CommError:
        """The ``PeerError`` of ``collective`` (its ``tag``) that ended with ``failure`` (naming the peer, and how
        it left where it said so); the group is marked failed as by :meth:`timed_out`."""
        if failure.abandoned is not None:  # the peer marked the call abandoned as it left (abandon.py)
            why = (f"{self.peer_name(failure.peer)} left {abandon.describe(failure.abandoned)}, so this call "
                   f"cannot complete on any rank")
        else:
            why = (f"{self.peer_name(failure.peer)} failed or went away"
                   f"{abandon.notes(self, failure.peer) if self.failure is None else ''}")
        return self._failed(PeerError(
            f"rank {self.my_global_rank}: {collective} on {self.describe()} failed: {why} "
            f"({self._in_rank_space(failure)})."
            f"{flight.note(self, collective, None if failure.peer is None else self.ranks[failure.peer])}"),
            collective, tag, False)

    def _failed(self, error: CommError, collective: str = "", tag: Optional[int] = None,
                timed_out: bool = False) -> CommError:
        # No lock: an inline call fails while holding it; a second failure racing the first changes nothing.
        if self.failure is None:
            self.failure = error
            # Peers still in the call, or late to it, must fail too (abandon.py): marked before this rank raises.
            abandon.leave(self, tag, collective, timed_out)
            flight.failed(self, str(error))  # ZEROCOMM_FLIGHT_DUMP: this rank's record, now
        return error

    def invoke(self, call, tag: int, deadline: float, segment_bytes: int, communicator=None) -> None:
        """Run ``call``'s function on ``communicator`` (default: the group's) with ``tag`` and ``deadline``, as the
        group runs every call once its check passed: no typing of errors, no ordering (``run`` does both; an
        observer that counts bytes passes its counting transport, ``traffic.run_observed``)."""
        if call.options is None:
            call.function(communicator or self.communicator, *call.args, tag=tag, deadline=deadline,
                          segment_bytes=segment_bytes)
        else:
            call.function(communicator or self.communicator, *call.args, tag=tag, deadline=deadline,
                          segment_bytes=segment_bytes, **call.options)

    def _in_rank_space(self, error: Exception) -> str:
        """A backend's text names peers by group rank ("recv from rank 1"); messages use global ranks."""
        return re.sub(r"\brank (\d+)\b", lambda m: self.peer_name(int(m.group(1))) if int(m.group(1)) < self.size()
                      else m.group(0), str(error))

    def _serve(self) -> None:
        """The executor thread: queued calls in order, waiting for more, until the group is closed."""
        self.run_until(None)

    def _run_queued(self, call, tag, future: Optional[Future], observers: tuple, issued_s: float) -> None:
        if call is None:  # an issued Work to wait for (``watch``), in ``tag``'s place
            try:
                tag.settle(None)
            except BaseException as error:  # a local error of the backend's wait: the Work holds it
                tag.fail(error)
        elif future.set_running_or_notify_cancel():
            try:
                if self.failure is not None:  # queued before an earlier call failed: it must not move a byte
                    raise type(self.failure)(
                        f"rank {self.my_global_rank}: {call.collective}: {self.describe()} is unusable after an "
                        f"earlier failure; destroy it and create it again. The first failure: {self.failure}")
                self.execute(call, tag, observers, issued_s)  # one at a time: only this thread runs queued calls
            except BaseException as error:  # the caller sees it through Work.wait
                future.set_exception(error)
            else:
                future.set_result(None)  # runs the Work's callbacks, on this thread
        with self._lock:
            self._pending -= 1

    def on_executor(self) -> bool:
        """True on this group's executor thread (inside a ``Work``'s future callback)."""
        return self._worker_ident == get_ident()

    def run_until(self, future: Optional[Future]) -> None:
        """Run queued calls on this thread, in order, until ``future`` is done (or nothing is queued).

        For ``Work.wait`` called inside a future callback, on the executor thread: the awaited call
        is queued behind the one whose callback is running, so waiting for the executor there would
        wait for itself.  Running the queue here keeps the order and ends.  With ``future`` ``None``
        it is the executor's own loop (``_serve``): it waits for calls and ends when the group closes.
        """
        while future is None or not future.done():
            with self._lock:
                if future is None:
                    self._changed.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                item = self._queue.popleft()
                self._changed.notify_all()
            self._run_queued(*item)
            del item  # drop this task's buffers now, not when the next task arrives

    def close(self) -> None:
        """Cancel what is still queued, give a running call a bounded grace, release the communicator.

        Queued calls fail at once (their ``Work`` raises); the running one ends by its own deadline,
        but ``close`` waits for it at most ``min(timeout, 10 s)``: destroying a group never hangs
        for a stuck peer's full timeout.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            cancelled = list(self._queue)
            self._queue.clear()
            self._pending -= len(cancelled)
            self._changed.notify_all()
        for call, _, future, *_ in cancelled:
            if call is not None and future.set_running_or_notify_cancel():  # an issued Work ends by its deadline
                future.set_exception(CommError(f"rank {self.my_global_rank}: {call.collective} on "
                                               f"{self.describe()} was cancelled: the group was destroyed first"))
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout=min(self.timeout.total_seconds(), 10.0))
        self.forget_plans()
        communicator, self.communicator = self.communicator, None
        communicator.close(abandon=self.failure is not None)


def _already_done(*args, **kwargs) -> None:
    """A call's function once its all_reduce rode in the mismatch check's message (observers still see it)."""


class _NonMember:
    """What ``new_group`` returns on processes outside the group (torch's ``NON_GROUP_MEMBER``)."""

    def __repr__(self) -> str:
        return "<zerocomm NON_GROUP_MEMBER>"


NON_GROUP_MEMBER = _NonMember()


class World:
    """The one process-wide registry: the default group, the groups made from it, and their configuration.

    The configuration belongs to the default group: ``init_process_group`` reads it from the
    environment (``CommConfig.from_env``, the one place that does), ``configure`` changes it while
    the group lives, and ``destroy_process_group`` drops it with the group.
    """

    def __init__(self) -> None:
        self.default: Optional[Group] = None
        self.groups: Dict[str, Group] = {}
        self.group_count = 0
        self._config: Optional[CommConfig] = None
        #: Call observers (byte counters, the profiler); see ``traffic.py``.
        self.observers: list = []
        #: Plans by the arguments a public function was passed (``api.py``'s keys; ``plan.py``).
        self.plans: dict = {}

    @property
    def config(self) -> CommConfig:
        """The configuration of the initialized world (the defaults, read from the environment, before init)."""
        if self._config is None:
            return CommConfig.from_env()
        return self._config

    @config.setter
    def config(self, value: CommConfig) -> None:
        self._config = value
        self.plans.clear()
        for group in self.groups.values():
            group.plans.clear()  # its cells were planned under the configuration this one replaces
            group.segment_bytes = value.segment_bytes

    def add_group(self, ranks: List[int], rank: int, communicator, timeout, backend: str, name: str) -> Group:
        """A new :class:`Group` over ``communicator`` (``ranks``: its members' global ranks; ``rank``: this
        process's index among them), registered under ``name`` so that ``destroy_process_group()`` closes it
        with the world's other groups.  The one way groups enter the registry (``new_group``, and the NCCL
        twin ``staging`` makes of a host group)."""
        group = Group(ranks, rank, communicator, timeout, backend, name)
        self.groups[name] = group
        return group

    def require(self, what: str) -> Group:
        if self.default is None:
            raise NotInitializedError(
                f"{what}: the default process group has not been initialized; "
                "call zerocomm.comm.init_process_group() first")
        return self.default

    def reset(self) -> None:
        for group in list(self.groups.values()):
            group.close()
        self.default = None
        self.groups.clear()
        self.group_count = 0
        self._config = None
        self.plans.clear()


#: The only module-level mutable state in zerocomm: the default world.
WORLD = World()
