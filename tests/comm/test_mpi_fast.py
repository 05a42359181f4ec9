"""The MPI backend's two ways of running an all_reduce and the mismatch check: the optional C hot loop
(``_mpifast``) and mpi4py.  Every case runs both ways in one job and must give the same results, the
same ``CollectiveMismatchError`` and the same timeout; the C way is skipped, with the reason, where the
extension was not built.  The short path (a blocking SUM all_reduce of a cell seen before) runs the
mismatch check too: a counter on ``Backend.agree`` shows that it did.
"""
import datetime
import time

import pytest
import torch

from support.worlds import worlds

import zerocomm.comm as dist

WAYS = ["c", "mpi4py"]
NOT_BUILT = "the _mpifast extension was not built or not bound (no compiler, or an MPI other than MPICH)"


def _backend(group=None):
    from zerocomm.comm.group import WORLD
    return (WORLD.default if group is None else group).communicator


def _switch(way: str, group=None):
    """Make ``group``'s backend run ``way``; returns what to restore, or None when ``way`` is unavailable."""
    backend = _backend(group)
    saved = backend._fast
    if way == "c" and saved is None:
        return None
    if way == "mpi4py":
        backend._fast = None
    return saved


CASES = [(dtype, op) for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16)
         for op in ("sum", "max", "min", "product", "avg") if not (op == "avg" and not dtype.is_floating_point)]
OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
       "product": dist.ReduceOp.PRODUCT, "avg": dist.ReduceOp.AVG}


def _input(rank: int, numel: int, dtype, op: str) -> torch.Tensor:
    values = torch.arange(numel, dtype=torch.float64)
    values = 1 + (values + rank) % 2 if op == "product" else (values * 3 + rank * 7) % 11 - 5
    return values.to(dtype)


def _expected(n: int, numel: int, dtype, op: str) -> torch.Tensor:
    every = torch.stack([_input(r, numel, torch.float64, op) for r in range(n)])
    reduced = {"sum": every.sum(0), "max": every.max(0).values if numel else every.sum(0),
               "min": every.min(0).values if numel else every.sum(0), "product": every.prod(0),
               "avg": every.sum(0) / n}[op]
    return reduced.to(dtype)


def results_both_ways() -> dict:
    """Every (dtype, op) cell at 0, 1, 7 and 1000 elements, twice (the second call takes the short path for
    SUM), each way; the number of mismatch checks the calls ran."""
    n, rank = dist.get_world_size(), dist.get_rank()
    backend = _backend()
    out = {}
    for way in WAYS:
        saved = _switch(way)
        if saved is None:
            out[way] = NOT_BUILT
            continue
        checks = [0]
        agree = backend.agree

        def counted(*args):
            checks[0] += 1
            return agree(*args)

        backend.agree = counted
        wrong = []
        try:
            for dtype, op in CASES:
                for numel in (0, 1, 7, 1000):
                    for _ in range(2):
                        tensor = _input(rank, numel, dtype, op)
                        dist.all_reduce(tensor, op=OPS[op], algorithm="native")
                        expected = _expected(n, numel, dtype, op)
                        if not torch.allclose(tensor.double(), expected.double(), rtol=1e-2 if op == "avg" else 0):
                            wrong.append((str(dtype), op, numel, tensor[:4].tolist(), expected[:4].tolist()))
        finally:
            del backend.agree
            backend._fast = saved
        out[way] = {"wrong": wrong, "checks": checks[0], "calls": 2 * 4 * len(CASES)}
    return out


@pytest.mark.parametrize("world", worlds(("mpi",), (2, 3)), indirect=True)
def test_all_reduce_gives_the_same_results_both_ways(world):
    for rank, out in enumerate(world.run(results_both_ways, timeout=120)):
        if out["c"] == NOT_BUILT:
            pytest.skip(NOT_BUILT)
        for way in WAYS:
            assert out[way]["wrong"] == [], (rank, way, out[way]["wrong"][:3])
            # every call is checked (default settings), the short path's too
            assert out[way]["checks"] == out[way]["calls"], (rank, way, out[way])


def mismatch_on_the_short_path() -> dict:
    """Cells warmed first (so every rank takes the short path), then the last rank calls a different size,
    then a different dtype; each must raise CollectiveMismatchError on every rank and leave the group usable."""
    n, rank = dist.get_world_size(), dist.get_rank()
    odd = rank == n - 1
    out = {}
    for way in WAYS:
        saved = _switch(way)
        if saved is None:
            out[way] = NOT_BUILT
            continue
        try:
            seen = {}
            for algorithm in (None, "native"):  # "auto"'s choice, and native (whose small calls ride in the check)
                for dtype in (torch.float32, torch.float64):
                    for _ in range(2):
                        dist.all_reduce(torch.ones(4, dtype=dtype), algorithm=algorithm)
                from zerocomm.comm.group import WORLD
                rows = [WORLD.default.short.get((algorithm, dtype)) for dtype in (torch.float32, torch.float64)]
                seen[f"short path checked {algorithm}"] = all(r is not None and r[0][2] is not None for r in rows)
                for kind, tensor in (("size", torch.ones(5 if odd else 4)),
                                     ("dtype", torch.ones(4, dtype=torch.float64 if odd else torch.float32))):
                    kind = f"{kind} {algorithm}"
                    original = tensor.clone()
                    try:
                        dist.all_reduce(tensor, algorithm=algorithm)
                        seen[kind] = "no error"
                    except dist.CommError as error:
                        seen[kind] = (type(error).__name__, str(error), torch.equal(tensor, original))
                    after = torch.ones(2)
                    dist.all_reduce(after, algorithm=algorithm)
                    seen[kind + " after"] = after.tolist()
            out[way] = seen
        finally:
            _backend()._fast = saved
    return out


