"""1-bit sign packing, compression and error feedback (zerocomm.ops.onebit)."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from zerocomm.ops.onebit import (
    ErrorFeedback,
    compress,
    decompress,
    onebit_padded_numel,
    pack_signs,
    pack_signs_numpy,
    unpack_signs,
    unpack_signs_numpy,
)

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
LENGTHS = [0, 1, 7, 8, 9, 1023]


def _random(n, dtype, seed=0):
    """Gaussian values with exact zeros and negative zeros sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    x[::5] = 0.0
    x[2::7] = -0.0
    return x.to(dtype)


def _numpy(x):
    # numpy has no bfloat16; the widening keeps every sign.
    return (x.float() if x.dtype == torch.bfloat16 else x).numpy()


# ---- packing ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", LENGTHS)
def test_pack_unpack_round_trip(dtype, n):
    x = _random(n, dtype, seed=n)
    packed = pack_signs(x)
    assert packed.dtype == torch.uint8 and packed.shape == (math.ceil(n / 8),)
    signs = unpack_signs(packed, n, dtype=dtype)
    assert signs.dtype == dtype and signs.shape == (n,)
    assert torch.equal(signs, torch.where(x >= 0, 1.0, -1.0).to(dtype))


def test_zero_and_negative_zero_count_positive_nan_negative():
    assert pack_signs(torch.zeros(8)).tolist() == [255]
    assert pack_signs(torch.full((8,), -0.0)).tolist() == [255]
    assert pack_signs(torch.tensor([float("nan")] + [1.0] * 7)).tolist() == [254]
    assert unpack_signs(pack_signs(torch.tensor([0.0, -0.0])), 2).tolist() == [1.0, 1.0]


def test_bit_order_is_little_end_and_padding_bits_are_zero():
    # Element 8k + i lives in bit i of byte k.
    for i in range(8):
        x = -torch.ones(8)
        x[i] = 1
        assert pack_signs(x).tolist() == [1 << i]
    assert pack_signs(torch.ones(9)).tolist() == [255, 1]
    assert pack_signs(torch.tensor([1.0, -1.0, 1.0])).tolist() == [0b101]
    assert pack_signs(-torch.ones(15)).tolist() == [0, 0]


def test_pack_reads_any_shape_in_row_major_order():
    x = _random(24, torch.float32).reshape(4, 6)
    assert torch.equal(pack_signs(x), pack_signs(x.reshape(-1)))
    t = x.t()  # non-contiguous
    assert torch.equal(pack_signs(t), pack_signs(t.contiguous().reshape(-1)))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", LENGTHS + [4096 + 3])
def test_torch_and_numpy_packing_are_byte_identical(dtype, n):
    x = _random(n, dtype, seed=7 + n)
    ours = pack_signs(x).numpy()
    theirs = pack_signs_numpy(_numpy(x))
    assert theirs.dtype == np.uint8
    assert ours.tobytes() == theirs.tobytes()
    back = unpack_signs_numpy(theirs, n, dtype=np.float64)
    assert np.array_equal(back, unpack_signs(torch.from_numpy(ours), n, dtype=torch.float64).numpy())


def test_unpack_reads_a_prefix_of_a_longer_buffer():
    x = _random(40, torch.float32)
    packed = pack_signs(x)
    assert torch.equal(unpack_signs(packed, 13), torch.where(x[:13] >= 0, 1.0, -1.0))
    assert np.array_equal(unpack_signs_numpy(packed.numpy(), 13), unpack_signs(packed, 13).numpy())


