"""Fused CUDA kernels of the 1-bit compressed all_reduce, through cupy (``pip install zerocomm[cuda]``).

The same three steps and the same arithmetic as the CPU codec (``ops/onebit_kernels.py``: lazy error
feedback, little-end bit order, the mean summed in rank order then divided by n), each step one kernel
launch that reads and writes every element once:

``onebit_encode``  the worker and the server step.  A thread takes a group of 4 elements (one 16-byte
                   load of float32 where aligned), so a warp reads 32 consecutive groups; ``x ← (x −
                   copysign(pending, x)) + src`` on the real elements and 0 on the padding, where ``src``
                   is the caller's tensor (worker) or, for the server, the mean of the n received rows
                   decoded on the fly (their scales read once per block into shared memory).  Two
                   neighbouring lanes join their 4 signs into one byte (a warp shuffle), written straight
                   into its message row.  Squares are summed in float64 per thread, then per warp
                   (shuffles), per block (shared memory) and once per block into the total (one atomic);
                   the last block to finish computes the scale, writes it behind every message row and
                   resets the total for the next launch.
``onebit_decode``  a thread per group of 4 output elements: one byte's nibble, ``±scale`` of its row.

The grid is one wave of resident blocks of 256 threads (4 per multiprocessor for the encode, 8 for the
decode), striding over the groups, so a launch adds a few hundred atomics at most.  The scale (``sqrt(total / valid)``, rounded once) stays on the
device as a 0-d tensor, and nothing synchronizes with the host.  Kernels run on torch's current stream.
``cupy_codec`` returns ``None`` when cupy does not import, or (with a warning) when the kernels fail to
build: the whole-tensor torch codec serves CUDA tensors then.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from .onebit_kernels import _TorchCodec

_THREADS = 256
#: Resident blocks of 256 threads per multiprocessor (the encode kernel takes 47 registers a thread, the decode
#: kernel 30, on sm_90): one wave of the whole grid, each block striding over its share.
_ENCODE_BLOCKS_PER_SM = 4
_DECODE_BLOCKS_PER_SM = 8

_SOURCE = r"""
#define FULL_MASK 0xffffffffu

template <typename T> __device__ __forceinline__ T copysign_t(T a, T b);
template <> __device__ __forceinline__ float copysign_t<float>(float a, float b) { return copysignf(a, b); }
template <> __device__ __forceinline__ double copysign_t<double>(double a, double b) { return copysign(a, b); }

// 4 consecutive values at a 16-byte aligned address
template <typename T> struct V4;
template <> struct V4<float> {
    static __device__ __forceinline__ void load(const float* p, float v[4]) {
        float4 a = *reinterpret_cast<const float4*>(p);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    }
    static __device__ __forceinline__ void store(float* p, const float v[4]) {
        *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    }
};
template <> struct V4<double> {
    static __device__ __forceinline__ void load(const double* p, double v[4]) {
        double2 a = reinterpret_cast<const double2*>(p)[0], b = reinterpret_cast<const double2*>(p)[1];
        v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
    }
    static __device__ __forceinline__ void store(double* p, const double v[4]) {
        reinterpret_cast<double2*>(p)[0] = make_double2(v[0], v[1]);
        reinterpret_cast<double2*>(p)[1] = make_double2(v[2], v[3]);
    }
};

// a scale stored behind a message row: native byte order, no alignment
template <typename T> __device__ __forceinline__ T load_scale(const unsigned char* p) {
    T s;
    unsigned char* d = reinterpret_cast<unsigned char*>(&s);
    for (int i = 0; i < (int)sizeof(T); ++i) d[i] = p[i];
    return s;
}
template <typename T> __device__ __forceinline__ void store_scale(unsigned char* p, T s) {
    const unsigned char* d = reinterpret_cast<const unsigned char*>(&s);
    for (int i = 0; i < (int)sizeof(T); ++i) p[i] = d[i];
}

