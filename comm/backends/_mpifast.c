/* The MPI backend's hot loop in C: post one MPI_Iallreduce and wait for it without burning a core.
 *
 * Optional: comm/backends/mpi.py uses it when it imports and binds, and runs the same steps through
 * mpi4py otherwise.  It reaches the MPI library mpi4py already loaded (bind() is given its path)
 * through MPICH's ABI, where communicators, datatypes, ops and requests are C ints, MPI_IN_PLACE is
 * (void *)-1 and MPI_STATUS_IGNORE is (MPI_Status *)1: so no mpi.h is needed to build it.  mpi.py
 * binds it only to an MPICH library whose handles are ints.
 *
 * bind(path, byte_handle) finds MPI_Iallreduce, MPI_Test, ... in the MPICH library at path (loaded
 * already), makes the mismatch check's type and op once, and returns the stage size in bytes.
 *
 * allreduce(comm, address, count, datatype, op, deadline) runs MPI_Iallreduce(MPI_IN_PLACE, address,
 * ...) and waits as mpi.py's _wait does: MPI_Test for SPIN_S, then MPI_Test with sched_yield in between
 * until YIELD_PHASE_S, then sleeps of 1/20 of the time waited so far (between FIRST_SLEEP_S and
 * MAX_SLEEP_S), the GIL released from the first yield on.  deadline is time.monotonic() seconds (the
 * same clock, CLOCK_MONOTONIC), negative for none.  It returns 0 when done, else a tuple whose request
 * handle the caller keeps (the request is still posted: MPI may write into the buffer later):
 *   (1, request)            the deadline passed;
 *   (2, request, error)     MPI_Test failed with MPI error code `error`;
 *   (3, request, exception) a signal handler raised (KeyboardInterrupt) while waiting.
 *
 * checked(comm, stage, data, nbytes, kind, op, count, digest, deadline) is the mismatch check with a
 * small all_reduce riding on it.  `stage` is the backend's STAGE_BYTES buffer: a header [digest,
 * -digest, kind, op, count] and up to PAYLOAD_BYTES of the tensor's bytes (`data`, `nbytes`; kind -1
 * for the check alone); its deadline may also be None (none).  It is all-reduced as ONE element of a contiguous STAGE_BYTES type with a
 * commutative user op (combine, below): every check of every call has this same type signature, so
 * ranks that called different things still make a valid MPI call (no truncation, nothing written
 * outside the stage), and an element is never split.  combine keeps the largest digest and the
 * largest negated digest, and reduces the payloads only where both sides carry one digest; the
 * ranks agree when the final largest digest equals the smallest.  The user's tensor is written
 * only then.  Returns 0 (agreed; data reduced when given), 1 (disagreed; data untouched), or the
 * failure tuples of allreduce.
 *
 * exchange(comm, send, recv, nbytes, peer, tag, deadline) posts MPI_Irecv(recv) and MPI_Isend(send) of
 * nbytes each with `peer` and `tag` (as MPI_BYTE), and waits for both as allreduce does: the whole-buffer
 * exchange of recursive doubling and of a two-rank tree in one call.  Returns 0, or a failure tuple
 * as allreduce's with ((send request, recv request)) in place of the one request.
 *
 * rider(comm, stage, owner, kind, op) wraps the same check for comm/_shortpath.c, which runs a small
 * blocking all_reduce from the public function to here without Python in between: a capsule named
 * "zerocomm.rider" whose first member is the function to call (see _shortpath.c for the contract).
 * plain_rider(comm, datatype, op) is the same capsule for a group whose mismatch check is off: its
 * function runs allreduce on the tensor itself (any size; it never answers "disagreed").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#define SPIN_S 20e-6
#define YIELD_PHASE_S 2e-3
#define FIRST_SLEEP_S 50e-6
#define MAX_SLEEP_S 10e-3

typedef int (*iallreduce_fn)(const void *, void *, int, int, int, int, int *);
typedef int (*test_fn)(int *, int *, void *);
typedef int (*isend_fn)(const void *, int, int, int, int, int, int *);
typedef int (*irecv_fn)(void *, int, int, int, int, int, int *);

typedef void (*user_fn)(void *, void *, int *, int *);
typedef int (*op_create_fn)(user_fn, int, int *);
typedef int (*type_contiguous_fn)(int, int, int *);
typedef int (*type_commit_fn)(int *);

static iallreduce_fn mpi_iallreduce = NULL;
static test_fn mpi_test = NULL;
static isend_fn mpi_isend = NULL;
static irecv_fn mpi_irecv = NULL;
static int byte_type = 0;  /* MPI_BYTE's handle, given to bind() */
static int stage_type = 0, stage_op = 0;  /* made once by bind() */

