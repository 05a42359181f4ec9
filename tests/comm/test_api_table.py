"""``api.COLLECTIVES``, the table of collectives, says what each public function does: held here to the code.

Every function builds its plan key inline (a tuple display costs no Python call): the key must hold the row's
``key`` arguments in order, then the dtype of the row's ``keyed`` tensor, and the function must hand the row's
``tensors`` to ``Plan.run`` and its own name and key to the slow path.  barrier, which has no tensor and no row,
plans its cell the same way.
"""
import ast
import inspect
import textwrap

import pytest

from zerocomm.comm import api
from zerocomm.comm.plan import QUICK


def _tree(function) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(function)))


def _name(node) -> str:
    """An argument's name; the op is keyed by name for ReduceOp.SUM (``"sum" if op is _SUM else op``), split sizes
    by whether they are given (``output_split_sizes is None``)."""
    if isinstance(node, ast.IfExp):
        node = node.orelse
    if isinstance(node, ast.Compare):
        node = node.left
    return node.id


def test_every_public_collective_with_tensors_has_a_row():
    assert set(api.COLLECTIVES) == {"broadcast", "all_reduce", "reduce", "all_gather_into_tensor", "all_gather",
                                    "gather", "scatter", "reduce_scatter_tensor", "reduce_scatter",
                                    "all_to_all_single", "all_to_all"}
    for name, row in api.COLLECTIVES.items():
        assert row.name == name and row.public is getattr(api, name) and row.checks.__name__ == name


@pytest.mark.parametrize("name", sorted(api.COLLECTIVES))
def test_the_functions_key_and_route_are_its_rows(name):
    row = api.COLLECTIVES[name]
    tree = _tree(row.public)
    slow = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_full"]
    assert len(slow) == 1 and slow[0].args[0].value == name
    keys = [node.value for node in ast.walk(tree) if isinstance(node, ast.NamedExpr) and node.target.id == "key"]
    runs = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "run"]
    tensors = [part.strip() for part in row.tensors.split(",")]
    assert len(keys) == 1, name
    items = keys[0].elts
    assert items[0].value == name
    assert [_name(item) for item in items[1:-1]] == list(row.key)
    assert items[-1].attr == "dtype" and ast.unparse(items[-1].value) == row.keyed
    assert row.keyed.split("[")[0] in tensors
    assert len(runs) == 1 and [arg.id for arg in runs[0].args] == tensors
    assert slow[0].args[1].id == "key"
    tail, larger, fields = QUICK[name]
    if fields is None:  # one tensor in place, or a pair whose larger one QUICK names
        assert (len(tensors) == 1) == (larger is None)
    else:  # a list form: its own quick test, over the arguments the function hands over
        assert len(tensors) >= 2 and not tail and larger is None


def test_barrier_plans_its_cell_like_the_collectives():
    """barrier's key is its group, async_op, timeout (and its type) and algorithm, ending with its plan's dtype; a
    cache hit hands ``Plan.run`` nothing, a miss goes to its full checks with the key."""
    tree = _tree(api.barrier)
    keys = [node.value for node in ast.walk(tree) if isinstance(node, ast.NamedExpr) and node.target.id == "key"]
    assert len(keys) == 1
    assert [ast.unparse(item) for item in keys[0].elts] == [
        "'barrier'", "group", "async_op", "timeout", "type(timeout)", "algorithm", "_BARRIER_DTYPE"]
    runs = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "run"]
    assert len(runs) == 1 and not runs[0].args and not runs[0].keywords
    slow = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and ast.unparse(node.func) == "validate.barrier"]
    assert len(slow) == 1 and slow[0].args[-1].id == "key"
    assert QUICK["barrier"][2] is not None
