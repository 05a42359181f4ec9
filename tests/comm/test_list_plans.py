"""Cache hits of the list forms and barrier: the same one route as the tensor forms.

gather, scatter, all_gather (list form), reduce_scatter (list form), all_to_all, all_to_all_single and barrier look
their cell's plan up by the arguments as passed (``api.py``), and ``Plan.run``'s quick test reads their lists and
split sizes (``plan.QUICK``).  Each rank traces which functions of ``comm/validate.py`` (the full checks) a call
enters: the first call of a cell enters them, the second does not, and both give the values computed here.  Then
each argument that may differ from the cached cell is changed -- a list's length, an item's dtype or size, a strided
item or tensor, a tensor subclass, split sizes, a list given where none may be -- and the call must take the full
checks again (or, for sizes the quick test re-derives, hit the plan) and give exactly what the same call gives on a
group with no plan, which is every call's route before these cells had plans: the same values, or the same error
type and message.
"""
import os
import random
import sys

import pytest
import torch

from support.plan_group import RecordingGroup
from support.worlds import worlds

import zerocomm.comm as dist
from zerocomm.comm import plan as plan_module
from zerocomm.comm import validate
from zerocomm.comm.errors import InvalidArgumentError
from zerocomm.comm.plan import MISS, Plan, Row

VALIDATE = os.sep + os.path.join("comm", "validate.py")


def traced(call) -> tuple:
    """``(whether call() entered comm/validate.py, ("ok", its value) or ("error", type name, message))``."""
    seen = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith(VALIDATE):
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        outcome = ("ok", call())
    except Exception as error:  # noqa: BLE001  (compared with the same call's on a group with no plan)
        outcome = ("error", type(error).__name__, str(error))
    finally:
        sys.setprofile(None)
    return bool(seen), outcome


def _done(work) -> None:
    if work is not None:
        work.wait()


# -- the forms: each runs one call on ``group`` (values differ by ``step``) and returns (what it gave, the reference)

def _all_gather(group, r, n, step, async_op=False):
    tensor = torch.full((3,), float(100 * step + r))
    out = [torch.zeros(3) for _ in range(n)]
    _done(dist.all_gather(out, tensor, group=group, async_op=async_op))
    return [x.tolist() for x in out], [[float(100 * step + j)] * 3 for j in range(n)]


def _gather(group, r, n, step, async_op=False):
    root = n - 1  # not rank 0: the root is the plan's
    tensor = torch.full((2,), float(100 * step + r))
    out = [torch.zeros(2) for _ in range(n)] if r == root else None
    _done(dist.gather(tensor, out, dst=root, group=group, async_op=async_op))
    return ([x.tolist() for x in out] if r == root else None,
            [[float(100 * step + j)] * 2 for j in range(n)] if r == root else None)


def _scatter(group, r, n, step, async_op=False):
    root = n - 1
    out = torch.zeros(2)
    items = [torch.full((2,), float(100 * step + 10 * j)) for j in range(n)] if r == root else None
    _done(dist.scatter(out, items, src=root, group=group, async_op=async_op))
    return out.tolist(), [float(100 * step + 10 * r)] * 2


def _reduce_scatter(group, r, n, step, async_op=False):
    items = [torch.full((2,), float(100 * step + 10 * j + r)) for j in range(n)]
    out = torch.zeros(2)
    _done(dist.reduce_scatter(out, items, group=group, async_op=async_op))
    return out.tolist(), [float(sum(100 * step + 10 * r + k for k in range(n)))] * 2


def _pair_size(r, j, step):
    """Elements rank r sends rank j (uneven, and changing with ``step``)."""
    return (r + 2 * j + step) % 3 + 1


