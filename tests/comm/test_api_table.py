"""``api.COLLECTIVES``, the table of collectives, says what each public function does: held here to the code.

Each function with a cache hit builds its plan key inline (a tuple display costs no Python call): the key
must hold the row's ``key`` arguments in order, then the dtype of the row's last tensor, and the function
must hand the row's tensors to ``Plan.run`` and its own name to the slow path.
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
    """An argument's name; the op is keyed by name for ReduceOp.SUM (``"sum" if op is _SUM else op``)."""
    if isinstance(node, ast.IfExp):
        node = node.orelse
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
    if not row.tensors:  # list forms: no plan looked up; the full checks pack the lists on every call
        assert not keys and not runs and name not in QUICK and not row.key
        assert isinstance(slow[0].args[1], ast.Constant) and slow[0].args[1].value is None
        return
    tensors = [part.strip() for part in row.tensors.split(",")]
    assert len(keys) == 1, name
    items = keys[0].elts
    assert items[0].value == name
    assert [_name(item) for item in items[1:-1]] == list(row.key)
    assert items[-1].attr == "dtype" and items[-1].value.id == tensors[-1]
    assert len(runs) == 1 and [arg.id for arg in runs[0].args] == tensors
    assert (len(tensors) == 1) == (QUICK[name][1] is None)
