"""The fused codec of the 1-bit all_reduce (zerocomm.ops.onebit_kernels), without communication.

``simulate`` plays n ranks in one process: each rank's ``ErrorFeedback.worker_step`` fills its send
rows, the rows are moved as the all_to_all and all_gather would move them, then ``server_step`` and
``decode``.  Every rank's result and both error states are compared with the numpy model of the
published scheme (tests/support/onebit_reference.py).  Tolerance: the model sums the norm in float64
in one go, the codec in float32 per block then float64, which moves a scale by a few ulps, so
results and states agree to 1e-5 of the largest value (1e-12 in float64); everything else is the
same operations in the same order (the lazy update is exact, see the kernels' note).

Every test here runs twice: with the C kernels (``zerocomm.ops._onebit``, when built) and with the
numpy path forced (``NATIVE = None``); ``test_c_kernels_match_numpy_bit_for_bit`` compares the two.
"""
import numpy as np
import pytest
import torch

import zerocomm.ops.onebit as onebit
import zerocomm.ops.onebit_kernels as kernels
from support.onebit_reference import OneBitModel
from zerocomm.ops import ErrorFeedback
from zerocomm.ops.onebit_kernels import _CpuCodec, _TorchCodec, pack_signs_torch

NUMELS = (1, 13, 100, 1027, 5000)

NO_EXTENSION = ("the C extension zerocomm.ops._onebit is not built here (no C compiler when the package was "
                "installed): only the numpy path runs")


@pytest.fixture(autouse=True, params=["c", "numpy"])
def codec_path(request, monkeypatch):
    """Run the test with the C kernels, then with the numpy path."""
    if request.param == "c":
        if kernels.NATIVE is None:
            pytest.skip(NO_EXTENSION)
    else:
        monkeypatch.setattr(kernels, "NATIVE", None)
    return request.param


def _inputs(n, numel, call, dtype, seed=0):
    rng = np.random.default_rng([seed, n, numel, call])
    values = [rng.standard_normal(numel) * (1.0 + 0.7 * call) for _ in range(n)]
    if call == 0:
        for v in values:
            v[::11] = 0.0  # zero is sent as +scale
    return [torch.from_numpy(v).to(dtype) for v in values]


def simulate(states, inputs, copy=True):
    """One compressed all_reduce of ``inputs`` (one per rank) through the codecs; the results (in ``inputs``
    themselves with ``copy=False``)."""
    n = len(states)
    tensors = [x.clone() for x in inputs] if copy else inputs
    codecs = [state.worker_step(tensors[r], n, r) for r, state in enumerate(states)]
    for r in range(n):  # all_to_all: rank r's row j goes to rank j, as its row r
        for j in range(n):
            codecs[j].recv[r] = codecs[r].send[j]
    for state in states:
        state.server_step()
    for r in range(n):  # all_gather
        for j in range(n):
            codecs[r].gathered[j] = codecs[j].mine
    for r, codec in enumerate(codecs):
        codec.decode(tensors[r])
    return tensors


def _check(states, model, got, expected, what):
    work = model.dtype
    tol = 1e-5 if work == np.float32 else 1e-12
    scale = float(np.max(np.abs(expected)))
    for r, t in enumerate(got):
        rounded = torch.from_numpy(expected).to(t.dtype).double().numpy()
        np.testing.assert_allclose(t.double().numpy(), rounded, rtol=0, atol=scale * max(tol, _half_tol(t.dtype)),
                                   err_msg=f"{what}: rank {r}")
        assert torch.equal(t, got[0]), f"{what}: rank {r} differs from rank 0"
    for r, state in enumerate(states):
        for name, have, want in (("worker", state.worker_error, model.worker[r]),
                                 ("server", state.server_error, model.server[r])):
            assert have.dtype == torch.from_numpy(np.zeros(1, work)).dtype, f"{what}: {name} dtype {have.dtype}"
            np.testing.assert_allclose(have.double().numpy(), want, rtol=0,
                                       atol=max(1e-30, float(np.max(np.abs(want)))) * tol,
                                       err_msg=f"{what}: rank {r} {name} error")


def _half_tol(dtype):
    return {torch.float16: 1e-3, torch.bfloat16: 8e-3}.get(dtype, 0.0)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("numel", NUMELS)
