"""Complex tensors travel as their real views (torch.view_as_real) in every collective, on every algorithm;
reductions that do not admit complex numbers raise torch's ValueError; sparse tensors are summed (as torch's gloo
does) and refused, with UnsupportedError, for every other op.

Expected values come from closed forms on integer-valued complex inputs (exact in any order).
"""
import pytest
import torch

from support.dist import STANDIN, dist
from support.worlds import worlds

pytestmark = pytest.mark.skipif(STANDIN, reason="checks zerocomm's algorithms and error types")

ALGORITHMS = ("native", "ring", "tree", "shm")
RUN_TIMEOUT_S = 120.0


def _value(rank: int, count: int) -> torch.Tensor:
    """Rank ``rank``'s input: real part rank + i, imaginary part 10 * rank - i."""
    i = torch.arange(count, dtype=torch.float64)
    return torch.complex(rank + i, 10.0 * rank - i).to(torch.complex64)


def complex_cases():
    """Every collective on complex64 with every algorithm; returns (ran, wrong, refused) lists of case names."""
    from zerocomm.comm import UnsupportedError

    n, r = dist.get_world_size(), dist.get_rank()
    total = sum(_value(q, 5) for q in range(n))
    ran, wrong, refused = [], [], []

    def case(name, run, expected, got):
        try:
            run()
        except UnsupportedError:
            refused.append(name)
            return
        ran.append(name)
        if not torch.equal(got(), expected):
            wrong.append(f"{name}: got {got().tolist()}, expected {expected.tolist()}")

    for algorithm in ALGORITHMS:
        kw = {"algorithm": algorithm}
        t = _value(r, 5)
        case(f"all_reduce SUM {algorithm}", lambda: dist.all_reduce(t, **kw), total, lambda: t)
        a = _value(r, 5).to(torch.complex128)
        case(f"all_reduce AVG {algorithm}", lambda: dist.all_reduce(a, dist.ReduceOp.AVG, **kw),
             total.to(torch.complex128) / n, lambda: a)
        b = _value(r, 3)
        case(f"broadcast {algorithm}", lambda: dist.broadcast(b, src=n - 1, **kw), _value(n - 1, 3), lambda: b)
        red = _value(r, 4)
        case(f"reduce {algorithm}", lambda: dist.reduce(red, dst=0, **kw),
             sum(_value(q, 4) for q in range(n)) if r == 0 else _value(r, 4), lambda: red)
        out = torch.empty(2 * n, dtype=torch.complex64)
        case(f"all_gather_into_tensor {algorithm}", lambda: dist.all_gather_into_tensor(out, _value(r, 2), **kw),
             torch.cat([_value(q, 2) for q in range(n)]), lambda: out)
        parts = [torch.empty(2, dtype=torch.complex64) for _ in range(n)]
        case(f"all_gather {algorithm}", lambda: dist.all_gather(parts, _value(r, 2), **kw),
             torch.cat([_value(q, 2) for q in range(n)]), lambda: torch.cat(parts))
        shard = torch.empty(2, dtype=torch.complex64)
        case(f"reduce_scatter_tensor {algorithm}",
             lambda: dist.reduce_scatter_tensor(shard, _value(r, 2 * n), **kw),
             sum(_value(q, 2 * n) for q in range(n))[2 * r:2 * r + 2], lambda: shard)
        swapped = torch.empty(n, dtype=torch.complex64)
        case(f"all_to_all_single {algorithm}", lambda: dist.all_to_all_single(swapped, _value(10 * r, n), **kw),
             torch.stack([_value(10 * q, n)[r] for q in range(n)]), lambda: swapped)
    if n > 1:
        p = _value(r, 3)
        inbox = torch.empty(3, dtype=torch.complex64)
        work = dist.isend(p, dst=(r + 1) % n)
        dist.recv(inbox, src=(r - 1) % n)
        work.wait()
        ran.append("send/recv")
        if not torch.equal(inbox, _value((r - 1) % n, 3)):
            wrong.append(f"send/recv: got {inbox.tolist()}")
    return ran, wrong, refused


def complex_errors():
    """(type name, message) of MIN/MAX/PRODUCT on complex and of MAX on a sparse tensor."""
    found = {}
    for op in ("MIN", "MAX", "PRODUCT"):
        try:
            dist.all_reduce(_value(0, 2), getattr(dist.ReduceOp, op))
            found[op] = None
        except Exception as error:  # noqa: BLE001  (the test asserts the type)
            found[op] = (isinstance(error, ValueError), str(error))
    try:
        dist.all_reduce(torch.eye(3).to_sparse(), dist.ReduceOp.MAX)
        found["sparse"] = None
    except Exception as error:  # noqa: BLE001
        found["sparse"] = (type(error).__name__, str(error))
    return found


@pytest.mark.parametrize("world", worlds(sizes=(2, 3)), indirect=True)
def test_complex_collectives(world):
    for rank, (ran, wrong, refused) in enumerate(world.run(complex_cases, timeout=RUN_TIMEOUT_S)):
        assert not wrong, f"rank {rank}: {wrong}"
        for collective in ("all_reduce SUM", "all_reduce AVG", "broadcast", "reduce", "all_gather_into_tensor",
                           "all_gather", "reduce_scatter_tensor", "all_to_all_single"):
            assert f"{collective} ring" in ran and f"{collective} native" in ran, (collective, ran, refused)
        assert "send/recv" in ran


@pytest.mark.parametrize("world", [("gloo", 2)], indirect=True)
def test_complex_refusals(world):
    for found in world.run(complex_errors):
        for op in ("MIN", "MAX", "PRODUCT"):
            is_value_error, message = found[op]
            assert is_value_error and "does not support" in message and "complex" in message, found[op]
        name, message = found["sparse"]
        assert name == "UnsupportedError" and "to_dense" in message, found["sparse"]


def sparse_sums():
    """Rank r's sparse addend has r nonzero rows (rank 0 none), each holding r: row i of the sum is
    sum(r for r > i); a (n + 1, 3) matrix with one sparse dimension, blocking and async."""
    r, n = dist.get_rank(), dist.get_world_size()
    results = []
    for async_op in (False, True):
        dense = torch.zeros(n + 1, 3)
        dense[:r] = r
        sparse = dense.to_sparse(1)
        work = dist.all_reduce(sparse, async_op=async_op)
        if work is not None:
            work.wait()
        results.append((sparse.is_sparse, sparse.to_dense().tolist()))
    return results


@pytest.mark.parametrize("world", worlds(sizes=(2, 3)), indirect=True)
def test_sparse_all_reduce_sum(world):
    n = world.world_size
    expected = [[float(sum(r for r in range(n) if r > i))] * 3 for i in range(n + 1)]
    for rank, results in enumerate(world.run(sparse_sums, timeout=RUN_TIMEOUT_S)):
        for is_sparse, dense in results:
            assert is_sparse and dense == expected, (rank, dense, expected)
