/* The short path of a small blocking all_reduce, in C, for the calls whose tensor rides in the mismatch
 * check's own message, or that have no check: from the public function to the bytes with no Python frame
 * in between.
 *
 * Optional: where it imports, group.short_all_reduce is this module's, which runs group.py's Python steps
 * for everything it declines.  It takes the same steps as group.short_all_reduce does for one case -- a
 * cell whose only row carries a backend's rider (a Backend.rider capsule, today MPI's, from _mpicheck.c:
 * the check with the tensor riding for a CHECK_RIDES row, the all_reduce alone for a CHECK_OFF one) --
 * and declines (returns None, having changed nothing) in every other case,
 * before it takes a tag, so the two paths can never take different numbers of tags.
 *
 * setup(Tensor, Group, world, SUM, profiler_enabled, log_enabled, USER_TAG_LIMIT, TAG_SPAN, DIGEST_MASK,
 *       declined, failed) hands it group.py's types, the world, constants and two functions, once.
 *
 * short_all_reduce(tensor, op, group, algorithm) is what the public all_reduce calls: ride(), and where it
 * declines, declined(tensor, op, group, algorithm) (group.py's Python steps); where the call failed,
 * failed(*tuple) (which raises the typed error and releases the lock).
 *
 * ride(tensor, op, group, algorithm) -> None (declined), True (done), or, when the call ran and failed,
 * a tuple (group, tensor, outcome, failure, tag, numel, row, start, deadline) with the group's lock STILL HELD:
 * outcome 1 the ranks disagreed (the tensor untouched), 2 the rider failed (failure is its backend's
 * failure tuple).  The caller raises the typed error and releases the lock.
 *
 * A rider is a capsule named "zerocomm.rider" whose pointer's first member is
 *   int ride(void *rider, void *data, Py_ssize_t nbytes, long long numel, long long digest, long long tag,
 *            double deadline, PyObject **failure)
 * (tag: the call's, for a rider whose messages carry it) returning 0 (agreed, data reduced in place), 1 (disagreed, data untouched) or 2 (failed: *failure
 * set, or NULL with a Python error).  A row is (most elements, function, check, hash of the cell, cell,
 * rider) and a rider entry (capsule, most elements that ride, element size).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <time.h>

typedef int (*ride_fn)(void *rider, void *data, Py_ssize_t nbytes, long long numel, long long digest,
                       long long tag, double deadline, PyObject **failure);

static PyObject *Tensor, *Group, *world, *sum, *profiler_enabled, *log_enabled, *debug_level, *declined, *failed;
static long long tag_base, tag_span, digest_mask;
static PyObject *s_default, *s_zerocomm_group, *s_short, *s_dtype, *s_is_contiguous, *s_is_cpu, *s_numel, *s_data_ptr, *s_lock,
    *s_acquire, *s_release, *s_pending, *s_failure, *s_closed, *s_observers, *s_seq, *s_timeout_s;

static double now(void) {  /* time.monotonic()'s clock */
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The key (algorithm, dtype) of Group.short, without a new tuple per call: the last one is kept (a new
 * tuple would cost more than the lookup, counting the garbage collections its allocations trigger). */
static PyObject *last_key;

static PyObject *cell_key(PyObject *algorithm, PyObject *dtype) {  /* borrowed */
    if (last_key == NULL || PyTuple_GET_ITEM(last_key, 0) != algorithm || PyTuple_GET_ITEM(last_key, 1) != dtype) {
        PyObject *key = PyTuple_Pack(2, algorithm, dtype);
        if (key == NULL)
            return NULL;
        Py_XSETREF(last_key, key);
    }
    return last_key;
}

/* hash((tag, numel, code)) as Python computes it (tuplehash, the same since CPython 3.8), without the
 * tuple; setup() compares it with Python's own hash and keeps build_digest false where they differ. */
#define PRIME_1 ((Py_uhash_t)11400714785074694791ULL)
#define PRIME_2 ((Py_uhash_t)14029467366897019727ULL)
#define PRIME_5 ((Py_uhash_t)2870177450012600261ULL)
static int same_hash;

