"""compressed_all_reduce (1-bit with error feedback) through real process groups.

Every rank's result and its ``ErrorFeedback`` tensors after several calls are compared with a
single-process numpy model of the 4-step scheme (support/onebit_reference.py), on gloo and MPI,
world sizes 1-4, with native, ring and tree collectives underneath.  Inputs are seeded Gaussians
whose scale changes from call to call (so no compressed value lands next to 0, where an ulp of
difference in a norm could flip a sign).  Tolerances: the model computes the same float32
(float64) operations in the same order; only the norm's summation order differs, which moves a
scale by a few ulps, so results and states must agree to 1e-5 of the largest scale (1e-12 for
float64), and a half-precision result to one rounding of its dtype.  Results must be bit-identical
across ranks: every rank decompresses the same gathered bytes.

Traffic: with ``algorithm="ring"`` the counted bytes must equal 2·(n−1)·(P/(8n) + scale bytes)
exactly (P = padded length), and stay within 1/32 of the float32 ring all_reduce's bytes plus the
scales and the padding.
"""
import io

import numpy as np
import pytest
import torch

from support.dist import STANDIN, UnsupportedError, dist
from support.onebit_reference import OneBitModel, padded_numel
from support.worlds import worlds

if STANDIN:
    pytest.skip(reason="compressed_all_reduce is zerocomm's own, not torch.distributed's", allow_module_level=True)

from zerocomm.ops import ErrorFeedback  # noqa: E402

ALGORITHMS = ("native", "ring", "tree")
NUMELS = (1, 13, 100, 1027)  # none a multiple of 8n for n > 1 except by accident: padding is exercised
CALLS = 4
SEED = 1234
HALF = {torch.float16: 1e-3, torch.bfloat16: 8e-3}  # one rounding of the result to its dtype
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


