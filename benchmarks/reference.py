"""Inputs every rank can recompute, and the numpy answer each rank must end up with (``--check``).

Each rank's input is a closed-form function of (rank, position), so any rank can
compute every other rank's input and hence its own expected output without
communicating.  Values are small positive integers, so sums and products are exact
in every floating dtype in scope (bfloat16 holds integers exactly up to 256) and the
order in which an algorithm reduces does not matter.  Integer overflow (int8 sums on
many ranks) wraps identically here and in the collective, because sums and products
modulo 2**bits do not depend on order either.

Shapes, for a :class:`~zerocomm.benchmarks.units.Layout` with ``chunk`` c on n ranks:

=============== ======================= =========================================
collective      input of rank r         expected output on rank r
=============== ======================= =========================================
broadcast       c (root's pattern,      root's input (every rank)
                others zeros)
scatter         root: n*c               root's input[r*c:(r+1)*c]
reduce          c                       reduction over ranks (root only)
all_reduce      c                       reduction over ranks
gather          c                       concatenation of inputs (root only)
all_gather      c                       concatenation of inputs
reduce_scatter  n*c                     reduction over ranks of input[r*c:(r+1)*c]
all_to_all      n*c                     block j = rank j's input[r*c:(r+1)*c]
=============== ======================= =========================================
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .units import PARTITIONED, REDUCING, canonical_collective

#: numpy dtype each dtype name is compared in (bfloat16 has none in numpy: compared as float32).
NUMPY_DTYPES = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "bfloat16": np.float32,
    "int8": np.int8,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "bool": np.bool_,
}
FLOAT_DTYPES = frozenset({"float32", "float64", "float16", "bfloat16"})

# Relative precision of each float dtype (machine epsilon); bfloat16 keeps 8 significant bits.
_EPS = {"float32": 2.0**-23, "float64": 2.0**-52, "float16": 2.0**-10, "bfloat16": 2.0**-7}

REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


def _check_dtype(dtype: str) -> None:
    if dtype not in NUMPY_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(NUMPY_DTYPES)}")


def rank_pattern(rank: int, length: int, dtype: str, op: Optional[str] = None) -> np.ndarray:
    """The ``length`` input values of ``rank`` (a 1-D numpy array of ``NUMPY_DTYPES[dtype]``).

    ``op`` is the reduction op for reducing collectives, ``None`` for those that only
    move data.  Moving collectives get values that differ between ranks (1..61, shifted
    by 7 per rank) so a block delivered from the wrong rank is caught; products get 1s
    and 2s so n-rank products stay exact; other reductions get 1..5.
    """
    _check_dtype(dtype)
    index = np.arange(length, dtype=np.int64)
    if dtype == "bool":
        values = (index + rank) % 3 == 0
    elif op is None:
        values = (index + 7 * rank) % 61 + 1
    elif op == "product":
        values = (index + rank) % 2 + 1
    else:
        values = (index + 2 * rank) % 5 + 1
    return values.astype(NUMPY_DTYPES[dtype])


def rank_input(collective: str, rank: int, n: int, chunk: int, dtype: str, op: str) -> np.ndarray:
    """The input buffer of ``rank`` (see the module table); the root's send buffer for scatter.

    For broadcast only the root's input matters; the benchmark overwrites the other
    ranks' buffers with zeros so a rank that never received is caught.
    """
    collective = canonical_collective(collective)
    length = n * chunk if collective in ("scatter", "reduce_scatter", "all_to_all") else chunk
    reduction = op if collective in REDUCING else None
    return rank_pattern(rank, length, dtype, reduction)


def _reduce(stack: np.ndarray, op: str, n: int, dtype: str) -> np.ndarray:
    """Reduce ``stack`` (n x length) over its first axis the way ``op`` does, in ``dtype``."""
    if dtype == "bool":
        table = {"min": np.logical_and, "band": np.logical_and, "max": np.logical_or,
                 "bor": np.logical_or, "bxor": np.logical_xor}
        if op not in table:
            raise ValueError(f"op {op!r} is not defined on bool; expected one of {', '.join(table)}")
        return table[op].reduce(stack, axis=0)
    is_float = dtype in FLOAT_DTYPES
    # Exact arithmetic first (float64 / int64), then one cast: integers wrap as the collective's do.
    wide = stack.astype(np.float64 if is_float else np.int64)
    if op in ("sum", "avg"):
        result = wide.sum(axis=0)
        if op == "avg":
            if not is_float:
                raise ValueError(f"op 'avg' is not defined on integer dtype {dtype!r}")
            result = result / n
    elif op == "product":
        result = wide.prod(axis=0)
    elif op == "min":
        result = wide.min(axis=0)
    elif op == "max":
        result = wide.max(axis=0)
    elif op in ("band", "bor", "bxor"):
        if is_float:
            raise ValueError(f"op {op!r} is not defined on float dtype {dtype!r}")
        ufunc = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
        result = ufunc.reduce(wide, axis=0)
    else:
        raise ValueError(f"unknown reduce op {op!r}; expected one of {', '.join(REDUCE_OPS)}")
    return result.astype(NUMPY_DTYPES[dtype])


def expected_output(collective: str, rank: int, n: int, root: int, chunk: int,
                    dtype: str, op: str) -> Optional[np.ndarray]:
    """What ``rank`` must hold after the call, or ``None`` where the result is undefined
    (non-root ranks of reduce and gather; the root of scatter checks its received chunk).
    """
    collective = canonical_collective(collective)
    if not 0 <= root < n or not 0 <= rank < n:
        raise ValueError(f"rank {rank} and root {root} must lie in [0, {n})")
    inputs = [rank_input(collective, j, n, chunk, dtype, op) for j in range(n)]
    mine = slice(rank * chunk, (rank + 1) * chunk)
    if collective == "broadcast":
        return inputs[root]
    if collective == "scatter":
        return inputs[root][mine]
    if collective in ("reduce", "all_reduce"):
        if collective == "reduce" and rank != root:
            return None
        return _reduce(np.stack(inputs), op, n, dtype)
    if collective in ("gather", "all_gather"):
        if collective == "gather" and rank != root:
            return None
        return np.concatenate(inputs)
    if collective == "reduce_scatter":
        return _reduce(np.stack([x[mine] for x in inputs]), op, n, dtype)
    assert collective == "all_to_all" and collective in PARTITIONED
    return np.concatenate([x[mine] for x in inputs])


def count_wrong(actual: np.ndarray, expected: np.ndarray, dtype: str, n: int) -> int:
    """Elements of ``actual`` that differ from ``expected`` (nccl-tests' ``#wrong``).

    Integers and bools compare exactly.  Floats allow ``2 * n`` units of the dtype's
    precision relative to the expected value: inputs are integers, so only ``avg``'s
    division and the final rounding into the dtype can be inexact.  A shape mismatch
    counts every expected element as wrong.
    """
    _check_dtype(dtype)
    if actual.shape != expected.shape:
        return int(expected.size)
    if dtype not in FLOAT_DTYPES:
        return int(np.count_nonzero(actual != expected))
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    close = np.isclose(a, e, rtol=2 * n * _EPS[dtype], atol=0.0) | ((a == e) & np.isinf(e))
    return int(np.count_nonzero(~close))
