"""barrier (nobody leaves before the last one arrives) and the object collectives
(broadcast_object_list, all_gather_object, gather_object, scatter_object_list), every root,
on the default group and a subgroup, at world sizes 1-4 on gloo and MPI.
"""
import time

import pytest
import torch

from support.cases import REFUSED, Cases, algorithms, assert_reports, groups
from support.dist import dist
from support.worlds import worlds

RUN_TIMEOUT_S = 120.0
STAGGER_S = 0.05  # group rank r reaches the barrier r * STAGGER_S late


def payload(rank: int, salt: int):
    """A picklable object whose pickled size and content depend on ``rank`` and ``salt``."""
    return {"rank": rank, "salt": salt, "text": "é" * rank + "x", "list": list(range(rank + salt)),
            "nested": (rank, None, 1.5, {"deep": [salt]}), "blob": bytes((rank * 7 + i) % 256 for i in range(999 * rank)),
            "tensor": torch.full((rank + 1,), salt, dtype=torch.int32)}


def _plain(obj):
    """``obj`` with tensors made comparable with ==."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", str(obj.dtype), obj.tolist())
    if isinstance(obj, dict):
        return {key: _plain(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(value) for value in obj)
    return obj


# --- what the ranks run ----------------------------------------------------------------------------

def barrier_times(backend):
    """Each member arrives staggered; returns the report with (arrived, left) per case in "times"."""
    cases = Cases(backend)
    times = {}
    for grp in groups():
        for async_op in (False, True):
            for alg in algorithms():
                what = f"barrier {grp} async_op={async_op}"
                time.sleep(STAGGER_S * grp.rank)
                arrived = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
                work = cases.call(what, grp.members, alg, dist.barrier, group=grp.handle, async_op=async_op)
                if work is REFUSED:
                    continue
                if async_op:
                    cases.check(what, work is not None and work.wait() is True, f"Work {work!r} did not wait() True")
                left = time.monotonic()
                times[f"{what} algorithm={alg}"] = (grp.members, arrived, left)
    report = cases.report()
    report["times"] = times
    return report


def object_cases(backend):
    cases = Cases(backend)
    for grp in groups():
        me, n = grp.members[grp.rank], grp.size
        gathered = [None] * n
        cases.call(f"all_gather_object {grp}", grp.members, None, dist.all_gather_object, gathered,
                   payload(me, 1), group=grp.handle)
        cases.check(f"all_gather_object {grp}", _plain(gathered) == _plain([payload(g, 1) for g in grp.members]),
                    f"got ranks {[o.get('rank') if isinstance(o, dict) else o for o in gathered]}")
        for root in range(n):
            src = grp.members[root]
            what = f"broadcast_object_list {grp} {grp.root('src', root)}"
            objects = [payload(src, 2), None, "end"] if me == src else [None, 7, None]
            cases.call(what, grp.members, None, dist.broadcast_object_list, objects, group=grp.handle,
                       **grp.root("src", root))
            cases.check(what, _plain(objects) == _plain([payload(src, 2), None, "end"]), f"got {objects!r:.200}")

            what = f"gather_object {grp} {grp.root('dst', root)}"
            slots = [None] * n if me == src else None
            cases.call(what, grp.members, None, dist.gather_object, payload(me, 3 + root), slots, group=grp.handle,
                       **grp.root("dst", root))
            if me == src:
                cases.check(what, _plain(slots) == _plain([payload(g, 3 + root) for g in grp.members]),
                            f"got {slots!r:.200}")

            what = f"scatter_object_list {grp} {grp.root('src', root)}"
            out = [None]
            inputs = [payload(src, 100 + g) for g in grp.members] if me == src else None
            cases.call(what, grp.members, None, dist.scatter_object_list, out, inputs, group=grp.handle,
                       **grp.root("src", root))
            cases.check(what, _plain(out[0]) == _plain(payload(src, 100 + me)), f"got {out[0]!r:.200}")
    return cases.report()


# --- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", worlds(), indirect=True)
def test_barrier_waits_for_the_last_rank(world):
    reports = world.run(barrier_times, world.backend, timeout=RUN_TIMEOUT_S)
    problems = []
    cases = {case: members for report in reports for case, (members, _, _) in report["times"].items()}
    for case, members in sorted(cases.items()):
        seen = {r["rank"]: r["times"][case] for r in reports if case in r["times"]}
        last_arrival = max(arrived for _, arrived, _ in seen.values())
        first_exit = min(left for _, _, left in seen.values())
        if sorted(seen) != sorted(members):
            problems.append(f"{case}: only ranks {sorted(seen)} of {list(members)} passed the barrier")
        elif first_exit < last_arrival:
            problems.append(f"{case}: a rank left {last_arrival - first_exit:.4f} s before the last one arrived")
    assert not problems, "\n".join(problems)
    assert_reports(reports)


@pytest.mark.parametrize("world", worlds(), indirect=True)
def test_object_collectives(world):
    assert_reports(world.run(object_cases, world.backend, timeout=RUN_TIMEOUT_S))
