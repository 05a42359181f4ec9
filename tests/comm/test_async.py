"""``async_op=True``: every collective returns a Work whose wait()/is_completed()/get_future()
behave as torch's, and many outstanding collectives of different kinds complete correctly.

The reference for an asynchronous call is the same call made synchronously just before (whose
correctness the other suites check against numpy): all collectives are launched back to back,
then waited in reverse order, so their messages overlap on the wire.
"""
import datetime

import pytest
import torch

from support.cases import REFUSED, Cases, algorithms, assert_reports, groups
from support.reference import rank_input, to_torch
from support.dist import dist
from support.worlds import worlds

RUN_TIMEOUT_S = 180.0
K = 3  # elements per rank's chunk


def _x(grp, dtype, count, salt):
    return to_torch(rank_input(grp.members[grp.rank], count, dtype, "sum", salt), dtype)


# Each launcher runs one collective and returns (work, the outputs defined on this rank).
def _all_reduce(grp, dtype, async_op, **extra):
    t = _x(grp, dtype, 7, 1)
    return dist.all_reduce(t, group=grp.handle, async_op=async_op, **extra), [t]


def _broadcast(grp, dtype, async_op, **extra):
    t = _x(grp, dtype, 7, 2)
    return dist.broadcast(t, grp.members[-1], group=grp.handle, async_op=async_op, **extra), [t]


def _reduce(grp, dtype, async_op, **extra):
    t = _x(grp, dtype, 7, 3)
    work = dist.reduce(t, grp.members[-1], group=grp.handle, async_op=async_op, **extra)
    return work, [t] if grp.rank == grp.size - 1 else []


def _all_gather(grp, dtype, async_op, **extra):
    outs = [torch.zeros(K, dtype=dtype) for _ in grp.members]
    return dist.all_gather(outs, _x(grp, dtype, K, 4), group=grp.handle, async_op=async_op, **extra), outs


def _all_gather_into_tensor(grp, dtype, async_op, **extra):
    out = torch.zeros(grp.size * K, dtype=dtype)
    work = dist.all_gather_into_tensor(out, _x(grp, dtype, K, 5), group=grp.handle, async_op=async_op, **extra)
    return work, [out]


def _gather(grp, dtype, async_op, **extra):
    outs = [torch.zeros(K, dtype=dtype) for _ in grp.members] if grp.rank == 0 else None
    work = dist.gather(_x(grp, dtype, K, 6), outs, grp.members[0], group=grp.handle, async_op=async_op, **extra)
    return work, outs or []


def _scatter(grp, dtype, async_op, **extra):
    out = torch.zeros(K, dtype=dtype)
    ins = [_x(grp, dtype, K, 10 + j) for j in range(grp.size)] if grp.rank == 0 else None
    return dist.scatter(out, ins, grp.members[0], group=grp.handle, async_op=async_op, **extra), [out]


def _reduce_scatter(grp, dtype, async_op, **extra):
    out = torch.zeros(K, dtype=dtype)
    ins = [_x(grp, dtype, K, 20 + j) for j in range(grp.size)]
    return dist.reduce_scatter(out, ins, group=grp.handle, async_op=async_op, **extra), [out]


def _reduce_scatter_tensor(grp, dtype, async_op, **extra):
    out = torch.zeros(K, dtype=dtype)
    work = dist.reduce_scatter_tensor(out, _x(grp, dtype, grp.size * K, 7), group=grp.handle, async_op=async_op, **extra)
    return work, [out]


def _all_to_all(grp, dtype, async_op, **extra):
    outs = [torch.zeros(K, dtype=dtype) for _ in grp.members]
    ins = [_x(grp, dtype, K, 30 + j) for j in range(grp.size)]
    return dist.all_to_all(outs, ins, group=grp.handle, async_op=async_op, **extra), outs


def _all_to_all_single(grp, dtype, async_op, **extra):
    out = torch.zeros(grp.size * K, dtype=dtype)
    work = dist.all_to_all_single(out, _x(grp, dtype, grp.size * K, 8), group=grp.handle, async_op=async_op, **extra)
    return work, [out]


def _barrier(grp, dtype, async_op, **extra):
    return dist.barrier(group=grp.handle, async_op=async_op, **extra), []