def _all_to_all(group, r, n, step, async_op=False):
    inputs = [torch.full((_pair_size(r, j, step),), float(100 * step + 10 * r + j)) for j in range(n)]
    out = [torch.zeros(_pair_size(j, r, step)) for j in range(n)]
    _done(dist.all_to_all(out, inputs, group=group, async_op=async_op))
    return [x.tolist() for x in out], [[float(100 * step + 10 * j + r)] * _pair_size(j, r, step) for j in range(n)]


def _all_to_all_single_even(group, r, n, step, async_op=False):
    data = torch.arange(2 * n, dtype=torch.float32) + 100 * step + 10 * r
    out = torch.zeros(2 * n)
    _done(dist.all_to_all_single(out, data, group=group, async_op=async_op))
    return out.tolist(), [100.0 * step + 10 * j + 2 * r + k for j in range(n) for k in range(2)]


def _all_to_all_single_uneven(group, r, n, step, async_op=False, splits=list):
    """Rank r sends ``_pair_size(r, j)`` rows of 2 to rank j; ``splits`` makes the split sizes' container."""
    sent = [_pair_size(r, j, step) for j in range(n)]
    got = [_pair_size(j, r, step) for j in range(n)]
    data = torch.tensor([[1000.0 * step + 100 * r + 10 * j + k] * 2 for j in range(n) for k in range(sent[j])])
    out = torch.zeros(sum(got), 2)
    _done(dist.all_to_all_single(out, data, splits(got), splits(sent), group=group, async_op=async_op))
    return out.tolist(), [[1000.0 * step + 100 * j + 10 * r + k] * 2 for j in range(n) for k in range(got[j])]


def _barrier(group, r, n, step, async_op=False):
    _done(dist.barrier(group=group, async_op=async_op))
    return None, None


FORMS = {"all_gather": _all_gather, "gather": _gather, "scatter": _scatter, "reduce_scatter": _reduce_scatter,
         "all_to_all": _all_to_all, "all_to_all_single even": _all_to_all_single_even,
         "all_to_all_single uneven": _all_to_all_single_uneven, "barrier": _barrier}


def second_calls() -> dict:
    n, r = dist.get_world_size(), dist.get_rank()
    group = dist.new_group(list(range(n)))
    seen = {}
    for name, form in FORMS.items():
        for async_op in (False, True):
            calls = [traced(lambda step=step: form(group, r, n, step, async_op)) for step in range(3)]
            seen[f"{name}{' async' if async_op else ''}"] = [(entered, outcome) for entered, outcome in calls]
    dist.destroy_process_group(group)
    return seen


@pytest.mark.parametrize("world", worlds(("gloo",), (2, 3)), indirect=True)
def test_a_second_call_of_each_list_form_and_barrier_hits_its_plan(world):
    for rank, seen in enumerate(world.run(second_calls, timeout=120)):
        assert len(seen) == 2 * len(FORMS)
        for name, calls in seen.items():
            where = (rank, name, calls)
            assert [entered for entered, _ in calls] == [True, False, False], where  # the full checks once
            for entered, outcome in calls:
                assert outcome[0] == "ok", where
                got, expected = outcome[1]
                assert got == expected, where


# -- refusals: (name, the call that plans the cell, the call that differs, whether it may hit the plan: sizes the quick
# test re-derives; "off the root": on the ranks that pass no list) ----------------------------------------------------

def _strided(*shape):
    """A tensor of ``shape`` that is not contiguous (every other element of a larger one)."""
    return torch.zeros(*shape[:-1], 2 * shape[-1])[..., ::2]


def _ag(items, tensor):
    return lambda group, r, n: (dist.all_gather(items(n), tensor(r), group=group), None)[1]


def _ag_values(group, r, n, items=None, tensor=None):
    out = items(n) if items else [torch.zeros(3) for _ in range(n)]
    value = tensor(r) if tensor else torch.full((3,), float(r))
    dist.all_gather(out, value, group=group)
    return [x.tolist() for x in out]


def _gather_misplaced_lists(group, r, n):
    root = n - 1  # the root passes no list, the others one: both refused on every rank
    dist.gather(torch.zeros(2), None if r == root else [torch.zeros(2) for _ in range(n)], dst=root, group=group)


