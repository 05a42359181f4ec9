"""numpy references for the collective suites: per-rank inputs, reductions, comparison.

Inputs are seeded pseudo-random integers (``numpy.random.default_rng`` seeded by rank, op and
salt, so any process recomputes any rank's input) in ranges chosen so that every reduction over up
to 8 ranks is exact in every dtype, in any order:

=============  ===========================================================================
sum, avg       |x| <= 8 in float16/bfloat16, 15 in int8, 31 in uint8, 2**20 in int32,
               2**40 in int64, 1000 in float32/float64
product        x in {-1, 1, 2} (uint8: {1, 2}), so |product| <= 2**n: exact in int8 up to 6 ranks
min, max       quarters in [-25, 25] for floats; the dtype's range for integers (int64: 2**40)
band/bor/bxor  the dtype's full range (int32/int64 bounded at 2**40), random bits for bool
=============  ===========================================================================

Random rather than affine inputs: an affine pattern such as ``(7 r + 3 i) % 9`` sums to zero
over ranks {0, 1, 2} at every index, so a collective that zeroes its output would pass.
Only avg rounds (once, dividing the exact sum); ``compare`` allows that one rounding.
Nothing here imports zerocomm.
"""
from __future__ import annotations

import numpy as np
import torch

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int8, torch.int32, torch.int64, torch.uint8)
DTYPES = FLOATS + INTS + (torch.bool,)
OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")

ADMITTED = {
    "float": ("sum", "avg", "product", "min", "max"),
    "int": ("sum", "product", "min", "max", "band", "bor", "bxor"),
    "bool": ("min", "max", "band", "bor", "bxor"),
}

_SUM_BOUND = {torch.float16: 8, torch.bfloat16: 8, torch.float32: 1000, torch.float64: 1000,
              torch.int8: 15, torch.uint8: 31, torch.int32: 2 ** 20, torch.int64: 2 ** 40}
_INT_RANGE = {torch.int8: (-128, 127), torch.uint8: (0, 255), torch.int32: (-2 ** 31, 2 ** 31 - 1),
              torch.int64: (-2 ** 40, 2 ** 40)}

RTOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6, torch.float64: 1e-12}
"""Relative error of one rounding (avg's division), with margin."""


def kind(dtype: torch.dtype) -> str:
    if dtype in FLOATS:
        return "float"
    return "bool" if dtype is torch.bool else "int"


def admitted_ops(dtype: torch.dtype) -> tuple[str, ...]:
    """The ops a dtype admits (floats: no bitwise; integers: no avg; bool: min/max/bitwise)."""
    return ADMITTED[kind(dtype)]


def rank_input(rank: int, count: int, dtype: torch.dtype, op: str = "max", salt: int = 0) -> np.ndarray:
    """Global rank ``rank``'s ``count`` input values for ``op``: float64, int64 or bool numpy."""
    rng = np.random.default_rng([rank, OPS.index(op), salt, DTYPES.index(dtype)])
    k = kind(dtype)
    if k == "bool":
        share_true = 0.8 if op in ("min", "band") else 0.5  # both outcomes must occur after reducing
        return rng.random(count) < share_true
    if op in ("sum", "avg"):
        bound = _SUM_BOUND[dtype]
        low = 0 if dtype is torch.uint8 else -bound
        v = rng.integers(low, bound, count, endpoint=True)
    elif op == "product":
        v = rng.choice(np.array([1, 2] if dtype is torch.uint8 else [-1, 1, 2]), count)
    elif k == "float":  # min, max
        return rng.integers(-100, 100, count, endpoint=True) / 4.0
    else:  # min, max and bitwise on integers
        v = rng.integers(*_INT_RANGE[dtype], count, endpoint=True)
    return v.astype(np.float64) if k == "float" else v.astype(np.int64)


def to_torch(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A fresh tensor (never sharing memory with ``values``, so references stay untouched)."""
    return torch.from_numpy(np.ascontiguousarray(values)).to(dtype, copy=True)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's values, flattened, as float64, int64 or bool (bfloat16 has no numpy dtype)."""
    wide = {"float": torch.float64, "int": torch.int64, "bool": torch.bool}[kind(tensor.dtype)]
    return tensor.detach().to(wide).reshape(-1).numpy()


def reduce(per_rank: list[np.ndarray], op: str) -> np.ndarray:
    """The reduction of the ranks' arrays by numpy, in float64/int64/bool; avg divides at the end."""
    stack = np.stack(per_rank)
    if op == "avg":
        return np.add.reduce(stack.astype(np.float64), axis=0) / len(per_rank)
    ufunc = {"sum": np.add, "product": np.multiply, "min": np.minimum, "max": np.maximum,
             "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
    if stack.dtype == np.bool_ and op in ("min", "max"):
        ufunc = np.logical_and if op == "min" else np.logical_or
    return ufunc.reduce(stack, axis=0)


def compare(actual: torch.Tensor, expected: np.ndarray, what: str) -> str | None:
    """``None`` if ``actual`` holds ``expected`` (floats to ``RTOL``), else a one-line description."""
    got = to_numpy(actual)
    want = np.asarray(expected).reshape(-1)
    if got.shape != want.shape:
        return f"{what}: {got.size} elements, expected {want.size}"
    if kind(actual.dtype) == "float":
        bad = ~np.isclose(got, want, rtol=RTOL[actual.dtype], atol=0.0)
    else:
        bad = got != want.astype(got.dtype)
    if not bad.any():
        return None
    where = np.flatnonzero(bad)
    shown = ", ".join(f"[{i}] {got[i]} != {want[i]}" for i in where[:5])
    return f"{what}: {where.size} of {got.size} elements differ ({actual.dtype}): {shown}"
