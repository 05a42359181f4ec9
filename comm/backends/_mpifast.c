/* The MPI backend's hot loop in C: post one MPI_Iallreduce and wait for it without burning a core.
 *
 * Optional: comm/backends/mpi.py uses it when it imports and binds, and runs the same steps through
 * mpi4py otherwise.  It reaches the MPI library mpi4py already loaded (bind() is given its path)
 * through MPICH's ABI, where communicators, datatypes, ops and requests are C ints, MPI_IN_PLACE is
 * (void *)-1 and MPI_STATUS_IGNORE is (MPI_Status *)1: so no mpi.h is needed to build it.  mpi.py
 * binds it only to an MPICH library whose handles are ints.
 *
 * bind(path, byte_handle) finds MPI_Iallreduce, MPI_Test, ... in the MPICH library at path (loaded already)
 * and keeps MPI_BYTE's handle for exchange().
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
 * exchange(comm, send, recv, nbytes, peer, tag, deadline) posts MPI_Irecv(recv) and MPI_Isend(send) of
 * nbytes each with `peer` and `tag` (as MPI_BYTE), and waits for both as allreduce does: the whole-buffer
 * exchange of recursive doubling and of a two-rank tree in one call.  Returns 0, or a failure tuple
 * as allreduce's with ((send request, recv request)) in place of the one request.
 *
 * collective(kind, ...) posts MPI_Iallgather, MPI_Ireduce_scatter_block or MPI_Ibcast and waits as allreduce
 * does (see the function).
 *
 * The mismatch check needs nothing of its own here: its stage is a SUM all_reduce of float64s (comm/check.py),
 * which allreduce() runs like any other.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <time.h>

/* MPICH's ABI: handles are ints (see above). */
typedef int (*iallreduce_fn)(const void *, void *, int, int, int, int, int *);
typedef int (*test_fn)(int *, int *, void *);
typedef int (*isend_fn)(const void *, int, int, int, int, int, int *);
typedef int (*irecv_fn)(void *, int, int, int, int, int, int *);

#define MPI_IN_PLACE_ ((const void *)-1)
#define MPI_STATUS_IGNORE_ ((void *)1)
#define MPI_REQUEST_NULL_ 0x2c000000
/* A request handle as mpi4py writes MPICH's handles (see allreduce), for MPI.Request.fromhandle. */
#define HANDLE(request) ((unsigned long long)(long long)(request))

#define SPIN_S 20e-6
#define YIELD_PHASE_S 2e-3
#define FIRST_SLEEP_S 50e-6
#define MAX_SLEEP_S 10e-3

typedef int (*iallgather_fn)(const void *, int, int, void *, int, int, int, int *);
typedef int (*ireduce_scatter_block_fn)(const void *, void *, int, int, int, int, int *);
typedef int (*ibcast_fn)(void *, int, int, int, int, int *);

static iallreduce_fn mpi_iallreduce = NULL;
static iallgather_fn mpi_iallgather = NULL;
static ireduce_scatter_block_fn mpi_ireduce_scatter_block = NULL;
static ibcast_fn mpi_ibcast = NULL;
static test_fn mpi_test = NULL;
static isend_fn mpi_isend = NULL;
static irecv_fn mpi_irecv = NULL;
static int byte_type = 0;  /* MPI_BYTE's handle, given to bind() */

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
    mpi_iallreduce = iallreduce;
    mpi_iallgather = (iallgather_fn)dlsym(library, "MPI_Iallgather");  /* NULL: collective() says so */
    mpi_ireduce_scatter_block = (ireduce_scatter_block_fn)dlsym(library, "MPI_Ireduce_scatter_block");
    mpi_ibcast = (ibcast_fn)dlsym(library, "MPI_Ibcast");
    mpi_test = test;
    mpi_isend = isend;
    mpi_irecv = irecv;
    byte_type = (int)(unsigned int)byte_handle;
    Py_RETURN_NONE;
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

/* Send `send` to and/or receive `recv` from `peer` (either may be NULL), nbytes each as MPI_BYTE, and wait
 * for both: 1 when done, else 0 with *failure set to the failure's tuple with ((send, recv) requests), or to
 * NULL when building it raised. */