def _values(rank: int, call: int, numel: int, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng([SEED, salt, rank, call, numel])
    x = rng.standard_normal(numel) * (1.0 + 0.7 * call)
    if call == 0:
        x[::11] = 0.0  # zero is compressed as +scale
    return x


def _input(rank: int, call: int, numel: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    return torch.from_numpy(_values(rank, call, numel, salt)).to(dtype)


def _np(t):
    return None if t is None else t.detach().double().numpy().copy()


# --- what the ranks run ----------------------------------------------------------------------------

def run_calls(numels, dtype_name, algorithm, calls, async_op=False, salt=0):
    """Per numel: the results of ``calls`` successive calls with one ErrorFeedback, then its state.

    Odd calls go through ``all_reduce(..., compression="onebit")``, even ones through
    ``compressed_all_reduce``.
    """
    dtype, rank = DTYPES[dtype_name], dist.get_rank()
    out = {}
    for numel in numels:
        state = ErrorFeedback(f"numel {numel}")
        results = []
        for call in range(calls):
            t = _input(rank, call, numel, dtype, salt)
            if call % 2:
                work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=async_op, algorithm=algorithm,
                                       compression="onebit", compression_state=state)
            else:
                work = dist.compressed_all_reduce(t, state, async_op=async_op, algorithm=algorithm)
            if async_op:
                work.wait()
            assert t.dtype == dtype and t.shape == (numel,)
            results.append(_np(t))
        out[numel] = (results, _np(state.worker_error), _np(state.server_error))
    return out


def run_both_paths(numels, dtype_name, algorithm, calls):
    """``run_calls`` with the C kernels, then with the numpy path forced; ``None`` without the extension."""
    import zerocomm.ops.onebit_kernels as kernels

    native = kernels.NATIVE
    if native is None:
        return None
    with_c = run_calls(numels, dtype_name, algorithm, calls)
    kernels.NATIVE = None
    try:
        with_numpy = run_calls(numels, dtype_name, algorithm, calls)
    finally:
        kernels.NATIVE = native
    return with_c, with_numpy


def run_two_in_flight(numel, algorithm):
    """Two async calls on two tensors with their own states, waited for in reverse order."""
    rank = dist.get_rank()
    a, b = _input(rank, 0, numel, torch.float32), _input(rank, 0, numel, torch.float32, salt=1)
    sa, sb = ErrorFeedback("a"), ErrorFeedback("b")
    wa = dist.compressed_all_reduce(a, sa, async_op=True, algorithm=algorithm)
    wb = dist.compressed_all_reduce(b, sb, async_op=True, algorithm=algorithm)
    wb.wait()
    wa.wait()
    return _np(a), _np(b)


def refusals():
    """(exception name, message) of each call that must be refused; nothing is communicated."""
    rank = dist.get_rank()
    got = []
    for dtype in (torch.int32, torch.int64, torch.uint8, torch.bool):
        t = torch.zeros(16, dtype=dtype)
        for call in (lambda: dist.compressed_all_reduce(t, ErrorFeedback()),
                     lambda: dist.all_reduce(t, op=dist.ReduceOp.AVG, compression="onebit",
                                             compression_state=ErrorFeedback())):
            try:
                call()
                got.append(("no error", str(dtype)))
            except Exception as exc:  # reported to the parent
                got.append((type(exc).__name__, str(exc)))
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
        try:
            dist.all_reduce(torch.ones(16), op=op, compression="onebit", compression_state=ErrorFeedback())
            got.append(("no error", str(op)))
        except Exception as exc:
            got.append((type(exc).__name__, str(exc)))
    return rank, got


def count_traffic(numel, algorithm):
    """Bytes this rank sent/received for one compressed call and one float32 all_reduce (sum)."""
    rank = dist.get_rank()
    x = _input(rank, 0, numel, torch.float32)
    with dist.count_bytes() as counter:
        dist.compressed_all_reduce(x.clone(), ErrorFeedback(), algorithm=algorithm)
        dist.all_reduce(x.clone(), algorithm=algorithm)
    c, u = counter.per_op["compressed_all_reduce"], counter.per_op["all_reduce"]
    return (c.calls, c.bytes_sent, c.bytes_received, c.measured), (u.calls, u.bytes_sent, u.bytes_received, u.measured)


def save_and_resume(numel, before, after):
    """``before`` calls, a checkpoint of the state (through torch.save), ``after`` more calls; then the
    ``after`` calls again from the loaded checkpoint in a fresh ErrorFeedback.  Both result lists."""
    rank = dist.get_rank()
    state = ErrorFeedback("bucket 0")
    for call in range(before):
        dist.compressed_all_reduce(_input(rank, call, numel, torch.float32), state, algorithm="ring")
    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)

    def continue_from(s):
        results = []
        for call in range(before, before + after):
            t = _input(rank, call, numel, torch.float32)
            dist.compressed_all_reduce(t, s, algorithm="ring")
            results.append(_np(t))
        return results

    first = continue_from(state)
    buffer.seek(0)
    resumed = ErrorFeedback("bucket 0")
    resumed.load_state_dict(torch.load(buffer))
    return first, continue_from(resumed), _np(state.worker_error), _np(resumed.worker_error)


# --- checks in the test process ---------------------------------------------------------------------

def _work_dtype(dtype):
    return np.float64 if dtype == torch.float64 else np.float32


def _check_against_model(per_rank, numels, dtype, calls, salt=0):
    n = len(per_rank)
    work = _work_dtype(dtype)
    for numel in numels:
        model = OneBitModel(n, numel, work)
        for call in range(calls):
            inputs = [_input(r, call, numel, dtype, salt).to(torch.float64).numpy().astype(work) for r in range(n)]
            expected = model.call(inputs)
            rounded = torch.from_numpy(expected).to(dtype).double().numpy()  # the result's dtype, once
            got = [per_rank[r][numel][0][call] for r in range(n)]
            what = f"n={n} numel={numel} {dtype} call {call}"
            for r in range(1, n):
                np.testing.assert_array_equal(got[r], got[0], err_msg=f"{what}: rank {r} differs from rank 0")
            scale = float(np.max(np.abs(expected))) if numel else 0.0
            atol = scale * (HALF.get(dtype, 1e-5 if work is np.float32 else 1e-12))
            np.testing.assert_allclose(got[0], rounded, rtol=0, atol=atol, err_msg=what)
            if n > 1 and numel:
                # each segment is +-(its scale): at most n distinct magnitudes
                assert len(np.unique(np.abs(expected))) <= n, what
        for r in range(n):
            _, worker, server = per_rank[r][numel]
            for name, got, want in (("worker_error", worker, model.worker[r]), ("server_error", server, model.server[r])):
                if want is None:
                    assert got is None, f"n={n} numel={numel} rank {r}: {name} should not exist"
                    continue
                assert got.shape == want.shape, f"{name} of rank {r}: shape {got.shape}, expected {want.shape}"
                tol = max(1e-30, float(np.max(np.abs(want)))) * (1e-5 if work is np.float32 else 1e-12)
                np.testing.assert_allclose(got, want, rtol=0, atol=tol,
                                           err_msg=f"n={n} numel={numel} rank {r}: {name}")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("world", worlds(), indirect=True)
