"""One path: the first call of a cell and every later one take the same route, traced function by function.

A reader follows ``zerocomm.comm.all_reduce`` to the bytes moving through these files and no
others: the public function (api) finds its cell's plan (plan), whose record the group orders,
tags and runs (group) inside the mismatch check (check; on one host a round of the shared segment,
shm), then the algorithm (with ``ops/chunk.py``'s split) or the backend.  The first call of a cell
also passes the full checks (validate), which make the plan; later calls find it cached.  Each rank
traces the first call of a cell on a group of its own and a later one with ``sys.setprofile`` and
compares the functions entered.
"""
import os
import sys

import pytest
import torch

from support.worlds import worlds

import zerocomm
import zerocomm.comm as dist

PACKAGE = os.path.dirname(os.path.abspath(zerocomm.__file__))
#: The files a later call may enter besides the algorithm's and the backend's own (work: an async call's Work).
ROUTE = {"comm/api.py", "comm/plan.py", "comm/group.py", "comm/check.py", "comm/shm.py", "comm/work.py"}


def functions_entered(call) -> list:
    """``file:function`` of every zerocomm Python function ``call()`` entered."""
    seen = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith(".py"):  # not "<string>" (generated code)
            path = os.path.abspath(frame.f_code.co_filename)
            if path.startswith(PACKAGE + os.sep) and not path.startswith(os.path.join(PACKAGE, "tests") + os.sep):
                seen.add(f"{os.path.relpath(path, PACKAGE)}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return sorted(seen)


def first_and_later():
    out = {}
    for algorithm, numel, async_op in (("native", 2, False), ("native", 1 << 18, False), ("ring", 1 << 18, False),
                                       ("shm", 2, False), (None, 1 << 16, False), ("native", 2, True),
                                       ("native", 1 << 18, True)):
        group = dist.new_group(list(range(dist.get_world_size())))  # a group of its own: no plan yet
        # Another cell first, so that the group's shared segment (made by its first check) exists: the
        # traced first call is the first of its cell, not the group's.
        dist.all_reduce(torch.ones(1, dtype=torch.float64), group=group)
        tensor = torch.ones(numel)

        def call():
            work = dist.all_reduce(tensor, group=group, algorithm=algorithm, async_op=async_op)
            if work is not None:
                work.wait()

        first = functions_entered(call)
        call()
        later = functions_entered(call)
        out[(algorithm, numel, async_op)] = (first, later, tensor[:1].item())
        dist.destroy_process_group(group)
    return out


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (2,)), indirect=True)
def test_the_first_call_and_a_later_one_take_one_route(world):
    for rank, paths in enumerate(world.run(first_and_later)):
        for (algorithm, numel, async_op), (first, later, value) in paths.items():
            where = (rank, algorithm, numel, async_op, later)
            assert value == 2.0 ** 3, where  # three calls of a SUM over two ranks of ones
            files = {f.split(":")[0] for f in later}
            assert "comm/validate.py" in {f.split(":")[0] for f in first}, (where, first)
            assert "comm/validate.py" not in files, where  # the cell's plan, cached
            assert {"comm/api.py:all_reduce", "comm/plan.py:run", "comm/group.py:run"} <= set(later), where
            if "comm/group.py:_enqueue" not in later:  # else the group's executor thread runs it, check and all
                assert any(f.startswith("comm/check.py:") for f in later), where  # the check wraps every call
            others = files - ROUTE
            # The algorithm's and the backend's own files, and the chunk arithmetic the ring and shm split with.
            assert all(f.startswith(("comm/algorithms/", "comm/backends/")) or f == "ops/chunk.py"
                       for f in others), (others, where)
            # A later call's route is the first call's, without the full checks and the plan's making.
            # (A peer late to a round makes its wait a function of its own: on either call, by timing alone; so does
            # the look between sleeps at whether a missing peer left the call, abandon.py.)
            assert set(later) - set(first) <= {"comm/work.py:wait", "comm/work.py:_settle", "comm/shm.py:_settle_round",
                                               "comm/shm.py:settle_check", "comm/shm.py:_still_late",
                                               "comm/shm.py:_left"}, (where, first)