// x: 4*ngroups values (state, updated in place); the first `valid` are real.
// Source: src (>= valid values) when rows == nullptr, else the mean of n rows (stride rstride bytes:
// seg_bytes bytes of signs, then the scale).  Signs: byte k into bits[(k / seg_bytes) * bstride + k % seg_bytes];
// the scale into scale_out and behind each of the nrows rows of bits.  total and count: 0 before, 0 after.
// vec: x and src are 16-byte aligned.  Dynamic shared memory: n * sizeof(T) bytes when rows != nullptr.
template <typename T>
__global__ void onebit_encode(T* x, const T* src, const unsigned char* rows, long long rstride, int n,
                              const T* pending, long long valid, long long ngroups, int vec,
                              unsigned char* bits, long long bstride, long long seg_bytes, int nrows,
                              T* scale_out, double* total, unsigned int* count) {
    extern __shared__ __align__(16) unsigned char dynamic_shared[];
    T* scales = reinterpret_cast<T*>(dynamic_shared);
    __shared__ double warp_sums[32];
    if (rows != nullptr) {
        for (int r = threadIdx.x; r < n; r += blockDim.x) scales[r] = load_scale<T>(rows + r * rstride + seg_bytes);
        __syncthreads();
    }
    const bool has_pending = pending != nullptr;
    const T p = has_pending ? *pending : (T)0;
    const int lane = threadIdx.x & 31;
    const long long warp = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const long long step = (long long)gridDim.x * blockDim.x;  // groups per sweep of the grid
    double sq = 0.0;
    for (long long base = warp * 32; base < ngroups; base += step) {  // whole warps: the shuffle needs all lanes
        const long long g = base + lane;
        unsigned int nib = 0;
        if (g < ngroups) {
            const long long e = 4 * g;
            T v[4], s[4];
            if (vec) V4<T>::load(x + e, v);
            else for (int i = 0; i < 4; ++i) v[i] = x[e + i];
            if (rows == nullptr) {
                if (vec && e + 4 <= valid) V4<T>::load(src + e, s);
                else for (int i = 0; i < 4; ++i) s[i] = (e + i < valid) ? src[e + i] : (T)0;
            } else {  // the mean of the rows, summed in rank order, then divided by n
                const long long byte = g >> 1;
                const int shift = (int)(g & 1) * 4;
                unsigned int b = (unsigned int)rows[byte] >> shift;
                T s0 = scales[0];
                for (int i = 0; i < 4; ++i) s[i] = ((b >> i) & 1u) ? s0 : -s0;
                for (int r = 1; r < n; ++r) {
                    b = (unsigned int)rows[r * rstride + byte] >> shift;
                    T sr = scales[r];
                    for (int i = 0; i < 4; ++i) s[i] = s[i] + (((b >> i) & 1u) ? sr : -sr);
                }
                for (int i = 0; i < 4; ++i) s[i] = s[i] / (T)n;
            }
            for (int i = 0; i < 4; ++i) {
                T w = (T)0;
                if (e + i < valid) {
                    w = v[i];
                    if (has_pending) w = w - copysign_t<T>(p, w);
                    w = w + s[i];
                    sq += (double)w * (double)w;
                }
                v[i] = w;
                nib |= (w >= (T)0 ? 1u : 0u) << i;
            }
            if (vec) V4<T>::store(x + e, v);
            else for (int i = 0; i < 4; ++i) x[e + i] = v[i];
        }
        const unsigned int high = __shfl_down_sync(FULL_MASK, nib, 1);
        if (g < ngroups && (lane & 1) == 0) {  // ngroups is even: the odd neighbour exists
            const long long k = g >> 1;
            const long long r = k / seg_bytes;
            bits[r * bstride + (k - r * seg_bytes)] = (unsigned char)(nib | (high << 4));
        }
    }
    for (int o = 16; o > 0; o >>= 1) sq += __shfl_down_sync(FULL_MASK, sq, o);
    if (lane == 0) warp_sums[threadIdx.x >> 5] = sq;
    __syncthreads();
    if (threadIdx.x < 32) {
        double t = threadIdx.x < (blockDim.x >> 5) ? warp_sums[threadIdx.x] : 0.0;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_down_sync(FULL_MASK, t, o);
        if (threadIdx.x == 0) {
            atomicAdd(total, t);
            __threadfence();
            const unsigned int done = atomicAdd(count, 1u);
            if (done == gridDim.x - 1) {  // the last block: every total has landed
                const double all = atomicAdd(total, 0.0);
                const T scale = valid > 0 ? (T)sqrt(all / (double)valid) : (T)0;
                *scale_out = scale;
                for (int r = 0; r < nrows; ++r) store_scale<T>(bits + r * bstride + seg_bytes, scale);
                *total = 0.0;
                *count = 0u;
            }
        }
    }
}

