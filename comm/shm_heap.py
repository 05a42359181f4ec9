"""Heaps: segments for tensors that live in shared memory from the start (:func:`shared_empty`).

All ranks of a group allocate a heap together, each gets its own region of it, and a zero-copy
"shm" all_reduce reads peers' regions in place instead of copying them into the arena's slots
(``algorithms/shm.py``'s ``heap_slot`` and ``heap_view`` find them).  Heaps are kept on the backend object beside the arena (``shm.py``) and
forgotten with it (``shm.release``); a mapping ends with the last tensor viewing it.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch

from . import shm, topology
from .algorithms.ring import all_gather_ring
from .errors import UnsupportedError
from .plan import special_plan
from .transport import Transport
from .validate import resolve_group


class Heap(NamedTuple):
    """One segment of ``n`` regions of ``stride`` bytes; region ``p`` belongs to rank ``p``."""

    raw: torch.Tensor
    stride: int


def allocate_heap(t: Transport, nbytes: int, *, tag: int, deadline: Optional[float]) -> Optional[torch.Tensor]:
    """This rank's ``nbytes``-byte uint8 region of a new heap of ``t`` (every rank calls it together), or
    ``None`` when the ranks are not all on one host."""
    names = topology.hosts(t, tag=tag, deadline=deadline, all_gather=all_gather_ring)
    if len(set(names)) > 1:
        return None
    stride = shm.aligned(max(nbytes, 1))
    mm = shm.map_together(t, t.size * stride, tag=tag, deadline=deadline)
    heap = Heap(torch.frombuffer(mm, dtype=torch.uint8), stride)
    t.local.heaps.append(heap)
    start = t.rank * stride
    return heap.raw[start:start + nbytes]


def _allocate(t: Transport, nbytes: int, made: list, *, tag: int, deadline: Optional[float],
              segment_bytes: int) -> None:
    """:func:`shared_empty`'s call, as the group runs it: this rank's region (or ``None``) appended to ``made``."""
    made.append(allocate_heap(t, nbytes, tag=tag, deadline=deadline))


def shared_empty(shape: Sequence[int] | int, dtype: torch.dtype = torch.float32, group=None) -> torch.Tensor:
    """A new uninitialized CPU tensor in shared memory that the group's ranks can read in place.

    Every rank of ``group`` (default: the world) calls it together, in the same order relative to
    the group's collectives, with its own ``shape`` (usually the same on every rank).  A "shm"
    all_reduce of tensors made here on every rank reads peers' data in place: no copy into a
    shared buffer first (zero-copy).  When the group's ranks are not all on one host it returns an
    ordinary ``torch.empty`` tensor, so callers need not ask.  The memory is freed when the tensor
    and the group are both gone; nothing is left in ``/dev/shm``.
    """
    g = resolve_group(group, "shared_empty")
    if not g.on_cpu:
        raise UnsupportedError(f"rank {g.my_global_rank}: shared_empty: backend {g.backend!r} moves "
                               f"{g.device_type} tensors; shared memory holds CPU tensors (use gloo or mpi)")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    numel = 1
    for dim in shape:
        numel *= dim
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    made: list = []
    # Planned like every call: a barrier-shaped cell of its own ("shm", checked as every "shm" call is).
    plan = special_plan(g, "barrier", torch.uint8, None, "shm", _allocate, False, "shared_empty")
    plan.run((nbytes, made), 0, 0, ())
    region = made[0]
    if region is None:
        return torch.empty(shape, dtype=dtype)
    return region.view(dtype).view(shape)
