"""MPI after a timeout: requests left behind never touch freed memory, and a new group works.

A rank that times out leaves its MPI request posted (MPI forbids cancelling a nonblocking
collective); when the late peer joins, MPI completes that request and writes into its tensor.
Each case here times rank 0 out of a 1 s group while rank 1 is late, drops rank 0's tensor
(1 MiB: glibc hands such a block back to the system when it is freed, so a write into it after
a free would crash) and fills a new tensor of the same size; then rank 1 joins the old call.
Every rank must see: a typed error on the timed-out call, an immediate typed error on the next
call of that group, no change in the new tensor, and a working group after destroy + create
(a subgroup, and the default group itself).
"""
import datetime
import gc
import time

import pytest
import torch

from support.worlds import worlds

import zerocomm.comm as dist

NUMEL = 1 << 18  # 1 MiB of float32
TIMEOUT = datetime.timedelta(seconds=1)


def _late_peer_on(group, algorithm: str, late_s: float) -> dict:
    """Rank 0 times out in an all_reduce on ``group``; rank 1 joins it ``late_s`` seconds later.

    The mismatch check is off here: with it, rank 0 would time out in the check's own 16-byte
    all_reduce, and the request left behind would point at the check's buffer, not at ``x``.
    """
    checking = dist.configure().check
    dist.configure(check=False)
    try:
        return _late_peer_unchecked(group, algorithm, late_s)
    finally:
        dist.configure(check=checking)


def _late_peer_unchecked(group, algorithm: str, late_s: float) -> dict:
    rank = dist.get_rank()
    seen = {"rank": rank}
    if rank == 0:
        x = torch.ones(NUMEL)
        start = time.monotonic()
        try:
            dist.all_reduce(x, group=group, algorithm=algorithm)
        except dist.CommError as error:
            seen["first"] = (type(error).__name__, round(time.monotonic() - start, 1))
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(2), group=group, algorithm=algorithm)
        except dist.CommError as error:
            seen["again"] = (type(error).__name__, "unusable after an earlier failure" in str(error),
                             time.monotonic() - start)
        del x  # MPI may still write into it: the backend must keep it alive
        gc.collect()
        seen["y"] = y = torch.full((NUMEL,), 7.0)
    else:
        time.sleep(late_s)
        x = torch.ones(NUMEL)
        try:
            dist.all_reduce(x, group=group, algorithm=algorithm)
            seen["late"] = "done"
        except dist.CommError as error:  # a multi-step schedule may wait for a rank 0 that gave up
            seen["late"] = type(error).__name__
    return seen


def late_peer_then_new_group(algorithm: str) -> dict:
    group = dist.new_group([0, 1], timeout=TIMEOUT)
    seen = _late_peer_on(group, algorithm, late_s=2.0)
    check = torch.ones(2)
    dist.all_reduce(check)  # the world is unaffected; rank 0's left-behind request progresses here
    dist.destroy_process_group(group)
    again = dist.new_group([0, 1], timeout=TIMEOUT)
    fresh = torch.full((8,), float(dist.get_rank() + 1))
    dist.all_reduce(fresh, group=again, algorithm=algorithm)
    dist.destroy_process_group(again)
    y = seen.pop("y", None)
    seen["y_intact"] = None if y is None else bool((y == 7.0).all())
    seen["check"] = check.tolist()
    seen["fresh"] = fresh.tolist()
    return seen


@pytest.mark.parametrize("world", worlds(("mpi",), (2,)), indirect=True)
@pytest.mark.parametrize("algorithm", ["native", "recursive_doubling", "ring"])
def test_a_timed_out_mpi_group_keeps_buffers_alive_and_a_new_group_works(world, algorithm):
    for seen in world.run(late_peer_then_new_group, algorithm, timeout=60):
        if seen["rank"] == 0:
            assert seen["first"][0] == "CommTimeoutError" and seen["first"][1] < 3.0, seen
            name, poisoned, took = seen["again"]
            assert name == "CommTimeoutError" and poisoned and took < 0.5, seen
            assert seen["y_intact"] is True, seen
        else:
            assert seen["late"] in ("done", "CommTimeoutError"), seen
        assert seen["check"] == [2.0, 2.0], seen
        assert seen["fresh"] == [3.0] * 8, seen