#define PAYLOAD_BYTES 224
#define STAGE_BYTES (32 + PAYLOAD_BYTES)

typedef struct {
    int64_t high, negated_low;  /* the largest digest, and the largest negated digest */
    int32_t kind, op;           /* the payload's element type and reduction (see KINDS and OPS in mpi.py) */
    int64_t count;              /* elements in the payload */
    unsigned char payload[PAYLOAD_BYTES];
} stage_t;

#define REDUCE(T, in, io, n, op)                                                        \
    do {                                                                                \
        const T *a = (const T *)(in);                                                   \
        T *b = (T *)(io);                                                               \
        switch (op) {                                                                   \
        case 0: for (int64_t i = 0; i < (n); i++) b[i] = a[i] + b[i]; break;            \
        case 1: for (int64_t i = 0; i < (n); i++) b[i] = a[i] * b[i]; break;            \
        case 2: for (int64_t i = 0; i < (n); i++) b[i] = a[i] < b[i] ? a[i] : b[i]; break; \
        case 3: for (int64_t i = 0; i < (n); i++) b[i] = a[i] > b[i] ? a[i] : b[i]; break; \
        }                                                                               \
    } while (0)

/* Integers: sums and products wrap around as MPI's do (computed unsigned: no signed overflow in C). */
#define INTEGER(T, U, in, io, n, op)                                                    \
    do {                                                                                \
        const T *a = (const T *)(in);                                                   \
        T *b = (T *)(io);                                                               \
        switch (op) {                                                                   \
        case 0: for (int64_t i = 0; i < (n); i++) b[i] = (T)((U)a[i] + (U)b[i]); break; \
        case 1: for (int64_t i = 0; i < (n); i++) b[i] = (T)((U)a[i] * (U)b[i]); break; \
        case 4: for (int64_t i = 0; i < (n); i++) b[i] = a[i] & b[i]; break;            \
        case 5: for (int64_t i = 0; i < (n); i++) b[i] = a[i] | b[i]; break;            \
        case 6: for (int64_t i = 0; i < (n); i++) b[i] = a[i] ^ b[i]; break;            \
        default: REDUCE(T, in, io, n, op);                                              \
        }                                                                               \
    } while (0)

static const int64_t kind_size[] = {4, 8, 4, 8, 1, 1, 2};  /* float32 float64 int32 int64 int8 uint8 int16 */

static void reduce_payload(const stage_t *in, stage_t *io) {
    int32_t kind = io->kind, op = io->op;
    int64_t n = io->count;
    if (kind < 0 || kind > 6 || op < 0 || op > 6 || n < 0 || n > PAYLOAD_BYTES / kind_size[kind])
        return;  /* a check alone, or a header this build does not know: nothing to reduce */
    if (kind <= 1 && op > 3)
        return;
    switch (kind) {
    case 0: REDUCE(float, in->payload, io->payload, n, op); break;
    case 1: REDUCE(double, in->payload, io->payload, n, op); break;
    case 2: INTEGER(int32_t, uint32_t, in->payload, io->payload, n, op); break;
    case 3: INTEGER(int64_t, uint64_t, in->payload, io->payload, n, op); break;
    case 4: INTEGER(int8_t, uint8_t, in->payload, io->payload, n, op); break;
    case 5: INTEGER(uint8_t, uint8_t, in->payload, io->payload, n, op); break;
    case 6: INTEGER(int16_t, uint16_t, in->payload, io->payload, n, op); break;
    }
}

static void combine(void *in_, void *inout_, int *len, int *datatype) {
    (void)datatype;
    for (int e = 0; e < *len; e++) {
        const stage_t *in = (const stage_t *)in_ + e;
        stage_t *io = (stage_t *)inout_ + e;
        int same = in->high == io->high && in->negated_low == io->negated_low;
        if (in->high > io->high)
            io->high = in->high;
        if (in->negated_low > io->negated_low)
            io->negated_low = in->negated_low;
        if (same && in->kind == io->kind && in->op == io->op && in->count == io->count)
            reduce_payload(in, io);
    }
}

