/* zerocomm.ops._onebit: the CPU kernels of the 1-bit all_reduce, one pass over the data each.
 *
 * Optional: zerocomm.ops.onebit_kernels uses these when the module imports and runs the same
 * arithmetic with numpy otherwise.  Both give the same bits (a test checks it), so everything
 * here follows the numpy path's order of operations exactly:
 *
 *   encode  x[i] <- (x[i] - copysign(pending, x[i])) + src[i]  for i < valid, 0 after;
 *           bit i of the packed signs <- x[i] >= 0 (little-end bit order, see ops/onebit.py).
 *           src is float32, bfloat16 or float16 (converted exactly); for encode_mean it is instead
 *           the mean of n packed rows: sum over r (in order) of +-t_r, then / divisor if not 0.
 *   decode  out[i] <- pos if bit i else neg, for an element of 2, 4 or 8 bytes.
 *
 * The sum of squares that gives the scale is left to the caller (numpy's dot over the block just
 * written, while it is still in cache), so that both paths sum in the same order.
 *
 * Every loop runs with the GIL released.  Compiled with -ffp-contract=off, so no multiply-add is
 * fused and float32 rounds exactly as numpy's ufuncs round; the float32 work stays float32.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Elements per piece of a row mean: its scratch (4 KiB) stays in L1 between decoding and use. */
#define PIECE 1024
typedef float v4sf __attribute__((vector_size(16)));

enum { SRC_F32 = 0, SRC_BF16 = 1, SRC_F16 = 2, SRC_MEAN = 3 };

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
/* One build runs everywhere: the loader picks the AVX2 copy where the CPU has it. */
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float from_bf16(uint16_t h) { return bits_f32((uint32_t)h << 16); }

/* Exact float16 -> float32: the exponent is rebased by a multiply by 2^112 (exact, subnormals
 * included); infinities and NaNs get the all-ones exponent. */
static inline float from_f16(uint16_t h) {
    uint32_t em = h & 0x7fffu, sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t u = f32_bits(bits_f32(em << 13) * 0x1p112f);
    if (em >= 0x7c00u) u = (em << 13) | 0x7f800000u;
    return bits_f32(u | sign);
}

static inline float load(const void *src, int kind, Py_ssize_t i) {
    switch (kind) {
    case SRC_BF16: return from_bf16(((const uint16_t *)src)[i]);
    case SRC_F16: return from_f16(((const uint16_t *)src)[i]);
    default: return ((const float *)src)[i];
    }
}

/* x[i] <- (x[i] - copysign(p, x[i])) + src[i] over m elements; kind and has_p are constants after
 * inlining into encode_run's cases, so each case compiles to its own vectorised loop. */
static inline __attribute__((always_inline)) void
update(float *restrict x, const void *restrict src, int kind, int has_p, float p, Py_ssize_t m) {
    for (Py_ssize_t i = 0; i < m; i++) {
        float v = x[i];
        if (has_p) v = v - copysignf(p, v);
        x[i] = v + load(src, kind, i);
    }
}

/* bits[g] <- the signs (x >= 0) of x[8g .. 8g + 7], bit j for element 8g + j. */
static inline __attribute__((always_inline)) void
pack(const float *restrict x, Py_ssize_t ngroups, uint8_t *restrict bits) {
#if defined(__SSE2__)
    /* Ordered compare: NaN gives 0, -0.0 gives 1, as x >= 0 does; movemask takes one bit a lane. */
    const __m128 zero = _mm_setzero_ps();
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        int low = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(x + 8 * g), zero));
        int high = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(x + 8 * g + 4), zero));
        bits[g] = (uint8_t)(low | high << 4);
    }
#else
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        unsigned byte = 0;
        for (int j = 0; j < 8; j++) byte |= (unsigned)(x[8 * g + j] >= 0.0f) << j;
        bits[g] = (uint8_t)byte;
    }
#endif
}

/* ngroups whole groups of 8 real elements, a PIECE at a time: update, then (from L1) the signs.
 * The portable form, for half sources and for compilers without SSE2. */
