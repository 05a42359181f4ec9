"""Where a group's mismatch checks run, for tests of the backend's own check (``Backend.agree``).

A group whose ranks share one host and a segment checks every call in the segment (see
``validate.segment_checks``); a group spanning hosts, or whose ranks share no segment, checks every
call through its backend, where MPI's small native all_reduce rides in the check (in C where built).
``checks_through_the_backend`` makes a one-host group check as a cross-host one does, for the block.
"""
import contextlib


@contextlib.contextmanager
def checks_through_the_backend(group):
    """``group`` (a zerocomm ``Group``) checks every call through its backend inside the block: its
    communicator is marked as sharing no segment (what ``shm.arena`` marks when ranks cannot share one),
    so selection stops offering "shm" too.  Cached choices and short-path rows are dropped on the way in
    and out, and whether the world has riding rows is restored.  Every rank of the group enters and leaves the block together."""
    from zerocomm.comm.group import WORLD
    backend = group.communicator
    had, rode = backend.__dict__.get("_zerocomm_no_segment"), WORLD.rides
    backend._zerocomm_no_segment = True
    group.short.clear()
    group.choices.clear()
    try:
        yield
    finally:
        if had is None:
            backend.__dict__.pop("_zerocomm_no_segment", None)
        group.short.clear()
        group.choices.clear()
        WORLD.rides = rode  # the riding rows made in the block are gone: calls after it need not try C first
