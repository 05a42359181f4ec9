"""The MPI backend's two ways of running an all_reduce, the mismatch check and an exchange: the optional C hot loop
(``_mpifast``) and mpi4py.  Every case runs both ways in one job and must give the same results, the
same ``CollectiveMismatchError`` and the same timeout; the C way is skipped, with the reason, where the
extension was not built.  A call of a cell planned before runs the mismatch check too: a counter on
``Backend.reduce_stage`` (the check's one primitive) shows that it did.
"""
import collections
import contextlib
import datetime
import sys
import time

import pytest
import torch

from support.check_place import checks_through_the_backend
from support.worlds import worlds

import zerocomm.comm as dist

#: "c": the all_reduces (the check's stage among them) posted and waited for in C, ``_mpifast``; "mpi4py": everything
#: through mpi4py.
WAYS = ["c", "mpi4py"]
NOT_BUILT = "the _mpifast extension was not built or not bound (no compiler, or an MPI other than MPICH)"


def _backend(group=None):
    from zerocomm.comm.group import WORLD
    return (WORLD.default if group is None else group).communicator


def _group(group=None):
    from zerocomm.comm.group import WORLD
    return WORLD.default if group is None else group.zerocomm_group


@contextlib.contextmanager
def _way(way: str, group=None):
    """Make ``group``'s backend run ``way`` inside the block, checking through the backend as across hosts;
    yields why not where it cannot, else None."""
    backend, g = _backend(group), _group(group)
    saved = backend._fast
    if saved is None:
        yield NOT_BUILT
        return
    if way == "mpi4py":
        backend._fast = None
    try:
        with checks_through_the_backend(g):  # as across hosts: on one host every check runs in the segment
            yield None
    finally:
        backend._fast = saved


def _skip_where_not_built(out: dict) -> None:
    """After the ways that ran were checked: skip, saying why, where a way could not run."""
    missing = sorted({reason for reason in out.values() if isinstance(reason, str)})
    if missing:
        pytest.skip("; ".join(missing))


def _each_way(outs: list, ways: list):
    """``(rank, way, result)`` for every rank's result of every way that ran (a string says why a way could not)."""
    for rank, out in enumerate(outs):
        for way in ways:
            if not isinstance(out[way], str):
                yield rank, way, out[way]


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
    """Every (dtype, op) cell at 0, 1, 7 and 1000 elements, twice (the second call runs the cell's plan from the
    cache), each way; the number of mismatch checks the calls ran."""
    n, rank = dist.get_world_size(), dist.get_rank()
    backend = _backend()
    out = {}
    for way in WAYS:
        with _way(way) as unavailable:
            if unavailable:
                out[way] = unavailable
                continue
            checks = [0]
            reduce_stage = backend.reduce_stage

            def counted(*args, **kwargs):
                checks[0] += 1
                return reduce_stage(*args, **kwargs)

            backend.reduce_stage = counted
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
                del backend.reduce_stage
            out[way] = {"wrong": wrong, "checks": checks[0], "calls": 2 * 4 * len(CASES)}
    return out


@pytest.mark.parametrize("world", worlds(("mpi",), (2, 3)), indirect=True)
def test_all_reduce_gives_the_same_results_both_ways(world):
    outs = world.run(results_both_ways, timeout=120)
    for rank, way, seen in _each_way(outs, WAYS):
        assert seen["wrong"] == [], (rank, way, seen["wrong"][:3])
        # every call is checked (default settings), a planned cell's too
        assert seen["checks"] == seen["calls"], (rank, way, seen)
    _skip_where_not_built(outs[0])


def mismatch_on_a_planned_cell() -> dict:
    """Cells warmed first (so every rank runs its cached plan), then the last rank calls a different size,
    then a different dtype; each must raise CollectiveMismatchError on every rank and leave the group usable."""
    n, rank = dist.get_world_size(), dist.get_rank()
    odd = rank == n - 1
    out = {}
    for way in WAYS:
        with _way(way) as unavailable:
            if unavailable:
                out[way] = unavailable
                continue
            seen = {}
            for algorithm in (None, "native"):  # "auto"'s choice, and native (whose small calls ride in the check)
                for dtype in (torch.float32, torch.float64):
                    for _ in range(2):
                        dist.all_reduce(torch.ones(4, dtype=dtype), algorithm=algorithm)
                from zerocomm.comm.group import WORLD
                plans = [plan for key, plan in WORLD.plans.items()  # (form, group, op, async_op, algorithm, .., dtype)
                         if key[0] == "all_reduce" and key[1] is None and key[3] is False and key[4] == algorithm
                         and key[-1] in (torch.float32, torch.float64)]
                seen[f"planned and checked {algorithm}"] = len(plans) == 2 and all(
                    row.checker is not None for plan in plans for row in plan.rows)
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
    return out


