/* The small shared-memory all_reduce in C: one call copies in and arrives, one combines; and a round of the other
 * shared-memory collectives (op MOVE below): one call copies in, arrives and copies out.
 *
 * Optional: comm/algorithms/shm.py's small all_reduce uses it when it imports, and runs the same
 * steps in Python (numpy ufuncs on cached views, Arena.sync) otherwise.  The layout is the arena's
 * (comm/shm.py): rank p's control line at base + p * line, its u32 `arrive` word at the line's
 * start and `sleeping` after it, i64 words addressed by index; round k's slots at `buf`, rank p's at
 * buf + p * slot_bytes.
 *
 * post(base, line, n, rank, buf, slot_bytes, step, data, nelem, kind, op, digest_word, digest) copies
 * this rank's nelem elements of `kind` at `data` into its slot, stores `digest` at its line's i64 word
 * `digest_word` (when digest_word >= 0: a mismatch check rides in this sync), then stores `step` in its
 * arrive word and wakes a peer sleeping on it (FUTEX_WAKE, as Arena.sync does).  Then it waits for every
 * peer's arrive word to reach `step` for at most SPIN_S, yielding the core between looks and with the
 * GIL released.  When all arrived it goes on as combine (below) and returns combine's answer (0 or 1);
 * else it returns 2: the caller then calls settle (below) until it answers, checking its deadline and the
 * late peers' liveness between slices (in Python).
 *
 * combine(base, line, n, rank, buf, slot_bytes, step, data, nelem, kind, op, digest_word, digest) (the
 * same arguments; step unused), once every peer arrived: returns 1 (nothing written) if some peer's
 * digest word differs from `digest` (when digest_word >= 0), else reduces every rank's slot into `data`
 * as the numpy path does — two ranks: data op= peer's slot; more: slot 0 op slot 1, then op each further
 * slot in rank order — so every rank ends with the same bits, and the same bits as the fallback's (ints
 * wrap; min/max propagate NaN like numpy.minimum/maximum; avg is the sum divided by n), and returns 0.
 * kind: 0 float32, 1 float64, 2 int32, 3 int64; 4 bytes, with op 8 (GATHER): every rank's nelem bytes at
 * data + rank * nelem are copied into data + p * nelem of every rank p (an all_gather round); kind 4 with op 9
 * (MOVE): `data` is the address of a list of copies (int64 words, nelem 0): n_in, n_out, then n_in triples
 * (source address, offset in the round's buffer, bytes) copied into the buffer before this rank arrives, then n_out
 * triples (destination address, offset in the round's buffer, bytes) copied out of it once every peer arrived (a
 * round of broadcast, scatter, gather, all_to_all, ... and the non-root side of a reduce).  The buffer is the n
 * slots of the round, n * slot_bytes from `buf`: a schedule writes only bytes that no peer writes in the same round
 * (its own slot, or any slot where one rank alone writes, as broadcast's and scatter's roots do); every entry is
 * checked to lie within the buffer before any byte moves.  op: 0 sum, 1 avg, 2 product, 3 min, 4 max, 5 band,
 * 6 bor, 7 bxor (comm/algorithms/shm.py's FAST_KINDS and FAST_OPS; bitwise ops and ints only where the
 * caller admits them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define SPIN_S 50e-6
#define STEP_MASK 0xFFFFFFFFu

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline uint32_t *arrive_word(char *base, Py_ssize_t line, Py_ssize_t p) {
    return (uint32_t *)(base + p * line);
}

static inline int reached(char *base, Py_ssize_t line, Py_ssize_t p, uint32_t step) {
    uint32_t seen = __atomic_load_n(arrive_word(base, line, p), __ATOMIC_ACQUIRE);
    return ((seen - step) & STEP_MASK) < 0x80000000u;
}

static int all_reached(char *base, Py_ssize_t line, Py_ssize_t n, Py_ssize_t rank, uint32_t step) {
    for (Py_ssize_t p = 0; p < n; p++)
        if (p != rank && !reached(base, line, p, step))
            return 0;
    return 1;
}

static int ints(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected, long long *out, const char *name) {
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, expected, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        out[i] = PyLong_AsLongLong(args[i]);
        if (out[i] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* numpy.minimum / numpy.maximum on floats: a NaN on either side wins. */
#define MIN_F(x, y) (((x) <= (y) || (x) != (x)) ? (x) : (y))
#define MAX_F(x, y) (((x) >= (y) || (x) != (x)) ? (x) : (y))
#define MIN_I(x, y) ((x) <= (y) ? (x) : (y))
#define MAX_I(x, y) ((x) >= (y) ? (x) : (y))