def test_matches_numpy_model(world, algorithm):
    per_rank = world.run(run_calls, NUMELS, "float32", algorithm, CALLS)
    _check_against_model(per_rank, NUMELS, torch.float32, CALLS)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16", "float64"])
@pytest.mark.parametrize("world", worlds(sizes=(2, 3)), indirect=True)
def test_other_float_dtypes(world, dtype_name):
    per_rank = world.run(run_calls, (1, 13, 1027), dtype_name, "ring", 3)
    _check_against_model(per_rank, (1, 13, 1027), DTYPES[dtype_name], 3)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("world", worlds(sizes=(2, 3)), indirect=True)
def test_c_kernels_and_numpy_path_give_the_same_bits(world, dtype_name):
    """Through real process groups: every result and both error states, bit for bit (as float64 copies,
    which are exact), with the C kernels and with the numpy path (600001 elements: several blocks)."""
    numels = (13, 600001)
    per_rank = world.run(run_both_paths, numels, dtype_name, "native", 3)
    if per_rank[0] is None:
        pytest.skip("the C extension zerocomm.ops._onebit is not built here (no C compiler when the package was "
                    "installed): the numpy path is the only one")
    for r, (with_c, with_numpy) in enumerate(per_rank):
        for numel in numels:
            (c_results, c_worker, c_server), (np_results, np_worker, np_server) = with_c[numel], with_numpy[numel]
            for call, (a, b) in enumerate(zip(c_results, np_results)):
                assert np.array_equal(a, b), f"rank {r} numel {numel} call {call}: {int((a != b).sum())} differ"
            assert np.array_equal(c_worker, np_worker) and np.array_equal(c_server, np_server), f"rank {r} {numel}"


@pytest.mark.parametrize("algorithm", ["native", "ring"])
@pytest.mark.parametrize("world", worlds(sizes=(1, 4)), indirect=True)
def test_async_op(world, algorithm):
    per_rank = world.run(run_calls, (100,), "float32", algorithm, 3, async_op=True, salt=2)
    _check_against_model(per_rank, (100,), torch.float32, 3, salt=2)
    pairs = world.run(run_two_in_flight, 37, algorithm)
    n = world.world_size
    for which, salt in ((0, 0), (1, 1)):
        expected = OneBitModel(n, 37).call([_input(r, 0, 37, torch.float32, salt).numpy() for r in range(n)])
        for r in range(n):
            np.testing.assert_allclose(pairs[r][which], expected, rtol=0, atol=1e-5 * np.max(np.abs(expected)),
                                       err_msg=f"in-flight call {which}, rank {r}")


@pytest.mark.parametrize("world", worlds(sizes=(1, 2)), indirect=True)
def test_refuses_integer_dtypes_and_other_ops(world):
    dtypes = [str(d) for d in (torch.int32, torch.int64, torch.uint8, torch.bool) for _ in range(2)]
    for rank, got in world.run(refusals):
        assert [name for name, _ in got] == [UnsupportedError.__name__] * 10, got
        for dtype, (_, message) in zip(dtypes, got[:8]):  # integer and bool dtypes, both entry points
            assert f"rank {rank}" in message and dtype in message and "onebit" in message, message
        for op, (_, message) in zip(("SUM", "MAX"), got[8:]):  # op != AVG
            assert f"rank {rank}" in message and "AVG" in message and op in message, message