def test_unpack_errors_name_the_values():
    with pytest.raises(ValueError, match="17 elements need 3 packed bytes, but packed has 2"):
        unpack_signs(torch.zeros(2, dtype=torch.uint8), 17)
    with pytest.raises(ValueError, match="17 elements need 3 packed bytes, but packed has 2"):
        unpack_signs_numpy(np.zeros(2, dtype=np.uint8), 17)
    with pytest.raises(ValueError, match="must be uint8, got torch.int8"):
        unpack_signs(torch.zeros(2, dtype=torch.int8), 8)
    with pytest.raises(ValueError, match="got torch.uint8"):
        unpack_signs(torch.zeros(2, dtype=torch.uint8), 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="numel must be an int >= 0, got -1"):
        unpack_signs(torch.zeros(2, dtype=torch.uint8), -1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_matches_cpu(dtype):
    x = _random(1023, dtype)
    packed = pack_signs(x.cuda())
    assert packed.is_cuda and torch.equal(packed.cpu(), pack_signs(x))
    assert torch.equal(unpack_signs(packed, 1023, dtype=dtype).cpu(), unpack_signs(pack_signs(x), 1023, dtype=dtype))
    p, s = compress(x.cuda())
    assert s.is_cuda and torch.equal(p.cpu(), pack_signs(x))


# ---- padding rule ----------------------------------------------------------


@pytest.mark.parametrize(
    "numel, world_size, expected",
    [(0, 1, 0), (0, 4, 0), (1, 1, 8), (8, 1, 8), (9, 1, 16), (100, 3, 120), (48, 3, 48), (49, 3, 72), (1023, 4, 1024)],
)
def test_padded_numel_table(numel, world_size, expected):
    assert onebit_padded_numel(numel, world_size) == expected


def test_padded_numel_is_the_smallest_whole_byte_split():
    for world_size in range(1, 9):
        unit = 8 * world_size
        for numel in range(0, 3 * unit + 2):
            p = onebit_padded_numel(numel, world_size)
            assert p % unit == 0 and numel <= p < numel + unit


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_each_rank_chunk_is_a_whole_byte_slice_of_the_packed_bucket(world_size):
    numel = 101
    p = onebit_padded_numel(numel, world_size)
    x = F.pad(_random(numel, torch.float32), (0, p - numel))
    packed = pack_signs(x)
    seg = p // world_size
    for r in range(world_size):
        assert torch.equal(packed[r * seg // 8 : (r + 1) * seg // 8], pack_signs(x[r * seg : (r + 1) * seg]))


def test_padded_numel_rejects_bad_arguments():
    with pytest.raises(ValueError, match="world_size must be an int >= 1, got 0"):
        onebit_padded_numel(10, 0)
    with pytest.raises(ValueError, match="numel must be an int >= 0, got -5"):
        onebit_padded_numel(-5, 2)


# ---- compress / decompress -------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", LENGTHS)
def test_compress_scale_matches_numpy(dtype, n):
    x = _random(n, dtype, seed=3 * n + 1)
    packed, scale = compress(x)
    wide = np.float64 if dtype == torch.float64 else np.float32
    assert scale.shape == () and scale.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    ref = np.linalg.norm(_numpy(x).astype(wide)) / np.sqrt(n) if n else 0.0
    rtol = 1e-12 if dtype == torch.float64 else 1e-6
    assert scale.item() == pytest.approx(float(ref), rel=rtol, abs=0.0)
    assert torch.equal(packed, pack_signs(x))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", LENGTHS)
def test_decompress_writes_scale_times_sign(dtype, n):
    x = _random(n, dtype, seed=n + 11)
    packed, scale = compress(x)
    out = torch.full((n,), 123.0, dtype=dtype)
    assert decompress(packed, scale, n, out) is out
    expected = (torch.where(x >= 0, 1.0, -1.0).double() * scale.double()).to(dtype)
    assert torch.equal(out, expected)


def test_decompress_into_shaped_out_and_python_scale():
    x = _random(12, torch.float32).reshape(3, 4)
    packed, _ = compress(x)
    out = decompress(packed, 0.5, 12, torch.empty(3, 4))
    assert torch.equal(out, torch.where(x >= 0, 0.5, -0.5))
    with pytest.raises(ValueError, match="out must have 12 elements, got 11"):
        decompress(packed, 0.5, 12, torch.empty(11))
    with pytest.raises(ValueError, match="floating"):
        compress(torch.ones(3, dtype=torch.int32))


def test_compress_empty():
    packed, scale = compress(torch.empty(0))
    assert packed.numel() == 0 and scale.item() == 0.0
    assert decompress(packed, scale, 0, torch.empty(0)).numel() == 0


# ---- error feedback --------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1023])
def test_worker_residual_is_exactly_x_minus_decompressed(dtype, n):
    ef = ErrorFeedback(name="bucket 0")
    assert ef.worker_error is None
    for step in range(4):
        g = _random(n, dtype, seed=100 * step + n)
        before = g.clone()
        err = torch.zeros(n, dtype=dtype) if ef.worker_error is None else ef.worker_error.clone()
        packed, scale = ef.compensate_and_compress(g)
        assert torch.equal(g, before + err)  # compensated in place
        sent = decompress(packed, scale, n, torch.empty(n, dtype=dtype))
        assert ef.worker_error.dtype == dtype and ef.worker_error.shape == (n,)
        assert torch.equal(ef.worker_error, g - sent)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_server_residual_is_exactly_segment_minus_decompressed(dtype):
    ef = ErrorFeedback()
    ef.compensate_and_compress(torch.ones(48, dtype=dtype))  # worker side sized to the bucket
    for step in range(3):
        seg = _random(16, dtype, seed=step)
        before = seg.clone()
        err = torch.zeros(16, dtype=dtype) if ef.server_error is None else ef.server_error.clone()
        packed, scale = ef.server_compensate_and_compress(seg)
        assert torch.equal(seg, before + err)
        assert ef.server_error.shape == (16,) and ef.worker_error.shape == (48,)
        assert torch.equal(ef.server_error, seg - decompress(packed, scale, 16, torch.empty(16, dtype=dtype)))


def test_error_feedback_rejects_size_changes_and_strided_input():
    ef = ErrorFeedback(name="bucket 3")
    ef.compensate_and_compress(torch.ones(16))
    with pytest.raises(ValueError, match=r"'bucket 3'.*worker_error has 16 elements, but the tensor has 24"):
        ef.compensate_and_compress(torch.ones(24))
    with pytest.raises(ValueError, match="contiguous"):
        ErrorFeedback().compensate_and_compress(torch.ones(4, 4).t())


def test_state_dict_round_trip_continues_identically():
    a = ErrorFeedback()
    assert a.state_dict() == {"worker_error": None, "server_error": None}
    grads = [_random(64, torch.float32, seed=s) for s in range(6)]
    for g in grads[:3]:
        a.compensate_and_compress(g.clone())
        a.server_compensate_and_compress(g[:32].clone())
    saved = {k: v.clone() for k, v in a.state_dict().items()}

    b = ErrorFeedback()
    b.load_state_dict(saved)
    saved["worker_error"].fill_(7)  # the loaded copy must not alias the dict
    assert not torch.equal(b.worker_error, saved["worker_error"])
    for g in grads[3:]:
        pa, sa = a.compensate_and_compress(g.clone())
        pb, sb = b.compensate_and_compress(g.clone())
        assert torch.equal(pa, pb) and torch.equal(sa, sb)
        qa, ta = a.server_compensate_and_compress(g[:32].clone())
        qb, tb = b.server_compensate_and_compress(g[:32].clone())
        assert torch.equal(qa, qb) and torch.equal(ta, tb)
    assert torch.equal(a.worker_error, b.worker_error) and torch.equal(a.server_error, b.server_error)


def test_state_dict_through_torch_save_and_dtype_move(tmp_path):
    a = ErrorFeedback()
    a.compensate_and_compress(_random(24, torch.float32))
    torch.save(a.state_dict(), tmp_path / "ef.pt")
    b = ErrorFeedback()
    b.load_state_dict(torch.load(tmp_path / "ef.pt"))
    assert b.server_error is None and torch.equal(b.worker_error, a.worker_error)
    c = ErrorFeedback()
    c.load_state_dict({"worker_error": a.worker_error.double(), "server_error": None})
    c.compensate_and_compress(torch.zeros(24))  # a float64 checkpoint moves to the tensor's dtype
    assert c.worker_error.dtype == torch.float32


def test_load_state_dict_rejects_bad_input():
    ef = ErrorFeedback()
    with pytest.raises(ValueError, match=r"missing keys \['server_error'\], unexpected keys \['extra'\]"):
        ef.load_state_dict({"worker_error": None, "extra": 1})
    with pytest.raises(ValueError, match="worker_error must be a 1-D floating tensor or None"):
        ef.load_state_dict({"worker_error": torch.zeros(2, 2), "server_error": None})


def test_worker_error_stays_bounded_over_200_steps():
    gen = torch.Generator().manual_seed(1234)
    ef = ErrorFeedback()
    norms = []
    for _ in range(200):
        g = torch.randn(1000, generator=gen)
        ef.compensate_and_compress(g)
        norms.append(ef.worker_error.norm().item())
    first, second = max(norms[:100]), max(norms[100:])
    assert math.isfinite(second) and second <= 1.5 * first
    # A unit Gaussian gradient of 1000 elements has norm ~31.6; the error settles near it.
    assert second < 3 * math.sqrt(1000)


def _simulate_onebit_allreduce(xs, efs):
    """In-process reference of the 1-bit scheme's four steps (comm/algorithms/compressed.py) over len(xs) ranks; returns the padded result."""
    n, numel, dtype = len(xs), xs[0].numel(), xs[0].dtype
    padded = onebit_padded_numel(numel, n)
    seg = padded // n
    msgs = [ef.compensate_and_compress(F.pad(x, (0, padded - numel))) for ef, x in zip(efs, xs)]  # step 1
    outs = []
    for r in range(n):  # step 2 (all_to_all of byte chunks) and step 3 on rank r
        chunks = [
            decompress(p[r * seg // 8 : (r + 1) * seg // 8], s, seg, torch.empty(seg, dtype=dtype)) for p, s in msgs
        ]
        outs.append(efs[r].server_compensate_and_compress(torch.stack(chunks).mean(0)))
    return torch.cat([decompress(p, s, seg, torch.empty(seg, dtype=dtype)) for p, s in outs])  # step 4


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_simulated_allreduce_tracks_the_true_mean(world_size):
    # With both errors starting at 0, the sum of outputs over steps telescopes to
    # sum of true means - mean(worker errors) - server errors: the compression
    # error never accumulates, however many steps run.
    numel, steps = 37, 200
    gen = torch.Generator().manual_seed(world_size)
    efs = [ErrorFeedback(name=f"rank {r}") for r in range(world_size)]
    padded = onebit_padded_numel(numel, world_size)
    sum_out = torch.zeros(padded, dtype=torch.float64)
    sum_true = torch.zeros(padded, dtype=torch.float64)
    drift = []
    for _ in range(steps):
        xs = [torch.randn(numel, generator=gen, dtype=torch.float64) for _ in range(world_size)]
        sum_true[:numel] += torch.stack(xs).mean(0)
        sum_out += _simulate_onebit_allreduce([x.clone() for x in xs], efs)
        drift.append((sum_out - sum_true).norm().item())
    residual = torch.stack([ef.worker_error for ef in efs]).mean(0) + torch.cat([ef.server_error for ef in efs])
    torch.testing.assert_close(sum_out - sum_true, -residual, rtol=0, atol=1e-9)
    assert max(drift[100:]) <= 1.5 * max(drift[:100])