/* out[i] = x[i] OP y[i] for the float type T. */
#define FLOAT_LOOP(T)                                                                     \
    static int combine_##T(T *out, const T *x, const T *y, Py_ssize_t m, int op) {        \
        switch (op) {                                                                     \
        case 0: case 1: for (Py_ssize_t i = 0; i < m; i++) out[i] = x[i] + y[i]; break;   \
        case 2: for (Py_ssize_t i = 0; i < m; i++) out[i] = x[i] * y[i]; break;           \
        case 3: for (Py_ssize_t i = 0; i < m; i++) out[i] = MIN_F(x[i], y[i]); break;     \
        case 4: for (Py_ssize_t i = 0; i < m; i++) out[i] = MAX_F(x[i], y[i]); break;     \
        default: return -1;                                                               \
        }                                                                                 \
        return 0;                                                                         \
    }

/* Signed T, with sums and products in its unsigned twin U: they wrap, as numpy's do. */
#define INT_LOOP(T, U)                                                                           \
    static int combine_##T(T *out, const T *x, const T *y, Py_ssize_t m, int op) {               \
        switch (op) {                                                                            \
        case 0: for (Py_ssize_t i = 0; i < m; i++) out[i] = (T)((U)x[i] + (U)y[i]); break;       \
        case 2: for (Py_ssize_t i = 0; i < m; i++) out[i] = (T)((U)x[i] * (U)y[i]); break;       \
        case 3: for (Py_ssize_t i = 0; i < m; i++) out[i] = MIN_I(x[i], y[i]); break;            \
        case 4: for (Py_ssize_t i = 0; i < m; i++) out[i] = MAX_I(x[i], y[i]); break;            \
        case 5: for (Py_ssize_t i = 0; i < m; i++) out[i] = x[i] & y[i]; break;                  \
        case 6: for (Py_ssize_t i = 0; i < m; i++) out[i] = x[i] | y[i]; break;                  \
        case 7: for (Py_ssize_t i = 0; i < m; i++) out[i] = x[i] ^ y[i]; break;                  \
        default: return -1;                                                                      \
        }                                                                                        \
        return 0;                                                                                \
    }

FLOAT_LOOP(float)
FLOAT_LOOP(double)
INT_LOOP(int32_t, uint32_t)
INT_LOOP(int64_t, uint64_t)

static int combine_kind(int kind, void *out, const void *x, const void *y, Py_ssize_t m, int op) {
    switch (kind) {
    case 0: return combine_float(out, x, y, m, op);
    case 1: return combine_double(out, x, y, m, op);
    case 2: return combine_int32_t(out, x, y, m, op);
    case 3: return combine_int64_t(out, x, y, m, op);
    default: return -1;
    }
}

#define NARGS 13
#define SIZE_OF(kind) ((kind) == 4 ? 1 : (kind) == 0 || (kind) == 2 ? 4 : 8)
/* op GATHER with kind 4 (bytes): every rank's nelem bytes at data + rank * nelem go through its slot into
 * data + p * nelem on every rank (an all_gather round) instead of being reduced. */
#define GATHER 8
/* op MOVE with kind 4: `data` points at a list of copies in and out of the slots (the module note). */
#define MOVE 9
#define IS_BYTES_OP(op) ((op) == GATHER || (op) == MOVE)

/* The copies of a MOVE round at `d`: 0 if every one lies within the round's buffer (n slots), else -1 with an
 * exception set.  Checked before the round copies or arrives, so a bad list moves nothing. */
static int move_valid(const int64_t *d, Py_ssize_t n, Py_ssize_t slot_bytes) {
    int64_t n_in = d[0], n_out = d[1], buffer = (int64_t)n * slot_bytes;
    if (n_in < 0 || n_out < 0 || n_in > 4 * n || n_out > 4 * n)
        goto bad;
    for (int64_t i = 0; i < n_in + n_out; i++) {
        const int64_t *e = d + 2 + 3 * i;
        if (e[1] < 0 || e[2] < 0 || e[1] > buffer - e[2])
            goto bad;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "post: a MOVE round's copies do not lie within the round's slots");
    return -1;
}

