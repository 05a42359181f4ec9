"""Independent numpy references for reductions, and per-rank inputs with closed-form results.

Inputs are integer-valued (or quarter-valued for min/max) so every sum and product is exact in
every dtype in scope, in any reduction order, for up to 8 ranks:

* sum/avg: values in ``-4..4`` (``0..8`` unsigned) -> |sum| <= 32, exact even in bfloat16 and int8;
* product: at most 3 of any 8 ranks contribute a 2, the rest +-1 -> |product| <= 8;
* min/max and bitwise ops: any values that fit the dtype.

Nothing here calls zerocomm's kernels: the admitted-ops table (in reference.py) is written out independently.
"""
from __future__ import annotations

import numpy as np
import torch

# The dtype rules, conversions and the numpy reduction are shared with the comm suites' reference.py;
# what this module adds is inputs whose reductions stay exact for up to 8 ranks.
from .reference import DTYPES, RTOL, admitted_ops, kind, to_numpy, to_torch
from .reference import reduce as reference

__all__ = ["DTYPES", "admitted_ops", "assert_matches", "dtype_op_pairs", "rank_values", "reference", "to_numpy",
           "to_torch"]


def dtype_op_pairs() -> list[tuple[torch.dtype, str]]:
    """Every (dtype, op) cell in scope that is defined."""
    return [(dtype, op) for dtype in DTYPES for op in admitted_ops(dtype)]


def rank_values(rank: int, numel: int, dtype: torch.dtype, op: str = "sum", salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s input as a numpy array (float64, int64 or bool) whose reduction is exact."""
    i = np.arange(numel, dtype=np.int64)
    k = kind(dtype)
    signed = dtype not in (torch.uint8, torch.bool)
    if k == "bool":
        # Seeded coin flips per (rank, index): patterns differ across ranks and indices at every world
        # size; mostly True for and (min/band), mostly False for or (max/bor), so that the result over
        # up to 8 ranks still varies along the index.
        rng = np.random.default_rng([rank, salt, 2026])
        return rng.random(numel) < {"min": 0.8, "band": 0.8, "max": 0.2, "bor": 0.2}.get(op, 0.5)
    # The rank*i term keeps every index's column of per-rank values different: without it, sums over
    # some world sizes were zero at every index, so a collective that zeroed its output could pass.
    salt = salt + rank * i
    if op in ("sum", "avg"):
        v = (rank * 7 + i * 3 + salt) % 9
        v = v - 4 if signed else v
    elif op == "product":
        sign = np.where(((rank * 5 + i + salt) % 2 == 1) & signed, -1, 1)
        v = np.where((rank + i + salt) % 3 == 0, 2, sign)
    elif op in ("min", "max"):
        v = (rank * 37 + i * 11 + salt) % 101
        v = v - 50 if signed else v
        if k == "float":
            return v / 4.0
    else:  # bitwise
        v = (rank * 37 + i * 11 + salt) % 61
        v = v - 30 if signed else v
    return v.astype(np.float64) if k == "float" else v.astype(np.int64)


def assert_matches(actual: torch.Tensor, expected: np.ndarray, what: str) -> None:
    got = to_numpy(actual)
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}"
    if kind(actual.dtype) == "float":
        np.testing.assert_allclose(got, expected, rtol=RTOL[actual.dtype], atol=0, err_msg=what)
    else:
        np.testing.assert_array_equal(got, expected.astype(got.dtype), err_msg=what)
