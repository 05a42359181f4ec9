"""Asynchronous native calls are issued to the backend directly: gloo runs them on its own thread, so
an ``async_op=True`` call of a native collective returns a Work that waits on gloo's own request, and
the group's executor thread is never started.  The order of a group's calls still holds: a native
call made while a call written in Python is queued or running goes behind it, through the executor.

Expected values are closed forms over integer-valued inputs (rank r contributes r + 1 + i at index i),
so sums are exact in any order.
"""
import pytest
import torch

from support.worlds import worlds


def _fresh_group():
    """A new group over every rank (the pool's default group may have run calls through its executor before),
    and its ``Group``."""
    import zerocomm.comm as zdist
    from zerocomm.comm.validate import resolve_group
    handle = zdist.new_group(list(range(zdist.get_world_size())))
    return handle, resolve_group(handle, "test")


def issued_without_the_executor():
    """Every native collective gloo runs by itself, async: the Work is an ``IssuedWork``, the results equal
    the closed forms, and the group never started its executor thread."""
    import zerocomm.comm as zdist
    from zerocomm.comm.work import IssuedWork
    n, r = zdist.get_world_size(), zdist.get_rank()
    handle, group = _fresh_group()
    k = 4
    mine = torch.arange(k, dtype=torch.float32) + r + 1
    total = sum(torch.arange(k, dtype=torch.float32) + q + 1 for q in range(n))
    summed, averaged = mine.clone(), mine.clone()
    gathered = torch.zeros(n * k)
    scattered = torch.zeros(k)
    bcast = mine.clone()
    a2a_out = torch.zeros(n * k)
    a2a_in = torch.arange(n * k, dtype=torch.float32) + 100 * r
    issued = {"async_op": True, "algorithm": "native", "group": handle}
    kinds = {
        "all_reduce SUM": zdist.all_reduce(summed, **issued),
        "all_reduce AVG": zdist.all_reduce(averaged, zdist.ReduceOp.AVG, **issued),
        "all_gather_into_tensor": zdist.all_gather_into_tensor(gathered, mine, **issued),
        "reduce_scatter_tensor": zdist.reduce_scatter_tensor(scattered, torch.cat([mine * (j + 1) for j in range(n)]),
                                                             **issued),
        "broadcast": zdist.broadcast(bcast, src=n - 1, **issued),
        "all_to_all_single": zdist.all_to_all_single(a2a_out, a2a_in, **issued),
        "barrier": zdist.barrier(**issued),
    }
    kinds_issued = {name: type(work) is IssuedWork for name, work in kinds.items()}
    for work in reversed(list(kinds.values())):
        assert work.wait() is True
    completed = all(work.is_completed() and work.is_success() for work in kinds.values())
    expected_a2a = torch.cat([torch.arange(k, dtype=torch.float32) + r * k + 100 * q for q in range(n)])
    results = {
        "all_reduce SUM": torch.equal(summed, total),
        "all_reduce AVG": torch.allclose(averaged, total / n),
        "all_gather_into_tensor": torch.equal(gathered, torch.cat([torch.arange(k, dtype=torch.float32) + q + 1
                                                                  for q in range(n)])),
        "reduce_scatter_tensor": torch.equal(scattered, total * (r + 1)),
        "broadcast": torch.equal(bcast, torch.arange(k, dtype=torch.float32) + n),
        "all_to_all_single": torch.equal(a2a_out, expected_a2a),
        "barrier": True,
    }
    no_thread = group._worker is None
    zdist.destroy_process_group(handle)
    return kinds_issued, results, completed, no_thread


@pytest.mark.parametrize("world", worlds(("gloo",), (1, 2, 3)), indirect=True)
def test_async_native_calls_are_issued_without_the_executor(world):
    for rank, (issued, results, completed, no_thread) in enumerate(world.run(issued_without_the_executor)):
        assert all(issued.values()), f"rank {rank}: not issued directly: {[k for k, v in issued.items() if not v]}"
        assert all(results.values()), f"rank {rank}: wrong results: {[k for k, v in results.items() if not v]}"
        assert completed, f"rank {rank}: a Work is not completed (or failed) after wait()"
        assert no_thread, f"rank {rank}: the group's executor thread was started"


def ordering_with_queued_calls():
    """A native call made while a ring call (written in Python) is queued goes behind it, through the executor:
    when it is done, the ring call is done too.  A native call issued directly, then a ring call: both right."""
    import zerocomm.comm as zdist
    from zerocomm.comm.work import IssuedWork
    n = zdist.get_world_size()
    handle, _ = _fresh_group()
    big = torch.ones(1 << 16)
    ring = zdist.all_reduce(big, group=handle, async_op=True, algorithm="ring")
    small = torch.ones(8)
    native = zdist.all_reduce(small, group=handle, async_op=True, algorithm="native")
    queued_behind = type(native) is not IssuedWork
    native.wait()
    ring_done_first = ring.is_completed()
    ring.wait()
    first = torch.ones(8)
    issued = zdist.all_reduce(first, group=handle, async_op=True, algorithm="native")
    second = torch.ones(1 << 12)
    after = zdist.all_reduce(second, group=handle, async_op=True, algorithm="ring")
    after.wait()
    issued.wait()
    right = (torch.equal(big, torch.full_like(big, n)) and torch.equal(small, torch.full_like(small, n))
             and torch.equal(first, torch.full_like(first, n)) and torch.equal(second, torch.full_like(second, n)))
    zdist.destroy_process_group(handle)
    return queued_behind, ring_done_first, type(issued) is IssuedWork, right