static Py_hash_t triple_hash(long long tag, long long numel, PyObject *code) {
    Py_hash_t code_hash = PyObject_Hash(code);
    if (code_hash == -1)
        return -1;
    if (!same_hash) {
        PyObject *pieces = Py_BuildValue("(LLO)", tag, numel, code);
        Py_hash_t hash = pieces ? PyObject_Hash(pieces) : -1;
        Py_XDECREF(pieces);
        return hash;
    }
    Py_uhash_t lanes[3] = {(Py_uhash_t)tag, (Py_uhash_t)numel, (Py_uhash_t)code_hash};  /* hash(i) == i: 0 <= i < 2**61 - 1 */
    Py_uhash_t acc = PRIME_5;
    for (int i = 0; i < 3; i++) {
        acc += lanes[i] * PRIME_2;
        acc = (acc << 31) | (acc >> 33);
        acc *= PRIME_1;
    }
    acc += 3 ^ (PRIME_5 ^ 3527539UL);
    return acc == (Py_uhash_t)-1 ? 1546275796 : (Py_hash_t)acc;
}

static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *t, *g, *w, *s, *p, *l, *d, *f;
    if (!PyArg_ParseTuple(args, "OOOOOOLLLOO", &t, &g, &w, &s, &p, &l, &tag_base, &tag_span, &digest_mask, &d, &f))
        return NULL;
    if (!PyType_Check(t) || !PyType_Check(g) || tag_span <= 0 || !PyCallable_Check(d) || !PyCallable_Check(f)) {
        PyErr_SetString(PyExc_TypeError, "setup(Tensor, Group, world, SUM, profiler_enabled, log_enabled, ...)");
        return NULL;
    }
    PyObject *old[] = {Tensor, Group, world, sum, profiler_enabled, log_enabled, declined, failed};
    Tensor = Py_NewRef(t), Group = Py_NewRef(g), world = Py_NewRef(w), sum = Py_NewRef(s);
    profiler_enabled = Py_NewRef(p), log_enabled = Py_NewRef(l), declined = Py_NewRef(d), failed = Py_NewRef(f);
    for (int i = 0; i < 8; i++)
        Py_XDECREF(old[i]);
    /* Check the hash replica against Python's own on a few calls, negative cell hashes included. */
    same_hash = 1;
    long long samples[][2] = {{0, 0}, {12345, 2}, {(1LL << 28) - 1, (1LL << 40) + 7}};
    for (int i = 0; i < 3 && same_hash; i++) {
        for (long long code_value = -3; code_value <= 3 && same_hash; code_value += 2) {
            PyObject *code = PyLong_FromLongLong(code_value * 0x123456789ABCDLL);
            PyObject *pieces = code ? Py_BuildValue("(LLO)", samples[i][0], samples[i][1], code) : NULL;
            Py_hash_t python = pieces ? PyObject_Hash(pieces) : -1;
            same_hash = python != -1 && triple_hash(samples[i][0], samples[i][1], code) == python;
            Py_XDECREF(pieces);
            Py_XDECREF(code);
        }
    }
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* Truthiness of obj.name; -1 with an error set. */
static int attribute_true(PyObject *obj, PyObject *name) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL)
        return -1;
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

/* Whether the tensor is a dense contiguous CPU tensor of at most `most` elements: 1, 0, or -1 (error). */
static int fits(PyObject *tensor, long long most, long long *numel) {
    PyObject *value = PyObject_CallMethodNoArgs(tensor, s_is_contiguous);
    if (value == NULL)
        return -1;
    int truth = value == Py_True;
    Py_DECREF(value);
    if (!truth)
        return 0;
    if ((truth = attribute_true(tensor, s_is_cpu)) != 1)
        return truth;
    if ((value = PyObject_CallMethodNoArgs(tensor, s_numel)) == NULL)
        return -1;
    *numel = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (*numel < 0)
        return PyErr_Occurred() ? -1 : 0;
    return *numel <= most;
}

/* The group's state lets a call run now (none queued, not failed or closed, nobody observing): 1, 0, -1. */
static int idle(PyObject *g) {
    int truth;
    if ((truth = attribute_true(g, s_pending)) != 0)
        return truth < 0 ? -1 : 0;
    PyObject *failure = PyObject_GetAttr(g, s_failure);
    if (failure == NULL)
        return -1;
    Py_DECREF(failure);
    if (failure != Py_None)
        return 0;
    if ((truth = attribute_true(g, s_closed)) != 0 || (truth = attribute_true(world, s_observers)) != 0)
        return truth < 0 ? -1 : 0;
    PyObject *profiling = PyObject_CallNoArgs(profiler_enabled);
    if (profiling == NULL)
        return -1;
    truth = PyObject_IsTrue(profiling);
    Py_DECREF(profiling);
    return truth < 0 ? -1 : !truth;
}