def test_codec_matches_the_model_over_calls(n, numel):
    states = [ErrorFeedback(f"rank {r}") for r in range(n)]
    model = OneBitModel(n, numel)
    for call in range(4):
        inputs = _inputs(n, numel, call, torch.float32)
        expected = model.call([x.numpy() for x in inputs])
        _check(states, model, simulate(states, inputs), expected, f"n={n} numel={numel} call {call}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_codec_other_dtypes(dtype):
    n, numel = 3, 1027
    work = np.float64 if dtype == torch.float64 else np.float32
    states = [ErrorFeedback() for _ in range(n)]
    model = OneBitModel(n, numel, work)
    for call in range(3):
        inputs = _inputs(n, numel, call, dtype)
        expected = model.call([x.double().numpy().astype(work) for x in inputs])
        got = simulate(states, inputs)
        assert all(t.dtype == dtype for t in got)
        _check(states, model, got, expected, f"{dtype} call {call}")


def test_many_blocks_and_padding_inside_a_block(monkeypatch):
    """A tiny BLOCK: segments of several blocks, the last real element in the middle of one."""
    monkeypatch.setattr(kernels, "BLOCK", 64)
    n, numel = 3, 64 * 7 + 29
    states = [ErrorFeedback() for _ in range(n)]
    model = OneBitModel(n, numel)
    for call in range(3):
        inputs = _inputs(n, numel, call, torch.float32, seed=5)
        _check(states, model, simulate(states, inputs), model.call([x.numpy() for x in inputs]), f"call {call}")


def test_torch_codec_matches_the_model(monkeypatch):
    """The whole-tensor torch codec (what CUDA runs without cupy), forced on CPU."""
    monkeypatch.setattr(onebit, "codec_for", lambda *key: _TorchCodec(*key))
    n, numel = 3, 1027
    states = [ErrorFeedback() for _ in range(n)]
    model = OneBitModel(n, numel)
    for call in range(3):
        inputs = _inputs(n, numel, call, torch.float32, seed=9)
        _check(states, model, simulate(states, inputs), model.call([x.numpy() for x in inputs]), f"call {call}")
        assert isinstance(states[0]._codec, _TorchCodec)


def test_torch_packing_is_numpy_packbits():
    x = torch.randn(8 * 1001)
    x[::7] = 0.0
    assert pack_signs_torch(x).numpy().tobytes() == np.packbits(x.numpy() >= 0, bitorder="little").tobytes()


def test_reading_the_state_between_calls_changes_nothing():
    """Settling the lazy state (reading it) and leaving it lazy give the same later results."""
    n, numel = 2, 300
    lazy, read = [ErrorFeedback() for _ in range(n)], [ErrorFeedback() for _ in range(n)]
    for call in range(4):
        inputs = _inputs(n, numel, call, torch.float32, seed=3)
        a, b = simulate(lazy, inputs), simulate(read, inputs)
        for r in range(n):
            assert torch.equal(a[r], b[r]), f"call {call} rank {r}"
            read[r].worker_error, read[r].server_error, read[r].state_dict()  # noqa: B018 - settles
    for r in range(n):
        assert torch.equal(lazy[r].worker_error, read[r].worker_error)
        assert torch.equal(lazy[r].server_error, read[r].server_error)


def test_state_round_trip_and_negative_zero_on_load():
    n, numel = 2, 50
    states = [ErrorFeedback() for _ in range(n)]
    simulate(states, _inputs(n, numel, 0, torch.float32))
    saved = [{k: v.clone() for k, v in s.state_dict().items()} for s in states]
    saved[0]["worker_error"][3] = -0.0
    resumed = [ErrorFeedback() for _ in range(n)]
    for s, d in zip(resumed, saved):
        s.load_state_dict(d)
    assert not torch.signbit(resumed[0].worker_error[3])  # -0.0 was made +0.0
    saved[0]["worker_error"][3] = 0.0
    for s, d in zip(states, saved):
        s.load_state_dict(d)
    inputs = _inputs(n, numel, 1, torch.float32)
    inputs[0][3] = -0.0
    for a, b in zip(simulate(states, inputs), simulate(resumed, inputs)):
        assert torch.equal(a, b)


def test_a_new_size_is_refused_with_both_sizes():
    state = ErrorFeedback("bucket 2")
    simulate([state, ErrorFeedback()], [torch.ones(16), torch.ones(16)])
    with pytest.raises(ValueError, match=r"'bucket 2'.*worker_error has 16 elements, but the tensor has 32"):
        state.worker_step(torch.ones(32), 2, 0)


def test_buffers_are_reused_across_calls():
    states = [ErrorFeedback() for _ in range(2)]
    simulate(states, _inputs(2, 100, 0, torch.float32))
    codec, send, x = states[0]._codec, states[0]._codec.send, states[0]._worker_error
    simulate(states, _inputs(2, 100, 1, torch.float32))
    assert states[0]._codec is codec and codec.send is send and states[0]._worker_error is x
    assert isinstance(codec, _CpuCodec)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the cupy codec runs on CUDA tensors)")