def _scatter_short_list(group, r, n):
    root = n - 1
    dist.scatter(torch.zeros(2), [torch.zeros(2) for _ in range(n - 1 if r == root else n)], src=root, group=group)


def _scatter_items(group, r, n, strided=False):
    root = n - 1
    out = torch.zeros(2)
    items = None
    if r == root:
        items = [_strided(2) if strided else torch.zeros(2) for _ in range(n)]
        for j, item in enumerate(items):
            item.fill_(float(j + 7))
    dist.scatter(out, items, src=root, group=group)
    return out.tolist()


def _reduce_scatter_mixed_dtypes(group, r, n):
    items = [torch.ones(2, dtype=torch.float64 if j == 0 else torch.float32) for j in range(n)]
    dist.reduce_scatter(torch.zeros(2), items, group=group)


def _a2a_lists(group, r, n, length=None, dtype=None, strided=False):
    length = n if length is None else length
    inputs = [torch.full((2,), float(10 * r + j), dtype=dtype if dtype is not None and j == 0 else torch.float32)
              for j in range(length)]
    out = [_strided(2) if strided else torch.zeros(2) for _ in range(length)]
    dist.all_to_all(out, inputs, group=group)
    return [x.tolist() for x in out]


def _a2as(group, r, n, out_splits=None, in_splits=None, rows=None, strided=False):
    rows = 2 * n if rows is None else rows
    data = torch.arange(float(rows)) + 100 * r
    if strided:
        data = torch.stack([data, data], 1)[:, 0]  # the same values, stride 2
    out = torch.zeros(rows)
    dist.all_to_all_single(out, data, out_splits, in_splits, group=group)
    return out.tolist()


def _barrier_timeout(timeout):
    return lambda group, r, n: dist.barrier(group=group, timeout=timeout)


