"""Local reduction kernels against numpy: every dtype x op cell in scope, CPU (and CUDA when present)."""
import numpy as np
import pytest
import torch

from zerocomm.ops import REDUCE_OPS, finalize_, op_admits, reduce_

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int8, torch.int32, torch.int64, torch.uint8)
DTYPES = FLOATS + INTS + (torch.bool,)
# Written out again here, independently of ops/reduce.py.
ADMITTED = {
    **{d: {"sum", "avg", "product", "min", "max"} for d in FLOATS},
    **{d: {"sum", "product", "min", "max", "band", "bor", "bxor"} for d in INTS},
    torch.bool: {"min", "max", "band", "bor", "bxor"},
}
NUMPY = {
    "sum": np.add,
    "avg": np.add,
    "product": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
    "band": np.bitwise_and,
    "bor": np.bitwise_or,
    "bxor": np.bitwise_xor,
}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _pair(dtype, op, numel=50):
    """Two operands whose combination is exact in ``dtype`` (small integers, +-1/2 for product)."""
    i = np.arange(numel)
    if dtype is torch.bool:
        return (i % 3 == 0), (i % 2 == 0)
    signed = dtype is not torch.uint8
    if op == "product":
        a, b = np.where(i % 3 == 0, 2, 1), np.where((i % 2 == 0) & signed, -1, 3)
    else:
        a, b = (i * 7) % 23, (i * 5) % 19
        if signed:
            a, b = a - 11, b - 9
    return a.astype(np.int64), b.astype(np.int64)


def _wide(dtype):
    return torch.bool if dtype is torch.bool else (torch.float64 if dtype in FLOATS else torch.int64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduce_matches_numpy(dtype, device):
    for op in sorted(ADMITTED[dtype]):
        a, b = _pair(dtype, op)
        dst = torch.tensor(a).to(dtype=dtype, device=device)  # a copy: numpy keeps a
        src = torch.tensor(b).to(dtype=dtype, device=device)
        before_src = src.clone()
        out = reduce_(dst, src, op)
        assert out is dst
        assert torch.equal(src, before_src), "src must not change"
        expected = NUMPY[op](a, b)
        got = dst.to(_wide(dtype)).cpu().numpy()
        np.testing.assert_array_equal(got, expected.astype(got.dtype), err_msg=f"{dtype} {op}")


def test_min_max_propagate_nan():
    a = torch.tensor([1.0, float("nan"), 3.0])
    b = torch.tensor([float("nan"), 2.0, 0.0])
    assert torch.equal(reduce_(a.clone(), b, "min").isnan(), torch.tensor([True, True, False]))
    assert reduce_(a.clone(), b, "max")[2] == 3.0


def test_reduce_views_and_shapes():
    base = torch.arange(10, dtype=torch.float32)
    reduce_(base[2:5], torch.ones(3), "sum")
    assert base.tolist() == [0, 1, 3, 4, 5, 5, 6, 7, 8, 9]
    grid = torch.ones(2, 3, dtype=torch.int32)
    reduce_(grid, torch.arange(6, dtype=torch.int32), "max")  # same numel, viewed flat
    assert grid.reshape(-1).tolist() == [1, 1, 2, 3, 4, 5]


def test_integer_overflow_wraps():
    x = torch.tensor([200], dtype=torch.uint8)
    assert reduce_(x, torch.tensor([100], dtype=torch.uint8), "sum").item() == 44


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_op_admits_table(dtype):
    for op in REDUCE_OPS:
        reason = op_admits(op, dtype)
        if op in ADMITTED[dtype]:
            assert reason is None, (dtype, op)
        else:
            assert isinstance(reason, str) and str(dtype) in reason and op in reason, reason


def test_op_admits_messages():
    assert op_admits("band", torch.float32) == "band needs an integer or bool dtype, got torch.float32"
    assert "avg needs a floating-point dtype" in op_admits("avg", torch.int32)
    assert "bor for bool" in op_admits("sum", torch.bool)
    assert "unknown reduce op 'mean'" in op_admits("mean", torch.float32)
    assert "does not support dtype torch.complex64" in op_admits("sum", torch.complex64).replace(
        "reductions do not", "does not"
    )
    assert REDUCE_OPS == ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


def test_reduce_rejects_bad_arguments():
    with pytest.raises(ValueError, match="band needs an integer or bool dtype, got torch.float32"):
        reduce_(torch.ones(2), torch.ones(2), "band")
    with pytest.raises(ValueError, match="dtypes differ: dst is torch.float32, src is torch.float64"):
        reduce_(torch.ones(2), torch.ones(2, dtype=torch.float64), "sum")
    with pytest.raises(ValueError, match="dst has 2 elements, src has 3"):
        reduce_(torch.ones(2), torch.ones(3), "sum")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_finalize_avg_divides_once(dtype):
    x = torch.tensor([3.0, 6.0, -9.0], dtype=dtype)
    assert finalize_(x, "avg", 3) is x
    assert x.tolist() == [1.0, 2.0, -3.0]
    y = torch.tensor([3.0], dtype=dtype)
    finalize_(y, "sum", 3)
    finalize_(y, "avg", 1)
    assert y.item() == 3.0


def test_finalize_leaves_other_ops_alone_and_rejects_integer_avg():
    x = torch.tensor([5, 7], dtype=torch.int32)
    for op in ("sum", "product", "min", "max", "band", "bor", "bxor"):
        finalize_(x, op, 4)
    assert x.tolist() == [5, 7]
    with pytest.raises(ValueError, match="avg needs a floating-point dtype, got torch.int32"):
        finalize_(x, "avg", 4)


def _awkward_values(dtype: torch.dtype) -> torch.Tensor:
    """Random values of every magnitude ``dtype`` holds, with its subnormals, extremes, zeros, inf and nan."""
    info = torch.finfo(dtype)
    exponents = torch.linspace(np.log2(info.tiny) - 8, np.log2(info.max) - 1, 4000, dtype=torch.float64)
    mantissas = torch.rand(4000, generator=torch.Generator().manual_seed(5), dtype=torch.float64) + 1.0
    specials = torch.tensor([0.0, -0.0, info.tiny, info.smallest_normal / 3, info.max, -info.max,
                             float("inf"), float("-inf"), float("nan")], dtype=torch.float64)
    signs = torch.where(torch.arange(4000) % 2 == 0, 1.0, -1.0).to(torch.float64)
    return torch.cat([mantissas * 2.0 ** exponents * signs, specials]).to(dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 64])
def test_finalize_avg_gives_the_bits_of_a_true_division(dtype, n):
    # finalize_ multiplies by 1/n where n is a power of two (a third of a divide's cost): the answer must
    # still be the correctly rounded x / n, bit for bit, subnormals and specials included.
    x = _awkward_values(dtype)
    expected = x.clone().div_(n)
    got = finalize_(x.clone(), "avg", n)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    assert torch.equal(got.view(bits), expected.view(bits))