@pytest.mark.parametrize("world", worlds(("mpi",), (2, 3)), indirect=True)
def test_a_mismatch_on_a_planned_cell_raises_on_every_rank_both_ways(world):
    outs = world.run(mismatch_on_a_planned_cell, timeout=120)
    n = len(outs)
    for rank, out in enumerate(outs):
        for way in WAYS:
            if isinstance(out[way], str):
                continue
            seen = out[way]
            for algorithm in (None, "native"):
                assert seen[f"planned and checked {algorithm}"], (rank, way, seen)
                for kind in (f"size {algorithm}", f"dtype {algorithm}"):
                    name, message, untouched = seen[kind]
                    assert name == "CollectiveMismatchError", (rank, way, kind, seen[kind])
                    assert "rank 0 called" in message and f"rank {n - 1} called" in message, message
                    assert untouched, f"rank {rank} {way} {kind}: the tensor changed though the call was refused"
                    assert seen[kind + " after"] == [float(n)] * 2, (rank, way, kind, seen)
    _skip_where_not_built(outs[0])


def late_peer_in_the_check(algorithm: str) -> dict:
    """Rank 0 times out in a 1 s group's mismatch check while rank 1 is late, each way, in the first call
    of the cell (the full checks) and in a later one (its plan from the cache): a typed error in time, the check's
    buffer kept with its posted requests, the group unusable after, the world fine.  ``algorithm``:
    native (whose small all_reduce rides in the check's stage) or recursive_doubling (checked first, then run)."""
    rank = dist.get_rank()
    out = {}
    for way in WAYS:
        for path in ("first call", "planned cell"):
            group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=1))
            switch = _way(way, group)
            unavailable = switch.__enter__()
            if unavailable:
                dist.destroy_process_group(group)
                out[way] = unavailable
                break
            seen = {}
            backend = _backend(group)
            if path == "planned cell":  # the cell planned, on time
                for _ in range(2):
                    dist.all_reduce(torch.ones(2), group=group, algorithm=algorithm)
            if rank == 1:
                time.sleep(2.0)
            start = time.monotonic()
            try:  # not "auto": the backend's own check is the one under test ("auto" picks shm on one host)
                dist.all_reduce(torch.ones(2), group=group, algorithm=algorithm)
                seen["first"] = "done"
            except dist.CommError as error:
                seen["first"] = (type(error).__name__, "mismatch check" in str(error), time.monotonic() - start)
            if rank == 0:
                seen["kept"] = any(keep is _group(group).check.stage for _, keep, _ in backend._orphans)
                try:
                    dist.all_reduce(torch.ones(2), group=group)
                    seen["again"] = "done"
                except dist.CommError as error:
                    seen["again"] = type(error).__name__
            switch.__exit__(None, None, None)
            dist.destroy_process_group(group)
            check = torch.ones(2)
            dist.all_reduce(check)
            seen["world"] = check.tolist()
            out.setdefault(way, {})[path] = seen
    return out


@pytest.mark.parametrize("algorithm", ["native", "recursive_doubling"])
@pytest.mark.parametrize("world", worlds(("mpi",), (2,)), indirect=True)
def test_a_late_peer_times_out_in_the_check_both_ways(world, algorithm):
    outs = world.run(late_peer_in_the_check, algorithm, timeout=90)
    for rank, out in enumerate(outs):
        for way in WAYS:
            if isinstance(out[way], str):
                continue
            for path, seen in out[way].items():
                if rank == 0:
                    assert seen["first"] != "done", (way, path, seen)  # not even by a message left over
                    name, in_check, took = seen["first"]
                    assert name == "CommTimeoutError" and in_check and took < 3.0, (way, path, seen)
                    assert seen["kept"] and seen["again"] == "CommTimeoutError", (way, path, seen)
                else:  # its check meets rank 0's posted one; its data then waits for a rank 0 that gave up
                    assert seen["first"] == "done" or seen["first"][0] == "CommTimeoutError", (way, path, seen)
                assert seen["world"] == [2.0, 2.0], (way, path, seen)
    _skip_where_not_built(outs[0])


