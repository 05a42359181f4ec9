"""``Work``: the handle an ``async_op=True`` call returns, as torch's ``Work`` behaves.

A collective written in Python runs on its group's executor (see ``group.py``); its ``Work``
wraps the ``concurrent.futures.Future`` of that run.  A native collective that its backend runs
asynchronously by itself is issued directly, and its :class:`IssuedWork` waits on the backend's
own request: no thread in between.  ``wait`` re-raises the run's error (a
``CommTimeoutError`` naming the op, group and awaited peer, a ``PeerError`` ...), or a
``CommTimeoutError`` of its own when the caller's ``timeout`` passes first.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import math
import time
from typing import List, Optional

import torch

from .errors import CommTimeoutError, InvalidArgumentError
from .transport import PeerFailure


def timeout_seconds(timeout, what: str = "timeout") -> Optional[float]:
    """``timedelta`` or seconds → seconds; ``None`` and zero mean "no limit of its own" (torch's ``kNoTimeout``:
    the call's group deadline still applies).  A negative, NaN or non-numeric timeout raises
    ``InvalidArgumentError`` naming ``what`` and the value."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or math.isnan(seconds) or seconds < 0:
        raise InvalidArgumentError(f"{what} must be a non-negative number of seconds or a datetime.timedelta "
                                   f"(0 or None: no limit of its own), got {timeout!r}")
    return None if seconds == 0 or math.isinf(seconds) else float(seconds)


class Work:
    """Handle of one asynchronous operation.

    Args:
        description: what runs, for error messages ("all_reduce on group [0, 1, 2]").
        future: completes with ``None`` when the operation is done, or with its error.
        outputs: the tensors the operation writes; ``result()`` and ``get_future()`` return them.
        group: the ``Group`` whose executor runs it (``wait`` inside a future callback runs the queue itself).
    """

    def __init__(self, description: str, future: concurrent.futures.Future, outputs: Optional[List[torch.Tensor]] = None,
                 group=None):
        self._description = description
        self._future = future
        self._group = group  # the Group whose executor runs it, if any
        self._outputs = list(outputs or [])
        self._torch_future: Optional[torch.futures.Future] = None

    def wait(self, timeout=None) -> bool:
        """Block until done; raise the operation's error, or ``CommTimeoutError`` after ``timeout``."""
        seconds = timeout_seconds(timeout, "Work.wait: timeout")
        if self._group is not None and not self._future.done() and self._group.on_executor():
            self._group.run_until(self._future)  # inside a future callback: see Group.run_until
        try:
            self._future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            raise CommTimeoutError(
                f"Work.wait: {self._description} did not complete within {seconds * 1000:.0f} ms") from None
        return True

    @property
    def group(self):
        """The ``Group`` whose executor runs this work, or ``None`` (a work made of other works)."""
        return self._group

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self._future.exception() is None

    def exception(self) -> Optional[BaseException]:
        return self._future.exception() if self._future.done() else None

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._outputs

    def synchronize(self) -> None:
        self.wait()

    def add_done_callback(self, callback) -> None:
        """Call ``callback(future)`` (a ``concurrent.futures.Future`` holding the outcome) once the operation is
        done, on the thread that completes it (the group's executor), or at once if it is done already."""
        self._future.add_done_callback(callback)

    def get_future(self) -> torch.futures.Future:
        """A ``torch.futures.Future`` completed with the output tensors (or the error)."""
        if self._torch_future is None:
            fut: torch.futures.Future = torch.futures.Future()

            def _settle(done: concurrent.futures.Future) -> None:
                error = done.exception()
                if error is not None:
                    fut.set_exception(error)
                else:
                    fut.set_result(self._outputs)

            self._torch_future = fut
            self._future.add_done_callback(_settle)
        return self._torch_future

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "pending"
        return f"<zerocomm Work {self._description} ({state})>"



class IssuedWork(Work):
    """The ``Work`` of a call issued directly to a backend that runs it asynchronously by itself
    (``Backend.ISSUE``; see ``Group.run``): ``wait`` waits on the backend's ``request`` on the caller's
    thread, by the call's deadline, and raises what the group's executor would have raised (a
    ``CommTimeoutError`` naming the op, the group and the awaited peer, a ``PeerError``); the group is
    unusable after either, as after a failed blocking call.  ``after`` (or ``None``) runs once when the
    request is done, before the outputs are read; ``copy_out`` as in ``plan.Call``.

    Nothing completes it in the background: where a future callback is asked for (``get_future``,
    ``add_done_callback``), the group's executor is asked to wait for it (``Group.watch``), and the
    callbacks run there, as for every other ``Work``.  ``request`` is ``None`` for a call that was
    done at issue (nothing to move, or its all_reduce rode in the mismatch check).
    """

    def __init__(self, call, group, request, after, start: float, seconds: float):
        self._call = call
        self._group = group
        self._outputs = call.outputs
        self._request = request
        self._after = after
        self._start = start
        self._seconds = seconds
        self._once = [] if request is None else [True]  # popped by the one thread that settles the outcome
        self._done = request is None
        self._error: Optional[BaseException] = None
        self._future: Optional[concurrent.futures.Future] = None  # made by _watch, for callbacks
        self._torch_future: Optional[torch.futures.Future] = None
        #: A stream-ordered request (NCCL) with nothing to run after it: ``wait`` is the request's own wait (its
        #: torch ``Work``'s, where it has one: no frame of ours between), else ``None``.
        self._direct = None
        if request is not None and request.STREAM_ORDERED and after is None and call.copy_out is None:
            self._direct = request if request.stream_work is None else request.stream_work
        if request is None and (after is not None or call.copy_out is not None):
            self._finish()

    @property
    def _description(self) -> str:
        return f"{self._call.collective} on {self._group.describe()}"

    @classmethod
    def failed(cls, call, group, error: BaseException) -> "IssuedWork":
        """A ``Work`` whose call failed while it was issued (its check): ``wait`` raises ``error``."""
        work = cls(call, group, None, None, 0.0, 0.0)
        work._error = error
        return work

    @property
    def collective(self) -> str:
        """The registry's name of the call ("all_reduce", ...)."""
        return self._call.collective

    def fail(self, error: BaseException) -> bool:
        """Settle this work as failed with ``error`` (its ``wait`` raises it, its callbacks run), unless another
        thread settled it already; whether this call did.  The group calls it for a work it can no longer wait
        for (destroyed first) or whose backend wait raised a local error."""
        try:
            self._once.pop()
        except IndexError:  # settled by now
            return False
        self._error = error
        self._finish()
        return True

    def _finish(self) -> None:
        if self._after is not None and self._error is None:
            self._after()
        if self._call.copy_out is not None and self._error is None:
            self._call.copy_out()
        self._done = True
        future = self._future
        if future is not None:
            self._resolve(future)

    def _resolve(self, future: concurrent.futures.Future) -> None:
        try:
            if self._error is None:
                future.set_result(None)
            else:
                future.set_exception(self._error)
        except concurrent.futures.InvalidStateError:  # resolved by the other thread already
            pass

    def settle(self, seconds: Optional[float]) -> None:
        """Wait for the request until ``seconds`` (None: the call's deadline) and settle the outcome: the one
        thread that gets here first records it (done, or the group's typed error); any other returns once it is
        recorded.  Raises ``CommTimeoutError`` only when ``seconds`` ran out before the call's deadline (the call
        goes on).  The group's executor calls it for a watched work (``Group.watch``)."""
        remaining = self._start + self._seconds - time.monotonic()
        limit = remaining if seconds is None or seconds >= remaining else seconds
        try:
            self._request.wait(limit if limit > 0.0 else 0.0)
        except TimeoutError as error:
            if limit < remaining:  # the caller's own timeout ran out first: the call goes on
                raise CommTimeoutError(f"Work.wait: {self._description} did not complete within "
                                       f"{seconds * 1000:.0f} ms") from None
            failure = self._group.timed_out(self._call.collective, self._seconds, error, self._start)
        except PeerFailure as peer:
            failure = self._group.peer_failed(self._call.collective, peer)
        else:
            failure = None
        try:
            del self._once[0]  # atomic, and not a call: the one settling thread takes it
        except IndexError:  # settled already, or being settled by another thread
            while not self._done:
                time.sleep(0)
            return
        if failure is None and self._after is None and self._call.copy_out is None:
            self._done = True  # the common case, without a further call (done first: see _watch)
            if self._future is not None:
                self._resolve(self._future)
            return
        self._error = failure
        self._finish()

    def wait(self, timeout=None) -> bool:
        """Block until done; raise the operation's error, or ``CommTimeoutError`` after ``timeout``."""
        if self._direct is not None and timeout is None and self._future is None:
            # The request's wait orders the caller's stream after the collective, done or not, and no clock of
            # ours bounds it (Request.STREAM_ORDERED): nothing is left to settle.  (With a future callback the
            # group's executor settles it, below.)
            self._direct.wait()
            self._done = True
            return True
        seconds = None if timeout is None else timeout_seconds(timeout, "Work.wait: timeout")  # refused even if done
        if self._error is None and self._request is not None:
            # Even when done: NCCL's wait orders the caller's current stream after the collective.
            self.settle(seconds)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if not self._done and self._request.test():
            try:
                self.settle(None)
            except CommTimeoutError:
                pass
        return self._done

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error if self.is_completed() else None

    def _watch(self) -> concurrent.futures.Future:
        future = self._future
        if future is None:
            self._future = future = concurrent.futures.Future()
            if self._done:
                self._resolve(future)
            else:
                self._group.watch(self)  # its executor waits for the request (see the class docstring)
        return future

    def add_done_callback(self, callback) -> None:
        self._watch().add_done_callback(callback)

    def get_future(self) -> torch.futures.Future:
        self._watch()
        return super().get_future()

    def __repr__(self) -> str:
        return f"<zerocomm Work {self._description} ({'done' if self._done else 'pending'})>"
