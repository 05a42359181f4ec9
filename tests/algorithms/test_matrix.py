"""Every registered (collective, algorithm) cell, over every dtype in scope and every op it admits.

The (dtype, op) table comes from support/references.py, written independently of
``zerocomm.ops``; inputs have closed-form results, so integer and bool results are compared
exactly and floats within one final rounding.  Worlds of 3 (not a power of two) and 4, with
multi-segment messages (16-byte segments: 1..16 elements per segment depending on the dtype).
"""
import pytest
import torch

from support import collective_checks as checks
from support.references import DTYPES, admitted_ops, dtype_op_pairs
from zerocomm.comm.algorithms import ALGORITHMS, COLLECTIVES, COMPRESSED, algorithms_for
from zerocomm.ops import op_admits

REDUCING = ("all_reduce", "reduce", "reduce_scatter")
SEGMENT_BYTES = 16
NUMEL = 13


def _cells(collectives):
    # Compressed algorithms return the mean with compression error, not the exact reduction: their
    # own suite (tests/comm/test_compressed.py) checks them against a reference of the same scheme.
    return [(coll, algo) for (coll, algo) in ALGORITHMS if coll in collectives and algo not in COMPRESSED]


def _id(value):
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return str(value)


def test_registry_shape():
    assert set(COLLECTIVES) == {coll for coll, _ in ALGORITHMS}
    assert algorithms_for("all_reduce") == ["ring", "tree", "recursive_doubling", "onebit", "shm"]
    assert algorithms_for("gather") == ["tree", "shm"]
    assert algorithms_for("no_such_collective") == []
    for (coll, algo), fn in ALGORITHMS.items():
        suffix = "recursive_doubling" if algo == "recursive_doubling" else algo
        assert fn.__name__ == f"{coll}_{suffix}"


def test_reference_table_agrees_with_op_admits():
    for dtype in DTYPES:
        for op in ("sum", "avg", "product", "min", "max", "band", "bor", "bxor"):
            assert (op_admits(op, dtype) is None) == (op in admitted_ops(dtype)), (dtype, op)


@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("dtype,op", dtype_op_pairs(), ids=_id)
@pytest.mark.parametrize("cell", _cells(REDUCING), ids=lambda c: "-".join(c))
def test_reducing_cells(cell, dtype, op, n):
    coll, _ = cell
    fn = ALGORITHMS[cell]
    if coll == "all_reduce":
        checks.check_all_reduce(fn, n, NUMEL, dtype, op, SEGMENT_BYTES)
    elif coll == "reduce":
        checks.check_reduce(fn, n, NUMEL, dtype, op, n - 1, SEGMENT_BYTES)
    else:
        checks.check_reduce_scatter(fn, n, 5, dtype, op, SEGMENT_BYTES)


MOVING = ("broadcast", "all_gather", "gather", "scatter", "all_to_all")


@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=_id)
@pytest.mark.parametrize("cell", _cells(MOVING), ids=lambda c: "-".join(c))
def test_data_movement_cells(cell, dtype, n):
    coll, _ = cell
    fn = ALGORITHMS[cell]
    if coll == "broadcast":
        checks.check_broadcast(fn, n, NUMEL, dtype, 1, SEGMENT_BYTES)
    elif coll == "all_gather":
        checks.check_all_gather(fn, n, 5, dtype, SEGMENT_BYTES)
    elif coll == "gather":
        checks.check_gather(fn, n, 5, dtype, 1, SEGMENT_BYTES)
    elif coll == "scatter":
        checks.check_scatter(fn, n, 5, dtype, 1, SEGMENT_BYTES)
    else:
        counts = [[(i + j) % 3 + (i == j) for j in range(n)] for i in range(n)]
        checks.check_all_to_all(fn, counts, dtype, SEGMENT_BYTES)


@pytest.mark.parametrize("algo", algorithms_for("barrier"))
def test_barrier_cells(algo):
    for n in (1, 3, 4):
        checks.check_barrier(ALGORITHMS[("barrier", algo)], n)