#define MPI_IN_PLACE_ ((const void *)-1)
#define MPI_STATUS_IGNORE_ ((void *)1)
#define MPI_REQUEST_NULL_ 0x2c000000
/* A request handle as mpi4py writes MPICH's handles (see allreduce), for MPI.Request.fromhandle. */
#define HANDLE(request) ((unsigned long long)(long long)(request))

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static PyObject *bind(PyObject *self, PyObject *args) {
    const char *path;
    unsigned long long byte_handle;
    if (!PyArg_ParseTuple(args, "sK", &path, &byte_handle))
        return NULL;
    void *library = dlopen(path, RTLD_NOW | RTLD_NOLOAD);  /* the copy already loaded, never a second one */
    if (library == NULL) {
        PyErr_Format(PyExc_OSError, "%s is not loaded: %s", path, dlerror());
        return NULL;
    }
    iallreduce_fn iallreduce = (iallreduce_fn)dlsym(library, "MPI_Iallreduce");
    test_fn test = (test_fn)dlsym(library, "MPI_Test");
    isend_fn isend = (isend_fn)dlsym(library, "MPI_Isend");
    irecv_fn irecv = (irecv_fn)dlsym(library, "MPI_Irecv");
    if (iallreduce == NULL || test == NULL || isend == NULL || irecv == NULL) {
        PyErr_Format(PyExc_OSError, "%s has no MPI_Iallreduce, MPI_Test, MPI_Isend or MPI_Irecv", path);
        return NULL;
    }
    op_create_fn op_create = (op_create_fn)dlsym(library, "MPI_Op_create");
    type_contiguous_fn contiguous = (type_contiguous_fn)dlsym(library, "MPI_Type_contiguous");
    type_commit_fn commit = (type_commit_fn)dlsym(library, "MPI_Type_commit");
    if (op_create == NULL || contiguous == NULL || commit == NULL) {
        PyErr_Format(PyExc_OSError, "%s has no MPI_Op_create, MPI_Type_contiguous or MPI_Type_commit", path);
        return NULL;
    }
    if (stage_type == 0) {
        int type = 0, op = 0;
        if (contiguous(STAGE_BYTES, (int)(unsigned int)byte_handle, &type) != 0 || commit(&type) != 0 ||
            op_create(combine, 1, &op) != 0) {
            PyErr_SetString(PyExc_OSError, "could not create the mismatch check's MPI type and op");
            return NULL;
        }
        stage_type = type;
        stage_op = op;
    }
    mpi_iallreduce = iallreduce;
    mpi_test = test;
    mpi_isend = isend;
    mpi_irecv = irecv;
    byte_type = (int)(unsigned int)byte_handle;
    return PyLong_FromLong(STAGE_BYTES);
}

/* 0: done; 1: deadline; 2: MPI error (*error set); 3: a signal handler raised (Python error set). */
static int wait_request(int *request, double deadline, int *error) {
    int done = 0;
    double start = now(), t = start;
    while (t - start < SPIN_S) {
        if ((*error = mpi_test(request, &done, MPI_STATUS_IGNORE_)) != 0)
            return 2;
        if (done)
            return 0;
        t = now();
    }
    int outcome = 0;
    PyThreadState *state = PyEval_SaveThread();
    for (;;) {
        if (deadline >= 0 && t > deadline) {
            outcome = 1;
            break;
        }
        double waited = t - start;
        if (waited < YIELD_PHASE_S) {
            sched_yield();  /* hands the core to any runnable rank; returns at once on an idle core */
        } else {
            double pause = waited / 20;
            pause = pause < FIRST_SLEEP_S ? FIRST_SLEEP_S : pause > MAX_SLEEP_S ? MAX_SLEEP_S : pause;
            struct timespec sleep = {0, (long)(pause * 1e9)};
            nanosleep(&sleep, NULL);
            PyEval_RestoreThread(state);  /* a long wait stays interruptible (Ctrl-C on the main thread) */
            int raised = PyErr_CheckSignals();
            state = PyEval_SaveThread();
            if (raised) {
                outcome = 3;
                break;
            }
        }
        if ((*error = mpi_test(request, &done, MPI_STATUS_IGNORE_)) != 0) {
            outcome = 2;
            break;
        }
        if (done)
            break;
        t = now();
    }
    PyEval_RestoreThread(state);
    return outcome;
}