TRAFFIC_NUMELS = (1 << 16, 3 * 4096 + 5)


@pytest.mark.parametrize("world", worlds(sizes=(2, 3, 4)), indirect=True)
def test_counted_traffic_matches_formula(world):
    n = world.world_size
    lines = []
    for numel in TRAFFIC_NUMELS:
        padded = padded_numel(numel, n)
        formula = 2 * (n - 1) * (padded // (8 * n) + 4)  # float32 scales: 4 bytes
        for algorithm in ("ring", "native"):
            per_rank = world.run(count_traffic, numel, algorithm)
            for r, ((calls, sent, received, measured), _) in enumerate(per_rank):
                assert calls == 1
                assert measured == (algorithm == "ring"), f"{algorithm}: measured={measured}"
                assert sent == received == formula, (
                    f"n={n} numel={numel} {algorithm} rank {r}: sent {sent}, received {received}, formula {formula}")
            if algorithm != "ring":
                continue
            fp32 = [u[1] for _, u in per_rank]
            # every chunk crosses n-1 links in each phase: summed over ranks the ring moves exactly this
            assert sum(fp32) == 2 * (n - 1) * 4 * numel, f"float32 ring all_reduce bytes {fp32}"
            per_rank_fp32 = sum(fp32) / n  # = 2(n-1)/n * 4 * numel
            allowance = 2 * (n - 1) * 4 + 2 * (n - 1) * (padded - numel) / (8 * n)  # scales + padding
            assert formula <= per_rank_fp32 / 32 + allowance + 1e-9, (formula, per_rank_fp32)
            lines.append(f"n={n} numel={numel}: compressed {formula} B/rank, float32 ring "
                         f"{per_rank_fp32:.0f} B/rank, ratio 1/{per_rank_fp32 / formula:.1f}")
    print("\n" + "\n".join(lines))


@pytest.mark.parametrize("world", [pytest.param(("gloo", 3), id="gloo-3"), pytest.param(("mpi", 2), id="mpi-2")],
                         indirect=True)
def test_state_dict_round_trip_continues_identically(world):
    for r, (first, resumed, worker, worker_resumed) in enumerate(world.run(save_and_resume, 1027, 3, 4)):
        for call, (a, b) in enumerate(zip(first, resumed)):
            np.testing.assert_array_equal(a, b, err_msg=f"rank {r}, call {call} after the checkpoint")
        np.testing.assert_array_equal(worker, worker_resumed, err_msg=f"rank {r}: worker error")


@pytest.mark.parametrize("world", worlds(sizes=(3,)), indirect=True)
def test_any_inner_algorithm_serves_the_sub_collectives(world):
    """recursive_doubling has neither all_to_all nor all_gather: the ring serves both (sub_algorithm)."""
    per_rank = world.run(run_calls, (100, 1027), "float32", "recursive_doubling", 3)
    _check_against_model(per_rank, (100, 1027), torch.float32, 3)


def test_sub_algorithm_falls_back_to_ring_per_collective():
    from zerocomm.comm.algorithms import ALGORITHMS, ALGORITHM_NAMES, COMPRESSED
    from zerocomm.comm.algorithms import sub_algorithm
    from zerocomm.comm.algorithms.compressed import SUB_COLLECTIVES

    assert sub_algorithm("all_to_all", "native") == sub_algorithm("all_gather", "native") == "native"
    assert (sub_algorithm("all_to_all", "tree"), sub_algorithm("all_gather", "tree")) == ("ring", "tree")
    for inner in ALGORITHM_NAMES:
        if inner in COMPRESSED:
            continue
        for collective in SUB_COLLECTIVES:
            chosen = sub_algorithm(collective, inner)
            assert chosen == "native" or (collective, chosen) in ALGORITHMS, (collective, inner, chosen)
            assert chosen in (inner, "ring"), (collective, inner, chosen)
