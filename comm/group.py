"""Groups: who takes part in a collective, over which transport, with which timeout.

[Note: ordering]  All ranks must run a group's collectives in the same order, and a
backend's native collectives are matched by order, not by tag.  So every collective
of a group, whatever its algorithm, runs on that group's one executor thread, in the
order the caller issued them.  A blocking call made while nothing is queued runs
inline on the caller's thread under the same run lock, which keeps the order and
saves the thread hand-off (~20 µs) that small messages would otherwise pay.
Point-to-point calls by the user do not go through the executor: they carry the
user's tag, below ``USER_TAG_LIMIT``, and never match a collective's messages.
"""
from __future__ import annotations

import datetime
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, Dict, List, Optional

from .config import CommConfig
from .errors import CommError, CommTimeoutError, NotInitializedError, PeerError
from .transport import USER_TAG_LIMIT, Transport
from .work import Work

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)

#: Collective tags cycle through [USER_TAG_LIMIT, USER_TAG_LIMIT + _TAG_SPAN): far more
#: than could ever be in flight at once, and below MPICH's 2**29 - 1 tag bound.
_TAG_SPAN = (1 << 28) - USER_TAG_LIMIT


class Group:
    """A set of processes that run collectives together.

    Attributes:
        ranks: global ranks of the members, indexed by group rank.
        rank: this process's group rank.
        transport: the communicator over the members (group ranks).
        timeout: bound on every blocking wait of this group's calls.
        backend: the backend's name.
        name: a name unique in the world, for messages and stores.
    """

    def __init__(self, ranks: List[int], rank: int, transport: Transport, timeout: datetime.timedelta,
                 backend: str, name: str):
        self.ranks = list(ranks)
        self.rank = rank
        self.transport = transport
        self.timeout = timeout
        self.backend = backend
        self.name = name
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._outstanding = 0
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._worker: Optional[threading.Thread] = None
        self._closed = False

    # -- identity -------------------------------------------------------------------
    def size(self) -> int:
        return len(self.ranks)

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank]

    @property
    def my_global_rank(self) -> int:
        return self.ranks[self.rank]

    def describe(self) -> str:
        return f"group {self.name} (global ranks {self.ranks})"

    def __repr__(self) -> str:
        return f"<zerocomm Group {self.name} ranks={self.ranks} backend={self.backend}>"

    # -- tags -----------------------------------------------------------------------
    def next_sequence(self) -> int:
        """The collective's sequence number in this group (same on every member)."""
        with self._seq_lock:
            self._seq += 1
            return self._seq

    @staticmethod
    def tag_for(sequence: int) -> int:
        return USER_TAG_LIMIT + sequence % _TAG_SPAN

    # -- running collectives --------------------------------------------------------
    def run(self, description: str, body: Callable[[int, Optional[float]], None], async_op: bool,
            outputs=None, timeout: Optional[datetime.timedelta] = None) -> Optional[Work]:
        """Run ``body(tag, deadline)`` in this group's order; return a ``Work`` if ``async_op``.

        The deadline is fixed when the body starts: ``timeout`` after the start.
        """
        if self._closed:
            raise CommError(f"rank {self.my_global_rank}: {description}: {self.describe()} was destroyed")
        tag = self.tag_for(self.next_sequence())
        # A blocking call made on the executor thread itself (from a Work's future callback) must run
        # inline: queueing it behind the task that is making the call would wait forever.
        on_worker = self._worker is not None and threading.current_thread() is self._worker
        with self._seq_lock:
            inline = not async_op and (self._outstanding == 0 or on_worker)
            self._outstanding += 1
        if inline:
            try:
                with self._run_lock:
                    self._execute(description, body, tag, timeout)
            finally:
                with self._seq_lock:
                    self._outstanding -= 1
            return None
        future: Future = Future()
        self._ensure_worker()
        self._queue.put((description, body, tag, future, timeout))
        work = Work(f"{description} on {self.describe()}", future, outputs)
        if async_op:
            return work
        work.wait()
        return None

    def _execute(self, description: str, body, tag: int, timeout: Optional[datetime.timedelta] = None) -> None:
        timeout_s = (timeout or self.timeout).total_seconds()
        deadline = time.monotonic() + timeout_s
        try:
            body(tag, deadline)
        except TimeoutError as error:
            raise CommTimeoutError(
                f"rank {self.my_global_rank}: {description} on {self.describe()} timed out after "
                f"{timeout_s * 1000:.0f} ms waiting for {error}") from None
        except CommError:
            raise
        except RuntimeError as error:
            raise PeerError(
                f"rank {self.my_global_rank}: {description} on {self.describe()} failed: {error}") from error

    def _ensure_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._serve, name=f"zerocomm-{self.name}", daemon=True)
            self._worker.start()

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            description, body, tag, future, timeout = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                with self._run_lock:
                    self._execute(description, body, tag, timeout)
            except BaseException as error:  # the caller sees it through Work.wait
                future.set_exception(error)
            else:
                future.set_result(None)
            finally:
                with self._seq_lock:
                    self._outstanding -= 1
                # Drop this task's references now: waiting for the next task would keep its buffers alive.
                del item, description, body, future

    def close(self) -> None:
        """Stop the executor (after the queued work) and release the transport."""
        if self._closed:
            return
        self._closed = True
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=self.timeout.total_seconds())
        self.transport.close()


class _NonMember:
    """What ``new_group`` returns on processes outside the group (torch's ``NON_GROUP_MEMBER``)."""

    def __repr__(self) -> str:
        return "<zerocomm NON_GROUP_MEMBER>"


NON_GROUP_MEMBER = _NonMember()


class World:
    """The one process-wide registry: the default group and the groups made from it."""

    def __init__(self) -> None:
        self.default: Optional[Group] = None
        self.groups: Dict[str, Group] = {}
        self.group_count = 0
        self._config: Optional[CommConfig] = None
        #: Call observers (byte counters, the profiler); see ``traffic.py``.
        self.observers: list = []

    @property
    def config(self) -> CommConfig:
        """Process-wide defaults, read from the environment on first use."""
        if self._config is None:
            self._config = CommConfig.from_env()
        return self._config

    @config.setter
    def config(self, value: CommConfig) -> None:
        self._config = value

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


#: The only module-level mutable state in zerocomm: the default world.
WORLD = World()