def late_peer_then_new_world() -> dict:
    """The same on the default group: destroy_process_group() and init_process_group() again."""
    from zerocomm.comm.group import WORLD
    original = WORLD.default.timeout
    dist.destroy_process_group()
    dist.init_process_group("mpi", timeout=TIMEOUT)
    seen = _late_peer_on(None, "native", late_s=2.0)
    dist.destroy_process_group()
    dist.init_process_group("mpi", timeout=original)  # as the pool made it, for the tests after this one
    fresh = torch.full((8,), float(dist.get_rank() + 1))
    dist.all_reduce(fresh)
    y = seen.pop("y", None)
    seen["y_intact"] = None if y is None else bool((y == 7.0).all())
    seen["fresh"] = fresh.tolist()
    return seen


@pytest.mark.parametrize("world", worlds(("mpi",), (2,)), indirect=True)
def test_a_timed_out_mpi_world_can_be_destroyed_and_created_again(world):
    for seen in world.run(late_peer_then_new_world, timeout=60):
        if seen["rank"] == 0:
            assert seen["first"][0] == "CommTimeoutError", seen
            assert seen["again"][1], seen
            assert seen["y_intact"] is True, seen
        else:
            assert seen["late"] == "done", seen
        assert seen["fresh"] == [3.0] * 8, seen


def stale_message_then_new_group(algorithm: str) -> dict:
    """Rank 0 times out and destroys the group before the late rank 1 sends at all; rank 1's message then
    waits, unreceived, on a communicator that no longer exists.  MPICH hands that communicator's context to
    the next one created, whose first call has the same sequence number: its tags must still differ, or
    rank 0's call would take the stale message (a wrong answer, silently).  The check is off in both calls,
    so both travel the algorithm's own messages."""
    checking = dist.configure().check
    dist.configure(check=False)
    rank = dist.get_rank()
    seen = {"rank": rank}
    try:
        group = dist.new_group([0, 1], timeout=TIMEOUT)
        if rank == 1:
            time.sleep(1.5)  # rank 0 has timed out and destroyed the group by now
        try:
            dist.all_reduce(torch.full((8,), 100.0), group=group, algorithm=algorithm)
            seen["old"] = "done"
        except dist.CommError as error:
            seen["old"] = type(error).__name__
        dist.destroy_process_group(group)
        again = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=10))
        if rank == 1:
            time.sleep(0.5)  # rank 0 waits in its call first: only a stale message could complete it early
        fresh = torch.full((8,), float(rank + 1))
        dist.all_reduce(fresh, group=again, algorithm=algorithm)
        dist.destroy_process_group(again)
    finally:
        dist.configure(check=checking)
    seen["fresh"] = fresh.tolist()
    return seen


@pytest.mark.parametrize("world", worlds(("mpi",), (2,)), indirect=True)
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "tree"])
def test_a_stale_message_of_a_destroyed_group_is_never_taken_by_the_next(world, algorithm):
    for seen in world.run(stale_message_then_new_group, algorithm, timeout=60):
        # rank 1 may finish: rank 0's own message left before it gave up
        assert seen["old"] in (("CommTimeoutError",) if seen["rank"] == 0 else ("done", "CommTimeoutError")), seen
        assert seen["fresh"] == [3.0] * 8, seen


def member_skips_new_group() -> dict:
    """World of 3 with a 1 s deadline: ranks 0 and 1 create a group of all three; rank 2 never calls
    new_group.  MPI's own communicator creation would wait for it forever."""
    from zerocomm.comm.group import WORLD
    original = WORLD.default.timeout
    dist.destroy_process_group()
    dist.init_process_group("mpi", timeout=TIMEOUT)
    rank = dist.get_rank()
    seen = {"rank": rank}
    start = time.monotonic()
    try:
        if rank == 2:
            time.sleep(2.0)
        else:
            dist.new_group([0, 1, 2])
            seen["error"] = None
    except dist.CommError as error:
        seen["error"] = (type(error).__name__, str(error))
    seen["took"] = time.monotonic() - start
    dist.destroy_process_group()  # every rank: the group count starts again, the same everywhere
    dist.init_process_group("mpi", timeout=original)
    again = dist.new_group([0, 1, 2])  # and a new group works
    fresh = torch.full((4,), float(rank + 1))
    dist.all_reduce(fresh, group=again)
    dist.destroy_process_group(again)
    seen["fresh"] = fresh.tolist()
    return seen


@pytest.mark.parametrize("world", worlds(("mpi",), (3,)), indirect=True)
def test_a_member_that_never_calls_new_group_times_the_others_out(world):
    for seen in world.run(member_skips_new_group, timeout=60):
        if seen["rank"] != 2:
            name, text = seen["error"]
            assert name == "CommTimeoutError" and seen["took"] < 1.9, seen
            assert f"rank {seen['rank']}: new_group([0, 1, 2]) timed out" in text and "not every member" in text, seen
        assert seen["fresh"] == [6.0] * 4, seen