CASES = [
    # all_gather: a list one too long, an item of another dtype or size, strided items, a strided tensor, a subclass
    ("all_gather longer list", _ag_values,
     lambda g, r, n: _ag_values(g, r, n, items=lambda n: [torch.zeros(3) for _ in range(n + 1)]), False),
    ("all_gather item dtype", _ag_values,
     lambda g, r, n: _ag_values(g, r, n, items=lambda n: [torch.zeros(3, dtype=torch.float64)]
                                + [torch.zeros(3) for _ in range(n - 1)]), False),
    ("all_gather item size", _ag_values,
     lambda g, r, n: _ag_values(g, r, n, items=lambda n: [torch.zeros(4)] + [torch.zeros(3) for _ in range(n - 1)]),
     False),
    ("all_gather strided items", _ag_values,
     lambda g, r, n: _ag_values(g, r, n, items=lambda n: [_strided(3) for _ in range(n)]), False),
    ("all_gather strided tensor", _ag_values,
     lambda g, r, n: _ag_values(g, r, n, tensor=lambda r: torch.full((3, 2), float(r)).t()[0]), False),
    ("all_gather tensor subclass", _ag_values,
     lambda g, r, n: _ag_values(g, r, n, tensor=lambda r: torch.nn.Parameter(torch.full((3,), float(r)),
                                                                               requires_grad=False)), False),
    # gather and scatter: a list where none may be, none where one must be; a short list; strided items
    ("gather misplaced lists", lambda g, r, n: _gather(g, r, n, 0), _gather_misplaced_lists, False),
    ("scatter short list", lambda g, r, n: _scatter(g, r, n, 0), _scatter_short_list, False),
    # (only the root has a list: the other ranks' calls are the cell's as planned, and hit)
    ("scatter strided items", _scatter_items, lambda g, r, n: _scatter_items(g, r, n, strided=True), "off the root"),
    ("reduce_scatter item dtype", lambda g, r, n: _reduce_scatter(g, r, n, 0), _reduce_scatter_mixed_dtypes, False),
    # all_to_all: a longer list, an item of another dtype, strided outputs; other sizes per pair re-derive (a hit)
    ("all_to_all longer list", _a2a_lists, lambda g, r, n: _a2a_lists(g, r, n, length=n + 1), False),
    ("all_to_all item dtype", _a2a_lists, lambda g, r, n: _a2a_lists(g, r, n, dtype=torch.float64), False),
    ("all_to_all strided outputs", _a2a_lists, lambda g, r, n: _a2a_lists(g, r, n, strided=True), False),
    ("all_to_all other sizes", lambda g, r, n: _all_to_all(g, r, n, 0), lambda g, r, n: _all_to_all(g, r, n, 1),
     True),
    # all_to_all_single: other valid splits re-derive (a hit); splits that do not add up, splits in a tensor, an even
    # split that does not divide, a strided input take the full checks
    ("all_to_all_single other splits", lambda g, r, n: _all_to_all_single_uneven(g, r, n, 0),
     lambda g, r, n: _all_to_all_single_uneven(g, r, n, 1), True),
    ("all_to_all_single splits in a tuple", lambda g, r, n: _all_to_all_single_uneven(g, r, n, 0),
     lambda g, r, n: _all_to_all_single_uneven(g, r, n, 2, splits=tuple), True),
    ("all_to_all_single splits in a tensor", lambda g, r, n: _all_to_all_single_uneven(g, r, n, 0),
     lambda g, r, n: _all_to_all_single_uneven(g, r, n, 1, splits=torch.tensor), False),
    ("all_to_all_single splits not adding up", lambda g, r, n: _a2as(g, r, n, [2] * n, [2] * n),
     lambda g, r, n: _a2as(g, r, n, [2] * n, [3] + [2] * (n - 1)), False),
    ("all_to_all_single negative split", lambda g, r, n: _a2as(g, r, n, [2] * n, [2] * n),
     lambda g, r, n: _a2as(g, r, n, [2] * n, [-1, 5] + [2] * (n - 2)), False),
    ("all_to_all_single bool splits", lambda g, r, n: _a2as(g, r, n, [2] * n, [2] * n),
     lambda g, r, n: _a2as(g, r, n, [True] * n, [True] * n, rows=n), False),
    ("all_to_all_single even split not dividing", _a2as, lambda g, r, n: _a2as(g, r, n, rows=2 * n + 1), False),
    ("all_to_all_single strided input", _a2as, lambda g, r, n: _a2as(g, r, n, strided=True), False),
    # barrier: a timeout equal to the cached one but refused (True == 1)
    ("barrier timeout True", _barrier_timeout(1), _barrier_timeout(True), False),
]


def refusals() -> dict:
    n, r = dist.get_world_size(), dist.get_rank()
    planned, fresh = dist.new_group(list(range(n))), dist.new_group(list(range(n)))
    seen = {}
    for name, plans, differs, may_hit in CASES:
        validate.resolve_group(planned, "test").forget_plans()
        plans(planned, r, n)
        second = traced(lambda: plans(planned, r, n))  # the cell is planned: this one hits
        on_plan = traced(lambda: differs(planned, r, n))
        after = traced(lambda: plans(planned, r, n))  # the cell's plan still serves the planning call
        # No plan: the full checks only, as every call before its plan.
        validate.resolve_group(fresh, "test").forget_plans()
        unplanned = traced(lambda: differs(fresh, r, n))
        seen[name] = (r != n - 1 if may_hit == "off the root" else may_hit, second, on_plan, after, unplanned)
    dist.destroy_process_group(fresh)
    dist.destroy_process_group(planned)
    return seen


