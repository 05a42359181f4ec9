"""Reduction operators: torch's own ``ReduceOp`` is ours, so torch's values are accepted as they are.

Below ``comm.api`` every layer names an operator by a lower-case string
("sum", "avg", "product", "min", "max", "band", "bor", "bxor"); this module maps
between the two and says which dtypes admit which operator.  On bool tensors SUM
and PRODUCT are the logical or and and, as in torch (:func:`for_dtype`).
"""
from __future__ import annotations

import torch
import torch.distributed as _td

from ..ops.reduce import DTYPES, op_admits  # noqa: F401  (re-exported: the kernels own the dtype rules)
from .errors import InvalidArgumentError, UnsupportedError

#: The drop-in ``ReduceOp``: ``zerocomm.comm.ReduceOp is torch.distributed.ReduceOp``.
ReduceOp = _td.ReduceOp

_NAMES = {
    ReduceOp.SUM: "sum",
    ReduceOp.AVG: "avg",
    ReduceOp.PRODUCT: "product",
    ReduceOp.MIN: "min",
    ReduceOp.MAX: "max",
    ReduceOp.BAND: "band",
    ReduceOp.BOR: "bor",
    ReduceOp.BXOR: "bxor",
}

#: Dtypes zerocomm moves and reduces (the kernels' table, ``zerocomm.ops.reduce.DTYPES``).
SUPPORTED_DTYPES = DTYPES

#: ``ReduceOp`` → lower-case name, for lookups on the call path (``OP_NAMES.get(op)``).
OP_NAMES = _NAMES

#: bool's SUM and PRODUCT as torch reduces them: the logical or and the logical and, which the kernels name "bor"
#: and "band" (their sum and product are not defined on bool: ``zerocomm.ops.op_admits``).
BOOL_OPS = {"sum": "bor", "product": "band"}


def for_dtype(name: str, dtype: torch.dtype) -> str:
    """The kernels' name of op ``name`` on ``dtype``: bool's "sum" is "bor" and its "product" "band" (as torch
    computes them), every other pair is as it is.  The comm layer looks ops up through it once per cell, before
    choosing an algorithm, so every backend and algorithm sees an op the dtype admits."""
    return BOOL_OPS.get(name, name) if dtype is torch.bool else name


def op_name(op, *, collective: str, rank: int) -> str:
    """The lower-case name of ``op`` (a ``ReduceOp`` or ``ReduceOp.RedOpType``)."""
    if isinstance(op, ReduceOp):
        op = op.op if hasattr(op, "op") else op
    try:
        return _NAMES[op]
    except (KeyError, TypeError):
        pass
    if getattr(op, "name", None) == "PREMUL_SUM" or "PREMUL_SUM" in str(op):
        raise UnsupportedError(
            f"rank {rank}: {collective}: ReduceOp.PREMUL_SUM is not supported by zerocomm; "
            "scale the tensor yourself and use ReduceOp.SUM")
    raise InvalidArgumentError(f"rank {rank}: {collective}: op must be a ReduceOp, got {op!r}")

