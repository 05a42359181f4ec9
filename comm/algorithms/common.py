"""Helpers shared by the ring and tree algorithms: argument checks, segmenting, scratch, sends.

Every algorithm is a plain function ``f(t, buffers..., *, tag, deadline, segment_bytes)`` over a
:class:`~zerocomm.comm.transport.Transport` ``t`` whose ranks are ``0..t.size-1``.  These
helpers check what one rank can check alone (sizes, roots, dtype/op) and raise
:class:`InvalidArgumentError` naming this process's rank and the offending value; whether the
ranks agree with each other is ``comm.validate``'s job, before an algorithm runs.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...ops.chunk import segment_bounds
from ...ops.reduce import op_admits
from ..errors import InvalidArgumentError
from ..transport import Request, Transport

#: Receives a chain or tree posts ahead of the segment it is consuming: enough to keep a
#: neighbour's sends completing while this rank reduces or forwards, small enough that
#: scratch stays a few segments.
RECV_DEPTH = 4


def flat(t: Transport, tensor: torch.Tensor, what: str, collective: str) -> torch.Tensor:
    """``tensor`` viewed as 1-D; it must be contiguous (transports move whole contiguous buffers)."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(
            f"{collective}: rank {t.rank}: {what} must be a torch.Tensor, got {type(tensor).__name__}"
        )
    if not tensor.is_contiguous():
        raise InvalidArgumentError(f"{collective}: rank {t.rank}: {what} must be contiguous (shape {tuple(tensor.shape)})")
    return tensor.view(-1)


def check_op(t: Transport, op: str, dtype: torch.dtype, collective: str) -> None:
    reason = op_admits(op, dtype)
    if reason is not None:
        raise InvalidArgumentError(f"{collective}: rank {t.rank}: {reason}")


def check_root(t: Transport, root: int, collective: str) -> None:
    if not isinstance(root, int) or not 0 <= root < t.size:
        raise InvalidArgumentError(f"{collective}: rank {t.rank}: root must be in [0, {t.size}), got {root!r}")


def check_numel(t: Transport, tensor: torch.Tensor, expected: int, what: str, collective: str) -> None:
    if tensor.numel() != expected:
        raise InvalidArgumentError(
            f"{collective}: rank {t.rank}: {what} must have {expected} elements, got {tensor.numel()}"
        )


def check_same_dtype(t: Transport, a: torch.Tensor, b: torch.Tensor, collective: str) -> None:
    if a.dtype != b.dtype:
        raise InvalidArgumentError(
            f"{collective}: rank {t.rank}: output and input dtypes differ ({a.dtype} vs {b.dtype})"
        )


def segment_elems(tensor: torch.Tensor, segment_bytes: int) -> Optional[int]:
    """Elements per segment for ``tensor``'s dtype (at least 1); ``None`` when ``segment_bytes <= 0`` (no segmenting)."""
    if segment_bytes <= 0:
        return None
    return max(1, segment_bytes // tensor.element_size())


def segments(start: int, end: int, seg: Optional[int]) -> list[tuple[int, int]]:
    """``[start, end)`` split into segments of ``seg`` elements; one piece when ``seg`` is None; none when empty."""
    if end <= start:
        return []
    return segment_bounds(start, end, seg if seg is not None else end - start)


def scratch(like: torch.Tensor, numel: int) -> torch.Tensor:
    """An uninitialized flat buffer of ``numel`` elements with ``like``'s dtype and device."""
    return torch.empty(numel, dtype=like.dtype, device=like.device)


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` are the same elements (in-place calls skip their self-copy)."""
    return a.numel() == b.numel() and (a.numel() == 0 or a.data_ptr() == b.data_ptr())


def send_segmented(t: Transport, buf: torch.Tensor, peer: int, tag: int, seg: Optional[int]) -> list[Request]:
    """Post sends of ``buf`` to ``peer`` in segments; the matching receive is :func:`recv_segmented`."""
    return [t.isend(buf[lo:hi], peer, tag) for lo, hi in segments(0, buf.numel(), seg)]


def recv_segmented(t: Transport, buf: torch.Tensor, peer: int, tag: int, seg: Optional[int]) -> list[Request]:
    """Post receives into ``buf`` from ``peer``, segmented exactly as the sender's :func:`send_segmented`."""
    return [t.irecv(buf[lo:hi], peer, tag) for lo, hi in segments(0, buf.numel(), seg)]

