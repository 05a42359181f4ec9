/* zerocomm.ops._quantize: block-wise int8/int4 quantization on the CPU, one pass over the data each way.
 *
 * Optional: zerocomm.ops.quantize uses these for contiguous float32 CPU tensors when the module imports,
 * and whole-tensor torch ops otherwise.  Both give the same bits (tests/ops/test_quantize.py checks both
 * against numpy), so everything here follows the definition's order of operations exactly:
 *
 *   quantize    per block of `block` elements (the last one zero-padded): amax = max |x|;
 *               scale = amax / qmax (a float32 division); code = round-half-even(clamp(x / scale,
 *               -qmax, qmax)), or 0 for the whole block when scale is 0 (a block of zeros, or of
 *               subnormals too small for a scale).  A block holding an infinity or a NaN gets that
 *               as its scale and codes 0, so it decodes to NaN: a non-finite input never decodes finite.
 *               int8: one signed byte a code; int4: code + 8 in a nibble, element 2i low, 2i+1 high.
 *   dequantize  out[i] = code * scale, or out[i] = out[i] + code * scale (two roundings, as numpy).
 *
 * A block's maximum is taken over the magnitudes' bit patterns as integers (for floats that are not
 * NaN the order is the same, and a NaN's pattern is above infinity's): an integer max vectorises
 * without fast-math.  Rounding adds and subtracts 1.5 * 2^23, which rounds half to even in the
 * default rounding mode for |v| < 2^22 (here |v| <= 127).  Compiled with -ffp-contract=off: no
 * multiply-add is fused.  Every loop runs with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
/* One build runs everywhere: the loader picks the AVX2 copy where the CPU has it. */
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

#define MAGIC 12582912.0f /* 1.5 * 2^23 */
#define MAGIC_BITS 0x4B400000u

static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* |x| as bits, maximum over m elements. */
static inline __attribute__((always_inline)) uint32_t
absmax_bits(const float *restrict x, Py_ssize_t m) {
    uint32_t mx = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        uint32_t u = f32_bits(x[i]) & 0x7fffffffu;
        mx = u > mx ? u : mx;
    }
    return mx;
}

/* round-half-even(clamp(x / scale, -q, q)) as an int32, clamped after rounding (the same for integer
 * bounds, and integer min/max vectorise).  |x / scale| stays below 2q: a scale rounded from a subnormal
 * amax / q is at least 2/3 of it, or 0 (then no code is computed). */
static inline __attribute__((always_inline)) int32_t
code_of(float x, float scale, int32_t q) {
    int32_t r = (int32_t)(f32_bits(x / scale + MAGIC) - MAGIC_BITS);
    r = r < -q ? -q : r;
    return r > q ? q : r;
}

/* The scale of a block whose largest magnitude has bits mx; *zero set when its codes are all 0. */
static inline float
block_scale(uint32_t mx, int32_t q, int *zero) {
    float amax = bits_f32(mx);
    if (mx >= 0x7f800000u) { /* an infinity or a NaN */
        *zero = 1;
        return amax;
    }
    float scale = amax / (float)q;
    *zero = !(scale > 0.0f);
    return scale;
}

HOT static void
quantize8(const float *restrict src, Py_ssize_t numel, Py_ssize_t block, int8_t *restrict codes,
          float *restrict scales) {
    const int32_t q = 127;
    Py_ssize_t blocks = (numel + block - 1) / block;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const float *x = src + b * block;
        int8_t *c = codes + b * block;
        Py_ssize_t m = numel - b * block < block ? numel - b * block : block;
        int zero;
        float scale = block_scale(absmax_bits(x, m), q, &zero);
        scales[b] = scale;
        if (zero) {
            memset(c, 0, (size_t)block);
            continue;
        }
        for (Py_ssize_t i = 0; i < m; i++) c[i] = (int8_t)code_of(x[i], scale, q);
        if (m < block) memset(c + m, 0, (size_t)(block - m));
    }
}

