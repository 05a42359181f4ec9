"""Block-wise int8/int4 quantization (zerocomm.ops.quantize) against a numpy reference written from the
definition: per block, scale = max|x| / qmax in float32, code = round-half-even(x / scale) clamped.

Every test runs on both CPU paths: the C kernels (ops/_quantize.c) and the torch ops (CUDA's path)."""
import numpy as np
import pytest
import torch

from zerocomm.ops import quantize as quantize_module
from zerocomm.ops.quantize import (BlockFeedback, code_bytes, dequantize_blocks, quantize_blocks,
                                   quantized_nbytes, split_payload)

_BUILT = quantize_module.NATIVE


@pytest.fixture(autouse=True, params=["c", "torch"])
def path(request, monkeypatch):
    """Which CPU kernels the test runs: the C extension (skipped where it was not built) or torch's ops."""
    if request.param == "c":
        if _BUILT is None:
            pytest.skip("the C extension zerocomm.ops._quantize was not built (pip install -e . builds it)")
        monkeypatch.setattr(quantize_module, "NATIVE", _BUILT)
    else:
        monkeypatch.setattr(quantize_module, "NATIVE", None)
    return request.param

LENGTHS = [0, 1, 7, 64, 65, 1000]
BLOCKS = [2, 16, 64]


