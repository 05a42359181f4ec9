"""``Work``: the handle an ``async_op=True`` call returns, as torch's ``Work`` behaves.

A collective runs on its group's executor (see ``group.py``); its ``Work`` wraps the
``concurrent.futures.Future`` of that run.  ``wait`` re-raises the run's error (a
``CommTimeoutError`` naming the op, group and awaited peer, a ``PeerError`` ...), or a
``CommTimeoutError`` of its own when the caller's ``timeout`` passes first.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import math
from typing import List, Optional

import torch

from .errors import CommTimeoutError, InvalidArgumentError


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

