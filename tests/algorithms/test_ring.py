"""Ring and chain algorithms on the in-process fake transport, against numpy references.

Algorithms trust their arguments (``comm.validate`` checks them once, before any byte moves);
wrong arguments are tested through the public API in tests/comm/test_errors.py.

World sizes 1..8 (powers of two and not), sizes 0, 1, fewer than the world, not divisible by it,
and several segments (``segment_bytes`` of 8 makes 2-element float32 segments).  The dtype x op
matrix for every algorithm lives in test_matrix.py.
"""
import threading

import pytest
import torch

from support.collective_checks import (
    check_all_gather,
    check_all_reduce,
    check_all_to_all,
    check_broadcast,
    check_reduce,
    check_reduce_scatter,
    deadline,
)
from support.local_transport import LocalFabric, run_ranks
from support.references import rank_values, reference, to_torch
from zerocomm.comm.algorithms.ring import (
    all_gather_ring,
    all_reduce_ring,
    all_to_all_ring,
    broadcast_ring,
    reduce_ring,
    reduce_scatter_ring,
)

SIZES = range(1, 9)
SEGMENTS = [8, 0]  # 2 float32 elements per segment; 0 = unsegmented


def _numels(n):
    return sorted({0, 1, max(n - 1, 0), n + 1, 3 * n + 2, 37})


@pytest.mark.parametrize("segment_bytes", SEGMENTS)
@pytest.mark.parametrize("n", SIZES)
def test_all_reduce_ring_shapes(n, segment_bytes):
    for numel in _numels(n):
        check_all_reduce(all_reduce_ring, n, numel, torch.float32, "sum", segment_bytes)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_all_reduce_ring_avg_and_odd_segments(n):
    # 12-byte segments of float64 do not divide the element size: rounded down to 1 element.
    check_all_reduce(all_reduce_ring, n, 11, torch.float64, "avg", 12)
    check_all_reduce(all_reduce_ring, n, 11, torch.int8, "product", 3)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter_ring(n, in_place):
    for m in (0, 1, 5):
        for segment_bytes in SEGMENTS:
            check_reduce_scatter(reduce_scatter_ring, n, m, torch.float32, "sum", segment_bytes, in_place=in_place)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("n", SIZES)
def test_all_gather_ring(n, in_place):
    for m in (0, 1, 5):
        for segment_bytes in SEGMENTS:
            check_all_gather(all_gather_ring, n, m, torch.float32, segment_bytes, in_place=in_place)


@pytest.mark.parametrize("n", SIZES)
def test_broadcast_ring_every_root(n):
    for root in range(n):
        for numel in (0, 1, 13):
            check_broadcast(broadcast_ring, n, numel, torch.int32, root, 8)


@pytest.mark.parametrize("n", SIZES)
def test_reduce_ring_every_root(n):
    # More segments than RECV_DEPTH, so scratch slots are reused while sends are in flight.
    for root in range(n):
        for numel in (0, 1, 13):
            check_reduce(reduce_ring, n, numel, torch.float32, "sum", root, 8)
    check_reduce(reduce_ring, n, 7, torch.float32, "avg", n - 1, 0)