/* The failure tuple of a wait's `outcome` (1, 2 or 3; see the module comment) with `requests` (a new
 * reference, stolen): (1, requests), (2, requests, error) or (3, requests, exception).  NULL if building it raised. */
static PyObject *failed(int outcome, PyObject *requests, int error) {
    if (requests == NULL)
        return NULL;
    PyObject *result;
    if (outcome == 1) {
        result = Py_BuildValue("(iN)", 1, requests);
    } else if (outcome == 2) {
        result = Py_BuildValue("(iNi)", 2, requests, error);
    } else {
        PyObject *kind, *exception, *traceback;
        PyErr_Fetch(&kind, &exception, &traceback);
        PyErr_NormalizeException(&kind, &exception, &traceback);
        if (traceback != NULL)
            PyException_SetTraceback(exception, traceback);
        result = Py_BuildValue("(iNO)", 3, requests, exception);
        Py_XDECREF(kind);
        Py_XDECREF(exception);
        Py_XDECREF(traceback);
    }
    return result;
}

/* Post MPI_Iallreduce(MPI_IN_PLACE, address, ...) and wait.  Returns 1 when done; 0 with *failure set to
 * the failure's new tuple (see the module comment), or to NULL when building it raised. */
static int run(void *address, int count, int datatype, int op, int comm, double deadline, PyObject **failure) {
    int request = MPI_REQUEST_NULL_, done = 0, error, outcome;
    if ((error = mpi_iallreduce(MPI_IN_PLACE_, address, count, datatype, op, comm, &request)) != 0 ||
        (error = mpi_test(&request, &done, MPI_STATUS_IGNORE_)) != 0) {
        *failure = failed(2, PyLong_FromUnsignedLongLong(HANDLE(request)), error);
        return 0;
    }
    if (done || (outcome = wait_request(&request, deadline, &error)) == 0)
        return 1;
    *failure = failed(outcome, PyLong_FromUnsignedLongLong(HANDLE(request)), error);
    return 0;
}

/* mpi4py gives MPICH's int handles sign-extended to 64 bits, as unsigned: the low 32 bits are the handle. */
static int handle(PyObject *value) { return (int)(unsigned int)PyLong_AsUnsignedLongLongMask(value); }

static int bound(void) {
    if (mpi_iallreduce != NULL)
        return 1;
    PyErr_SetString(PyExc_RuntimeError, "_mpifast.bind() was not called");
    return 0;
}

static PyObject *allreduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "allreduce(comm, address, count, datatype, op, deadline)");
        return NULL;
    }
    if (!bound())
        return NULL;
    int comm = handle(args[0]), datatype = handle(args[3]), op = handle(args[4]);
    void *address = PyLong_AsVoidPtr(args[1]);
    int count = (int)PyLong_AsLong(args[2]);
    double deadline = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *failure = NULL;
    if (run(address, count, datatype, op, comm, deadline, &failure))
        return PyLong_FromLong(0);
    return failure;
}

/* Exchange nbytes with peer (see the module comment): both requests posted, then each waited. */
static PyObject *exchange(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "exchange(comm, send, recv, nbytes, peer, tag, deadline)");
        return NULL;
    }
    if (!bound())
        return NULL;
    int comm = handle(args[0]);
    const void *send = PyLong_AsVoidPtr(args[1]);
    void *recv = PyLong_AsVoidPtr(args[2]);
    long nbytes = PyLong_AsLong(args[3]), peer = PyLong_AsLong(args[4]), tag = PyLong_AsLong(args[5]);
    double deadline = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (nbytes < 0 || nbytes > 0x7fffffffL) {
        PyErr_Format(PyExc_ValueError, "exchange: %ld bytes do not fit an MPI count", nbytes);
        return NULL;
    }
    int requests[2] = {MPI_REQUEST_NULL_, MPI_REQUEST_NULL_};  /* send, recv */
    int error = 0, outcome = 2;
    if ((error = mpi_irecv(recv, (int)nbytes, byte_type, (int)peer, (int)tag, comm, &requests[1])) == 0 &&
        (error = mpi_isend(send, (int)nbytes, byte_type, (int)peer, (int)tag, comm, &requests[0])) == 0) {
        outcome = 0;
        for (int k = 0; k < 2 && outcome == 0; k++) {
            int done = 0;
            if ((error = mpi_test(&requests[k], &done, MPI_STATUS_IGNORE_)) != 0)
                outcome = 2;
            else if (!done)
                outcome = wait_request(&requests[k], deadline, &error);
        }
    }
    if (outcome == 0)
        return PyLong_FromLong(0);
    return failed(outcome, Py_BuildValue("(KK)", HANDLE(requests[0]), HANDLE(requests[1])), error);
}

