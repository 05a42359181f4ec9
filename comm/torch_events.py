"""torch profiler events for zerocomm's collectives, named and shaped as torch's own backends record them.

torch's c10d backends record every collective as one asynchronous event ``"<backend>:<op>"``
(``"gloo:all_reduce"``, ``"mpi:broadcast"``) whose input shapes are the tensors the op moves;
profiling tools and torch's own distributed tests look events up by those names.  With
``torch.profiler.profile(record_shapes=True)`` (or ``torch.autograd.profiler.profile``) active,
a zerocomm collective records the same event.  ``api.py`` enters this module only when
``torch.autograd._profiler_enabled()`` (a C call) is true on the calling thread, so an
unprofiled call pays nothing else.

[Note: where an event opens and closes]
torch's profiler state is thread-local: a record opened on zerocomm's executor thread would not
be seen.  So the record is opened here, on the caller's thread, with the inputs (for their
shapes), and the call goes to the group's executor even when it blocks; the record is closed
there, when the algorithm returns or raises, through a ``torch.futures.Future`` that torch's
``_call_end_callbacks_on_jit_fut`` ends it on — torch carries the caller's profiler state to the
thread that completes that future (a record simply exited on another thread gets no end).  Start
and end threads differ, which is how torch tells an asynchronous event (its own ``Work`` events
are marked so explicitly).  The transport's own work on the executor is invisible to the profiler
(no profiler state on that thread), so one call gives exactly one event — gloo's inner
``"gloo:all_reduce"`` of a native call does not add a second one.  A call made of several
collectives (the coalesced forms) runs them all under one event, closed by the last.

Point-to-point calls record nothing here: over gloo, torch's own ``"gloo:send"``/``"gloo:recv"``
events appear, since zerocomm hands gloo the user's tensor in its own shape.
"""
from __future__ import annotations

from typing import List, Sequence

import torch


def run_all(calls: Sequence, name: str, inputs) -> List:
    """Run ``calls`` (checked ``plan.Call``\\ s of one group, issued in order) under one event
    ``"<backend>:<name>"`` (``name`` is torch's title: both all_to_all forms are "all_to_all") recording
    the shapes of ``inputs`` as they travel (complex ones as real views).  Returns what ``Group.run``
    returns for each: a ``Work`` if the call is ``async_op``, else ``None`` once done."""
    group = calls[0].group
    moved = [torch.view_as_real(t) if t.is_complex() else t for t in inputs]
    record = torch.autograd._record_function_with_args_enter(f"{group.backend}:{name}", *moved)
    # The record ends when ``done`` completes, with this thread's profiler state carried to whichever
    # thread completes it (a plain exit on another thread would record no end).
    done = torch.futures.Future()
    torch.ops.profiler._call_end_callbacks_on_jit_fut._RecordFunction(record, done)

    def close() -> None:
        if not done.done():  # once: by the last call on the executor, or here if that call never ran
            done.set_result(None)

    last = calls[-1]
    function = last.function

    def closing(*args, **kwargs):
        try:
            function(*args, **kwargs)
        finally:
            close()

    results = []
    try:
        # Never issued directly (``issue=None``): an issued call's backend work would run on this thread, seen
        # by the profiler, and the closing function would not run.
        for call in calls[:-1]:
            results.append(_run_off_thread(call._replace(issue=None)))
        results.append(_run_off_thread(last._replace(function=closing, ride=None, issue=None)))  # ridden: no close
    except BaseException:
        close()  # refused before the executor ran it (a destroyed or failed group), or a blocking call failed
        raise
    return results


def run(call, name: str, inputs):
    """``Group.run(call)`` with one event ``"<backend>:<name>"`` recording ``inputs``."""
    return run_all((call,), name, inputs)[0]


def _run_off_thread(call):
    """Run ``call`` on its group's executor (see the module's note); block if the caller asked to."""
    if call.async_op:
        return call.group.run(call)
    call.group.run(call._replace(async_op=True)).wait()
    return None