static int message(int comm, const void *send, void *recv, int nbytes, int peer, int tag, double deadline,
            PyObject **failure) {
    int requests[2] = {MPI_REQUEST_NULL_, MPI_REQUEST_NULL_};  /* send, recv */
    int error = 0, outcome = 2;
    if ((recv == NULL || (error = mpi_irecv(recv, nbytes, byte_type, peer, tag, comm, &requests[1])) == 0) &&
        (send == NULL || (error = mpi_isend(send, nbytes, byte_type, peer, tag, comm, &requests[0])) == 0)) {
        outcome = 0;
        for (int k = 0; k < 2 && outcome == 0; k++) {
            int done = 0;
            if (requests[k] == MPI_REQUEST_NULL_)
                continue;
            if ((error = mpi_test(&requests[k], &done, MPI_STATUS_IGNORE_)) != 0)
                outcome = 2;
            else if (!done)
                outcome = wait_request(&requests[k], deadline, &error);
        }
    }
    if (outcome == 0)
        return 1;
    *failure = failed(outcome, Py_BuildValue("(KK)", HANDLE(requests[0]), HANDLE(requests[1])), error);
    return 0;
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
    PyObject *failure = NULL;
    if (message(comm, send, recv, (int)nbytes, (int)peer, (int)tag, deadline, &failure))
        return PyLong_FromLong(0);
    return failure;
}

/* collective(kind, comm, send, recv, count, datatype, op_or_root, deadline): post one nonblocking collective and
 * wait for it as allreduce does.  kind 0: MPI_Iallgather(send or MPI_IN_PLACE when send is 0, count, datatype,
 * recv, count, datatype); 1: MPI_Ireduce_scatter_block(send, recv, count, datatype, op); 2: MPI_Ibcast(recv, count,
 * datatype, root).  Returns 0, or a failure tuple as allreduce's. */
static PyObject *collective(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "collective(kind, comm, send, recv, count, datatype, op_or_root, deadline)");
        return NULL;
    }
    if (!bound())
        return NULL;
    int kind = (int)PyLong_AsLong(args[0]), comm = handle(args[1]), datatype = handle(args[5]);
    void *send = PyLong_AsVoidPtr(args[2]), *recv = PyLong_AsVoidPtr(args[3]);
    int count = (int)PyLong_AsLong(args[4]);
    int op_or_root = kind == 2 ? (int)PyLong_AsLong(args[6]) : handle(args[6]);
    double deadline = PyFloat_AsDouble(args[7]);
    if (PyErr_Occurred())
        return NULL;
    int request = MPI_REQUEST_NULL_, done = 0, error = 0, outcome;
    if (kind == 0 && mpi_iallgather != NULL)
        error = mpi_iallgather(send == NULL ? MPI_IN_PLACE_ : send, count, datatype, recv, count, datatype, comm,
                               &request);
    else if (kind == 1 && mpi_ireduce_scatter_block != NULL)
        error = mpi_ireduce_scatter_block(send, recv, count, datatype, op_or_root, comm, &request);
    else if (kind == 2 && mpi_ibcast != NULL)
        error = mpi_ibcast(recv, count, datatype, op_or_root, comm, &request);
    else {
        PyErr_Format(PyExc_ValueError, "collective: kind %d is not one this library offers", kind);
        return NULL;
    }
    if (error != 0 || (error = mpi_test(&request, &done, MPI_STATUS_IGNORE_)) != 0)
        return failed(2, PyLong_FromUnsignedLongLong(HANDLE(request)), error);
    if (done || (outcome = wait_request(&request, deadline, &error)) == 0)
        return PyLong_FromLong(0);
    return failed(outcome, PyLong_FromUnsignedLongLong(HANDLE(request)), error);
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(path, MPI_BYTE handle): take MPI's functions from the loaded MPICH library at path"},
    {"allreduce", (PyCFunction)(void (*)(void))allreduce, METH_FASTCALL,
     "allreduce(comm, address, count, datatype, op, deadline) -> 0 or (kind, request[, detail]); see the module"},
    {"collective", (PyCFunction)(void (*)(void))collective, METH_FASTCALL,
     "collective(kind, comm, send, recv, count, datatype, op_or_root, deadline) -> 0 or a failure; see the function"},
    {"exchange", (PyCFunction)(void (*)(void))exchange, METH_FASTCALL,
     "exchange(comm, send, recv, nbytes, peer, tag, deadline) -> 0 or (kind, (send, recv)[, detail]); see the module"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_mpifast",
                                    "The MPI backend's hot loop (an optional C extension).", -1, methods};

PyMODINIT_FUNC PyInit__mpifast(void) { return PyModule_Create(&module); }
