"""The mismatch check of a group spanning hosts (``check.across_hosts``), in real processes on pretend hosts.

Each rank sets ``ZEROCOMM_HOST`` before it makes a fresh group (a group learns its hosts at its first use).
Where every host's ranks share a segment, the digests meet in one small hierarchical all_reduce; a call
that differs on one rank -- in size, op, collective or algorithm, on the leader's host or another -- raises
``CollectiveMismatchError`` on every rank, naming the two ranks.  Where one host's ranks cannot share a
segment, every rank learns it at the first check and checks through the backend from then on, still
catching a mismatch.
"""
import numpy as np
import pytest
import torch

from support.dist import dist
from support.pretend_hosts import group_on_hosts
from support.worlds import worlds

#: Pretend hosts by world size: each has a host of several ranks (where the segment round runs).
LAYOUTS = {3: ("aab", "aba"), 4: ("aabb", "abab", "aaab")}


def _on_hosts(names: str, mismatch, refused_host=None):
    """On a fresh group over every rank, on the pretend hosts ``names`` (by rank): the checker its plans chose,
    the values of two matched all_reduces, and what a call that differs on rank ``mismatch[0]`` raised
    (``mismatch[1]`` says how it differs).  Ranks on ``refused_host`` cannot map a segment."""
    from zerocomm.comm import shm

    saved_map = shm._map
    rank = dist.get_rank()
    if names[rank] == refused_host:
        def refused_map(path, nbytes, create):
            raise PermissionError(13, "Permission denied", path)
        shm._map = refused_map
    try:
        with group_on_hosts(names) as group:
            return _calls(group, rank, mismatch, refused_host)
    finally:
        shm._map = saved_map


def _calls(group, rank: int, mismatch, refused_host) -> tuple:
    inner = group.zerocomm_group
    values = []
    algorithm = "hierarchical" if refused_host is None else "ring"  # hierarchical needs each host's segment
    for numel in (3, 100_000):  # small and large (hierarchical's own rounds)
        x = torch.full((numel,), float(rank + 1))
        dist.all_reduce(x, group=group, algorithm=algorithm)
        values.append(sorted(set(x.tolist())))
    y = torch.arange(4, dtype=torch.float64) + rank
    dist.all_reduce(y, dist.ReduceOp.MAX, group=group, algorithm="native")
    values.append(y.tolist())
    for numel in (8, 9):  # rides in the check (float64 sums, rounded once), and too large to ride
        z = _floats(rank, numel)
        dist.all_reduce(z, dist.ReduceOp.AVG, group=group, algorithm="native")
        values.append(z.tolist())
    checkers = sorted({row.checker.__name__ for plan in inner.plans.values() for row in plan.rows})
    odd, how = mismatch
    try:
        if rank != odd:
            dist.all_reduce(torch.ones(4), group=group, algorithm="native")
        elif how == "size":
            dist.all_reduce(torch.ones(5), group=group, algorithm="native")
        elif how == "op":
            dist.all_reduce(torch.ones(4), dist.ReduceOp.MAX, group=group, algorithm="native")
        elif how == "collective":
            dist.broadcast(torch.ones(4), src=0, group=group, algorithm="native")
        else:  # "algorithm"
            dist.all_reduce(torch.ones(4), group=group, algorithm="ring")
        raised = "no error"
    except dist.CollectiveMismatchError as error:
        raised = f"CollectiveMismatchError: {error}"
    return checkers, values, raised, inner.communicator.local.host_segments


def _floats(rank: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(100 * numel + rank))


CASES = [("size", -1), ("op", 0), ("collective", 1), ("algorithm", -1)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", worlds(backends=("gloo", "mpi"), sizes=(3, 4)), indirect=True)
def test_checks_meet_by_host_and_name_a_mismatch_on_every_rank(world):
    n = world.world_size
    total = sum(range(1, n + 1))
    for names in LAYOUTS[n]:
        for how, odd in CASES:
            odd %= n
            reports = world.run(_on_hosts, names, (odd, how), timeout=60)
            for rank, (checkers, values, raised, host_segments) in enumerate(reports):
                where = (names, how, rank)
                assert checkers == ["across_hosts"] and host_segments, where + (checkers,)
                assert values[:3] == [[float(total)], [float(total)], [float(n - 1 + k) for k in range(4)]], where
                for got, numel in zip(values[3:], (8, 9)):
                    every = np.stack([_floats(r, numel).double().numpy() for r in range(n)])
                    assert np.allclose(got, every.mean(axis=0), rtol=1e-6, atol=1e-7), where + (numel, got)
                    if numel == 8:  # rode: summed in float64 and rounded once
                        assert got == every.mean(axis=0).astype(np.float32).tolist(), where + (got,)
                    assert got == reports[0][1][3 + (numel == 9)], where  # the same bits on every rank
                assert raised.startswith("CollectiveMismatchError"), where + (raised,)
                # The error names the first rank and the first rank that differs from it.
                first_other = 1 if odd == 0 else odd
                assert f"rank {first_other} called" in raised and "but rank" in raised, where + (raised,)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", worlds(backends=("gloo",), sizes=(4,)), indirect=True)
def test_a_host_without_a_segment_sends_every_rank_through_the_backend(world):
    for refused_host in ("a", "b"):
        reports = world.run(_on_hosts, "aabb", (3, "size"), refused_host, timeout=60)
        for rank, (checkers, values, raised, host_segments) in enumerate(reports):
            where = (refused_host, rank)
            assert "through_backend" in checkers and "across_hosts" not in checkers, where + (checkers,)
            assert not host_segments, where
            assert values[:3] == [[10.0], [10.0], [3.0, 4.0, 5.0, 6.0]], where
            assert raised.startswith("CollectiveMismatchError"), where + (raised,)