@pytest.mark.parametrize("world", worlds(("gloo",), (2, 3)), indirect=True)
def test_each_refusal_of_the_quick_test_takes_the_full_checks_with_the_same_outcome(world):
    for rank, seen in enumerate(world.run(refusals, timeout=240)):
        assert len(seen) == len(CASES)
        for name, (may_hit, second, on_plan, after, unplanned) in seen.items():
            where = (rank, name, second, on_plan, after, unplanned)
            assert second[0] is False and second[1][0] == "ok", where
            assert on_plan[0] is (not may_hit), where  # refused: the full checks ran; re-derived: the plan served
            assert unplanned[0] is True, where
            assert on_plan[1] == unplanned[1], where  # the same values, or the same error and message
            assert after[0] is False and after[1] == second[1], where
        errors = {name for name, (_, _, on_plan, _, _) in seen.items() if on_plan[1][0] == "error"}
        assert errors == {"all_gather longer list", "all_gather item dtype", "all_gather item size",
                          "gather misplaced lists", "scatter short list", "reduce_scatter item dtype",
                          "all_to_all longer list", "all_to_all item dtype", "all_to_all_single splits not adding up",
                          "all_to_all_single negative split", "all_to_all_single even split not dividing",
                          "barrier timeout True"}, (rank, seen)
        for name in errors:
            assert seen[name][2][1][1] == "InvalidArgumentError", (rank, name, seen[name])


# -- the quick test's split sizes, without a world: the counts validate derives, or MISS ---------------------------

def _a2as_plan(size: int) -> Plan:
    row = Row(most_bytes=plan_module.select.UNBOUNDED, algorithm="native", function=lambda *a, **k: None,
              checker=None, check=(1, ("cell",)), ride=None)
    return Plan(RecordingGroup(size), "all_to_all", torch.float32, None, -1, False, None, (row,), "all_to_all",
                True, "all_to_all_single")


def test_the_quick_tests_split_counts_are_validates_or_a_miss():
    """Random split sizes (valid, or broken one way each) against ``validate._split_counts``: where it admits them as
    plain ints the record carries its counts; everything else is a MISS, left to it to convert or refuse."""
    rng = random.Random(46)
    for _ in range(300):
        n = rng.randint(1, 5)
        plan = _a2as_plan(n)
        row_numel = rng.randint(1, 3)
        sent = [rng.randint(0, 3) for _ in range(n)]
        got = [rng.randint(0, 3) for _ in range(n)]
        data, out = torch.zeros(sum(sent), row_numel), torch.zeros(sum(got), row_numel)
        broken = rng.choice([None, "sum", "negative", "length", "float", "bool"])
        splits = list(sent)
        if broken == "sum":
            splits[0] += 1
        elif broken == "negative" and n > 1:
            splits[0], splits[1] = -1, splits[1] + splits[0] + 1
        elif broken == "length":
            splits.append(0)
        elif broken == "float":
            splits[0] = float(splits[0])
        elif broken == "bool" and splits[0] in (0, 1):
            splits[0] = bool(splits[0])
        call = plan.run(out, data, got, splits)
        group = RecordingGroup(n)
        try:
            counts = validate._split_counts(data, splits, "input", group)
        except InvalidArgumentError:
            counts = None
        plain = all(type(s) is int for s in splits)
        if counts is None or not plain:
            assert call is MISS, (n, splits, counts)
        else:
            assert call is not MISS, (n, splits)
            assert call.args[3] == counts and call.args[2] == [g * row_numel for g in got], (n, splits)
            assert call.nbytes == data.nbytes and call.numel == -1


def test_an_even_split_is_counted_as_validate_counts_it():
    plan = _a2as_plan(3)
    call = plan.run(torch.zeros(6, 2), torch.zeros(6, 2))
    assert call.args[2] == call.args[3] == [4, 4, 4] and call.numel == 12
    assert plan.run(torch.zeros(7), torch.zeros(7)) is MISS  # 7 rows over 3 ranks: the full checks refuse it
    assert plan.run(torch.zeros(6, dtype=torch.float64), torch.zeros(6)) is MISS  # the output's dtype
