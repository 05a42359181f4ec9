"""Calls that used to hang end, and failures name who failed.

* ``Work.wait()`` inside a ``get_future()`` callback, on a call queued behind the one whose callback
  runs: the callback runs on the group's executor, so waiting there for the executor would wait
  for itself.  It completes, in order.
* an all_to_all where one rank sends and receives nothing: that rank still takes part.
* a rank that never joins: the others' wait ends at the group's timeout with ``CommTimeoutError``
  naming the op, the group, the call and the measured wait.
"""
import datetime

import pytest
import torch

from support.worlds import worlds

import zerocomm.comm as dist


def wait_inside_callback():
    n = dist.get_world_size()
    first = torch.ones(4)
    second = torch.full((4,), 2.0)
    seen = []
    work1 = dist.all_reduce(first, async_op=True)
    work2 = dist.all_reduce(second, async_op=True)

    def callback(fut):
        work2.wait()  # queued behind work1, whose callback this is
        seen.append(second.tolist())
        return fut.value()

    chained = work1.get_future().then(callback)
    chained.wait()
    work2.wait()
    return first.tolist(), seen, n


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (2, 3)), indirect=True)
def test_wait_inside_a_future_callback_completes(world):
    for first, seen, n in world.run(wait_inside_callback, timeout=60):
        assert first == [float(n)] * 4
        assert seen == [[2.0 * n] * 4]


def lopsided_all_to_all():
    rank, n = dist.get_rank(), dist.get_world_size()
    # Rank 0 sends one row to every other rank and receives nothing; the others send nothing back.
    if rank == 0:
        inp, out = torch.arange(float(n - 1)), torch.empty(0)
        in_splits, out_splits = [0] + [1] * (n - 1), [0] * n
    else:
        inp, out = torch.empty(0), torch.empty(1)
        in_splits, out_splits = [0] * n, [1] + [0] * (n - 1)
    results = []
    for algorithm in ("native", "ring"):
        out.zero_()
        dist.all_to_all_single(out, inp, out_splits, in_splits, algorithm=algorithm)
        results.append(out.tolist())
    return results


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (2, 3)), indirect=True)
def test_all_to_all_with_a_rank_that_sends_and_receives_nothing(world):
    for rank, results in enumerate(world.run(lopsided_all_to_all, timeout=60)):
        for got in results:
            assert got == ([] if rank == 0 else [float(rank - 1)])


def never_joined():
    """Rank 1 never joins a subgroup collective; rank 0 times out, then calls the subgroup again."""
    import time
    group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=1))
    first = again = None
    again_s = 0.0
    if dist.get_rank() == 0:
        try:
            dist.all_reduce(torch.ones(8), group=group, algorithm="ring")
        except dist.CommTimeoutError as error:
            first = str(error)
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(8), group=group)
        except dist.CommTimeoutError as error:
            again = str(error)
        again_s = time.monotonic() - start
    check = torch.ones(2)
    dist.all_reduce(check)  # the world is unaffected (and rank 1 keeps its end of the subgroup open till here)
    dist.destroy_process_group(group)
    return first, again, again_s, check.tolist()


@pytest.mark.parametrize("world", worlds(("gloo",), (2,)), indirect=True)
def test_a_timed_out_group_fails_fast_and_names_the_first_failure(world):
    first, again, again_s, check = world.run(never_joined, timeout=60)[0]
    assert first and "deadline 1000 ms" in first and "global ranks [0, 1]" in first and "every rank to reach" in first, first
    assert again and "unusable after an earlier failure" in again and first in again, again
    assert again_s < 0.5
    assert check == [2.0, 2.0]


def local_error_stays_local():
    """A local failure (an in-place write into a leaf that requires grad) is not a peer's fault."""
    n = dist.get_world_size()
    outputs = [torch.zeros(2, requires_grad=True) for _ in range(n)]
    try:
        dist.all_gather(outputs, torch.ones(2))
        raised = None
    except Exception as error:  # judged by the parent
        raised = (type(error).__name__, isinstance(error, dist.CommError))
    check = torch.ones(2)
    dist.all_reduce(check)  # the group is not poisoned by a local error
    return raised, check.tolist(), n


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (2,)), indirect=True)
def test_a_local_error_stays_local(world):
    for raised, check, n in world.run(local_error_stays_local, timeout=60):
        assert raised == ("RuntimeError", False)
        assert check == [float(n)] * 2