// rows: n rows of `stride` bytes (seg_bytes bytes of signs, then the scale); out: count values,
// element e from row e / seg.  vec: out is 16-byte aligned.  Dynamic shared memory: n * sizeof(T) bytes.
template <typename T>
__global__ void onebit_decode(const unsigned char* rows, long long stride, long long seg_bytes, int n, long long seg,
                              long long count, int vec, T* out) {
    extern __shared__ __align__(16) unsigned char dynamic_shared[];
    T* scales = reinterpret_cast<T*>(dynamic_shared);
    for (int r = threadIdx.x; r < n; r += blockDim.x) scales[r] = load_scale<T>(rows + r * stride + seg_bytes);
    __syncthreads();
    const long long groups = (count + 3) / 4;
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
         g += (long long)gridDim.x * blockDim.x) {
        const long long e = 4 * g;
        const long long r = e / seg;  // seg is a multiple of 8: a group lies in one row
        const long long j = e - r * seg;
        const unsigned int b = (unsigned int)rows[r * stride + (j >> 3)] >> (int)(j & 4);
        const T s = scales[r];
        T v[4];
        for (int i = 0; i < 4; ++i) v[i] = ((b >> i) & 1u) ? s : -s;
        if (vec && e + 4 <= count) V4<T>::store(out + e, v);
        else for (int i = 0; i < 4; ++i) if (e + i < count) out[e + i] = v[i];
    }
}
"""

_NAMES = {torch.float32: "float", torch.float64: "double"}


@functools.lru_cache(maxsize=None)
def _module(type_name: str):
    import cupy

    names = [f"onebit_encode<{type_name}>", f"onebit_decode<{type_name}>"]
    module = cupy.RawModule(code=_SOURCE, options=("--std=c++14",), name_expressions=names)
    return tuple(module.get_function(name) for name in names)


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


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


def _aligned(*tensors: Optional[torch.Tensor]) -> int:
    return int(all(t is None or t.data_ptr() % 16 == 0 for t in tensors))


class _CupyCodec(_TorchCodec):
    """The torch codec's buffers and message layout, with each step's element work in one cupy kernel."""

    def __init__(self, numel: int, n: int, rank: int, dtype: torch.dtype, device: torch.device):
        super().__init__(numel, n, rank, dtype, device)
        self.encode_kernel, self.decode_kernel = _module(_NAMES[dtype])
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device_index = index
        self.sms = _multiprocessors(index)
        self.total = torch.zeros((), dtype=torch.float64, device=device)  # the kernels leave both at 0
        self.count = torch.zeros((), dtype=torch.int32, device=device)
        self.item = torch.empty((), dtype=dtype).element_size()
        self._stream_key = None
        self._stream = None

    def _launch(self, kernel, items: int, per_sm: int, args, shared: int = 0) -> None:
        import cupy

        handle = torch.cuda.current_stream(self.device).cuda_stream
        if handle != self._stream_key:
            self._stream_key, self._stream = handle, cupy.cuda.ExternalStream(handle, self.device_index)
        blocks = max(1, min(-(-items // _THREADS), per_sm * self.sms))
        with cupy.cuda.Device(self.device_index), self._stream:
            kernel((blocks,), (_THREADS,), args, shared_mem=shared)

    def _encode(self, x: torch.Tensor, src: Optional[torch.Tensor], rows: Optional[torch.Tensor], pending,
                valid: int, bits: torch.Tensor, nrows: int) -> torch.Tensor:
        """x (whole groups of 8) from src or the mean of ``rows``; signs and scale into the ``nrows`` rows of
        ``bits`` (a (rows, self.row) buffer); the scale as a new 0-d tensor."""
        import numpy as np

        scale = torch.empty((), dtype=self.dtype, device=self.device)
        pending = None if pending is None else pending.to(self.dtype).reshape(1).contiguous()
        groups = x.numel() // 4
        self._launch(self.encode_kernel, groups, _ENCODE_BLOCKS_PER_SM,
                     (_ptr(x), _ptr(src), _ptr(rows), np.int64(self.row), np.int32(self.n), _ptr(pending),
                      np.int64(valid), np.int64(groups), np.int32(_aligned(x, src)), _ptr(bits),
                      np.int64(self.row), np.int64(self.seg_bytes), np.int32(nrows), _ptr(scale),
                      _ptr(self.total), _ptr(self.count)),
                     shared=self.n * self.item if rows is not None else 0)
        return scale

    def worker(self, tensor: torch.Tensor, x: torch.Tensor, pending) -> torch.Tensor:
        src = tensor.detach()
        src = src if src.dtype == self.dtype else src.to(self.dtype)
        return self._encode(x, src.contiguous(), None, pending, self.numel, self.send, self.n)

    def server(self, x: torch.Tensor, pending) -> torch.Tensor:
        return self._encode(x, None, self.recv, pending, self.valid, self.mine, 1)

    def decode(self, tensor: torch.Tensor) -> None:
        import numpy as np

        out = tensor if tensor.dtype == self.dtype else torch.empty(self.numel, dtype=self.dtype, device=self.device)
        self._launch(self.decode_kernel, -(-self.numel // 4), _DECODE_BLOCKS_PER_SM,
                     (_ptr(self.gathered), np.int64(self.row), np.int64(self.seg_bytes), np.int32(self.n),
                      np.int64(self.seg), np.int64(self.numel), np.int32(_aligned(out)), _ptr(out)),
                     shared=self.n * self.item)
        if out is not tensor:
            tensor.copy_(out)


def cupy_codec(numel: int, n: int, rank: int, dtype: torch.dtype, device: torch.device):
    """The fused CUDA codec, or ``None`` when cupy does not import."""
    if cupy_available() is not None:
        return None
    try:
        return _CupyCodec(numel, n, rank, dtype, device)
    except Exception as exc:  # noqa: BLE001 - cupy's compile or driver errors: the torch codec still serves
        import warnings

        warnings.warn(f"the cupy 1-bit kernels failed to build or load ({type(exc).__name__}: {exc}); "
                      "the whole-tensor torch codec serves CUDA tensors instead", RuntimeWarning, stacklevel=2)
        return None