LAUNCHERS = [_all_reduce, _broadcast, _reduce, _all_gather, _all_gather_into_tensor, _gather, _scatter,
             _reduce_scatter, _reduce_scatter_tensor, _all_to_all, _all_to_all_single, _barrier]


# --- what the ranks run ----------------------------------------------------------------------------

def overlapping_async_cases(backend):
    cases = Cases(backend)
    for grp in groups():
        for dtype in (torch.float32, torch.int64):
            for alg in algorithms():
                label = f"{grp} {dtype} algorithm={alg}"
                # Synchronous first: the reference, and the set of calls this algorithm serves.
                expected = {}
                for launch in LAUNCHERS:
                    result = cases.call(f"{launch.__name__[1:]} {grp} {dtype}", grp.members, alg, launch, grp, dtype,
                                        False, dtype=dtype)
                    if result is not REFUSED:
                        work, outputs = result
                        cases.check(f"{launch.__name__[1:]} {label}", work is None,
                                    f"a synchronous call returned {work!r}, torch returns None")
                        expected[launch] = outputs
                extra = {"algorithm": alg} if alg else {}
                launched = [(launch, *launch(grp, dtype, True, **extra)) for launch in LAUNCHERS if launch in expected]
                for launch, work, outputs in reversed(launched):
                    what = f"async {launch.__name__[1:]} {label}"
                    if work is None or not hasattr(work, "wait"):
                        cases.fail(f"{what}: async_op=True returned {work!r}, expected a Work")
                        continue
                    done = work.wait(timeout=datetime.timedelta(seconds=60))
                    cases.check(what, done is True, f"Work.wait() returned {done!r}, torch returns True")
                    cases.check(what, work.is_completed(), "is_completed() is False after wait()")
                    for index, (got, want) in enumerate(zip(outputs, expected[launch])):
                        cases.check(what, torch.equal(got, want),
                                    f"output {index} is {got.tolist()}, the synchronous call gave {want.tolist()}")
    return cases.report()


def future_cases(backend):
    """get_future(): a torch Future that completes with the collective; waiting twice is fine."""
    cases = Cases(backend)
    for grp in groups():
        for alg in algorithms():
            what = f"get_future all_reduce {grp} algorithm={alg}"
            t = _x(grp, torch.float32, 7, 1)
            expected = sum(to_torch(rank_input(g, 7, torch.float32, "sum", 1), torch.float32) for g in grp.members)
            work = cases.call(what, grp.members, alg, dist.all_reduce, t, group=grp.handle, async_op=True,
                              dtype=torch.float32)
            if work is REFUSED:
                continue
            future = work.get_future()
            future.wait()
            cases.check(what, future.done(), "the future is not done after wait()")
            cases.check(what, torch.equal(t, expected), f"result {t.tolist()}, expected {expected.tolist()}")
            # torch may complete the future a moment before the Work: wait on the Work too.
            cases.check(what, work.wait() is True, "wait() after the future's wait did not return True")
            cases.check(what, work.is_completed(), "the Work is not completed after wait()")
    return cases.report()


# --- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", worlds(), indirect=True)
@pytest.mark.parametrize("cases_fn", [overlapping_async_cases, future_cases],
                         ids=lambda fn: fn.__name__.removesuffix("_cases"))
def test_async_work(world, cases_fn):
    assert_reports(world.run(cases_fn, world.backend, timeout=RUN_TIMEOUT_S))


def collective_from_a_future_callback():
    """A blocking collective issued from a Work's future callback (it runs on the group's executor thread)
    runs inline instead of waiting behind the task that issued it."""
    import torch
    import zerocomm.comm as zdist
    first = torch.ones(4)
    second = torch.ones(4)
    work = zdist.all_reduce(first, async_op=True)
    chained = work.get_future().then(lambda _: zdist.all_reduce(second))
    chained.wait()
    return first.tolist(), second.tolist(), zdist.get_world_size()


@pytest.mark.parametrize("world", worlds(("gloo",), (2,)), indirect=True)
def test_blocking_collective_from_a_future_callback_does_not_deadlock(world):
    for first, second, n in world.run(collective_from_a_future_callback, timeout=60):
        assert first == [float(n)] * 4 and second == [float(n)] * 4