def test_the_check_digest_is_the_same_in_every_process():
    """Ranks compare digests computed in different processes: no string or object hash may enter them
    (Python salts those per process), so two interpreters with different hash seeds must agree."""
    import os
    import subprocess
    import sys
    probe = ("import torch; from zerocomm.comm.check import digest, fingerprint_cell;"
             "cell = fingerprint_cell('all_reduce', 'sum', torch.float32, -1, 'native');"
             "print(digest(1048577, 2, hash(cell)), cell)")
    outputs = {subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120,
                              env=dict(os.environ, PYTHONHASHSEED=seed)).stdout for seed in ("1", "2")}
    assert len(outputs) == 1, outputs


def test_the_check_digest_in_c_is_its_python_twin():
    """``check.digest`` (``_shmfast.digest`` where built) and its Python twin ``check.digest_twin`` give the same
    bits, on the edges of every argument's range (a per-rank count is -1; a cell code is any Python hash)."""
    from zerocomm.comm import check, shm
    if shm.digest_in_c is None:
        pytest.skip("the C extension zerocomm.comm._shmfast is not built here: only the Python twin runs")
    import random
    rng = random.Random(5)
    edges = [0, 1, -1, 2**31, 2**62 - 1, -(2**63), 2**63 - 1]
    cases = [(t, n, c) for t in (0, 1, 1048577, 2**40) for n in edges for c in edges]
    cases += [(rng.randrange(2**40), rng.randrange(-1, 2**40), rng.randrange(-(2**63), 2**63)) for _ in range(2000)]
    for case in cases:
        assert check.digest(*case) == check.digest_twin(*case), case
        assert 0 <= check.digest(*case) < 2**62, case
    assert len({check.digest(t, 4, 7) for t in range(10000)}) == 10000  # consecutive calls never collide here


def _with_the_world_checked(out: dict) -> dict:
    """``out`` and, under "world", a SUM all_reduce of ones over the whole world once the failed groups are gone."""
    check = torch.ones(2)
    dist.all_reduce(check)
    out["world"] = check.tolist()
    return out


#: The ways ``exchange`` runs: in C (``_mpifast.exchange``), or as ``irecv`` + ``isend`` through mpi4py.
EXCHANGE_WAYS = ["c", "mpi4py"]


def _exchanges_per_call(n: int, rank: int, algorithm: str, numel: int, dtype, op: str) -> int:
    """Whole-buffer exchanges ``Backend.exchange`` makes on ``rank`` for one call: recursive doubling's steps
    among the largest power of two of ranks (the others fold in and out), or the two-rank tree's one (the check's
    stage rides only "native" and "hierarchical" calls, so these always exchange)."""
    if numel == 0 or n == 1:
        return 0
    if algorithm == "tree":
        return 1 if n == 2 else 0
    p = 1 << (n.bit_length() - 1)
    folded_out = rank < 2 * (n - p) and rank % 2 == 0
    return 0 if folded_out else p.bit_length() - 1


def exchange_results_both_ways() -> dict:
    """recursive_doubling and tree all_reduce on every (dtype, op) cell at 0, 1, 7 and 1000 elements, each
    way: the results, and how many exchanges ran in C against how many the schedules make."""
    n, rank = dist.get_world_size(), dist.get_rank()
    backend = _backend()
    out = {}
    for way in EXCHANGE_WAYS:
        with _way(way) as unavailable:
            if unavailable:
                out[way] = unavailable
                continue
            in_c, fast_exchange = [0], backend._exchange

            def counted(*args):
                in_c[0] += 1
                return fast_exchange(*args)

            backend._exchange = counted
            wrong, expected_exchanges = [], 0
            try:
                for algorithm in ("recursive_doubling", "tree"):
                    for dtype, op in CASES:
                        for numel in (0, 1, 7, 1000):
                            tensor = _input(rank, numel, dtype, op)
                            dist.all_reduce(tensor, op=OPS[op], algorithm=algorithm)
                            expected_exchanges += _exchanges_per_call(n, rank, algorithm, numel, dtype, op)
                            expected = _expected(n, numel, dtype, op)
                            if not torch.allclose(tensor.double(), expected.double(), rtol=1e-2 if op == "avg" else 0):
                                wrong.append((algorithm, str(dtype), op, numel, tensor[:4].tolist()))
            finally:
                backend._exchange = fast_exchange
            out[way] = {"wrong": wrong, "in C": in_c[0],
                        "expected in C": expected_exchanges if way == "c" else 0}
    return out


