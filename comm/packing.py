"""A list form's tensors packed into one flat buffer, and results unpacked back item by item.

The list forms (``all_gather``'s ``tensor_list``, ``gather``'s and ``scatter``'s lists, ``reduce_scatter``'s and
``all_to_all``'s) run their algorithm on one flat buffer of the lists' items end to end.  On the host both moves
are ``memmove`` by address: torch's ``cat``, ``view`` and ``copy_`` cost a few microseconds per call and per item
on the small tensors these lists hold, more than the whole collective on shared memory.  CUDA items take torch's
copies (stream-ordered), and so do host items that are not contiguous (the full checks admit them in a list).
"""
from __future__ import annotations

import ctypes
from functools import partial
from typing import Callable, Optional, Sequence

import torch

_memmove = ctypes.memmove


def _by_address(items: Sequence[torch.Tensor], device: torch.device) -> bool:
    return device.type == "cpu" and all(item.is_contiguous() for item in items)


def pack(items: Sequence[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One flat tensor of ``items`` (of ``dtype``, on ``device``) end to end, in order."""
    if not _by_address(items, device):
        return torch.cat([item.reshape(-1) for item in items]) if items else torch.empty(0, dtype=dtype, device=device)
    flat = torch.empty(sum(item.numel() for item in items), dtype=dtype)
    into = flat.data_ptr()
    for item in items:
        nbytes = item.nbytes
        if nbytes:
            _memmove(into, item.data_ptr(), nbytes)
            into += nbytes
    return flat


def _moves(moves: tuple, flat: torch.Tensor) -> None:  # ``flat``: held while its addresses are in ``moves``
    for into, source, nbytes in moves:
        _memmove(into, source, nbytes)


def _copies(pairs: tuple) -> None:
    for source, destination in pairs:
        destination.copy_(source.view(destination.shape))


def unpacker(flat: torch.Tensor, items: Sequence[torch.Tensor]) -> Optional[Callable[[], None]]:
    """What copies ``flat``'s consecutive pieces back into ``items`` (each piece its item's size, in order) once the
    collective wrote ``flat``: a function of no arguments (``Call.copy_out``), or ``None`` where nothing is copied."""
    if not _by_address(items, flat.device):
        pairs = tuple((piece, item) for piece, item in zip(flat.split([item.numel() for item in items]), items)
                      if item.numel())
        return partial(_copies, pairs) if pairs else None
    moves = []
    source = flat.data_ptr()
    for item in items:
        nbytes = item.nbytes
        if nbytes:
            moves.append((item.data_ptr(), source, nbytes))
            source += nbytes
    return partial(_moves, tuple(moves), flat) if moves else None
