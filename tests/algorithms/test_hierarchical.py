"""Hierarchical algorithms on the in-process fake transport, with pretend hosts per rank.

Each rank first learns the hosts with its pretend name (``topology.hosts(..., name=)``, cached on
its transport), so the algorithm sees the layout under test: one host, one rank per host, even
hosts, uneven ones (3 + 1, 1 + 3, 2 + 2 + 1 ...) and interleaved ones (a, b, a, b), world sizes 1..8.
Sizes: empty, fewer elements than ranks, not divisible by a host's size, and the large path
(``SMALL_BYTES`` lowered so small data takes it); in all_reduce each size runs segmented or not, in
turns (see test_all_reduce).  The dtype x op matrix is in test_matrix.py.
"""
import pytest
import torch

from support.collective_checks import (
    check_all_gather,
    check_all_reduce,
    check_broadcast,
    check_reduce_scatter,
    deadline,
    on_pretend_hosts as with_hosts,
)
from support.local_transport import LocalFabric, run_ranks
from zerocomm.comm import topology
from zerocomm.comm.algorithms import hierarchical
from zerocomm.comm.algorithms.hierarchical import (
    all_gather_hierarchical,
    all_reduce_hierarchical,
    broadcast_hierarchical,
    reduce_scatter_hierarchical,
)

#: Pretend hosts per rank, by world size: every shape the schedules branch on.
LAYOUTS = [
    "a",
    "aa", "ab",
    "aab", "abb", "aba", "abc",
    "aaab", "abbb", "aabb", "abab", "abcd",
    "aaabb", "aabbc", "abcab",
    "aaabbb", "aaaaab", "abcabc",
    "aaaabbc", "abababa",
    "aaaabbbb", "aabbccdd", "aaaaaaab", "abcdabcd",
]


@pytest.fixture(params=["small path", "large path"])
def path(request, monkeypatch):
    if request.param == "large path":
        monkeypatch.setattr(hierarchical, "SMALL_BYTES", 0)
        monkeypatch.setattr(hierarchical, "INTER_TREE_BYTES", 8)
        monkeypatch.setattr(hierarchical, "PIPELINE_BYTES", 20)  # several rounds, the last one short
        monkeypatch.setattr(hierarchical, "PIPELINE_FIRST_BYTES", 8)  # ... growing from the first, shrinking to the last
    return request.param


@pytest.mark.parametrize("names", LAYOUTS)
def test_all_reduce(names, path):
    n = len(names)
    fn = with_hosts(all_reduce_hierarchical, names)
    # Segmented (8 bytes: many pieces) and unsegmented take turns along the sizes, starting from the other
    # one on the next layout: every layout runs both, and over consecutive layouts every size runs both.
    for i, numel in enumerate(sorted({0, 1, max(n - 1, 1), 3 * n + 2, 41})):
        check_all_reduce(fn, n, numel, torch.float32, "sum", (8, 0)[(i + LAYOUTS.index(names)) % 2])
    # One other (dtype, op) a layout and path, in turns over the layouts (the full dtype x op matrix of
    # "hierarchical" is in test_matrix.py).
    other = [(11, torch.float64, "avg", 16), (10, torch.int64, "product", 16), (9, torch.int32, "max", 4)]
    numel, dtype, op, segment_bytes = other[LAYOUTS.index(names) % len(other)]
    check_all_reduce(fn, n, numel, dtype, op, segment_bytes)


@pytest.mark.parametrize("names", LAYOUTS)
def test_reduce_scatter(names):
    n = len(names)
    fn = with_hosts(reduce_scatter_hierarchical, names)
    for m in (0, 1, 3):
        for in_place in (False, True):
            check_reduce_scatter(fn, n, m, torch.float32, "sum", 8, in_place=in_place)
    check_reduce_scatter(fn, n, 2, torch.float64, "avg", 0)
    check_reduce_scatter(fn, n, 3, torch.int16, "min", 4)


@pytest.mark.parametrize("names", LAYOUTS)
def test_all_gather(names):
    n = len(names)
    fn = with_hosts(all_gather_hierarchical, names)
    for m in (0, 1, 3):
        for in_place in (False, True):
            check_all_gather(fn, n, m, torch.int32, 4, in_place=in_place)


@pytest.mark.parametrize("names", LAYOUTS)
def test_broadcast_every_root(names):
    n = len(names)
    fn = with_hosts(broadcast_hierarchical, names)
    # Every root with 13 elements (two 16-byte segments and a short one); the empty and one-element
    # tensors take turns along the roots, so every layout runs both from 2 ranks on.
    for root in range(n):
        for numel in (0 if (root + LAYOUTS.index(names)) % 2 else 1, 13):
            check_broadcast(fn, n, numel, torch.float64, root, 16)
    check_broadcast(fn, n, 40, torch.uint8, n - 1, 0)  # above the inter-host tree bound: the chain


def test_pieces_follow_every_hosts_chunk_bounds():
    # 3 ranks on host a (chunks of 3, tail 1 to a's last rank), 2 on b (chunks of 5): cuts at 3, 5, 6.
    lay = hierarchical._Layout(("a", "a", "a", "b", "b"), 0, "x")
    assert hierarchical._pieces(lay, 10) == [(0, 3, (0, 3)), (3, 5, (1, 3)), (5, 6, (1, 4)), (6, 10, (2, 4))]
    even = hierarchical._Layout(("a", "a", "b", "b"), 0, "x")
    assert hierarchical._pieces(even, 9) == [(0, 4, (0, 2)), (4, 9, (1, 3))]  # the classic same-index rings


def _calls(t, names, count):
    topology.hosts(t, tag=1, deadline=deadline(), name=names[t.rank])
    splits = []
    original = t.split

    def counting_split(ranks, key):
        splits.append(tuple(ranks))
        return original(ranks, key)

    t.split = counting_split
    for _ in range(count):
        x = torch.ones(1000)
        all_reduce_hierarchical(t, x, "sum", tag=2, deadline=deadline(), segment_bytes=0)
        assert torch.equal(x, torch.full((1000,), float(t.size)))
    subs = [c for c in t.local.hierarchy.comms.values() if c is not None and c is not t]
    hierarchical.release(t)
    return splits, len(subs), t.local.hierarchy is not None


def test_sub_communicators_are_made_once_cached_and_released():
    names = "aabb"
    fabric = LocalFabric(4)
    results = run_ranks(4, _calls, names, 3, fabric=fabric)
    for rank, (splits, subs, still_cached) in enumerate(results):
        # Every rank takes part in every split (two hosts, then the leaders), once, not once per call.
        assert splits == [(0, 1), (2, 3), (0, 2)], f"rank {rank}: {splits}"
        assert subs == 2 - (rank in (1, 3)) and not still_cached
