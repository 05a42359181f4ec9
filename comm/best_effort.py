"""Store calls on a failure path, made at most once per stuck store: what the flight recorder and the notes of a
rank that left (``flight.py``, ``abandon.py``) read and write to tell peers more, never what a call needs.

Such a call runs on a daemon thread and is waited for a bounded time: a store whose host rank left, or whose link
went down, must not hold back the error being raised or the ``destroy_process_group`` after it.  Once one call
was not answered in time, every later one in this world gives up at once (``reset`` at each init): a link that is
down stays down, and each bounded wait would otherwise add up on the way out (a failing rank makes several).
"""
from __future__ import annotations

import threading

_unanswered = threading.Event()


def reset() -> None:
    """A new world: its store is asked again."""
    _unanswered.clear()


def gave_up() -> bool:
    """Whether a store call of this world went unanswered, so that the next ones are not made."""
    return _unanswered.is_set()


def within(function, timeout_s: float) -> bool:
    """``function()`` on a daemon thread, waited for at most ``timeout_s`` seconds; True if it finished (its errors
    dropped: what it adds to a failure is best effort, and must not raise a failure of its own)."""
    if _unanswered.is_set():
        return False
    finished = threading.Event()

    def run() -> None:
        try:
            function()
        except Exception:  # noqa: BLE001 - a store that is gone: the caller says the record is unavailable
            pass
        finally:
            finished.set()

    threading.Thread(target=run, name="zerocomm-store-call", daemon=True).start()
    if finished.wait(timeout_s):
        return True
    _unanswered.set()
    return False
