"""``Plan.run``: the one route's record and its quick test, checked without a world.

A stand-in group hands back the record it is given, so each test reads the ``Call`` a cache hit (tensors as
passed) or the full checks (fields given) make, and compares it field by field with one built by keyword.
"""
import ast
import inspect
import textwrap

import pytest
import torch

from support.plan_group import RecordingGroup

from zerocomm.comm import plan as plan_module
from zerocomm.comm.plan import MISS, Call, Plan, Row


def _fn(*args, **kwargs):
    """A stand-in algorithm function."""


def _plan(collective: str, public: str, size: int = 2, op="sum", root=-1, rows=None) -> Plan:
    rows = rows or (Row(most_bytes=plan_module.select.UNBOUNDED, algorithm="native", function=_fn, checker=None,
                        check=(1, ("cell",)), ride=None),)
    return Plan(RecordingGroup(size), collective, torch.float32, op, root, False, None, rows, public)


def _expected(plan: Plan, row: Row, **per_call) -> Call:
    """The record built by keyword: the cell's fields from ``plan`` and ``row``, the call's from ``per_call``."""
    return Call(collective=plan.collective, group=plan.group, op=plan.op, root=plan.root, algorithm=row.algorithm,
                function=row.function, async_op=plan.async_op, timeout=plan.timeout, dtype=plan.dtype,
                checker=row.checker, check=row.check, ride=row.ride, issue=row.issue,
                **{"options": None, "copy_out": None, **per_call})


def test_the_record_lists_calls_fields_in_order():
    """``Plan.run`` builds the record with ``tuple.__new__`` (a keyword ``Call(...)`` is one Python call more per
    collective call): each item of that tuple must be the field of its place, read here off its expression."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(Plan.run)))
    built = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_new"]
    assert len(built) == 1, "Plan.run makes its record in one place"
    items = built[0].args[1].elts

    def field(node):
        node = node.body if isinstance(node, ast.IfExp) else node
        return node.attr if isinstance(node, ast.Attribute) else node.id

    assert [field(item) for item in items] == list(Call._fields)


def test_group_run_reads_the_flight_recorders_fields_by_index():
    """``Group.run`` records ``call[16]`` and ``call[12]`` (index reads are its cheapest)."""
    assert Call._fields[16] == "check" and Call._fields[12] == "nbytes"


def test_a_cache_hit_in_place_makes_the_record_the_full_checks_would():
    plan = _plan("reduce", "reduce", op="max", root=1)
    tensor = torch.arange(6, dtype=torch.float32).view(2, 3)
    call = plan.run(tensor)
    assert call == _expected(plan, plan.rows[0], args=(call.args[0], "max", 1), outputs=(tensor,), nbytes=24,
                             numel=6)
    assert call.args[0].shape == (6,) and call.args[0].data_ptr() == tensor.data_ptr()
    given = plan.run(args=call.args, nbytes=24, numel=6, outputs=(tensor,))
    assert given == call
    assert plan.record(call.args, 24, 6, (tensor,)) == call


@pytest.mark.parametrize("public,collective,op", [("all_gather_into_tensor", "all_gather", None),
                                                  ("reduce_scatter_tensor", "reduce_scatter", "sum")])
def test_a_cache_hit_of_a_pair_reads_the_larger_tensor_by_the_collectives_role(public, collective, op):
    plan = _plan(collective, public, size=3, op=op)
    small, large = torch.zeros(4), torch.zeros(12)
    output, input = (large, small) if collective == "all_gather" else (small, large)
    call = plan.run(output, input)
    assert call == _expected(plan, plan.rows[0], args=(output, input) + ((op,) if op else ()), outputs=(output,),
                             nbytes=48, numel=4)
    assert plan.run(input, output) is MISS  # the sizes the other way round
    assert plan.run(output, torch.zeros(5)) is MISS


def test_the_quick_test_refuses_what_may_differ_between_calls():
    plan = _plan("all_reduce", "all_reduce")
    assert plan.run(torch.zeros(4, 2).t()) is MISS  # not contiguous
    assert plan.run(torch.nn.Parameter(torch.zeros(2))) is MISS  # a subclass: the full checks decide
    assert plan.run([1.0, 2.0]) is MISS
    assert plan.run(torch.zeros(2).to_sparse()) is MISS
    pair = _plan("all_gather", "all_gather_into_tensor")
    assert pair.run(torch.zeros(4, dtype=torch.float64), torch.zeros(2)) is MISS  # the output's dtype
    assert pair.run(torch.zeros(8)[::2], torch.zeros(2)) is MISS


def test_the_row_is_chosen_by_size_and_a_small_all_reduce_rides_in_its_check():
    def in_segment(call, tag, deadline):  # the group's segment checker, which a riding call is checked by
        return True

    small = Row(most_bytes=16, algorithm="shm", function=_fn, checker=None, check=(1, ()),
                ride=("f", "sum", in_segment))
    large = Row(most_bytes=plan_module.select.UNBOUNDED, algorithm="ring", function=_fn, checker=None,
                check=(2, ()), ride=("f", "sum", in_segment))
    plan = _plan("all_reduce", "all_reduce", rows=(small, large))
    assert plan.run(torch.zeros(4)).algorithm == "shm"
    ridden = plan.run(torch.zeros(4))
    assert ridden.ride == ("f", "sum", in_segment) and ridden.checker is in_segment
    big = plan.run(torch.zeros(plan_module._RIDE_BYTES // 4 + 1))
    assert big.algorithm == "ring" and big.ride is None and big.checker is None