HOT static void
encode_generic(float *x, const void *src, int kind, int has_p, float p, Py_ssize_t ngroups, uint8_t *bits) {
    for (Py_ssize_t g = 0; g < ngroups; g += PIECE / 8) {
        Py_ssize_t count = ngroups - g < PIECE / 8 ? ngroups - g : PIECE / 8, m = 8 * count;
        float *xg = x + 8 * g;
        const void *at = kind == SRC_F32 ? (const void *)((const float *)src + 8 * g)
                                         : (const void *)((const uint16_t *)src + 8 * g);
        if (has_p) {
            switch (kind) {
            case SRC_BF16: update(xg, at, SRC_BF16, 1, p, m); break;
            case SRC_F16: update(xg, at, SRC_F16, 1, p, m); break;
            default: update(xg, at, SRC_F32, 1, p, m); break;
            }
        } else {
            switch (kind) {
            case SRC_BF16: update(xg, at, SRC_BF16, 0, p, m); break;
            case SRC_F16: update(xg, at, SRC_F16, 0, p, m); break;
            default: update(xg, at, SRC_F32, 0, p, m); break;
            }
        }
        pack(xg, count, bits + g);
    }
}

#if defined(__SSE2__)
/* One group in registers: x <- (x - copysign(p, x)) + (a, b), stored; returns its byte of signs. */
static inline __attribute__((always_inline)) unsigned
group_sse(float *x, __m128 a, __m128 b, int has_p, __m128 pv) {
    const __m128 sign = _mm_set1_ps(-0.0f), zero = _mm_setzero_ps();
    __m128 lo = _mm_loadu_ps(x), hi = _mm_loadu_ps(x + 4);
    if (has_p) {  /* copysign(p, x) = (x & sign bit) | p, p >= 0 */
        lo = _mm_sub_ps(lo, _mm_or_ps(_mm_and_ps(lo, sign), pv));
        hi = _mm_sub_ps(hi, _mm_or_ps(_mm_and_ps(hi, sign), pv));
    }
    lo = _mm_add_ps(lo, a), hi = _mm_add_ps(hi, b);
    _mm_storeu_ps(x, lo), _mm_storeu_ps(x + 4, hi);
    /* Ordered compare: NaN gives 0, -0.0 gives 1, as x >= 0 does. */
    return (unsigned)(_mm_movemask_ps(_mm_cmpge_ps(lo, zero)) | _mm_movemask_ps(_mm_cmpge_ps(hi, zero)) << 4);
}
#endif

/* ngroups whole groups of 8 real elements with a float32 source, in one pass. */
HOT static void
encode_f32(float *restrict x, const float *restrict src, int has_p, float p, Py_ssize_t ngroups,
           uint8_t *restrict bits) {
#if defined(__SSE2__)
    const __m128 pv = _mm_set1_ps(p);
    for (Py_ssize_t g = 0; g < ngroups; g++)
        bits[g] = (uint8_t)group_sse(x + 8 * g, _mm_loadu_ps(src + 8 * g), _mm_loadu_ps(src + 8 * g + 4), has_p, pv);
#else
    encode_generic(x, src, SRC_F32, has_p, p, ngroups, bits);
#endif
}

static inline v4sf load4(const float *p) { v4sf v; memcpy(&v, p, sizeof v); return v; }
static inline void store4(float *p, v4sf v) { memcpy(p, &v, sizeof v); }

/* The mean of n packed rows over elements [a, a + count) (a a multiple of 8) into acc: row 0's
 * values, then each further row's added in row order, then divided (unless divisor is 0).  A table
 * row is the 8 float32 values a byte stands for. */
static void
row_mean(const uint8_t *rows, Py_ssize_t stride, Py_ssize_t n, const float *tables, float divisor,
         Py_ssize_t a, Py_ssize_t count, float *restrict acc) {
    Py_ssize_t nbytes = (count + 7) / 8, m = 8 * nbytes;
    const uint8_t *row = rows + a / 8;
    for (Py_ssize_t k = 0; k < nbytes; k++) {
        const float *t = tables + 8 * row[k];
        store4(acc + 8 * k, load4(t)), store4(acc + 8 * k + 4, load4(t + 4));
    }
    for (Py_ssize_t r = 1; r < n; r++) {
        const float *table = tables + 256 * 8 * r;
        row = rows + r * stride + a / 8;
        for (Py_ssize_t k = 0; k < nbytes; k++) {
            const float *t = table + 8 * row[k];
            store4(acc + 8 * k, load4(acc + 8 * k) + load4(t));
            store4(acc + 8 * k + 4, load4(acc + 8 * k + 4) + load4(t + 4));
        }
    }
    if (divisor != 0.0f)
        for (Py_ssize_t i = 0; i < m; i++) acc[i] = acc[i] / divisor;
}