@pytest.mark.parametrize("world", worlds(("mpi",), (2, 3, 4)), indirect=True)
def test_recursive_doubling_and_tree_exchange_in_c_with_the_same_results(world):
    outs = world.run(exchange_results_both_ways, timeout=120)
    for rank, way, seen in _each_way(outs, EXCHANGE_WAYS):
        assert seen["wrong"] == [], (rank, way, seen["wrong"][:3])
        assert seen["in C"] == seen["expected in C"], (rank, way, seen)
    _skip_where_not_built(outs[0])


def late_peer_in_an_exchange() -> dict:
    """Rank 0 exchanges with rank 1 under a 0.5 s deadline while rank 1 is 1.5 s late, each way: a
    ``TimeoutError`` naming the peer, in time, with the receive kept posted with its buffer; rank 1's late
    exchange then meets what rank 0 left posted (its bytes land in that buffer), and the world still works
    after the group is destroyed."""
    import gc
    rank = dist.get_rank()
    out = {}
    for way in EXCHANGE_WAYS:
        group = dist.new_group([0, 1])
        with _way(way, group) as unavailable:
            if unavailable:
                out[way] = unavailable
            else:
                backend, seen = _backend(group), {}
                send, recv = torch.full((4,), float(rank + 1)), torch.zeros(4)
                if rank == 0:
                    start = time.monotonic()
                    try:
                        backend.exchange(send, recv, 1, 77, start + 0.5)
                        seen["first"] = "done"
                    except TimeoutError as error:
                        seen["first"] = ("TimeoutError", "rank 1" in str(error), time.monotonic() - start)
                    gc.collect()  # a dropped unfinished request joins the orphans when collected
                    seen["kept"] = any(keep is recv or (isinstance(keep, tuple) and any(k is recv for k in keep))
                                       for _, keep, _ in backend._orphans)
                    # The receive stays posted: rank 1's late bytes land in the kept buffer.  Waiting for them
                    # also keeps this rank from freeing the communicator under rank 1's message.
                    until = time.monotonic() + 10
                    while recv.tolist() != [2.0] * 4 and time.monotonic() < until:
                        for request, _, _ in backend._orphans:
                            request.Test()  # drives MPI's progress, which delivers into posted receives
                        time.sleep(0.01)
                    seen["late bytes"] = recv.tolist()
                else:
                    time.sleep(1.5)
                    backend.exchange(send, recv, 0, 77, time.monotonic() + 10)
                    seen["got"] = recv.tolist()
                out[way] = seen
        dist.destroy_process_group(group)
    return _with_the_world_checked(out)


@pytest.mark.parametrize("world", worlds(("mpi",), (2,)), indirect=True)
def test_a_late_peer_times_out_in_an_exchange_both_ways(world):
    outs = world.run(late_peer_in_an_exchange, timeout=90)
    assert all(out["world"] == [2.0, 2.0] for out in outs), outs
    for rank, way, seen in _each_way(outs, EXCHANGE_WAYS):
        if rank == 0:
            assert seen["first"] != "done", (way, seen)
            name, names_peer, took = seen["first"]
            assert name == "TimeoutError" and names_peer and 0.45 < took < 1.4, (way, seen)
            assert seen["kept"] and seen["late bytes"] == [2.0] * 4, (way, seen)
        else:
            assert seen["got"] == [1.0] * 4, (way, seen)
    _skip_where_not_built(outs[0])


#: The dtypes of a native SUM all_reduce with the mismatch check off, run each way.
UNCHECKED_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64, torch.int8, torch.uint8, torch.float16,
                    torch.bfloat16)


@contextlib.contextmanager
def _check_off():
    checking = dist.configure().check
    dist.configure(check=False)
    try:
        yield
    finally:
        dist.configure(check=checking)