/* The mismatch check with `nbytes` of `data` riding (see the module comment): 0 agreed (data reduced), 1
 * disagreed (data untouched), 2 failed (*failure set to the failure's tuple, or NULL when building it raised). */
static unsigned long long checks_run = 0;  /* for the tests: every check, from agree or a rider, is counted */

static int check(int comm, stage_t *stage, unsigned char *data, Py_ssize_t nbytes, int kind, int op, long long count,
                 long long digest, double deadline, PyObject **failure) {
    checks_run++;
    stage->high = digest;
    stage->negated_low = -digest;
    stage->kind = (int32_t)(nbytes > 0 ? kind : -1);
    stage->op = (int32_t)op;
    stage->count = count;
    if (nbytes > 0)
        memcpy(stage->payload, data, (size_t)nbytes);
    if (!run(stage, 1, stage_type, stage_op, comm, deadline, failure))
        return 2;
    if (stage->high != -stage->negated_low)
        return 1;
    if (nbytes > 0)
        memcpy(data, stage->payload, (size_t)nbytes);
    return 0;
}

static PyObject *checked(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "checked(comm, stage, data, nbytes, kind, op, count, digest, deadline)");
        return NULL;
    }
    if (!bound())
        return NULL;
    int comm = handle(args[0]);
    stage_t *stage = (stage_t *)PyLong_AsVoidPtr(args[1]);
    unsigned char *data = (unsigned char *)PyLong_AsVoidPtr(args[2]);
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[3]);
    long kind = PyLong_AsLong(args[4]), op = PyLong_AsLong(args[5]);
    long long count = PyLong_AsLongLong(args[6]), digest = PyLong_AsLongLong(args[7]);
    double deadline = args[8] == Py_None ? -1.0 : PyFloat_AsDouble(args[8]);
    if (PyErr_Occurred())
        return NULL;
    if (nbytes < 0 || nbytes > PAYLOAD_BYTES || (nbytes > 0 && data == NULL)) {
        PyErr_Format(PyExc_ValueError, "checked: %zd bytes do not fit the %d-byte payload", nbytes, PAYLOAD_BYTES);
        return NULL;
    }
    PyObject *failure = NULL;
    int outcome = check(comm, stage, data, nbytes, (int)kind, (int)op, count, digest, deadline, &failure);
    return outcome == 2 ? failure : PyLong_FromLong(outcome);
}

/* A rider for the C short path (comm/_shortpath.c): its first member is the function that path calls. */
typedef int (*ride_fn)(void *rider, void *data, Py_ssize_t nbytes, long long numel, long long digest,
                       double deadline, PyObject **failure);
typedef struct {
    ride_fn ride;
    int comm, kind, op;
    stage_t *stage;
    PyObject *keep;  /* the object that owns the stage's memory */
} rider_t;

static int ride(void *rider_, void *data, Py_ssize_t nbytes, long long numel, long long digest, double deadline,
                PyObject **failure) {
    rider_t *rider = (rider_t *)rider_;
    return check(rider->comm, rider->stage, (unsigned char *)data, nbytes, rider->kind, rider->op, numel, digest,
                 deadline, failure);
}