ALL_TO_ALL_COUNTS = [
    [[3]],
    [[0, 2], [5, 1]],
    [[1, 2, 3], [0, 0, 4], [7, 0, 1]],
    [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
    [[2, 2, 2, 2], [2, 2, 2, 2], [2, 2, 2, 2], [2, 2, 2, 2]],
    [[i * j % 4 for j in range(5)] for i in range(5)],
    [[(i + 2 * j) % 3 for j in range(7)] for i in range(7)],
]


@pytest.mark.parametrize("counts", ALL_TO_ALL_COUNTS, ids=lambda c: f"n{len(c)}")
def test_all_to_all_ring_uneven(counts):
    for segment_bytes in (4, 0):
        check_all_to_all(all_to_all_ring, counts, torch.float32, segment_bytes)
    check_all_to_all(all_to_all_ring, counts, torch.bool, 1)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_traffic_matches_schedule(n):
    """Each rank sends 2(n-1)/n of the buffer in all_reduce and (n-1)/n in reduce_scatter/all_gather."""
    numel = 16 * n
    fabric = LocalFabric(n)
    check_all_reduce(all_reduce_ring, n, numel, torch.float32, "sum", 16, fabric=fabric)
    assert fabric.bytes_sent == [2 * (n - 1) * 16 * 4] * n

    def rs(t):
        out = torch.empty(16)
        reduce_scatter_ring(t, out, torch.ones(16 * n), "sum", tag=1, deadline=deadline(), segment_bytes=16)
        all_gather_ring(t, torch.empty(16 * n), out, tag=2, deadline=deadline(), segment_bytes=16)

    fabric = LocalFabric(n)
    run_ranks(n, rs, fabric=fabric)
    assert fabric.bytes_sent == [2 * (n - 1) * 16 * 4] * n


@pytest.mark.parametrize("n", [1, 3, 4])
def test_empty_buffers_send_nothing(n):
    def body(t):
        e = torch.empty(0)
        kw = dict(deadline=deadline(), segment_bytes=8)
        all_reduce_ring(t, e, "sum", tag=1, **kw)
        reduce_scatter_ring(t, e, e, "sum", tag=2, **kw)
        all_gather_ring(t, e, torch.empty(0), tag=3, **kw)
        broadcast_ring(t, e, n - 1, tag=4, **kw)
        reduce_ring(t, e, "max", 0, tag=5, **kw)
        all_to_all_ring(t, e, e, [0] * n, [0] * n, tag=6, **kw)

    fabric = LocalFabric(n)
    run_ranks(n, body, fabric=fabric)
    assert fabric.messages_sent == [0] * n


@pytest.mark.parametrize("n", [3, 4])
def test_concurrent_collectives_with_different_tags(n):
    """Two all_reduces per rank, each on its own thread and tag, interleave on one transport."""
    numel = 29
    a_in = [rank_values(r, numel, torch.float32, "sum") for r in range(n)]
    b_in = [rank_values(r, numel, torch.int64, "max", salt=1) for r in range(n)]

    def body(t):
        a, b = to_torch(a_in[t.rank], torch.float32), to_torch(b_in[t.rank], torch.int64)
        errors = []

        def run(fn):
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 -- re-raised on the rank's thread
                errors.append(exc)

        threads = [
            threading.Thread(target=run, args=(lambda: all_reduce_ring(t, a, "sum", tag=11, deadline=deadline(), segment_bytes=8),)),
            threading.Thread(target=run, args=(lambda: reduce_ring(t, b, "max", 1, tag=12, deadline=deadline(), segment_bytes=8),)),
        ]
        for th in threads:
            th.start()
        all_gathered = torch.empty(n * 3, dtype=torch.float32)
        all_gather_ring(t, all_gathered, torch.full((3,), float(t.rank)), tag=13, deadline=deadline(), segment_bytes=4)
        for th in threads:
            th.join()
        if errors:
            raise errors[0]
        return a, b, all_gathered

    results = run_ranks(n, body)
    for r, (a, b, g) in enumerate(results):
        assert torch.equal(a, to_torch(reference(a_in, "sum"), torch.float32))
        assert torch.equal(b, to_torch(reference(b_in, "max") if r == 1 else b_in[r], torch.int64))
        assert torch.equal(g, torch.arange(n, dtype=torch.float32).repeat_interleave(3))


def test_timeout_names_the_peer():
    """Rank 1 never joins: rank 0's bounded wait names the recv it was waiting on."""
    import time

    def body(t):
        if t.rank == 0:
            all_reduce_ring(t, torch.ones(4), "sum", tag=9, deadline=time.monotonic() + 0.2, segment_bytes=0)

    with pytest.raises(TimeoutError, match=r"(recv from|send to) rank 1 \(tag 9\)"):
        run_ranks(2, body)