def _reference(x: np.ndarray, bits: int, block: int):
    """(codes as int8 per element, float32 scales, decoded float32) from first principles."""
    qmax = np.float32(2 ** (bits - 1) - 1)
    blocks = -(-len(x) // block)
    padded = np.zeros(blocks * block, dtype=np.float32)
    padded[:len(x)] = x.astype(np.float32)
    padded = padded.reshape(blocks, block)
    scales = (np.abs(padded).max(axis=1) / qmax).astype(np.float32) if blocks else np.zeros(0, np.float32)
    codes = np.zeros_like(padded, dtype=np.int8)
    for b in range(blocks):
        if scales[b] > 0:
            codes[b] = np.clip(np.round(padded[b] / scales[b]), -qmax, qmax).astype(np.int8)
    decoded = (codes.astype(np.float32) * scales[:, None]).reshape(-1)[:len(x)]
    return codes.reshape(-1), scales, decoded


def _pack4(codes: np.ndarray) -> np.ndarray:
    nibbles = (codes.astype(np.int16) + 8).astype(np.uint8).reshape(-1, 2)
    return nibbles[:, 0] | (nibbles[:, 1] << 4)


def _input(n: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.logspace(-3, 2, max(n, 1))[:n]  # blocks of very different ranges
    if n > 20:
        x[16:32] = 0.0  # a block of zeros (scale 0)
        x[5] = 0.5 * x[4].abs().clamp(min=1e-3) * 254 / 127  # ties to round
    return x.to(dtype)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("n", LENGTHS)
def test_codes_scales_and_values_match_numpy(bits, block, n):
    x = _input(n)
    codes, scales = quantize_blocks(x, bits=bits, block=block)
    ref_codes, ref_scales, ref_decoded = _reference(x.numpy(), bits, block)
    np.testing.assert_array_equal(scales.numpy(), ref_scales)
    expected_codes = ref_codes if bits == 8 else _pack4(ref_codes)
    np.testing.assert_array_equal(codes.numpy(), expected_codes)
    assert codes.numel() == code_bytes(n, bits, block)
    decoded = dequantize_blocks(codes, scales, bits=bits, block=block, numel=n)
    np.testing.assert_array_equal(decoded.numpy(), ref_decoded)
    if n:  # the error bound of rounding: half a step of the block's scale
        step = np.repeat(ref_scales, block)[:n]
        assert np.all(np.abs(decoded.numpy() - x.numpy()) <= step / 2 * (1 + 1e-6))


@pytest.mark.parametrize("bits", [8, 4])
def test_one_buffer_holds_codes_then_scales(bits):
    x = _input(200, seed=3)
    payload = torch.full((quantized_nbytes(200, bits, 32),), 0xAB, dtype=torch.uint8)
    quantize_blocks(x, bits=bits, block=32, out=payload)
    codes, scales = split_payload(payload, 200, bits=bits, block=32)
    ref_codes, ref_scales, ref_decoded = _reference(x.numpy(), bits, 32)
    np.testing.assert_array_equal(scales.numpy(), ref_scales)
    np.testing.assert_array_equal(codes.numpy(), ref_codes if bits == 8 else _pack4(ref_codes))
    np.testing.assert_array_equal(dequantize_blocks(codes, scales, bits=bits, block=32, numel=200).numpy(),
                                  ref_decoded)


def test_several_payloads_decode_at_once():
    """Ranks' payloads laid end to end (whole blocks each) decode in one call, as the quantized all_gather does."""
    parts = [_input(64, seed=s) for s in range(3)]
    coded = [quantize_blocks(p, bits=8, block=16) for p in parts]
    codes = torch.cat([c for c, _ in coded])
    scales = torch.cat([s for _, s in coded])
    decoded = dequantize_blocks(codes, scales, bits=8, block=16, numel=192, dtype=torch.bfloat16)
    expected = np.concatenate([_reference(p.numpy(), 8, 16)[2] for p in parts])
    np.testing.assert_array_equal(decoded.float().numpy(), torch.tensor(expected).bfloat16().float().numpy())


@pytest.mark.parametrize("bits", [8, 4])
def test_subnormal_blocks_are_clamped_like_numpy(bits):
    """A block whose largest magnitude is subnormal gets a coarsely rounded scale: x / scale can pass qmax, and
    the codes are clamped (as the reference's clip); a block too small for any scale codes as zeros."""
    ulp = np.float32(1.4e-45)  # the smallest subnormal
    qmax = 2 ** (bits - 1) - 1
    x = np.zeros(64, np.float32)
    x[:16] = ulp * np.arange(-qmax * 3 // 2, qmax * 3 // 2, qmax * 3 // 16 or 1, dtype=np.float32)[:16]
    x[:16][0] = -ulp * (qmax * 3 // 2)  # max|x| / qmax rounds down to one ulp: x / scale is 1.5 qmax
    assert np.abs(x[:16] / (np.abs(x[:16]).max() / np.float32(qmax))).max() > qmax  # the clamp is exercised
    x[16:32] = ulp                                                          # too small for a scale: 0
    x[32:48] = np.linspace(-2e-39, 1e-39, 16, dtype=np.float32)
    x[48:] = np.linspace(-1, 1, 16, dtype=np.float32)
    codes, scales = quantize_blocks(torch.from_numpy(x), bits=bits, block=16)
    ref_codes, ref_scales, ref_decoded = _reference(x, bits, 16)
    np.testing.assert_array_equal(scales.numpy(), ref_scales)
    np.testing.assert_array_equal(codes.numpy(), ref_codes if bits == 8 else _pack4(ref_codes))
    decoded = dequantize_blocks(codes, scales, bits=bits, block=16, numel=64)
    np.testing.assert_array_equal(decoded.numpy(), ref_decoded)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_block_never_decodes_finite(bits, bad):
    x = torch.linspace(-1, 1, 48)
    x[20] = bad
    codes, scales = quantize_blocks(x, bits=bits, block=16)
    decoded = dequantize_blocks(codes, scales, bits=bits, block=16, numel=48)
    assert not torch.isfinite(decoded[16:32]).any()
    ref_codes, ref_scales, ref_decoded = _reference(x.numpy()[np.r_[0:16, 32:48]], bits, 16)
    np.testing.assert_array_equal(decoded[np.r_[0:16, 32:48]].numpy(), ref_decoded)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("n", [1, 65, 1000])
def test_decoding_adds_into_out(bits, n):
    """add=True: out + decoded, one float32 rounding each (the sum of ranks' codes without a temporary)."""
    x, base = _input(n, seed=11), _input(n, seed=12)
    codes, scales = quantize_blocks(x, bits=bits, block=16)
    out = base.clone()
    assert dequantize_blocks(codes, scales, bits=bits, block=16, numel=n, out=out, add=True) is out
    expected = (base.numpy() + _reference(x.numpy(), bits, 16)[2]).astype(np.float32)
    np.testing.assert_array_equal(out.numpy(), expected)
    strided = torch.zeros(2 * n)[::2]  # not contiguous: decoded apart, then added
    dequantize_blocks(codes, scales, bits=bits, block=16, numel=n, out=strided, add=True)
    np.testing.assert_array_equal(strided.numpy(), _reference(x.numpy(), bits, 16)[2])
    with pytest.raises(ValueError, match="add=True"):
        dequantize_blocks(codes, scales, bits=bits, block=16, numel=n, add=True)


@pytest.mark.skipif(_BUILT is None, reason="the C extension zerocomm.ops._quantize was not built")
@pytest.mark.parametrize("bits", [8, 4])
def test_c_and_torch_give_the_same_bytes(bits, path, monkeypatch):
    """A large input of odd length with ties, zeros and wide ranges: the two paths' payloads are equal."""
    if path != "c":
        pytest.skip("compares both paths once")
    x = _input(100_003, seed=13)
    nbytes = quantized_nbytes(x.numel(), bits, 256)
    payloads = []
    for native in (_BUILT, None):
        monkeypatch.setattr(quantize_module, "NATIVE", native)
        payload = torch.empty(nbytes, dtype=torch.uint8)
        quantize_blocks(x, bits=bits, block=256, out=payload)
        codes, scales = split_payload(payload, x.numel(), bits=bits, block=256)
        payloads.append((payload, dequantize_blocks(codes, scales, bits=bits, block=256, numel=x.numel())))
    assert torch.equal(payloads[0][0], payloads[1][0])
    assert torch.equal(payloads[0][1], payloads[1][1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_dtypes_are_quantized_in_float32(dtype):
    x = _input(100, seed=5, dtype=dtype)
    codes, scales = quantize_blocks(x, bits=8, block=16)
    ref_codes, ref_scales, _ = _reference(x.to(torch.float32).numpy(), 8, 16)
    np.testing.assert_array_equal(codes.numpy(), ref_codes)
    np.testing.assert_array_equal(scales.numpy(), ref_scales)


@pytest.mark.parametrize("bits", [8, 4])
def test_error_feedback_carries_what_the_codes_lost(bits):
    """Against numpy: e_k = (x_k + e_{k-1}) - decode(quantize(x_k + e_{k-1})); the decoded sum over k calls
    equals the input sum minus the last error."""
    feedback = BlockFeedback(bits=bits, block=16, name="bucket 0")
    error = np.zeros(100, np.float32)
    sent, inputs = np.zeros(100, np.float64), np.zeros(100, np.float64)
    for k in range(5):
        x = _input(100, seed=10 + k)
        codes, scales = feedback.quantize(x)
        compensated = (x.numpy() + error).astype(np.float32)
        ref_codes, ref_scales, ref_decoded = _reference(compensated, bits, 16)
        np.testing.assert_array_equal(scales.numpy(), ref_scales)
        np.testing.assert_array_equal(codes.numpy(), ref_codes if bits == 8 else _pack4(ref_codes))
        error = compensated - ref_decoded
        np.testing.assert_allclose(feedback.error.numpy(), error, rtol=0, atol=0)
        sent += ref_decoded
        inputs += x.numpy()
    np.testing.assert_allclose(sent, inputs - error, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="bucket 0"):
        feedback.quantize(torch.zeros(99))


@pytest.mark.parametrize("kwargs, words", [
    ({"bits": 3, "block": 16}, ["bits", "3"]),
    ({"bits": 4, "block": 15}, ["even", "15"]),
    ({"bits": 8, "block": 0}, ["block", "0"]),
])
def test_bad_arguments_are_named(kwargs, words):
    with pytest.raises(ValueError) as info:
        quantize_blocks(torch.zeros(4), **kwargs)
    for word in words:
        assert word in str(info.value)
    with pytest.raises(ValueError, match="1-D floating"):
        quantize_blocks(torch.zeros(2, 2), bits=8, block=4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("bits", [8, 4])
def test_cuda_codes_equal_the_cpu_codes(bits):
    """The kernels are torch code: on a GPU they must give the CPU's codes and values bit for bit (IEEE float32
    division, round half to even on both)."""
    x = _input(10_000, seed=7)
    codes, scales = quantize_blocks(x, bits=bits, block=256)
    gpu_codes, gpu_scales = quantize_blocks(x.cuda(), bits=bits, block=256)
    assert torch.equal(gpu_codes.cpu(), codes) and torch.equal(gpu_scales.cpu(), scales)
    decoded = dequantize_blocks(gpu_codes, gpu_scales, bits=bits, block=256, numel=10_000)
    assert torch.equal(decoded.cpu(), dequantize_blocks(codes, scales, bits=bits, block=256, numel=10_000))


def test_the_kernels_leave_storage_resizable():
    """Stage 3 frees a gathered unit by resizing its storage to 0 bytes: decoding into it must not pin its size."""
    full = torch.zeros(64)
    codes, scales = quantize_blocks(full[:32], bits=8, block=16)
    dequantize_blocks(codes, scales, bits=8, block=16, numel=32, out=full[32:])
    full.untyped_storage().resize_(0)
    assert full.untyped_storage().nbytes() == 0