/* A plain rider (no check): `kind` and `op` hold the tensor's MPI datatype and op handles, `stage` is NULL. */
static int ride_plain(void *rider_, void *data, Py_ssize_t nbytes, long long numel, long long digest,
                      double deadline, PyObject **failure) {
    (void)nbytes, (void)digest;
    rider_t *rider = (rider_t *)rider_;
    if (numel == 0)
        return 0;
    return run(data, (int)numel, rider->kind, rider->op, rider->comm, deadline, failure) ? 0 : 2;
}

static void drop_rider(PyObject *capsule) {
    rider_t *rider = (rider_t *)PyCapsule_GetPointer(capsule, "zerocomm.rider");
    if (rider != NULL) {
        Py_XDECREF(rider->keep);
        PyMem_Free(rider);
    }
}

static PyObject *make_rider(PyObject *self, PyObject *args) {
    unsigned long long comm;
    PyObject *stage, *keep;
    int kind, op;
    if (!PyArg_ParseTuple(args, "KOOii", &comm, &stage, &keep, &kind, &op))
        return NULL;
    if (!bound())
        return NULL;
    if (kind < 0 || kind > 6 || op < 0 || op > 6) {
        PyErr_Format(PyExc_ValueError, "rider: kind %d or op %d unknown", kind, op);
        return NULL;
    }
    void *address = PyLong_AsVoidPtr(stage);
    if (address == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "rider: no stage");
        return NULL;
    }
    rider_t *rider = PyMem_Malloc(sizeof(rider_t));
    if (rider == NULL)
        return PyErr_NoMemory();
    *rider = (rider_t){ride, (int)(unsigned int)comm, kind, op, (stage_t *)address, keep};  /* see handle() */
    Py_INCREF(keep);
    PyObject *capsule = PyCapsule_New(rider, "zerocomm.rider", drop_rider);
    if (capsule == NULL) {
        Py_DECREF(keep);
        PyMem_Free(rider);
    }
    return capsule;
}

static PyObject *make_plain_rider(PyObject *self, PyObject *args) {
    unsigned long long comm, datatype, op;
    if (!PyArg_ParseTuple(args, "KKK", &comm, &datatype, &op))
        return NULL;
    if (!bound())
        return NULL;
    rider_t *rider = PyMem_Malloc(sizeof(rider_t));
    if (rider == NULL)
        return PyErr_NoMemory();
    *rider = (rider_t){ride_plain, (int)(unsigned int)comm, (int)(unsigned int)datatype, (int)(unsigned int)op, NULL,
                       Py_NewRef(Py_None)};  /* see handle() */
    PyObject *capsule = PyCapsule_New(rider, "zerocomm.rider", drop_rider);
    if (capsule == NULL) {
        Py_DECREF(Py_None);
        PyMem_Free(rider);
    }
    return capsule;
}

static PyObject *checks(PyObject *self, PyObject *unused) { return PyLong_FromUnsignedLongLong(checks_run); }

static PyMethodDef methods[] = {
    {"checks", checks, METH_NOARGS, "checks() -> how many mismatch checks ran in C in this process (for tests)"},
    {"bind", bind, METH_VARARGS,
     "bind(path, MPI_BYTE handle): take MPI's functions from the loaded MPICH library at path; the stage's size"},
    {"allreduce", (PyCFunction)(void (*)(void))allreduce, METH_FASTCALL,
     "allreduce(comm, address, count, datatype, op, deadline) -> 0 or (kind, request[, detail]); see the module"},
    {"exchange", (PyCFunction)(void (*)(void))exchange, METH_FASTCALL,
     "exchange(comm, send, recv, nbytes, peer, tag, deadline) -> 0 or (kind, (send, recv)[, detail]); see the module"},
    {"checked", (PyCFunction)(void (*)(void))checked, METH_FASTCALL,
     "checked(comm, stage, data, nbytes, kind, op, count, digest, deadline) -> 0 agreed, 1 not, or a failure"},
    {"plain_rider", make_plain_rider, METH_VARARGS,
     "plain_rider(comm, datatype, op) -> a capsule for the C short path: allreduce of the tensor, no check"},
    {"rider", make_rider, METH_VARARGS,
     "rider(comm, stage, owner, kind, op) -> a capsule for the C short path: checked() with a tensor riding"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_mpifast",
                                    "The MPI backend's hot loop (an optional C extension).", -1, methods};

PyMODINIT_FUNC PyInit__mpifast(void) { return PyModule_Create(&module); }
