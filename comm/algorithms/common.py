"""Helpers shared by the tree algorithms: segmenting, scratch, segmented sends, bounded waits.

Every algorithm is a plain function ``f(t, buffers..., *, tag, deadline, segment_bytes)`` over a
:class:`~zerocomm.comm.transport.Transport` ``t`` whose ranks are ``0..t.size-1``; buffers are flat
(1-D, contiguous) and were validated by ``comm.validate`` before any byte moved.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import torch

from ...ops.chunk import segment_bounds
from ..transport import Request, Transport


def remaining(deadline: Optional[float]) -> Optional[float]:
    """Seconds left until ``deadline`` (``time.monotonic()`` seconds; never negative), or ``None``."""
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def wait_all(requests: Sequence[Request], deadline: Optional[float]) -> None:
    """Wait for every request, each bounded by the absolute ``deadline``."""
    for req in requests:
        req.wait(remaining(deadline))


def finalize(buf: torch.Tensor, op: str, n: int) -> None:
    """``avg`` divides the reduced sum by the number of contributions; other ops are done already."""
    if op == "avg" and n > 1:
        buf.div_(n)

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