/* Everything ride() reads before it takes the lock; NULL fields mean "decline" (or an error when set). */
typedef struct {
    PyObject *g, *row, *lock;
    void *rider;
    long long numel, item_size;
} cell_t;

static int find(PyObject *tensor, PyObject *op, PyObject *group, PyObject *algorithm, cell_t *cell) {
    if (op != sum || Py_TYPE(tensor) != (PyTypeObject *)Tensor)
        return 0;
    PyObject *g = group == Py_None ? PyObject_GetAttr(world, s_default) : Py_NewRef(group);
    if (g == NULL)
        return -1;
    cell->g = g;  /* owned from here: the caller drops it */
    if (Py_TYPE(g) != (PyTypeObject *)Group && g != Py_None) {  /* the ProcessGroup new_group returned */
        PyObject *plain = PyObject_GetAttr(g, s_zerocomm_group);
        if (plain == NULL) {
            PyErr_Clear();  /* not a group of ours: the Python path says what is wrong */
            return 0;
        }
        Py_SETREF(cell->g, plain);
        g = plain;
    }
    if (Py_TYPE(g) != (PyTypeObject *)Group)
        return 0;  /* None: not initialised; the Python path raises */
    PyObject *rows_by_cell = PyObject_GetAttr(g, s_short), *dtype = PyObject_GetAttr(tensor, s_dtype);
    PyObject *key = rows_by_cell && dtype ? cell_key(algorithm, dtype) : NULL;
    PyObject *rows = key ? PyDict_GetItemWithError(rows_by_cell, key) : NULL;  /* borrowed */
    Py_XDECREF(dtype);
    Py_XINCREF(rows);
    Py_XDECREF(rows_by_cell);
    if (rows == NULL)
        return PyErr_Occurred() ? -1 : 0;
    int found = 0;
    if (PyTuple_Check(rows) && PyTuple_GET_SIZE(rows) == 1) {  /* "auto"'s rows by size: the Python path */
        PyObject *row = PyTuple_GET_ITEM(rows, 0);
        if (PyTuple_Check(row) && PyTuple_GET_SIZE(row) == 6 && PyTuple_Check(PyTuple_GET_ITEM(row, 5))) {
            PyObject *rider = PyTuple_GET_ITEM(row, 5);
            cell->rider = PyCapsule_GetPointer(PyTuple_GET_ITEM(rider, 0), "zerocomm.rider");
            long long most = PyLong_AsLongLong(PyTuple_GET_ITEM(rider, 1));
            cell->item_size = PyLong_AsLongLong(PyTuple_GET_ITEM(rider, 2));
            if (cell->rider != NULL && !PyErr_Occurred()) {
                cell->row = Py_NewRef(row);
                found = fits(tensor, most, &cell->numel);
            }
        }
    }
    Py_DECREF(rows);
    if (found != 1)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *logging = PyObject_CallOneArg(log_enabled, debug_level);  /* selection logging: the Python path */
    if (logging == NULL)
        return -1;
    found = logging == Py_False;
    Py_DECREF(logging);
    return found;
}

