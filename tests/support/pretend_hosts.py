"""Pretend hosts inside one test world: a group that learns its ranks' hosts from ``ZEROCOMM_HOST`` now.

A new group inherits the hosts its world learnt at ``init_process_group`` (``topology.inherit``: no bytes move),
so setting ``ZEROCOMM_HOST`` in a running world changes nothing by itself.  :func:`group_on_hosts` sets it,
makes a group over every rank and has that group learn its hosts again, as a world started on those hosts would.
"""
import contextlib
import os
import time

from support.dist import dist


@contextlib.contextmanager
def group_on_hosts(names: str):
    """A group (torch-style handle) over every rank, rank ``r`` on pretend host ``names[r]``; every rank enters
    together.  ``ZEROCOMM_HOST`` is put back and the group destroyed on the way out."""
    from zerocomm.comm import topology

    saved = os.environ.get("ZEROCOMM_HOST")
    os.environ["ZEROCOMM_HOST"] = names[dist.get_rank()]
    group = dist.new_group(list(range(dist.get_world_size())))
    try:
        inner = group.zerocomm_group
        local = inner.communicator.local
        local.hosts = local.one_host = None
        # Tag 0: nothing else is in flight on the new group (the mismatch check's fingerprints use it too).
        learnt = topology.hosts(inner.communicator, tag=0, deadline=time.monotonic() + 30)
        assert "".join(learnt) == names, (learnt, names)
        inner.forget_plans()
        yield group
    finally:
        if saved is None:
            os.environ.pop("ZEROCOMM_HOST", None)
        else:
            os.environ["ZEROCOMM_HOST"] = saved
        dist.destroy_process_group(group)
