"""Index arithmetic for splitting flat buffers: balanced chunks, pipelined segments, padding.

Terms, used the same way everywhere in zerocomm: a *chunk* is one rank's contiguous slice of a
flat buffer; a *segment* is a pipelined piece of a chunk (sent while the previous one is being
reduced or forwarded).  Bounds are half-open ``(start, end)`` element offsets.
"""
from __future__ import annotations


def partition_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """Split ``[0, numel)`` into ``parts`` contiguous, balanced ranges.

    The first ``numel % parts`` ranges get one extra element, so sizes differ by at most one;
    when ``numel < parts`` the trailing ranges are empty.  Always returns ``parts`` pairs.
    Example: ``partition_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]``.
    """
    if parts < 1:
        raise ValueError(f"partition_bounds: parts must be at least 1, got {parts}")
    if numel < 0:
        raise ValueError(f"partition_bounds: numel must be non-negative, got {numel}")
    base, extra = divmod(numel, parts)
    bounds = []
    start = 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def segment_bounds(start: int, end: int, segment_elems: int) -> list[tuple[int, int]]:
    """Split ``[start, end)`` into consecutive pieces of ``segment_elems`` (the last may be shorter).

    An empty range gives an empty list.  Example: ``segment_bounds(3, 10, 3) == [(3, 6), (6, 9), (9, 10)]``.
    """
    if segment_elems < 1:
        raise ValueError(f"segment_bounds: segment_elems must be at least 1, got {segment_elems}")
    if end < start:
        raise ValueError(f"segment_bounds: end ({end}) is before start ({start})")
    return [(lo, min(lo + segment_elems, end)) for lo in range(start, end, segment_elems)]


def padded_numel(numel: int, multiple: int) -> int:
    """The smallest count ``>= numel`` that is a multiple of ``multiple`` (``padded_numel(10, 4) == 12``)."""
    if multiple < 1:
        raise ValueError(f"padded_numel: multiple must be at least 1, got {multiple}")
    if numel < 0:
        raise ValueError(f"padded_numel: numel must be non-negative, got {numel}")
    return -(-numel // multiple) * multiple
