"""Flat buffers: pack tensors into one contiguous 1-D buffer and get them back.

A bucket (a group of gradients reduced together) or a ZeRO shard is one flat
buffer so that a collective moves it in one call.  The layout is always the
same: the tensors' elements in the given order, each in row-major order, one
after the other with no gaps, then zero padding at the end.  ``views_into`` and
``unflatten_into`` read that layout back, so the three functions agree as long
as the caller passes the tensors (or their shapes) in the same order.

``pack`` and ``unpacker`` do the same for a list form's arguments (a gather's list, a scatter's): the list's
items end to end in one buffer, and the buffer's pieces back into the items, by address on the host.

Local kernels only: nothing here communicates.
"""
from __future__ import annotations

import ctypes
import math
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Callable, Optional

import torch

_memmove = ctypes.memmove

__all__ = ["total_numel", "flatten_tensors", "views_into", "unflatten_into", "joined", "as_chunks", "pack",
           "unpacker"]

def _shape_numel(item: object, index: int) -> int:
    """Number of elements of one tensor, shape (sequence of ints) or plain length."""
    if isinstance(item, torch.Tensor):
        return item.numel()
    if isinstance(item, bool):
        raise TypeError(f"item {index}: expected a tensor, a shape or an int length, got bool {item!r}")
    if isinstance(item, int):
        if item < 0:
            raise ValueError(f"item {index}: a length must be >= 0, got {item}")
        return item
    if isinstance(item, Sequence) and not isinstance(item, (str, bytes)):
        dims = list(item)
        for d in dims:
            if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                raise ValueError(f"item {index}: a shape must hold ints >= 0, got {tuple(dims)!r}")
        return math.prod(dims)
    raise TypeError(f"item {index}: expected a tensor, a shape or an int length, got {type(item).__name__}")


def _as_shape(item: object, index: int) -> tuple[int, ...]:
    if isinstance(item, torch.Tensor):
        return tuple(item.shape)
    _shape_numel(item, index)  # validates
    return (item,) if isinstance(item, int) else tuple(item)  # type: ignore[arg-type]


def total_numel(shapes_or_tensors: Iterable[object]) -> int:
    """Total element count of tensors, shapes (``torch.Size`` or int sequences) or int lengths, mixed freely.

    >>> total_numel([torch.zeros(2, 3), (4,), 5])
    15
    """
    return sum(_shape_numel(item, i) for i, item in enumerate(shapes_or_tensors))


def _check_multiple(pad_to_multiple: object) -> int:
    if isinstance(pad_to_multiple, bool) or not isinstance(pad_to_multiple, int) or pad_to_multiple < 1:
        raise ValueError(f"pad_to_multiple must be an int >= 1, got {pad_to_multiple!r}")
    return pad_to_multiple


