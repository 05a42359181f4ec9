"""Fused CUDA kernels of the 1-bit compressed all_reduce, through cupy (``pip install zerocomm[cuda]``).

The same three steps and the same arithmetic as the CPU codec (``ops/onebit_kernels.py``: lazy error
feedback, little-end bit order, the mean summed in rank order then divided by n), with each step's
element work in one kernel launch:

``_ENCODE``  one thread per packed byte (8 elements): ``x ← (x − copysign(pending, x)) + src`` on the
             real elements and 0 on the padding, the byte of the 8 signs, and the 8 squares added
             into a per-block partial sum (shared memory) that one atomic adds to the total.
``_MEAN``    one thread per byte of the segment: the n rows' signs times their scales, summed in
             rank order, divided by n (the server's source).
``_DECODE``  one thread per byte: 8 values ``±scale`` of its row into the output.

The scale (``sqrt(total / valid)``) stays on the device as a 0-d tensor, and the message bytes are
written by device copies, so a step never synchronizes with the host.  Kernels run on torch's
current stream.  ``cupy_codec`` returns ``None`` when cupy does not import: the whole-tensor torch
codec serves CUDA tensors then.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from .onebit_kernels import _TorchCodec

_THREADS = 256

_SOURCE = r"""
template <typename T> __device__ __forceinline__ T copysign_t(T a, T b);
template <> __device__ __forceinline__ float copysign_t<float>(float a, float b) { return copysignf(a, b); }
template <> __device__ __forceinline__ double copysign_t<double>(double a, double b) { return copysign(a, b); }

// x: nbytes*8 values; src: >= valid values; pending: 1 value or nullptr; total: 1 double
template <typename T>
__global__ void onebit_encode(T* x, const T* src, const T* pending, long long valid, long long nbytes,
                              unsigned char* bits, double* total) {
    __shared__ double partial[256];
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    double sq = 0.0;
    if (k < nbytes) {
        unsigned char byte = 0;
        for (int i = 0; i < 8; ++i) {
            long long e = 8 * k + i;
            T v = (T)0;
            if (e < valid) {
                v = x[e];
                if (pending != nullptr) v = v - copysign_t<T>(*pending, v);
                v = v + src[e];
                sq += (double)v * (double)v;
            }
            x[e] = v;
            if (v >= (T)0) byte |= (unsigned char)(1u << i);
        }
        bits[k] = byte;
    }
    partial[threadIdx.x] = sq;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(total, partial[0]);
}

// rows: n rows of `stride` bytes (signs first); scales: n values; out: nbytes*8 values
template <typename T>
__global__ void onebit_mean(const unsigned char* rows, long long stride, const T* scales, int n, long long nbytes,
                            T* out) {
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= nbytes) return;
    for (int i = 0; i < 8; ++i) {
        T acc = (T)0;
        for (int r = 0; r < n; ++r) {
            T s = scales[r];
            acc = acc + (((rows[r * stride + k] >> i) & 1) ? s : -s);
        }
        out[8 * k + i] = acc / (T)n;
    }
}

// rows as above; out: count values, element e from row e / seg
template <typename T>
__global__ void onebit_decode(const unsigned char* rows, long long stride, const T* scales, long long seg,
                              long long count, T* out) {
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= count) return;
    long long r = e / seg, j = e - r * seg;
    T s = scales[r];
    out[e] = ((rows[r * stride + j / 8] >> (j % 8)) & 1) ? s : -s;
}
"""

_NAMES = {torch.float32: "float", torch.float64: "double"}


@functools.lru_cache(maxsize=None)
def _module(type_name: str):
    import cupy

    names = [f"onebit_encode<{type_name}>", f"onebit_mean<{type_name}>", f"onebit_decode<{type_name}>"]
    module = cupy.RawModule(code=_SOURCE, options=("--std=c++14",), name_expressions=names)
    return tuple(module.get_function(name) for name in names)


def cupy_available() -> Optional[str]:
    """``None`` if the fused CUDA path can run, else why not."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a cupy built for another CUDA
        return f"cupy does not import ({type(exc).__name__}: {exc}); pip install zerocomm[cuda]"
    return None


def _ptr(t: Optional[torch.Tensor]):
    import numpy as np

    return np.uint64(0 if t is None else t.data_ptr())  # a pointer argument: 8 bytes, 0 for nullptr


class _CupyCodec(_TorchCodec):
    """The torch codec's buffers and message layout, with each step's element work in one cupy kernel."""

    def __init__(self, numel: int, n: int, rank: int, dtype: torch.dtype, device: torch.device):
        super().__init__(numel, n, rank, dtype, device)
        self.encode_kernel, self.mean_kernel, self.decode_kernel = _module(_NAMES[dtype])
        self.total = torch.empty((), dtype=torch.float64, device=device)
        self.scratch = torch.empty(self.seg, dtype=dtype, device=device)

    def _launch(self, kernel, items: int, args) -> None:
        import cupy

        if items == 0:
            return
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(self.device).cuda_stream)
        with cupy.cuda.Device(self.device.index), stream:
            kernel(((items + _THREADS - 1) // _THREADS,), (_THREADS,), args)

    def encode(self, x: torch.Tensor, src: torch.Tensor, valid: int, pending, bits: torch.Tensor) -> torch.Tensor:
        import numpy as np

        packed = torch.empty(x.numel() // 8, dtype=torch.uint8, device=self.device)
        src = src if src.dtype == self.dtype else src.to(self.dtype)
        pending = None if pending is None else pending.to(self.dtype).reshape(1).contiguous()
        self.total.zero_()
        self._launch(self.encode_kernel, packed.numel(),
                     (_ptr(x), _ptr(src), _ptr(pending), np.int64(valid), np.int64(packed.numel()),
                      _ptr(packed), _ptr(self.total)))
        bits.copy_(packed.view(bits.shape))
        if valid == 0:
            return torch.zeros((), dtype=self.dtype, device=self.device)
        return torch.sqrt(self.total / valid).to(self.dtype)

    def server(self, x: torch.Tensor, pending) -> torch.Tensor:
        import numpy as np

        scales = self.recv[:, self.seg_bytes:].clone().view(self.dtype).view(self.n)
        self._launch(self.mean_kernel, self.seg_bytes,
                     (_ptr(self.recv), np.int64(self.row), _ptr(scales), np.int32(self.n),
                      np.int64(self.seg_bytes), _ptr(self.scratch)))
        scale = self.encode(x, self.scratch, self.valid, pending, self.mine[:self.seg_bytes].view(1, -1))
        self.mine[self.seg_bytes:] = scale.reshape(1).view(torch.uint8)
        return scale

    def decode(self, tensor: torch.Tensor) -> None:
        import numpy as np

        scales = self.gathered[:, self.seg_bytes:].clone().view(self.dtype).view(self.n)
        out = tensor if tensor.dtype == self.dtype else torch.empty(self.numel, dtype=self.dtype, device=self.device)
        self._launch(self.decode_kernel, self.numel,
                     (_ptr(self.gathered), np.int64(self.row), _ptr(scales), np.int64(self.seg),
                      np.int64(self.numel), _ptr(out)))
        if out is not tensor:
            tensor.copy_(out)


def cupy_codec(numel: int, n: int, rank: int, dtype: torch.dtype, device: torch.device):
    """The fused CUDA codec, or ``None`` when cupy does not import."""
    if cupy_available() is not None:
        return None
    return _CupyCodec(numel, n, rank, dtype, device)