def unchecked_results_each_way() -> dict:
    """Native SUM all_reduce of every dtype at 0, 1, 7, 1000 and 100000 elements, twice, with the check off,
    each way: the results, and per dtype how many calls ran the backend's all_reduce (every non-empty one: with the
    check off nothing rides)."""
    from zerocomm.comm.backends.mpi import MpiBackend
    n, rank = dist.get_world_size(), dist.get_rank()
    out = {}
    for way in WAYS:
        with _way(way) as unavailable, _check_off():
            if unavailable:
                out[way] = unavailable
                continue
            in_python, native = collections.Counter(), MpiBackend.NATIVE["all_reduce"]

            def counted(backend, tensor, *args, **kwargs):
                in_python[str(tensor.dtype)] += 1
                return native(backend, tensor, *args, **kwargs)

            MpiBackend.NATIVE["all_reduce"] = counted  # plans take it when they are made
            _group().forget_plans()
            wrong = []
            try:
                for dtype in UNCHECKED_DTYPES:
                    for numel in (0, 1, 7, 1000, 100_000):
                        for _ in range(2):
                            tensor = _input(rank, numel, dtype, "sum")
                            dist.all_reduce(tensor, algorithm="native")
                            if not torch.equal(tensor.double(), _expected(n, numel, dtype, "sum").double()):
                                wrong.append((str(dtype), numel, tensor[:4].tolist()))
            finally:
                MpiBackend.NATIVE["all_reduce"] = native
                _group().forget_plans()
            out[way] = {"wrong": wrong, "in python": dict(in_python)}
    return out


@pytest.mark.parametrize("world", worlds(("mpi",), (1, 2, 3)), indirect=True)
def test_with_the_check_off_a_native_all_reduce_gives_the_same_results_each_way(world):
    outs = world.run(unchecked_results_each_way, timeout=120)
    for rank, way, seen in _each_way(outs, WAYS):
        assert seen["wrong"] == [], (rank, way, seen["wrong"][:3])
        for dtype in map(str, UNCHECKED_DTYPES):
            calls = seen["in python"].get(dtype, 0)
            assert calls >= 8, (rank, way, dtype, seen)  # every non-empty call
    _skip_where_not_built(outs[0])


def late_peer_with_the_check_off() -> dict:
    """Rank 0 times out in a 1 s group's native all_reduce, check off, from the cell's cached plan (planned on
    time) while rank 1 is late, each way: a typed error in time, the tensor kept with the request MPI may still
    write through, the group unusable after, the world fine."""
    rank = dist.get_rank()
    out = {}
    for way in WAYS:
        group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=1))
        with _way(way, group) as unavailable, _check_off():
            if unavailable:
                out[way] = unavailable
            else:
                seen, backend = {}, _backend(group)
                for _ in range(2):
                    dist.all_reduce(torch.ones(2), group=group, algorithm="native")
                if rank == 1:
                    time.sleep(2.0)
                tensor, start = torch.ones(2), time.monotonic()
                try:
                    dist.all_reduce(tensor, group=group, algorithm="native")
                    seen["first"] = "done"
                except dist.CommError as error:
                    seen["first"] = (type(error).__name__, "Iallreduce" in str(error), time.monotonic() - start)
                if rank == 0:
                    seen["kept"] = any(keep is tensor for _, keep, _ in backend._orphans)
                    try:
                        dist.all_reduce(torch.ones(2), group=group)
                        seen["again"] = "done"
                    except dist.CommError as error:
                        seen["again"] = type(error).__name__
                out[way] = seen
        dist.destroy_process_group(group)
    return _with_the_world_checked(out)


@pytest.mark.parametrize("world", worlds(("mpi",), (2,)), indirect=True)
def test_a_late_peer_times_out_with_the_check_off_each_way(world):
    outs = world.run(late_peer_with_the_check_off, timeout=90)
    assert all(out["world"] == [2.0, 2.0] for out in outs), outs
    for rank, way, seen in _each_way(outs, WAYS):
        if rank == 0:
            assert seen["first"] != "done", (way, seen)
            name, names_call, took = seen["first"]
            assert name == "CommTimeoutError" and names_call and took < 3.0, (way, seen)
            assert seen["kept"] and seen["again"] == "CommTimeoutError", (way, seen)
        else:  # its call meets rank 0's posted one
            assert seen["first"] == "done", (way, seen)
    _skip_where_not_built(outs[0])