@pytest.mark.parametrize("world", worlds(("gloo",), (2, 3)), indirect=True)
def test_a_native_call_never_overtakes_a_queued_call(world):
    for rank, (queued_behind, ring_done_first, issued, right) in enumerate(world.run(ordering_with_queued_calls)):
        assert queued_behind, f"rank {rank}: a native call overtook the queued ring call (issued directly)"
        assert ring_done_first, f"rank {rank}: the native call completed before the ring call queued before it"
        assert issued, f"rank {rank}: with nothing queued, the native call went through the executor"
        assert right, f"rank {rank}: wrong results"


def issued_checks_and_callbacks():
    """An issued call's mismatch check fails on every rank, at wait() (as from the executor); a future callback
    of an issued call runs once it is done (on the executor, which then exists)."""
    import zerocomm.comm as zdist
    from zerocomm.comm.errors import CollectiveMismatchError
    n, r = zdist.get_world_size(), zdist.get_rank()
    t = torch.ones(4)
    work = zdist.all_reduce(t, async_op=True, algorithm="native")
    seen = []
    future = work.get_future().then(lambda f: seen.append(f.value()[0].tolist()) or True)
    future.wait()
    callback = seen == [[float(n)] * 4]
    sizes = torch.ones(3 + r)  # rank r passes 3 + r elements: the ranks disagree
    mismatch = zdist.all_reduce(sizes, async_op=True, algorithm="native")
    try:
        mismatch.wait()
        raised = None
    except CollectiveMismatchError as error:
        raised = str(error)
    return callback, raised


@pytest.mark.parametrize("world", worlds(("gloo",), (2,)), indirect=True)
def test_issued_calls_keep_the_check_and_callbacks(world):
    for rank, (callback, raised) in enumerate(world.run(issued_checks_and_callbacks)):
        assert callback, f"rank {rank}: the future callback of an issued call did not see its result"
        assert raised is not None and "mismatched collectives" in raised and "all_reduce" in raised, \
            f"rank {rank}: a mismatched issued call raised {raised!r}"


def reduce_scatter_settles_once():
    """An issued reduce_scatter (AVG, SUM, MAX) reports completion without a wait, and a second wait, or a
    wait racing a future callback's settling on the executor, leaves its output as the first wait did.
    (torch's gloo reduce_scatter copies its chunk again at every wait: see the note in gloo.py.)"""
    import time
    import zerocomm.comm as zdist
    n, r = zdist.get_world_size(), zdist.get_rank()
    handle, _ = _fresh_group()
    k = 3
    rows = [torch.arange(k, dtype=torch.float32) + 10 * j + r for j in range(n)]  # row j is rank j's chunk
    expected = {"avg": sum(torch.arange(k, dtype=torch.float32) + 10 * r + q for q in range(n)) / n,
                "sum": sum(torch.arange(k, dtype=torch.float32) + 10 * r + q for q in range(n)),
                "max": torch.arange(k, dtype=torch.float32) + 10 * r + n - 1}
    ops = {"avg": zdist.ReduceOp.AVG, "sum": zdist.ReduceOp.SUM, "max": zdist.ReduceOp.MAX}
    outcome = {}
    for name, op in ops.items():
        out = torch.zeros(k)
        work = zdist.reduce_scatter_tensor(out, torch.cat(rows), op=op, group=handle, async_op=True,
                                           algorithm="native")
        deadline = time.monotonic() + 30.0
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(0.001)
        completed = work.is_completed()
        work.wait()
        first = out.clone()
        work.wait()
        outcome[name] = (completed, torch.equal(first, expected[name]), torch.equal(out, first))
    out = torch.zeros(k)
    work = zdist.reduce_scatter_tensor(out, torch.cat(rows), op=zdist.ReduceOp.AVG, group=handle, async_op=True,
                                       algorithm="native")
    seen = []
    work.add_done_callback(lambda future: seen.append(out.clone()))
    work.wait()
    zdist.barrier(group=handle)
    outcome["avg, waited beside a callback"] = (True, torch.equal(out, expected["avg"]),
                                                len(seen) == 1 and torch.equal(seen[0], expected["avg"]))
    zdist.destroy_process_group(handle)
    return outcome


@pytest.mark.parametrize("world", worlds(("gloo",), (2, 3)), indirect=True)
def test_an_issued_reduce_scatter_is_settled_once(world):
    for rank, outcome in enumerate(world.run(reduce_scatter_settles_once)):
        for name, (completed, right, unchanged) in outcome.items():
            assert completed, f"rank {rank}: {name}: is_completed() never became True before wait()"
            assert right, f"rank {rank}: {name}: wrong result after the first wait"
            assert unchanged, f"rank {rank}: {name}: a second wait (or the callback's settling) changed the output"