@pytest.mark.parametrize("world", worlds(("mpi",), (2, 3)), indirect=True)
def test_a_mismatch_on_the_short_path_raises_on_every_rank_both_ways(world):
    outs = world.run(mismatch_on_the_short_path, timeout=120)
    n = len(outs)
    for rank, out in enumerate(outs):
        for way in WAYS:
            if out[way] == NOT_BUILT:
                continue
            seen = out[way]
            for algorithm in (None, "native"):
                assert seen[f"short path checked {algorithm}"], (rank, way, seen)
                for kind in (f"size {algorithm}", f"dtype {algorithm}"):
                    name, message, untouched = seen[kind]
                    assert name == "CollectiveMismatchError", (rank, way, kind, seen[kind])
                    assert "rank 0 called" in message and f"rank {n - 1} called" in message, message
                    assert untouched, f"rank {rank} {way} {kind}: the tensor changed though the call was refused"
                    assert seen[kind + " after"] == [float(n)] * 2, (rank, way, kind, seen)
    if outs[0]["c"] == NOT_BUILT:
        pytest.skip(NOT_BUILT)


def late_peer_in_the_check() -> dict:
    """Rank 0 times out in a 1 s group's mismatch check while rank 1 is late, each way: a typed error in
    time, the check's buffer kept with its posted request, the group unusable after, the world fine."""
    rank = dist.get_rank()
    out = {}
    for way in WAYS:
        group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=1))
        saved = _switch(way, group)
        if saved is None:
            dist.destroy_process_group(group)
            out[way] = NOT_BUILT
            continue
        seen = {}
        backend = _backend(group)
        if rank == 1:
            time.sleep(2.0)
        start = time.monotonic()
        try:  # native: the backend's own check is the one under test ("auto" picks shm on one host)
            dist.all_reduce(torch.ones(2), group=group, algorithm="native")
            seen["first"] = "done"
        except dist.CommError as error:
            seen["first"] = (type(error).__name__, "mismatch check" in str(error), time.monotonic() - start)
        if rank == 0:
            seen["kept"] = any(keep is backend._agreement for _, keep, _ in backend._orphans)
            try:
                dist.all_reduce(torch.ones(2), group=group)
                seen["again"] = "done"
            except dist.CommError as error:
                seen["again"] = type(error).__name__
        dist.destroy_process_group(group)
        check = torch.ones(2)
        dist.all_reduce(check)
        seen["world"] = check.tolist()
        out[way] = seen
    return out


@pytest.mark.parametrize("world", worlds(("mpi",), (2,)), indirect=True)
def test_a_late_peer_times_out_in_the_check_both_ways(world):
    outs = world.run(late_peer_in_the_check, timeout=60)
    for rank, out in enumerate(outs):
        for way in WAYS:
            if out[way] == NOT_BUILT:
                continue
            seen = out[way]
            if rank == 0:
                name, in_check, took = seen["first"]
                assert name == "CommTimeoutError" and in_check and took < 3.0, (way, seen)
                assert seen["kept"] and seen["again"] == "CommTimeoutError", (way, seen)
            else:  # its check meets rank 0's posted one; its data then waits for a rank 0 that gave up
                assert seen["first"] == "done" or seen["first"][0] == "CommTimeoutError", (way, seen)
            assert seen["world"] == [2.0, 2.0], (way, seen)
    if outs[0]["c"] == NOT_BUILT:
        pytest.skip(NOT_BUILT)


def test_the_check_digest_is_the_same_in_every_process():
    """Ranks compare digests computed in different processes: no string or object hash may enter them
    (Python salts those per process), so two interpreters with different hash seeds must agree."""
    import os
    import subprocess
    import sys
    probe = ("import torch; from zerocomm.comm.group import digest;"
             "from zerocomm.comm.validate import fingerprint_cell;"
             "cell = fingerprint_cell('all_reduce', 'sum', torch.float32, -1, 'native');"
             "print(digest(1048577, 2, hash(cell)), cell)")
    outputs = {subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120,
                              env=dict(os.environ, PYTHONHASHSEED=seed)).stdout for seed in ("1", "2")}
    assert len(outputs) == 1, outputs