static PyObject *ride(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "ride(tensor, op, group, algorithm)");
        return NULL;
    }
    if (Tensor == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_shortpath.setup() was not called");
        return NULL;
    }
    cell_t cell = {NULL, NULL, NULL, NULL, 0, 0};
    PyObject *result = NULL, *taken = NULL;
    int found = find(args[0], args[1], args[2], args[3], &cell);
    if (found != 1) {
        result = found < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    if ((cell.lock = PyObject_GetAttr(cell.g, s_lock)) == NULL ||
        (taken = PyObject_CallMethodOneArg(cell.lock, s_acquire, Py_False)) == NULL)
        goto done;
    if (taken != Py_True) {
        result = Py_NewRef(Py_None);  /* another thread holds the group: the full path queues behind it */
        goto done;
    }
    int ready = idle(cell.g);
    PyObject *seq = ready == 1 ? PyObject_GetAttr(cell.g, s_seq) : NULL;
    long long next = seq ? PyLong_AsLongLong(seq) + 1 : 0;
    Py_XDECREF(seq);
    PyObject *next_seq = seq && !PyErr_Occurred() ? PyLong_FromLongLong(next) : NULL;
    if (next_seq == NULL || PyObject_SetAttr(cell.g, s_seq, next_seq) < 0) {
        Py_XDECREF(next_seq);
        result = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        PyObject *error_type, *error, *traceback;
        PyErr_Fetch(&error_type, &error, &traceback);
        PyObject *released = PyObject_CallMethodNoArgs(cell.lock, s_release);
        Py_XDECREF(released);
        PyErr_Restore(error_type, error, traceback);
        goto done;
    }
    Py_DECREF(next_seq);
    /* From here the call is this group's: a tag is taken, and every way out runs the call or reports it. */
    long long tag = tag_base + next % tag_span;
    PyObject *timeout = PyObject_GetAttr(cell.g, s_timeout_s);
    double start = now(), deadline = start + (timeout ? PyFloat_AsDouble(timeout) : 0.0);
    Py_XDECREF(timeout);
    Py_hash_t hash = PyErr_Occurred() ? -1 : triple_hash(tag, cell.numel, PyTuple_GET_ITEM(cell.row, 3));
    PyObject *address = hash == -1 ? NULL : PyObject_CallMethodNoArgs(args[0], s_data_ptr);
    void *data = address ? PyLong_AsVoidPtr(address) : NULL;
    Py_XDECREF(address);
    int outcome = 2;
    PyObject *failure = NULL;
    if (!PyErr_Occurred())
        outcome = ((ride_fn *)cell.rider)[0](cell.rider, data, (Py_ssize_t)(cell.numel * cell.item_size), cell.numel,
                                             (long long)hash & digest_mask, tag, deadline, &failure);
    if (outcome == 0) {
        PyObject *released = PyObject_CallMethodNoArgs(cell.lock, s_release);
        result = released ? Py_NewRef(Py_True) : NULL;
        Py_XDECREF(released);
    } else if (failure != NULL || outcome == 1) {  /* the lock stays held: the caller reports, then releases */
        result = Py_BuildValue("(OOiOLLOdd)", cell.g, args[0], outcome, failure ? failure : Py_None, tag, cell.numel,
                               cell.row, start, deadline);
        Py_XDECREF(failure);
    } else {  /* a Python error before or in the rider: raise it here, the lock released */
        PyObject *error_type, *error, *traceback;
        PyErr_Fetch(&error_type, &error, &traceback);
        PyObject *released = PyObject_CallMethodNoArgs(cell.lock, s_release);
        Py_XDECREF(released);
        PyErr_Restore(error_type, error, traceback);
    }
done:
    Py_XDECREF(taken);
    Py_XDECREF(cell.lock);
    Py_XDECREF(cell.row);
    Py_XDECREF(cell.g);
    return result;
}

static PyObject *short_all_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *rode = ride(self, args, nargs);
    if (rode == Py_None) {
        Py_DECREF(rode);
        return PyObject_Vectorcall(declined, args, (size_t)nargs, NULL);
    }
    if (rode != NULL && PyTuple_Check(rode)) {
        PyObject *reported = PyObject_Call(failed, rode, NULL);
        Py_DECREF(rode);
        return reported;
    }
    return rode;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS,
     "setup(Tensor, Group, world, SUM, profiler_enabled, log_enabled, USER_TAG_LIMIT, TAG_SPAN, DIGEST_MASK, "
     "declined, failed)"},
    {"ride", (PyCFunction)(void (*)(void))ride, METH_FASTCALL,
     "ride(tensor, op, group, algorithm) -> None (declined), True (done) or a failure tuple, the lock held"},
    {"short_all_reduce", (PyCFunction)(void (*)(void))short_all_reduce, METH_FASTCALL,
     "short_all_reduce(tensor, op, group, algorithm) -> bool: ride(), else declined(...) or failed(*tuple)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_shortpath",
                                    "The short path of a small blocking all_reduce (an optional C extension).",
                                    -1, methods};

#define NAME(variable, text) if ((variable = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__shortpath(void) {
    NAME(s_default, "default");
    NAME(s_zerocomm_group, "zerocomm_group");
    NAME(s_short, "short");
    NAME(s_dtype, "dtype");
    NAME(s_is_contiguous, "is_contiguous");
    NAME(s_is_cpu, "is_cpu");
    NAME(s_numel, "numel");
    NAME(s_data_ptr, "data_ptr");
    NAME(s_lock, "_lock");
    NAME(s_acquire, "acquire");
    NAME(s_release, "release");
    NAME(s_pending, "_pending");
    NAME(s_failure, "failure");
    NAME(s_closed, "_closed");
    NAME(s_observers, "observers");
    NAME(s_seq, "_seq");
    NAME(s_timeout_s, "_timeout_s");
    if ((debug_level = PyLong_FromLong(10)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