def test_cupy_codec_matches_the_model():
    from zerocomm.ops.onebit_cuda import _CupyCodec, cupy_available

    reason = cupy_available()
    if reason is not None:
        pytest.skip(reason)
    n, numel = 3, 100003
    states = [ErrorFeedback() for _ in range(n)]
    model = OneBitModel(n, numel)
    for call in range(3):
        inputs = _inputs(n, numel, call, torch.float32, seed=11)
        got = [t.cpu() for t in simulate(states, [x.cuda() for x in inputs])]
        assert isinstance(states[0]._codec, _CupyCodec)
        states_cpu = [_CpuStateView(s) for s in states]
        _check(states_cpu, model, got, model.call([x.numpy() for x in inputs]), f"cuda call {call}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the cupy codec runs on CUDA tensors)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
# No n = 1: a world of one never reaches the codec (compressed_all_reduce returns its input first), while
# the reference model returns the input at n = 1; the codec alone would compress it.
@pytest.mark.parametrize("n, numel, offset", [(2, 1, 0), (2, 1027, 1), (3, 100003, 3), (5, 70001, 0),
                                              (4, 4099, 2), (8, 1000, 0)])
def test_cupy_codec_edge_cases(n, numel, offset, dtype):
    """Sizes with padding inside a group of 4 and of 8, empty segments, one rank, float64, and a source that is
    not 16-byte aligned (``offset`` elements into its storage: the kernel's scalar loads)."""
    from zerocomm.ops.onebit_cuda import _CupyCodec, cupy_available

    reason = cupy_available()
    if reason is not None:
        pytest.skip(reason)
    work = np.float64 if dtype == torch.float64 else np.float32
    states = [ErrorFeedback() for _ in range(n)]
    model = OneBitModel(n, numel, work)
    for call in range(3):
        inputs = _inputs(n, numel, call, dtype, seed=13)
        on_device = [torch.cat([torch.zeros(offset, dtype=dtype), x]).cuda()[offset:] for x in inputs]
        assert all(t.data_ptr() % 16 == (offset * t.element_size()) % 16 for t in on_device)
        got = [t.cpu() for t in simulate(states, on_device, copy=False)]
        assert isinstance(states[0]._codec, _CupyCodec)
        expected = model.call([x.numpy() for x in inputs])
        _check([_CpuStateView(s) for s in states], model, got, expected, f"cuda n={n} numel={numel} call {call}")


def test_cuda_kernel_source_compiles(tmp_path):
    """The cupy kernels' source, compiled ahead by nvcc for sm_90 with every template instantiated (where nvcc is
    installed): a typo shows here instead of on the first GPU that runs it."""
    import shutil
    import subprocess

    from zerocomm.ops import onebit_cuda

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed here")
    instances = []
    for t in ("float", "double"):
        instances.append(f"template __global__ void onebit_encode<{t}>({t}*, const {t}*, const unsigned char*, "
                         f"long long, int, const {t}*, long long, long long, int, unsigned char*, long long, "
                         f"long long, int, {t}*, double*, unsigned int*);")
        instances.append(f"template __global__ void onebit_decode<{t}>(const unsigned char*, long long, long long, "
                         f"int, long long, long long, int, {t}*);")
    source = tmp_path / "onebit.cu"
    source.write_text(onebit_cuda._SOURCE + "\n".join(instances) + "\n")
    done = subprocess.run([nvcc, "-std=c++14", "-arch=sm_90", "-c", str(source), "-o", str(tmp_path / "onebit.o")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


class _CpuStateView:
    """An ErrorFeedback's errors on the CPU, for ``_check``."""

    def __init__(self, state):
        self.worker_error, self.server_error = state.worker_error.cpu(), state.server_error.cpu()


# --- the C kernels against the numpy path ------------------------------------------------------------

def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _edge_inputs(n, numel, call, dtype):
    """Gradient-like values with zeros, -0.0, tiny and large values (subnormal in float16)."""
    values = _inputs(n, numel, call, torch.float64, seed=21)
    for r, v in enumerate(values):
        v[r::5] = 0.0
        v[r + 1::9] = -0.0
        v[r + 2::13] *= 1e-6
        v[r + 3::17] *= 1e3
    return [v.to(dtype) for v in values]


def _run_path(native, n, numel, dtype, monkeypatch, calls=3):
    monkeypatch.setattr(kernels, "NATIVE", native)
    states = [ErrorFeedback() for _ in range(n)]
    results = [simulate(states, _edge_inputs(n, numel, call, dtype)) for call in range(calls)]
    for state in states:
        assert (state._codec.native is not None) == (native is not None and dtype != torch.float64)
    return results, [(s.worker_error, s.server_error) for s in states]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n, numel", [(1, 13), (2, 1), (2, 8), (2, 1027), (3, 100), (4, 5000), (5, 70001),
                                      (8, 1000), (2, 2 * (1 << 18) + 4099)])
def test_c_kernels_match_numpy_bit_for_bit(n, numel, dtype, codec_path, monkeypatch):
    """Results (every rank, every call) and both error states, bit for bit; numel past two BLOCKs per
    segment, padding inside a group of 8, empty segments (n=8, numel=1000 has none; n=2, numel=1 has)."""
    if codec_path == "numpy":
        pytest.skip("compares both paths itself (runs once, under the 'c' parameter)")
    native = kernels.NATIVE
    c_results, c_states = _run_path(native, n, numel, dtype, monkeypatch)
    np_results, np_states = _run_path(None, n, numel, dtype, monkeypatch)
    for call, (c_call, np_call) in enumerate(zip(c_results, np_results)):
        for r, (a, b) in enumerate(zip(c_call, np_call)):
            assert a.dtype == b.dtype == dtype
            assert torch.equal(_bits(a), _bits(b)), f"call {call} rank {r}: {int((_bits(a) != _bits(b)).sum())} differ"
    for r, ((cw, cs), (nw, ns)) in enumerate(zip(c_states, np_states)):
        assert torch.equal(_bits(cw), _bits(nw)) and torch.equal(_bits(cs), _bits(ns)), f"rank {r} error states"


def test_c_kernels_refuse_buffers_that_do_not_fit(codec_path):
    if codec_path == "numpy":
        pytest.skip("the C kernels' own checks")
    native = kernels.NATIVE
    x, bits = np.zeros(16, np.float32), np.zeros(2, np.uint8)
    with pytest.raises(ValueError, match="whole groups of 8"):
        native.encode(np.zeros(12, np.float32), 12, None, bits, np.zeros(12, np.float32), 0)
    with pytest.raises(ValueError, match=r"valid must be in \[0, 16\], got 17"):
        native.encode(x, 17, None, bits, np.zeros(17, np.float32), 0)
    with pytest.raises(ValueError, match="16 elements need 2 bytes of signs, got 1"):
        native.encode(x, 16, None, bits[:1], np.zeros(16, np.float32), 0)
    with pytest.raises(ValueError, match="need 64 bytes, got 60"):
        native.encode(x, 16, None, bits, np.zeros(15, np.float32), 0)
    with pytest.raises(ValueError, match="kind must be 0, 1 or 2, got 7"):
        native.encode(x, 16, None, bits, np.zeros(16, np.float32), 7)
    with pytest.raises(ValueError, match="do not fit"):
        native.encode_mean(x, 16, 0.5, bits, np.zeros(4, np.uint8), 3, 0, [1.0, 1.0], 0.0)
    with pytest.raises(ValueError, match="pos and neg must be one element of 2, 4 or 8 bytes"):
        native.decode(x, bits, 16, b"abc", b"abc")
    with pytest.raises(ValueError, match="16 elements need 64 bytes of out"):
        native.decode(x[:8], bits, 16, b"abcd", b"efgh")
    with pytest.raises(TypeError):
        native.encode(x.copy().view(np.uint8)[::2], 0, None, bits, b"", 0)  # not contiguous
