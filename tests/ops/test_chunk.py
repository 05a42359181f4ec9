"""Chunk and segment bounds: balanced, contiguous, covering, for every small (numel, parts)."""
import pytest

from zerocomm.ops import padded_numel, partition_bounds, segment_bounds


@pytest.mark.parametrize("parts", range(1, 10))
def test_partition_bounds_balanced_and_covering(parts):
    for numel in range(0, 40):
        bounds = partition_bounds(numel, parts)
        assert len(bounds) == parts
        assert bounds[0][0] == 0 and bounds[-1][1] == numel
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # contiguous
        sizes = [hi - lo for lo, hi in bounds]
        # The first numel % parts get one extra element.
        assert sizes == [numel // parts + (1 if i < numel % parts else 0) for i in range(parts)]


def test_partition_bounds_examples():
    assert partition_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert partition_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert partition_bounds(0, 2) == [(0, 0), (0, 0)]


def test_segment_bounds():
    assert segment_bounds(3, 10, 3) == [(3, 6), (6, 9), (9, 10)]
    assert segment_bounds(0, 4, 4) == [(0, 4)]
    assert segment_bounds(0, 4, 100) == [(0, 4)]
    assert segment_bounds(5, 5, 2) == []
    for start in range(0, 5):
        for end in range(start, 20):
            for seg in range(1, 7):
                pieces = segment_bounds(start, end, seg)
                assert sum(hi - lo for lo, hi in pieces) == end - start
                assert all(0 < hi - lo <= seg for lo, hi in pieces)
                assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))


def test_padded_numel():
    assert padded_numel(10, 4) == 12
    assert padded_numel(12, 4) == 12
    assert padded_numel(0, 8) == 0
    assert padded_numel(1, 1) == 1


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: partition_bounds(3, 0), "parts must be at least 1, got 0"),
        (lambda: partition_bounds(-1, 2), "numel must be non-negative, got -1"),
        (lambda: segment_bounds(0, 4, 0), "segment_elems must be at least 1, got 0"),
        (lambda: segment_bounds(4, 2, 1), r"end \(2\) is before start \(4\)"),
        (lambda: padded_numel(3, 0), "multiple must be at least 1, got 0"),
    ],
)
def test_errors_quote_values(call, message):
    with pytest.raises(ValueError, match=message):
        call()