def flatten_tensors(
    tensors: Sequence[torch.Tensor],
    *,
    dtype: torch.dtype | None = None,
    pad_to_multiple: int = 1,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Copy ``tensors`` into one new contiguous 1-D buffer, in order, zero-padded at the end.

    Returns a tensor of shape ``(ceil(total / pad_to_multiple) * pad_to_multiple,)``
    where ``total`` is the sum of the inputs' element counts.  Elements are cast
    to ``dtype`` (default: the inputs' common dtype) and placed on ``device``
    (default: the inputs' common device).  The result never shares memory with
    the inputs and is not part of any autograd graph.

    Raises ``ValueError`` when ``dtype``/``device`` is left out and the inputs
    disagree on it, or when there are no inputs to take it from.
    """
    tensors = list(tensors)
    multiple = _check_multiple(pad_to_multiple)
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flatten_tensors: item {i} is a {type(t).__name__}, expected a torch.Tensor")
    if dtype is None:
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            raise ValueError(
                "flatten_tensors expects uniform dtype when dtype is not given, "
                f"but got {sorted(str(d) for d in dtypes) or 'no tensors'}"
            )
        dtype = dtypes.pop()
    if device is None:
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(
                "flatten_tensors expects all tensors on one device when device is not given, "
                f"but got {sorted(str(d) for d in devices)}"
            )
        device = devices.pop() if devices else torch.device("cpu")

    total = total_numel(tensors)
    padded = -(-total // multiple) * multiple
    flat = torch.empty(padded, dtype=dtype, device=device)
    with torch.no_grad():
        offset = 0
        for t in tensors:
            n = t.numel()
            # Copying into a view of the slice lets copy_ read a non-contiguous source
            # directly instead of materialising t.reshape(-1) first.
            flat[offset : offset + n].view(t.shape).copy_(t)
            offset += n
        flat[total:].zero_()
    return flat


def _check_flat(flat: object, op: str) -> torch.Tensor:
    if not isinstance(flat, torch.Tensor):
        raise TypeError(f"{op}: flat must be a torch.Tensor, got {type(flat).__name__}")
    if flat.dim() != 1:
        raise ValueError(f"{op}: flat must be 1-D, got shape {tuple(flat.shape)}")
    return flat


def views_into(flat: torch.Tensor, shapes: Iterable[object]) -> list[torch.Tensor]:
    """Views of consecutive slices of the 1-D ``flat``, one per shape, starting at element 0.

    ``shapes`` holds shapes, int lengths or tensors (whose shapes are used).
    The views share memory with ``flat``: writing into one writes into the
    buffer.  Padding after the last slice is left out.  Raises ``ValueError``
    naming the expected and actual element counts if ``flat`` is too small.
    """
    flat = _check_flat(flat, "views_into")
    shape_list = [_as_shape(s, i) for i, s in enumerate(shapes)]
    needed = sum(math.prod(s) for s in shape_list)
    if needed > flat.numel():
        raise ValueError(
            f"views_into: the {len(shape_list)} shapes need {needed} elements, "
            f"but flat has only {flat.numel()}"
        )
    views = []
    offset = 0
    for shape in shape_list:
        n = math.prod(shape)
        views.append(flat[offset : offset + n].view(shape))
        offset += n
    return views


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of the 1-D ``flat`` back into ``tensors``, in place.

    Each tensor receives the next ``t.numel()`` elements, reshaped to its shape
    and cast to its dtype/device.  Padding after the last slice is ignored.
    Runs under ``torch.no_grad()`` so leaf parameters can be written.  Raises
    ``ValueError`` naming expected and actual element counts if ``flat`` is too
    small.
    """
    tensors = list(tensors)
    flat = _check_flat(flat, "unflatten_into")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"unflatten_into: item {i} is a {type(t).__name__}, expected a torch.Tensor")
    needed = total_numel(tensors)
    if needed > flat.numel():
        raise ValueError(
            f"unflatten_into: the {len(tensors)} tensors need {needed} elements, "
            f"but flat has only {flat.numel()}"
        )
    with torch.no_grad():
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view(t.shape))
            offset += n


def joined(chunks) -> torch.Tensor:
    """One flat tensor of ``chunks``: a tensor as it is, a non-empty sequence of 1-D tensors end to end (:func:`pack`).

    A scatter's root input travels as its list of chunks where the algorithm reads them where they lie (gloo's own
    scatter, shared memory); an algorithm that sends one flat buffer joins them here.
    """
    if isinstance(chunks, torch.Tensor):
        return chunks
    return pack(chunks, chunks[0].dtype, chunks[0].device)


def pack(items: Sequence[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One flat tensor of ``items`` (of ``dtype``, on ``device``) end to end, in order: a list form's arguments as
    the one buffer its algorithm moves.  Host items that are contiguous are copied by address (``memmove``):
    torch's ``cat`` costs a few microseconds per call and item on the small tensors such lists hold, more than a
    whole collective on shared memory.  CUDA items and strided ones take torch's copies."""
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


def unpacker(flat: torch.Tensor, items: Sequence[torch.Tensor]) -> Optional[Callable[[], None]]:
    """What copies ``flat``'s consecutive pieces back into ``items`` (each piece its item's size, in order) once a
    collective wrote ``flat``: a function of no arguments (``plan.Call.copy_out``), or ``None`` where nothing is
    copied.  By address on the host where every item is contiguous (as :func:`pack`), else torch's copies."""
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


def _by_address(items: Sequence[torch.Tensor], device: torch.device) -> bool:
    # A tensor that requires grad takes torch's copy: autograd's rules (an in-place write into a leaf is refused).
    return device.type == "cpu" and all(item.is_contiguous() and not item.requires_grad for item in items)


def _moves(moves: tuple, flat: torch.Tensor) -> None:  # ``flat``: held while its addresses are in ``moves``
    for into, source, nbytes in moves:
        _memmove(into, source, nbytes)


def _copies(pairs: tuple) -> None:
    for source, destination in pairs:
        destination.copy_(source.view(destination.shape))


def as_chunks(chunks, n: int) -> list:
    """``chunks`` as a list of its ``n`` chunks: a sequence's items as they are, a flat tensor's ``n`` equal views."""
    return list(chunks.chunk(n)) if isinstance(chunks, torch.Tensor) else list(chunks)
