"""A small all_reduce that rides in its mismatch check's segment round gives what its algorithm gives.

On one host every call is checked in a round of the shared segment (``check.in_segment``), and a small
all_reduce rides in it: "native" and "shm" at any size of group, the algorithms whose two-rank bits the round
reproduces ("ring", "tree", "recursive_doubling") at two ranks.  Each case here runs the same inputs with
the check on (riding) and off (the algorithm itself runs) and compares the bits ("shm"'s small all_reduce
is that round itself: the same bits at any size of group); at more ranks "native" is compared with numpy's
float64 sum within float32 rounding, and must be the same on every rank.
"""
import numpy as np
import pytest
import torch

from support.worlds import worlds

RIDING = ("native", "shm", "ring", "tree", "recursive_doubling")
CASES = [(torch.float32, "SUM"), (torch.float32, "AVG"), (torch.float64, "MAX"), (torch.int32, "SUM"),
         (torch.int64, "MIN")]


def _input(rank: int, numel: int, dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=generator, dtype=torch.float64).to(dtype)
    return torch.randint(-1000, 1000, (numel,), generator=generator, dtype=dtype)


def ridden_and_run() -> dict:
    import zerocomm.comm as dist
    from zerocomm.comm.group import WORLD
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for seed, (dtype, op) in enumerate(CASES):
        for algorithm in RIDING:
            for numel in (1, 7, 1000):
                results = []
                for check in (False, True):  # the algorithm itself, then ridden
                    dist.configure(check=check)
                    tensor = _input(rank, numel, dtype, seed)
                    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op), algorithm=algorithm)
                    results.append(tensor)
                    out.setdefault("log", []).append((check, algorithm, numel, str(dtype), op, tensor[:2].tolist()))
                plan = next(p for k, p in WORLD.plans.items() if k[0] == "all_reduce" and k[4] == algorithm
                            and k[-1] == dtype and k[1] is None and k[3] is False)
                rides = plan.rows[0].ride is not None
                in_segment = plan.rows[0].checker.__name__ in ("in_segment", "in_first_sync")
                everyone = [_input(r, numel, dtype, seed).double().numpy() for r in range(n)]
                expected = {"SUM": np.sum, "AVG": np.mean, "MAX": np.max, "MIN": np.min}[op](everyone, axis=0)
                out[(str(dtype), op, algorithm, numel)] = (
                    rides, in_segment, torch.equal(results[0], results[1]),
                    float(np.max(np.abs(results[1].double().numpy() - expected))), results[1].tolist())
    return out


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (2, 3)), indirect=True)
def test_a_ridden_all_reduce_gives_its_algorithms_result(world):
    outs = world.run(ridden_and_run, timeout=180)
    n = world.world_size
    for rank, out in enumerate(outs):
        in_segment = [v[1] for k, v in out.items() if k != "log"]
        assert all(in_segment) or not any(in_segment), (rank, in_segment)  # one place per group
        log = out.pop("log")
        for (dtype, op, algorithm, numel), (rides, in_segment, same_bits, error, values) in out.items():
            where = (rank, dtype, op, algorithm, numel, in_segment)
            assert rides == (in_segment and (algorithm in ("native", "shm") or n == 2)), where  # see check.py
            if n == 2 or not rides or algorithm == "shm":
                assert same_bits, (where, log[:6])  # the round reproduces the bits
            assert error <= (1e-5 * n if dtype == "torch.float32" else 1e-12 if dtype == "torch.float64" else 0), where
            assert values == outs[0][(dtype, op, algorithm, numel)][4], where  # the same on every rank
