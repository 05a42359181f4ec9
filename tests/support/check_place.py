"""Where a group's mismatch checks run, for tests of the check through the backend (``Backend.reduce_stage``).

A group whose ranks share one host and a segment checks every call in the segment (``MismatchCheck.in_segment``);
a group spanning hosts, or whose ranks share no segment, checks every call in the stage reduced by its backend
(``MismatchCheck.through_backend``), where a small native SUM/AVG all_reduce of floats rides.
``checks_through_the_backend`` makes a one-host group check as a cross-host one does, for the block.
"""
import contextlib


@contextlib.contextmanager
def checks_through_the_backend(group):
    """``group`` (a zerocomm ``Group``) checks every call through its backend inside the block: its
    communicator is marked as sharing no segment (what ``shm.arena`` marks when ranks cannot share one),
    so selection stops offering "shm" too.  The group's plans are dropped on the way in and out.  Every rank
    of the group enters and leaves the block together."""
    local = group.communicator.local
    had = local.no_segment
    local.no_segment = True
    group.forget_plans()
    try:
        yield
    finally:
        local.no_segment = had
        group.forget_plans()
