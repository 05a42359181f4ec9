"""Every collective with every algorithm at world sizes 5 to 8 (non-powers of two included), on the real
backends, with a tiny segment size so multi-segment pipelines run on small data.

The exhaustive dtype x op x root sweeps run at 1-4 ranks (test_collectives.py, test_data_movement.py) and,
over an in-process transport, at 1-8 (tests/algorithms); this file proves the same schedules on gloo and
MPI when more ranks than cores take turns (oversubscribed: nothing may spin).

Every world runs every collective with every algorithm, each algorithm at 2 of the 4 ``SIZES`` (empty,
one element, 7: uneven at every world size here, 1000: many 64-byte segments).  The sizes take turns
(``sizes_for``): the turn is (world size + algorithm index), so gloo's four consecutive world sizes run
every size with every algorithm twice over, and MPI's 5 and 8, whose turns differ by an odd number, split
the four sizes between them; ``test_every_size_runs_with_every_algorithm`` checks that without ranks.
"""
import numpy as np
import pytest
import torch

from support.worlds import worlds

import zerocomm.comm as dist

ALGORITHMS = ("native", "ring", "tree", "recursive_doubling", "shm")
SIZES = (0, 1, 7, 1000)
SIZES_TAKE = 2
WORLDS = {"gloo": (5, 6, 7, 8), "mpi": (5, 8)}


def sizes_for(world_size: int, alg: str) -> list:
    """The 2 of ``SIZES`` that ``alg`` runs at at ``world_size``: see the module docstring."""
    turn = world_size + ALGORITHMS.index(alg)
    return [size for i, size in enumerate(SIZES) if (i - turn * SIZES_TAKE) % len(SIZES) < SIZES_TAKE]


def _values(rank: int, numel: int, salt: int) -> np.ndarray:
    return ((np.arange(numel) * 3 + rank * 7 + rank * np.arange(numel) + salt) % 11 - 5).astype(np.int64)


def _try(failures, what, call, check):
    try:
        call()
    except dist.UnsupportedError:
        return  # a refused (collective, algorithm) cell; the capability matrix tests its wording
    except Exception as error:  # report and carry on: every rank runs the same sequence
        failures.append(f"{what}: {type(error).__name__}: {error}")
        return
    problem = check()
    if problem:
        failures.append(f"{what}: {problem}")


def every_collective():
    rank, n = dist.get_rank(), dist.get_world_size()
    default_segment = dist.configure().segment_bytes
    dist.configure(segment_bytes=64)
    failures = []
    try:
        for numel in SIZES:
            ins = [_values(r, numel, 1) for r in range(n)]
            for alg in ALGORITHMS:
                if numel not in sizes_for(n, alg):
                    continue
                kw = {"algorithm": alg}
                for dtype, op, reduce in ((torch.float32, dist.ReduceOp.SUM, np.sum),
                                          (torch.int32, dist.ReduceOp.MAX, np.max)):
                    t = torch.tensor(ins[rank]).to(dtype)
                    _try(failures, f"all_reduce {alg} {dtype} n={numel}", lambda: dist.all_reduce(t, op, **kw),
                         lambda: None if np.array_equal(t.numpy(), reduce(np.stack(ins), 0)) else t.tolist())
                b = torch.tensor(ins[rank], dtype=torch.float32)
                _try(failures, f"broadcast {alg} n={numel}", lambda: dist.broadcast(b, src=n - 1, **kw),
                     lambda: None if np.array_equal(b.numpy(), ins[n - 1]) else b.tolist())
                r = torch.tensor(ins[rank], dtype=torch.int64)
                _try(failures, f"reduce {alg} n={numel}", lambda: dist.reduce(r, dst=2, **kw),
                     lambda: None if np.array_equal(r.numpy(), np.sum(ins, 0) if rank == 2 else ins[rank])
                     else r.tolist())
                out = torch.empty(n * numel, dtype=torch.int64)
                _try(failures, f"all_gather {alg} n={numel}",
                     lambda: dist.all_gather_into_tensor(out, torch.tensor(ins[rank]), **kw),
                     lambda: None if np.array_equal(out.numpy(), np.concatenate(ins)) else out.tolist())
                full = [_values(r, n * numel, 2) for r in range(n)]
                rs = torch.empty(numel, dtype=torch.int64)
                _try(failures, f"reduce_scatter {alg} n={numel}",
                     lambda: dist.reduce_scatter_tensor(rs, torch.tensor(full[rank]), **kw),
                     lambda: None if np.array_equal(rs.numpy(), np.sum(full, 0)[rank * numel:(rank + 1) * numel])
                     else rs.tolist())
                g = [torch.empty(numel, dtype=torch.int64) for _ in range(n)] if rank == 1 else None
                _try(failures, f"gather {alg} n={numel}", lambda: dist.gather(torch.tensor(ins[rank]), g, dst=1, **kw),
                     lambda: None if rank != 1 or np.array_equal(torch.cat(g).numpy(), np.concatenate(ins))
                     else [x.tolist() for x in g])
                s = torch.empty(numel, dtype=torch.int64)
                pieces = [torch.tensor(_values(r, numel, 3)) for r in range(n)] if rank == 0 else None
                _try(failures, f"scatter {alg} n={numel}", lambda: dist.scatter(s, pieces, src=0, **kw),
                     lambda: None if np.array_equal(s.numpy(), _values(rank, numel, 3)) else s.tolist())
                # uneven all_to_all: rank i sends (i + j) % 3 * numel // 3 elements to rank j
                sizes_out = [((rank + j) % 3) * (numel // 3 + 1) for j in range(n)]
                sizes_in = [((j + rank) % 3) * (numel // 3 + 1) for j in range(n)]
                send = torch.tensor(np.concatenate([np.full(c, 100 * rank + j) for j, c in enumerate(sizes_out)]),
                                    dtype=torch.int64)
                recv = torch.empty(sum(sizes_in), dtype=torch.int64)
                expected = np.concatenate([np.full(c, 100 * j + rank) for j, c in enumerate(sizes_in)])
                _try(failures, f"all_to_all {alg} n={numel}",
                     lambda: dist.all_to_all_single(recv, send, sizes_in, sizes_out, **kw),
                     lambda: None if np.array_equal(recv.numpy(), expected) else recv.tolist())
            _try(failures, "barrier tree", lambda: dist.barrier(algorithm="tree"), lambda: None)
    finally:
        dist.configure(segment_bytes=default_segment)
    return failures


def test_every_size_runs_with_every_algorithm():
    for backend, sizes in WORLDS.items():
        for alg in ALGORITHMS:
            ran = [size for world_size in sizes for size in sizes_for(world_size, alg)]
            assert sorted(set(ran)) == sorted(SIZES), (backend, alg, ran)


@pytest.mark.parametrize("world", [w for backend, sizes in WORLDS.items() for w in worlds((backend,), sizes)],
                         indirect=True)
def test_every_collective_and_algorithm_at_5_to_8_ranks(world):
    failures = [f"rank {r}: {f}" for r, fs in enumerate(world.run(every_collective, timeout=300)) for f in fs]
    assert not failures, "\n".join(failures[:30])
