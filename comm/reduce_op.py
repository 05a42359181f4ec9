"""Reduction operators: torch's own ``ReduceOp`` is ours, so torch's values are accepted as they are.

Below ``comm.api`` every layer names an operator by a lower-case string
("sum", "avg", "product", "min", "max", "band", "bor", "bxor"); this module maps
between the two and says which dtypes admit which operator.
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