/* Compare the digests and reduce (combine's work); 0, 1, or -1 with an exception set. */
static int finish(const long long *a) {
    char *base = (char *)(intptr_t)a[0], *buf = (char *)(intptr_t)a[4];
    Py_ssize_t line = a[1], n = a[2], rank = a[3], slot_bytes = a[5];
    void *data = (void *)(intptr_t)a[7];
    Py_ssize_t m = a[8], digest_word = a[11];
    int kind = (int)a[9], op = (int)a[10];
    if (digest_word >= 0)
        for (Py_ssize_t p = 0; p < n; p++)
            if (p != rank && ((int64_t *)(base + p * line))[digest_word] != (int64_t)a[12])
                return 1;
    if (op == GATHER) {
        for (Py_ssize_t p = 0; p < n; p++)
            if (p != rank)
                memcpy((char *)data + p * m, buf + p * slot_bytes, m);
        return 0;
    }
    if (op == MOVE) {
        const int64_t *d = data, *e = (const int64_t *)data + 2 + 3 * ((const int64_t *)data)[0];
        if (move_valid(d, n, slot_bytes) < 0)  /* post checked it; combine() is called on its own too */
            return -1;
        for (int64_t i = 0; i < d[1]; i++, e += 3)
            if (e[2] > 0)
                memcpy((void *)(intptr_t)e[0], buf + e[1], (size_t)e[2]);
        return 0;
    }
    int bad;
    if (n == 2) {
        bad = combine_kind(kind, data, data, buf + (1 - rank) * slot_bytes, m, op);
    } else {
        bad = combine_kind(kind, data, buf, buf + slot_bytes, m, op);
        for (Py_ssize_t p = 2; p < n && !bad; p++)
            bad = combine_kind(kind, data, data, buf + p * slot_bytes, m, op);
    }
    if (bad) {
        PyErr_Format(PyExc_ValueError, "combine: kind %d with op %d is not one this module reduces", kind, op);
        return -1;
    }
    if (op == 1 && kind == 0)
        for (Py_ssize_t i = 0; i < m; i++) ((float *)data)[i] /= (float)n;
    else if (op == 1 && kind == 1)
        for (Py_ssize_t i = 0; i < m; i++) ((double *)data)[i] /= (double)n;
    return 0;
}

static PyObject *answer(int code) { return code < 0 ? NULL : PyLong_FromLong(code); }