typedef struct {
    const uint8_t *rows;  /* n rows of packed signs, stride bytes apart */
    Py_ssize_t stride, n;
    const float *tables;  /* n tables of 256 x 8 values +-t_r */
    float divisor;
} mean_src;

/* ngroups whole groups of 8 real elements with the row mean as source, in one pass. */
HOT static void
encode_mean_groups(float *restrict x, const mean_src *mean, int has_p, float p, Py_ssize_t ngroups,
                   uint8_t *restrict bits) {
    /* Locals, not the struct's fields: the byte stores below may alias anything, and would make the
     * compiler reload every field after each of them. */
    const uint8_t *restrict rows = mean->rows;
    const float *restrict tables = mean->tables;
    const Py_ssize_t n = mean->n, stride = mean->stride;
    const float divisor = mean->divisor;
#if defined(__SSE2__)
    const __m128 pv = _mm_set1_ps(p), dv = _mm_set1_ps(divisor);
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        const float *t = tables + 8 * rows[g];
        __m128 a = _mm_loadu_ps(t), b = _mm_loadu_ps(t + 4);
        for (Py_ssize_t r = 1; r < n; r++) {  /* in row order, as the numpy path adds */
            t = tables + 256 * 8 * r + 8 * rows[r * stride + g];
            a = _mm_add_ps(a, _mm_loadu_ps(t)), b = _mm_add_ps(b, _mm_loadu_ps(t + 4));
        }
        if (divisor != 0.0f) a = _mm_div_ps(a, dv), b = _mm_div_ps(b, dv);
        bits[g] = (uint8_t)group_sse(x + 8 * g, a, b, has_p, pv);
    }
#else
    float acc[PIECE];
    for (Py_ssize_t g = 0; g < ngroups; g += PIECE / 8) {
        Py_ssize_t count = ngroups - g < PIECE / 8 ? ngroups - g : PIECE / 8;
        row_mean(rows, stride, n, tables, divisor, 8 * g, 8 * count, acc);
        encode_generic(x + 8 * g, acc, SRC_F32, has_p, p, count, bits + g);
    }
#endif
}

/* Elements [a, b) one at a time (a group holding the last real element, or padding); src holds the
 * source of elements a.. (read only below valid). */
static void
encode_slow(float *x, const void *src, int kind, int has_p, float p, Py_ssize_t a, Py_ssize_t b,
            Py_ssize_t valid, uint8_t *bits) {
    for (Py_ssize_t i = a; i < b; i++) {
        float v = 0.0f;
        if (i < valid) {
            v = x[i];
            if (has_p) v = v - copysignf(p, v);
            v = v + load(src, kind, i - a);
        }
        x[i] = v;
        if (v >= 0.0f) bits[i >> 3] |= (uint8_t)(1u << (i & 7));
        else bits[i >> 3] &= (uint8_t)~(1u << (i & 7));
    }
}

/* The whole encode of one x (see the top of the file): the groups with no padding in one pass, then
 * the rest one element at a time. */
static void
encode(float *x, Py_ssize_t size, Py_ssize_t valid, int has_p, float p, const void *src, int kind,
       const mean_src *mean, uint8_t *bits) {
    Py_ssize_t whole = valid / 8, s = 8 * whole;
    const void *rest;
    float acc[8];
    if (kind == SRC_MEAN) {
        encode_mean_groups(x, mean, has_p, p, whole, bits);
        if (valid > s) row_mean(mean->rows, mean->stride, mean->n, mean->tables, mean->divisor, s, valid - s, acc);
        rest = acc, kind = SRC_F32;
    } else if (kind == SRC_F32) {
        encode_f32(x, (const float *)src, has_p, p, whole, bits);
        rest = (const float *)src + s;
    } else {
        encode_generic(x, src, kind, has_p, p, whole, bits);
        rest = (const uint16_t *)src + s;
    }
    if (s < size) encode_slow(x, rest, kind, has_p, p, s, size, valid, bits);
}

/* --- Python wrappers --------------------------------------------------------------------------- */

static int
get_pending(PyObject *obj, int *has_p, float *p) {
    if (obj == Py_None) {
        *has_p = 0, *p = 0.0f;
        return 0;
    }
    double value = PyFloat_AsDouble(obj);
    if (value == -1.0 && PyErr_Occurred()) return -1;
    *has_p = 1, *p = (float)value;
    return 0;
}