HOT static void
quantize4(const float *restrict src, Py_ssize_t numel, Py_ssize_t block, uint8_t *restrict codes,
          float *restrict scales) {
    const int32_t q = 7;
    Py_ssize_t blocks = (numel + block - 1) / block, half = block / 2;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const float *x = src + b * block;
        uint8_t *c = codes + b * half;
        Py_ssize_t m = numel - b * block < block ? numel - b * block : block;
        int zero;
        float scale = block_scale(absmax_bits(x, m), q, &zero);
        scales[b] = scale;
        if (zero) {
            memset(c, 0x88, (size_t)half);
            continue;
        }
        Py_ssize_t pairs = m / 2;
        for (Py_ssize_t i = 0; i < pairs; i++) {
            uint32_t lo = (uint32_t)(code_of(x[2 * i], scale, q) + 8);
            uint32_t hi = (uint32_t)(code_of(x[2 * i + 1], scale, q) + 8);
            c[i] = (uint8_t)(lo | (hi << 4));
        }
        if (m % 2) c[pairs++] = (uint8_t)((uint32_t)(code_of(x[m - 1], scale, q) + 8) | 0x80u);
        if (pairs < half) memset(c + pairs, 0x88, (size_t)(half - pairs));
    }
}

HOT static void
dequantize8(float *restrict out, Py_ssize_t numel, Py_ssize_t block, const int8_t *restrict codes,
            const float *restrict scales, int add) {
    Py_ssize_t blocks = (numel + block - 1) / block;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        float *o = out + b * block;
        const int8_t *c = codes + b * block;
        Py_ssize_t m = numel - b * block < block ? numel - b * block : block;
        float scale = scales[b];
        if (add)
            for (Py_ssize_t i = 0; i < m; i++) o[i] = o[i] + (float)c[i] * scale;
        else
            for (Py_ssize_t i = 0; i < m; i++) o[i] = (float)c[i] * scale;
    }
}

HOT static void
dequantize4(float *restrict out, Py_ssize_t numel, Py_ssize_t block, const uint8_t *restrict codes,
            const float *restrict scales, int add) {
    Py_ssize_t blocks = (numel + block - 1) / block, half = block / 2;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        float *o = out + b * block;
        const uint8_t *c = codes + b * half;
        Py_ssize_t m = numel - b * block < block ? numel - b * block : block;
        float scale = scales[b];
        Py_ssize_t pairs = m / 2;
        if (add) {
            for (Py_ssize_t i = 0; i < pairs; i++) {
                o[2 * i] = o[2 * i] + (float)((int32_t)(c[i] & 15) - 8) * scale;
                o[2 * i + 1] = o[2 * i + 1] + (float)((int32_t)(c[i] >> 4) - 8) * scale;
            }
            if (m % 2) o[m - 1] = o[m - 1] + (float)((int32_t)(c[pairs] & 15) - 8) * scale;
        } else {
            for (Py_ssize_t i = 0; i < pairs; i++) {
                o[2 * i] = (float)((int32_t)(c[i] & 15) - 8) * scale;
                o[2 * i + 1] = (float)((int32_t)(c[i] >> 4) - 8) * scale;
            }
            if (m % 2) o[m - 1] = (float)((int32_t)(c[pairs] & 15) - 8) * scale;
        }
    }
}

/* The byte counts every call checks: numel elements in blocks of `block` need blocks scales and
 * blocks * block (int8) or blocks * block / 2 (int4) bytes of codes. */
