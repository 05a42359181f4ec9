"""Binomial-tree and recursive-doubling algorithms on the in-process fake transport.

Every root, world sizes 1..8 (non-powers of two exercise the partial subtrees and the
recursive-doubling fold-in), sizes 0, 1, fewer than the world and not divisible by it, and
several segments.  The dtype x op matrix for every algorithm lives in test_matrix.py.
"""
import pytest
import torch

from support.collective_checks import (
    check_all_gather,
    check_all_reduce,
    check_barrier,
    check_broadcast,
    check_gather,
    check_reduce,
    check_reduce_scatter,
    check_scatter,
    deadline,
)
from support.local_transport import LocalFabric, run_ranks
from zerocomm.comm.algorithms import tree
from zerocomm.comm.algorithms.tree import (
    all_gather_tree,
    all_reduce_recursive_doubling,
    all_reduce_tree,
    barrier_tree,
    broadcast_tree,
    gather_tree,
    reduce_scatter_tree,
    reduce_tree,
    scatter_tree,
)

SIZES = range(1, 9)


@pytest.mark.parametrize("n", SIZES)
def test_binomial_tree_shape(n):
    """Every non-root has one parent that lists it as a child; subtrees tile their virtual ranges."""
    for v in range(1, n):
        assert v in tree._children(tree._parent(v), n)
    for v in range(n):
        span = 1 + sum(tree._subtree_size(c, n) for c in tree._children(v, n))
        assert span == tree._subtree_size(v, n)
    assert tree._subtree_size(0, n) == n


@pytest.mark.parametrize("n", SIZES)
def test_broadcast_tree_every_root(n):
    for root in range(n):
        for numel in (0, 1, 13):
            check_broadcast(broadcast_tree, n, numel, torch.float64, root, 8)


@pytest.mark.parametrize("n", SIZES)
def test_reduce_tree_every_root(n):
    # 13 float32 elements in 4-byte segments: many segments, so both receive slots and both
    # accumulator slots are reused while sends are in flight.
    for root in range(n):
        for numel in (0, 1, 13):
            check_reduce(reduce_tree, n, numel, torch.float32, "sum", root, 4)
    check_reduce(reduce_tree, n, 5, torch.int64, "product", n // 2, 0)


@pytest.mark.parametrize("fn", [all_reduce_tree, all_reduce_recursive_doubling], ids=lambda f: f.__name__)
@pytest.mark.parametrize("n", SIZES)
def test_all_reduce_tree_shapes(fn, n):
    for numel in sorted({0, 1, max(n - 1, 0), 3 * n + 2}):
        for segment_bytes in (8, 0):
            check_all_reduce(fn, n, numel, torch.float32, "sum", segment_bytes)
    check_all_reduce(fn, n, 9, torch.float16, "avg", 6)


@pytest.mark.parametrize("n", SIZES)
def test_gather_and_scatter_tree_every_root(n):
    for root in range(n):
        for m in (0, 1, 3):
            check_gather(gather_tree, n, m, torch.int32, root, 4)
            check_scatter(scatter_tree, n, m, torch.int32, root, 4)
    check_gather(gather_tree, n, 5, torch.bool, 0, 0)
    check_scatter(scatter_tree, n, 5, torch.bool, n - 1, 0)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("n", SIZES)
def test_all_gather_and_reduce_scatter_tree(n, in_place):
    for m in (0, 1, 5):
        check_all_gather(all_gather_tree, n, m, torch.float32, 8, in_place=in_place)
        check_reduce_scatter(reduce_scatter_tree, n, m, torch.float32, "sum", 8, in_place=in_place)


@pytest.mark.parametrize("n", SIZES)
def test_barrier_tree(n):
    check_barrier(barrier_tree, n)


@pytest.mark.parametrize("n", [3, 5, 6, 8])
def test_recursive_doubling_exchange_count(n):
    """ceil(log2 n) exchanges on power-of-two worlds; the folded ranks send once and receive once."""
    numel = 4
    fabric = LocalFabric(n)
    check_all_reduce(all_reduce_recursive_doubling, n, numel, torch.float32, "sum", 0, fabric=fabric)
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    rounds = p.bit_length() - 1
    for r in range(n):
        if r < 2 * rem:
            expected = 1 if r % 2 == 0 else rounds + 1
        else:
            expected = rounds
        assert fabric.messages_sent[r] == expected, f"rank {r}"


@pytest.mark.parametrize("n", [1, 2, 5])
def test_empty_tree_collectives_send_nothing(n):
    def body(t):
        e = torch.empty(0)
        kw = dict(deadline=deadline(), segment_bytes=8)
        all_reduce_tree(t, e, "sum", tag=1, **kw)
        all_reduce_recursive_doubling(t, e, "max", tag=2, **kw)
        broadcast_tree(t, e, n - 1, tag=3, **kw)
        reduce_tree(t, e, "sum", n - 1, tag=4, **kw)
        gather_tree(t, e if t.rank == 0 else None, e, 0, tag=5, **kw)
        scatter_tree(t, e, e if t.rank == 0 else None, 0, tag=6, **kw)
        all_gather_tree(t, e, e, tag=7, **kw)
        reduce_scatter_tree(t, e, e, "sum", tag=8, **kw)

    fabric = LocalFabric(n)
    run_ranks(n, body, fabric=fabric)
    assert fabric.messages_sent == [0] * n