static int
check_encode(Py_buffer *x, Py_ssize_t valid, Py_buffer *bits) {
    if (x->len % 32 != 0) {
        PyErr_Format(PyExc_ValueError, "encode: x must be float32 elements in whole groups of 8, got %zd bytes",
                     x->len);
        return -1;
    }
    Py_ssize_t size = x->len / 4;
    if (valid < 0 || valid > size) {
        PyErr_Format(PyExc_ValueError, "encode: valid must be in [0, %zd], got %zd", size, valid);
        return -1;
    }
    if (bits->len < size / 8) {
        PyErr_Format(PyExc_ValueError, "encode: %zd elements need %zd bytes of signs, got %zd", size, size / 8,
                     bits->len);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(encode_doc,
"encode(x, valid, pending, bits, src, kind)\n\n"
"x: writable float32 buffer (a multiple of 8 elements); bits: len(x) / 8 writable bytes; src: valid\n"
"elements of kind 0 (float32), 1 (bfloat16) or 2 (float16); pending: the scale last sent, or None.");

static PyObject *
py_encode(PyObject *self, PyObject *args) {
    Py_buffer x, bits, src;
    Py_ssize_t valid;
    PyObject *pending;
    int kind, has_p;
    float p;
    if (!PyArg_ParseTuple(args, "w*nOw*y*i", &x, &valid, &pending, &bits, &src, &kind)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t esize = kind == SRC_F32 ? 4 : 2;
    if (get_pending(pending, &has_p, &p) < 0 || check_encode(&x, valid, &bits) < 0) goto done;
    if (kind < SRC_F32 || kind > SRC_F16) {
        PyErr_Format(PyExc_ValueError, "encode: kind must be 0, 1 or 2, got %d", kind);
        goto done;
    }
    if (src.len < valid * esize) {
        PyErr_Format(PyExc_ValueError, "encode: %zd elements of source need %zd bytes, got %zd", valid,
                     valid * esize, src.len);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    encode((float *)x.buf, x.len / 4, valid, has_p, p, src.buf, kind, NULL, (uint8_t *)bits.buf);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&x), PyBuffer_Release(&bits), PyBuffer_Release(&src);
    return result;
}

PyDoc_STRVAR(encode_mean_doc,
"encode_mean(x, valid, pending, bits, rows, stride, offset, values, divisor)\n\n"
"As encode, with src the mean of the packed rows: row r starts r * stride + offset bytes into rows\n"
"and holds len(x) / 8 bytes of signs, each standing for +values[r] or -values[r] (float32); their sum,\n"
"in row order, divided by divisor unless it is 0.");

static PyObject *
py_encode_mean(PyObject *self, PyObject *args) {
    Py_buffer x, bits, rows;
    Py_ssize_t valid, stride, offset;
    PyObject *pending, *values;
    double divisor;
    int has_p;
    float p;
    if (!PyArg_ParseTuple(args, "w*nOw*y*nnOd", &x, &valid, &pending, &bits, &rows, &stride, &offset, &values,
                          &divisor))
        return NULL;
    PyObject *result = NULL, *seq = NULL;
    float *tables = NULL;
    if (get_pending(pending, &has_p, &p) < 0 || check_encode(&x, valid, &bits) < 0) goto done;
    seq = PySequence_Fast(values, "encode_mean: values must be a sequence of floats");
    if (seq == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), size = x.len / 4;
    if (n < 1 || offset < 0 || stride < offset + size / 8 || rows.len < (n - 1) * stride + offset + size / 8) {
        PyErr_Format(PyExc_ValueError, "encode_mean: %zd rows of %zd bytes, %zd apart from byte %zd on, do not fit "
                     "%zd bytes", n, size / 8, stride, offset, rows.len);
        goto done;
    }
    tables = malloc((size_t)n * 256 * 8 * sizeof(float));
    if (tables == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < n; r++) {
        double t = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, r));
        if (t == -1.0 && PyErr_Occurred()) goto done;
        for (int b = 0; b < 256; b++)
            for (int j = 0; j < 8; j++) tables[(r * 256 + b) * 8 + j] = (b >> j) & 1 ? (float)t : -(float)t;
    }
    mean_src mean = {(const uint8_t *)rows.buf + offset, stride, n, tables, (float)divisor};
    Py_BEGIN_ALLOW_THREADS
    encode((float *)x.buf, size, valid, has_p, p, NULL, SRC_MEAN, &mean, (uint8_t *)bits.buf);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    free(tables);
    Py_XDECREF(seq);
    PyBuffer_Release(&x), PyBuffer_Release(&bits), PyBuffer_Release(&rows);
    return result;
}

/* out (count elements of esize bytes) <- the table rows of the packed bytes.  The output is written
 * once and not read here again: where it is 16-byte aligned, streaming stores skip reading its cache
 * lines in first (a third of the memory traffic of plain stores). */
HOT static void
decode_run(uint8_t *restrict out, int esize, const uint8_t *restrict packed, Py_ssize_t count,
           const uint8_t *restrict table) {
    Py_ssize_t whole = count / 8, row = 8 * (Py_ssize_t)esize;
#if defined(__SSE2__)
    if (((uintptr_t)out & 15) == 0) {
        for (Py_ssize_t k = 0; k < whole; k++) {
            const uint8_t *t = table + row * packed[k];
            for (Py_ssize_t q = 0; q < row; q += 16)
                _mm_stream_si128((__m128i *)(out + row * k + q), _mm_loadu_si128((const __m128i *)(t + q)));
        }
        _mm_sfence();  /* the streamed lines are visible before the caller goes on */
    } else
#endif
    switch (esize) {  /* constant-size copies compile to plain vector moves */
    case 2:
        for (Py_ssize_t k = 0; k < whole; k++) memcpy(out + 16 * k, table + 16 * packed[k], 16);
        break;
    case 4:
        for (Py_ssize_t k = 0; k < whole; k++) memcpy(out + 32 * k, table + 32 * packed[k], 32);
        break;
    default:
        for (Py_ssize_t k = 0; k < whole; k++) memcpy(out + 64 * k, table + 64 * packed[k], 64);
        break;
    }
    if (count > 8 * whole) memcpy(out + row * whole, table + row * packed[whole], (size_t)(count % 8) * esize);
}

PyDoc_STRVAR(decode_doc,
"decode(out, packed, count, pos, neg)\n\n"
"out: writable buffer of count elements of len(pos) bytes (2, 4 or 8); element i <- pos where bit i of\n"
"packed is 1, neg where it is 0.");

static PyObject *
py_decode(PyObject *self, PyObject *args) {
    Py_buffer out, packed, pos, neg;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "w*y*ny*y*", &out, &packed, &count, &pos, &neg)) return NULL;
    PyObject *result = NULL;
    int esize = (int)pos.len;
    if ((esize != 2 && esize != 4 && esize != 8) || neg.len != pos.len) {
        PyErr_Format(PyExc_ValueError, "decode: pos and neg must be one element of 2, 4 or 8 bytes, got %zd and %zd",
                     pos.len, neg.len);
        goto done;
    }
    if (count < 0 || out.len < count * esize || packed.len < (count + 7) / 8) {
        PyErr_Format(PyExc_ValueError, "decode: %zd elements need %zd bytes of out and %zd packed, got %zd and %zd",
                     count, count * esize, (count + 7) / 8, out.len, packed.len);
        goto done;
    }
    _Alignas(64) uint8_t table[256 * 8 * 8];  /* aligned: no row load crosses a cache line */
    /* Element j of row b is pos where bit j of b is set: row b is row (b without its top bit) with
     * one more element set, so each row is a copy of an earlier one plus one element. */
    for (int j = 0; j < 8; j++) memcpy(table + j * esize, neg.buf, esize);
    for (int b = 1; b < 256; b++) {
        int top = 31 - __builtin_clz((unsigned)b);
        memcpy(table + 8 * b * esize, table + 8 * (b ^ (1 << top)) * esize, 8 * (size_t)esize);
        memcpy(table + (8 * b + top) * esize, pos.buf, esize);
    }
    Py_BEGIN_ALLOW_THREADS
    decode_run((uint8_t *)out.buf, esize, (const uint8_t *)packed.buf, count, table);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&out), PyBuffer_Release(&packed), PyBuffer_Release(&pos), PyBuffer_Release(&neg);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", py_encode, METH_VARARGS, encode_doc},
    {"encode_mean", py_encode_mean, METH_VARARGS, encode_mean_doc},
    {"decode", py_decode, METH_VARARGS, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_onebit",
    "C kernels of the 1-bit all_reduce (optional; zerocomm.ops.onebit_kernels falls back to numpy).", -1, methods,
};

PyMODINIT_FUNC
PyInit__onebit(void) {
    PyObject *m = PyModule_Create(&module);
    return m;
}