static int
check_sizes(const char *op, int bits, Py_ssize_t block, Py_ssize_t values_len, Py_ssize_t codes_len,
            Py_ssize_t scales_len, Py_ssize_t *numel) {
    if (bits != 4 && bits != 8) {
        PyErr_Format(PyExc_ValueError, "%s: bits must be 4 or 8, got %d", op, bits);
        return -1;
    }
    if (block < 1 || (bits == 4 && block % 2)) {
        PyErr_Format(PyExc_ValueError, "%s: block must be >= 1 (and even for int4), got %zd", op, block);
        return -1;
    }
    if (values_len % 4) {
        PyErr_Format(PyExc_ValueError, "%s: the float32 buffer has %zd bytes, not whole elements", op, values_len);
        return -1;
    }
    *numel = values_len / 4;
    Py_ssize_t blocks = (*numel + block - 1) / block;
    Py_ssize_t need = bits == 8 ? blocks * block : blocks * block / 2;
    if (codes_len < need || scales_len < 4 * blocks) {
        PyErr_Format(PyExc_ValueError, "%s: %zd elements in blocks of %zd need %zd bytes of codes and %zd of "
                     "scales, got %zd and %zd", op, *numel, block, need, 4 * blocks, codes_len, scales_len);
        return -1;
    }
    return 0;
}

/* The arguments name memory by address and length in bytes: zerocomm.ops.quantize passes a CPU tensor's
 * data_ptr() and its size (a tensor exported through numpy's buffer protocol could no longer have its
 * storage resized, which stage 3 does to every gathered unit). */
static int
check_memory(const char *op, Py_ssize_t address, Py_ssize_t len) {
    if ((address == 0 && len > 0) || len < 0) {
        PyErr_Format(PyExc_ValueError, "%s: a buffer of %zd bytes at address %zd", op, len, address);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(quantize_doc,
"quantize(src, src_bytes, codes, codes_bytes, scales, scales_bytes, bits, block)\n\n"
"src: address of float32 elements; codes, scales: addresses to write (whole blocks of codes, one float32\n"
"scale a block); each with its length in bytes.");

static PyObject *
py_quantize(PyObject *self, PyObject *args) {
    Py_ssize_t src, src_len, codes, codes_len, scales, scales_len, block, numel;
    int bits;
    if (!PyArg_ParseTuple(args, "nnnnnnin", &src, &src_len, &codes, &codes_len, &scales, &scales_len, &bits, &block))
        return NULL;
    if (check_memory("quantize", src, src_len) < 0 || check_memory("quantize", codes, codes_len) < 0 ||
        check_memory("quantize", scales, scales_len) < 0 ||
        check_sizes("quantize", bits, block, src_len, codes_len, scales_len, &numel) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    if (bits == 8)
        quantize8((const float *)src, numel, block, (int8_t *)codes, (float *)scales);
    else
        quantize4((const float *)src, numel, block, (uint8_t *)codes, (float *)scales);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyDoc_STRVAR(dequantize_doc,
"dequantize(out, out_bytes, codes, codes_bytes, scales, scales_bytes, bits, block, add)\n\n"
"out: address of the float32 elements to decode (a prefix of the blocks'); add: out += decoded.");

static PyObject *
py_dequantize(PyObject *self, PyObject *args) {
    Py_ssize_t out, out_len, codes, codes_len, scales, scales_len, block, numel;
    int bits, add;
    if (!PyArg_ParseTuple(args, "nnnnnninp", &out, &out_len, &codes, &codes_len, &scales, &scales_len, &bits,
                          &block, &add))
        return NULL;
    if (check_memory("dequantize", out, out_len) < 0 || check_memory("dequantize", codes, codes_len) < 0 ||
        check_memory("dequantize", scales, scales_len) < 0 ||
        check_sizes("dequantize", bits, block, out_len, codes_len, scales_len, &numel) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    if (bits == 8)
        dequantize8((float *)out, numel, block, (const int8_t *)codes, (const float *)scales, add);
    else
        dequantize4((float *)out, numel, block, (const uint8_t *)codes, (const float *)scales, add);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"quantize", py_quantize, METH_VARARGS, quantize_doc},
    {"dequantize", py_dequantize, METH_VARARGS, dequantize_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_quantize",
    "C kernels of block-wise int8/int4 quantization (optional; zerocomm.ops.quantize falls back to torch).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__quantize(void) {
    return PyModule_Create(&module);
}