/* post's work on its arguments `a`: 0, 1, 2 (see the module note), or -1 with an exception set. */
static int round_post(const long long *a) {
    char *base = (char *)(intptr_t)a[0], *buf = (char *)(intptr_t)a[4];
    Py_ssize_t line = a[1], n = a[2], rank = a[3], slot_bytes = a[5];
    uint32_t step = (uint32_t)a[6];
    if (a[9] < 0 || a[9] > 4 || (a[9] == 4) != IS_BYTES_OP(a[10]) || a[8] < 0 || a[8] * SIZE_OF(a[9]) > slot_bytes
        || (a[10] == MOVE && a[8] != 0)) {
        PyErr_Format(PyExc_ValueError, "post: kind %lld with op %lld and %lld elements is not a round", a[9], a[10],
                     a[8]);
        return -1;
    }
    if (a[10] == MOVE) {
        const int64_t *d = (const int64_t *)(intptr_t)a[7];
        if (move_valid(d, n, slot_bytes) < 0)
            return -1;
        for (int64_t i = 0; i < d[0]; i++) {
            const int64_t *e = d + 2 + 3 * i;
            if (e[2] > 0)
                memcpy(buf + e[1], (const void *)(intptr_t)e[0], (size_t)e[2]);
        }
    } else {
        const char *mine_in = (const char *)(intptr_t)a[7] + (a[10] == GATHER ? rank * a[8] : 0);
        memcpy(buf + rank * slot_bytes, mine_in, a[8] * SIZE_OF(a[9]));
    }
    if (a[11] >= 0)
        ((int64_t *)(base + rank * line))[a[11]] = (int64_t)a[12];
    uint32_t *mine = arrive_word(base, line, rank);
    __atomic_store_n(mine, step, __ATOMIC_SEQ_CST);  /* the slot and digest are visible before it */
    uint32_t *sleeping = mine + 1;
    if (__atomic_load_n(sleeping, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(sleeping, 0, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, mine, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
    if (all_reached(base, line, n, rank, step))
        return finish(a);
    int done;
    Py_BEGIN_ALLOW_THREADS
    double until = now_s() + SPIN_S;
    do {
        sched_yield();  /* ranks share cores: let the peer run */
        done = all_reached(base, line, n, rank, step);
    } while (!done && now_s() < until);
    Py_END_ALLOW_THREADS
    return done ? finish(a) : 2;
}

static PyObject *post(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[NARGS];
    if (ints(args, nargs, NARGS, a, "post") < 0)
        return NULL;
    return answer(round_post(a));
}

/* settle(<post's arguments>, slice_s): after post answered 2, sleep on the futex of a peer that has not
 * arrived (marking it `sleeping`, as Arena._wait_for does) until every peer reached `step` or slice_s passed,
 * with the GIL released; then combine.  Returns combine's answer, or 2 when the slice ran out: the caller
 * checks its deadline and the late peers' liveness and calls again. */
static PyObject *settle(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[NARGS];
    if (nargs != NARGS + 1) {
        PyErr_Format(PyExc_TypeError, "settle takes %d arguments (%zd given)", NARGS + 1, nargs);
        return NULL;
    }
    if (ints(args, NARGS, NARGS, a, "settle") < 0)
        return NULL;
    double slice_s = PyFloat_AsDouble(args[NARGS]);
    if (slice_s == -1.0 && PyErr_Occurred())
        return NULL;
    char *base = (char *)(intptr_t)a[0];
    Py_ssize_t line = a[1], n = a[2], rank = a[3];
    uint32_t step = (uint32_t)a[6];
    int done = 0;
    Py_BEGIN_ALLOW_THREADS
    double until = now_s() + slice_s;
    for (;;) {
        Py_ssize_t late = -1;
        for (Py_ssize_t p = 0; p < n && late < 0; p++)
            if (p != rank && !reached(base, line, p, step))
                late = p;
        if (late < 0) {
            done = 1;
            break;
        }
        double left = until - now_s();
        if (left <= 0)
            break;
        uint32_t *word = arrive_word(base, line, late);
        __atomic_store_n(word + 1, 1, __ATOMIC_SEQ_CST);  /* `sleeping`: the peer wakes us when it arrives */
        uint32_t seen = __atomic_load_n(word, __ATOMIC_SEQ_CST);
        if (((seen - step) & STEP_MASK) < 0x80000000u)
            continue;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
    Py_END_ALLOW_THREADS
    return done ? answer(finish(a)) : PyLong_FromLong(2);
}

static PyObject *combine(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[NARGS];
    if (ints(args, nargs, NARGS, a, "combine") < 0)
        return NULL;
    return answer(finish(a));
}

/* cross(write, pid, remote, local, nbytes): process_vm_writev (write true) or process_vm_readv of nbytes between
 * this process's address `local` and `remote` in process pid, with the GIL released; the bytes moved, or -errno. */
static PyObject *cross(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[5];
    if (ints(args, nargs, 5, a, "cross") < 0)
        return NULL;
    struct iovec local = {(void *)(intptr_t)a[3], (size_t)a[4]}, remote = {(void *)(intptr_t)a[2], (size_t)a[4]};
    ssize_t done = 0;
    int error = 0;
    if (a[4] > 0) {
        Py_BEGIN_ALLOW_THREADS
        done = a[0] ? process_vm_writev((pid_t)a[1], &local, 1, &remote, 1, 0)
                    : process_vm_readv((pid_t)a[1], &local, 1, &remote, 1, 0);
        error = errno;
        Py_END_ALLOW_THREADS
    }
    return PyLong_FromSsize_t(done >= 0 ? done : -error);
}

/* digest(tag, numel, cell_code): the mismatch check's 62-bit hash of one call (comm/check.py's `digest`, whose
 * Python twin gives the same bits): splitmix64's finalizer over the call's sequence number, element count and
 * cell code, all taken modulo 2**64. */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static long long call_digest(long long tag, long long numel, long long cell_code) {
    uint64_t x = ((uint64_t)tag * 0x9E3779B97F4A7C15ull + mix64((uint64_t)numel + 0x632BE59BD9B4E019ull))
                 ^ (uint64_t)cell_code;
    return (long long)(mix64(x) & ((1ull << 62) - 1));
}

static PyObject *digest(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[3];
    if (ints(args, nargs, 3, a, "digest") < 0)
        return NULL;
    return PyLong_FromLongLong(call_digest(a[0], a[1], a[2]));
}

/* Rounds(base, line, n, rank, buffers, slot_bytes, digest_word): an arena's round counters, owned here so that
 * a mismatch check's round is one call.  `step` (the last step stored, u32), `round` (the next round's number:
 * its buffer is round % 3, at buffers + (round % 3) * n * slot_bytes) and `checks` (checks run: the digest word
 * alternates between digest_word and digest_word + 1) are attributes the arena's Python rounds read and set.
 * check(tag, numel, cell_code, data, nelem, kind, op) runs the next round with the check of that call in it (its
 * digest, as digest() makes it, compared): post's arguments made from the counters, which it advances; post's
 * answer.  last() gives that round's post arguments (for settle). */
typedef struct {
    PyObject_HEAD
    long long base, line, n, rank, buffers, slot_bytes, digest_word;
    unsigned int step;
    long long round, checks;
    long long last[NARGS];
} Rounds;

static int rounds_init(Rounds *self, PyObject *args, PyObject *kwds) {
    if (!PyArg_ParseTuple(args, "LLLLLLL", &self->base, &self->line, &self->n, &self->rank, &self->buffers,
                          &self->slot_bytes, &self->digest_word))
        return -1;
    if (self->n < 1 || self->rank < 0 || self->rank >= self->n || self->line < 8 || self->slot_bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "Rounds: not an arena's layout");
        return -1;
    }
    self->step = 0;
    self->round = self->checks = 0;
    memset(self->last, 0, sizeof self->last);
    return 0;
}

static PyObject *rounds_check(Rounds *self, PyObject *const *args, Py_ssize_t nargs) {
    long long c[7];
    if (ints(args, nargs, 7, c, "check") < 0)
        return NULL;
    if (c[6] == MOVE && move_valid((const int64_t *)(intptr_t)c[3], self->n, self->slot_bytes) < 0)
        return NULL;  /* before the counters move: a refused round leaves every rank in step */
    long long *a = self->last;
    long long k = self->round;
    self->round = k + 1;
    self->checks += 1;
    self->step += 1;  /* u32: wraps as the Python rounds' (step + 1) & 0xFFFFFFFF */
    a[0] = self->base, a[1] = self->line, a[2] = self->n, a[3] = self->rank;
    a[4] = self->buffers + (k % 3) * self->n * self->slot_bytes, a[5] = self->slot_bytes, a[6] = self->step;
    a[7] = c[3], a[8] = c[4], a[9] = c[5], a[10] = c[6];
    a[11] = self->digest_word + (self->checks & 1), a[12] = call_digest(c[0], c[1], c[2]);
    return answer(round_post(a));
}

static PyObject *rounds_last(Rounds *self, PyObject *unused) {
    PyObject *out = PyTuple_New(NARGS);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < NARGS; i++) {
        PyObject *v = PyLong_FromLongLong(self->last[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, v);
    }
    return out;
}

static PyMemberDef rounds_members[] = {
    {"step", T_UINT, offsetof(Rounds, step), 0, "The last step this rank stored in its arrive word (u32)."},
    {"round", T_LONGLONG, offsetof(Rounds, round), 0, "The next round's number (its buffer: round % 3)."},
    {"checks", T_LONGLONG, offsetof(Rounds, checks), 0, "Mismatch checks run (their digest word alternates)."},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef rounds_methods[] = {
    {"check", (PyCFunction)(void (*)(void))rounds_check, METH_FASTCALL,
     "check(tag, numel, cell_code, data, nelem, kind, op): the next round with that call's check; post's answer."},
    {"last", (PyCFunction)rounds_last, METH_NOARGS, "The last check round's post arguments (a tuple), for settle."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RoundsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "zerocomm.comm._shmfast.Rounds",
    .tp_basicsize = sizeof(Rounds),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An arena's round counters (see _shmfast.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)rounds_init,
    .tp_members = rounds_members,
    .tp_methods = rounds_methods,
};

static PyMethodDef methods[] = {
    {"digest", (PyCFunction)(void (*)(void))digest, METH_FASTCALL,
     "digest(tag, numel, cell_code): the mismatch check's 62-bit hash of a call (see check.digest)."},
    {"post", (PyCFunction)(void (*)(void))post, METH_FASTCALL,
     "Copy in, arrive, spin briefly for the peers, then combine: 0, 1 (mismatch) or 2 (wait; see the note)."},
    {"settle", (PyCFunction)(void (*)(void))settle, METH_FASTCALL,
     "After post answered 2: sleep until every peer arrived or slice_s passed, then combine: 0, 1 or 2."},
    {"cross", (PyCFunction)(void (*)(void))cross, METH_FASTCALL,
     "cross(write, pid, remote, local, nbytes): process_vm_writev/readv; the bytes moved, or -errno."},
    {"combine", (PyCFunction)(void (*)(void))combine, METH_FASTCALL,
     "Compare digests and reduce every slot into data: 0, or 1 on a digest mismatch (see the module note)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_shmfast",
                                    "The small shared-memory all_reduce in C (see _shmfast.c).", -1, methods};

PyMODINIT_FUNC PyInit__shmfast(void) {
    if (PyType_Ready(&RoundsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RoundsType);
    if (PyModule_AddObject(m, "Rounds", (PyObject *)&RoundsType) < 0) {
        Py_DECREF(&RoundsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
