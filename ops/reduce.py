"""Elementwise reduction kernels: which (op, dtype) pairs exist, and how to combine two buffers.

Ops are lower-case strings: ``"sum", "avg", "product", "min", "max", "band", "bor", "bxor"``.
``avg`` combines as ``sum`` while data moves and is divided by the group size exactly once,
by :func:`finalize_`, on every rank that holds a result.  All kernels are plain torch calls, so
the same code serves CPU and CUDA tensors (and never synchronizes a device).

Which dtypes admit which ops:

* floating point (float16, bfloat16, float32, float64): sum, avg, product, min, max
* integers (uint8, int8, int32, int64): sum, product, min, max, band, bor, bxor
  (no avg: an integer mean would silently truncate)
* bool: min, max, band, bor, bxor (min is logical and, max logical or)
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

#: Every reduce op the library knows, in the order error messages list them.
REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# int16 is left out: torch's gloo refuses it ("Invalid scalar type"), so no backend could serve it everywhere.
INT_DTYPES = (torch.uint8, torch.int8, torch.int32, torch.int64)

#: Every dtype zerocomm moves and reduces, in the order tables list them: the one dtype table that
#: validation, selection, the capability matrix, the docs and the tests read.
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool)

_FLOAT_OPS = frozenset(("sum", "avg", "product", "min", "max"))
_INT_OPS = frozenset(("sum", "product", "min", "max", "band", "bor", "bxor"))
_BOOL_OPS = frozenset(("min", "max", "band", "bor", "bxor"))


def _ops_for(dtype: torch.dtype) -> Optional[frozenset]:
    if dtype in FLOAT_DTYPES:
        return _FLOAT_OPS
    if dtype in INT_DTYPES:
        return _INT_OPS
    if dtype is torch.bool:
        return _BOOL_OPS
    return None


def op_admits(op: str, dtype: torch.dtype) -> Optional[str]:
    """``None`` if reduce op ``op`` is defined on ``dtype``, else a sentence saying why not.

    Example: ``op_admits("band", torch.float32)`` returns
    ``"band needs an integer or bool dtype, got torch.float32"``.
    """
    if op not in REDUCE_OPS:
        return f"unknown reduce op {op!r}; expected one of {', '.join(REDUCE_OPS)}"
    admitted = _ops_for(dtype)
    if admitted is None:
        supported = ", ".join(str(d) for d in FLOAT_DTYPES + INT_DTYPES + (torch.bool,))
        return f"reductions do not support dtype {dtype}; supported: {supported}"
    if op in admitted:
        return None
    if op in ("band", "bor", "bxor"):
        return f"{op} needs an integer or bool dtype, got {dtype}"
    if op == "avg":
        if dtype is torch.bool:
            return f"avg needs a floating-point dtype, got {dtype}"
        return f"avg needs a floating-point dtype (an integer mean would truncate), got {dtype}; use sum and divide"
    return f"{op} needs a numeric (non-bool) dtype, got {dtype}; use {'bor' if op == 'sum' else 'band'} for bool"


def _minimum(dst: torch.Tensor, src: torch.Tensor) -> None:
    torch.minimum(dst, src, out=dst)


def _maximum(dst: torch.Tensor, src: torch.Tensor) -> None:
    torch.maximum(dst, src, out=dst)


#: ``KERNELS[op](dst, src)`` combines ``src`` into ``dst`` in place, unchecked: for algorithms, whose
#: arguments were validated before any byte moved (``avg`` combines as ``sum``).
KERNELS: dict[str, Callable[[torch.Tensor, torch.Tensor], object]] = {
    "sum": torch.Tensor.add_,
    "avg": torch.Tensor.add_,
    "product": torch.Tensor.mul_,
    "min": _minimum,
    "max": _maximum,
    "band": torch.Tensor.bitwise_and_,
    "bor": torch.Tensor.bitwise_or_,
    "bxor": torch.Tensor.bitwise_xor_,
}


#: ``KERNELS_OUT[op](a, b, out=dst)`` writes ``a (op) b`` into ``dst`` (which may be ``a`` or ``b``), unchecked:
#: one pass over memory where a copy followed by an in-place combine would take two.  torch's own functions,
#: so a call enters no Python frame.
KERNELS_OUT: dict[str, Callable[..., object]] = {
    "sum": torch.add,
    "avg": torch.add,
    "product": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "band": torch.bitwise_and,
    "bor": torch.bitwise_or,
    "bxor": torch.bitwise_xor,
}


def reduce_(dst: torch.Tensor, src: torch.Tensor, op: str) -> torch.Tensor:
    """Combine ``src`` into ``dst`` elementwise, in place: ``dst = dst (op) src``; returns ``dst``.

    Both tensors have the same dtype and number of elements (any shapes with equal numel are
    viewed flat) and live on the same device.  ``avg`` combines as ``sum``.  Integer overflow
    wraps as torch's integer arithmetic does.
    """
    reason = op_admits(op, dst.dtype)
    if reason is not None:
        raise ValueError(f"reduce_: {reason}")
    if src.dtype != dst.dtype:
        raise ValueError(f"reduce_: dtypes differ: dst is {dst.dtype}, src is {src.dtype}")
    if src.numel() != dst.numel():
        raise ValueError(f"reduce_: sizes differ: dst has {dst.numel()} elements, src has {src.numel()}")
    if src.shape != dst.shape:
        src = src.reshape(dst.shape)
    KERNELS[op](dst, src)
    return dst


def finalize_(tensor: torch.Tensor, op: str, n: int) -> torch.Tensor:
    """Finish a reduction over ``n`` contributions in place: ``avg`` divides by ``n``; other ops do nothing.

    Call it once, on every rank that holds a reduced result, after all data has been combined.
    """
    if op == "avg" and n != 1:
        if not tensor.is_floating_point():
            raise ValueError(f"finalize_: avg needs a floating-point dtype, got {tensor.dtype}")
        if n & (n - 1) == 0:
            # 1/n is exact for a power of two, so x * (1/n) is the same correctly rounded value as x / n
            # (every float dtype computes both in float or wider), and a multiply costs a third of a divide.
            tensor.mul_(1.0 / n)
        else:
            tensor.div_(n)
    return tensor
