/* The mismatch check in C, with a small all_reduce riding in its messages: the other half of _mpifast
 * (see _mpifast.c for how it reaches MPICH).
 *
 * The stage.  Every check exchanges one STAGE_BYTES stage per rank: a header [digest, -digest, kind, op,
 * count] and up to PAYLOAD_BYTES of the tensor's bytes (kind -1 for the check alone).  combine() merges
 * two stages: it keeps the largest digest and the largest negated digest, and reduces the payloads only
 * where both sides carry one digest; the ranks agree when the final largest digest equals the smallest.
 * The user's tensor is written only then.
 *
 * Two schedules carry the stage, chosen by what the digest covers (so every rank making the same call
 * picks the same one):
 *
 * - MPI's own collective (a native all_reduce, and every check with nothing riding): the stage is
 *   all-reduced as ONE element of a contiguous STAGE_BYTES type with combine as a commutative user op.
 *   Every such check has this same type signature, so ranks that called different things still make a
 *   valid MPI call (no truncation, nothing written outside the stage), and an element is never split.
 *
 * - Recursive doubling's own messages (zerocomm's recursive_doubling, and its two-rank tree, which is the
 *   same one exchange): the stage goes round the algorithm's schedule as point-to-point messages of
 *   STAGE_BYTES on the check's communicator, tagged with the call's tag, each rank combining what it
 *   receives.  After log2(n) exchanges (one more each way for the ranks beyond a power of two) every rank
 *   holds every rank's combined stage: the check and the all_reduce in one round trip per step, where
 *   checking first would cost a whole collective more.
 *
 * [Note: answering]  A rank in the first schedule and a rank in the second would wait for each other
 * forever.  So a rank waiting in the collective also answers: once its spin is over, each pass of its
 * wait probes for a stage sent to it with its call's tag, receives it and sends back its own header
 * with ANSWERED set in `op` (answer_peers).  A recursive-doubling rank takes the answer as its peer's
 * stage: the digests differ, and combine carries ANSWERED on, so every recursive-doubling rank ends
 * disagreeing and knowing that some rank waits in the collective -- each can be reached from every
 * answering rank along the schedule, because an answering rank answers each peer that sends to it.
 * They then join the collective with their own stage, which completes it everywhere with the ranks
 * disagreeing: every rank raises CollectiveMismatchError and the group stays in step.  Ranks beyond a
 * power of two exchange with their partner (not only send), so that an answering partner is seen there
 * too, and skip the result message an answering partner would never send or read.
 *
 * checked(comm, stage, data, nbytes, kind, op, count, digest, tag, schedule, rank, size, deadline) runs a
 * check (schedule 0: the collective; 1: recursive doubling, where `stage` holds three stages) with
 * `nbytes` of `data` riding; deadline None for none.  Returns 0 (agreed; data reduced when given), 1
 * (disagreed; data untouched), or the failure tuples of allreduce (with both requests for a message).
 */
#include "_mpifast.h"

#include <stdlib.h>
#include <string.h>

/* Set in a stage's op by a rank that waits in the check's collective and answers a message (see the note). */
#define ANSWERED 0x10000
/* At most this many answers per check: a rank answers one message per step of recursive doubling. */
#define MOST_ANSWERS 64

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

void combine(void *in_, void *inout_, int *len, int *datatype) {
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
        io->op |= in->op & ANSWERED;
    }
}

static void fill(stage_t *stage, const unsigned char *data, Py_ssize_t nbytes, int kind, int op, long long count,
                 long long digest) {
    stage->high = digest;
    stage->negated_low = -digest;
    stage->kind = (int32_t)(nbytes > 0 ? kind : -1);
    stage->op = (int32_t)op;
    stage->count = count;
    if (nbytes > 0)
        memcpy(stage->payload, data, (size_t)nbytes);
}

/* -- answering (see the note) ------------------------------------------------------------------------- */

struct answering {
    int comm, tag, sent;
    unsigned char header[32];            /* this rank's stage header, as it entered the collective */
    int requests[MOST_ANSWERS];          /* the answers' sends */
    stage_t *answers[MOST_ANSWERS];      /* their buffers (malloc: the GIL may be released) */
};

void answer_peers(answering_t *answering) {
    while (answering->sent < MOST_ANSWERS) {
        int found = 0, status[STATUS_INTS];
        if (mpi_iprobe(MPI_ANY_SOURCE_, answering->tag, answering->comm, &found, status) != 0 || !found)
            return;
        int peer = status[status_source];
        stage_t incoming, *answer = calloc(1, sizeof(stage_t));
        if (answer == NULL)
            return;  /* tried again on the next pass */
        /* The probed message is there: this receive does not wait. */
        if (mpi_recv(&incoming, STAGE_BYTES, byte_type, peer, answering->tag, answering->comm, MPI_STATUS_IGNORE_) != 0) {
            free(answer);
            return;
        }
        memcpy(answer, answering->header, sizeof answering->header);
        answer->op |= ANSWERED;
        int *request = &answering->requests[answering->sent];
        if (mpi_isend(answer, STAGE_BYTES, byte_type, peer, answering->tag, answering->comm, request) != 0) {
            free(answer);
            return;
        }
        answering->answers[answering->sent++] = answer;
    }
}

/* Wait for the answers' sends (the peers wait for them, so they finish at once); a send that fails or
 * outlives the deadline keeps its buffer (leaked: MPI may still read it). */
static void settle_answers(answering_t *answering, double deadline) {
    for (int k = 0; k < answering->sent; k++) {
        int done = 0, error = 0;
        if (mpi_test(&answering->requests[k], &done, MPI_STATUS_IGNORE_) == 0 &&
            (done || wait_request(&answering->requests[k], deadline, &error, NULL) == 0))
            free(answering->answers[k]);
    }
    if (PyErr_Occurred())  /* a signal handler raised during that wait: the check's own outcome stands */
        PyErr_Clear();
}

/* -- the two schedules ------------------------------------------------------------------------------- */

static unsigned long long checks_run = 0;  /* for the tests: every check is counted */

/* The check in MPI's collective (see the comment at the top): 0 agreed (data reduced), 1 disagreed (data
 * untouched), 2 failed (*failure set to the failure's tuple, or NULL when building it raised). */
static int check(int comm, stage_t *stage, unsigned char *data, Py_ssize_t nbytes, int kind, int op, long long count,
                 long long digest, long long tag, double deadline, PyObject **failure) {
    checks_run++;
    fill(stage, data, nbytes, kind, op, count, digest);
    answering_t answering;
    answering.comm = comm, answering.tag = (int)tag, answering.sent = 0;
    memcpy(answering.header, stage, sizeof answering.header);
    int ran = run(stage, 1, stage_type, stage_op, comm, deadline, &answering, failure);
    settle_answers(&answering, deadline);
    if (!ran)
        return 2;
    if (stage->high != -stage->negated_low)
        return 1;
    if (nbytes > 0)
        memcpy(data, stage->payload, (size_t)nbytes);
    return 0;
}

/* The check riding in recursive doubling's messages (see the comment at the top and the note): `stages`
 * holds three stages (this rank's running result, the one received, its own as it entered).  Returns
 * as check() does. */
static int check_by_recursive_doubling(int comm, stage_t *stages, unsigned char *data, Py_ssize_t nbytes, int kind,
                                       int op, long long count, long long digest, long long tag, int rank, int size,
                                       double deadline, PyObject **failure) {
    checks_run++;
    stage_t *result = stages, *received = stages + 1, *own = stages + 2;
    fill(result, data, nbytes, kind, op, count, digest);
    memcpy(own, result, sizeof *own);
    int one = 1, t = (int)tag, answered = 0, virtual_rank;
    int power = 1;  /* the largest power of two <= size; the first 2 * extra ranks pair up first */
    while (power <= size / 2)
        power *= 2;
    int extra = size - power;
    if (rank < 2 * extra) {  /* odd ranks take their even partner's stage; the even ones wait for the result */
        if (!message(comm, result, received, STAGE_BYTES, rank ^ 1, t, deadline, failure))
            return 2;
        answered = (received->op & ANSWERED) != 0;
        if (rank % 2 == 1 || answered)
            combine(received, result, &one, NULL);
        virtual_rank = rank % 2 == 1 ? rank / 2 : -1;
    } else {
        virtual_rank = rank - extra;
    }
    if (virtual_rank >= 0) {
        for (int mask = 1; mask < power; mask <<= 1) {
            int v = virtual_rank ^ mask, peer = v < extra ? 2 * v + 1 : v + extra;
            if (!message(comm, result, received, STAGE_BYTES, peer, t, deadline, failure))
                return 2;
            combine(received, result, &one, NULL);
        }
        if (rank < 2 * extra && !answered && !message(comm, result, NULL, STAGE_BYTES, rank - 1, t, deadline, failure))
            return 2;
    } else if (!answered && !message(comm, NULL, result, STAGE_BYTES, rank + 1, t, deadline, failure)) {
        return 2;
    }
    if (result->high != -result->negated_low) {
        /* Some rank waits in the collective: meet it there, with this rank's own stage (see the note). */
        if ((result->op & ANSWERED) && !run(own, 1, stage_type, stage_op, comm, deadline, NULL, failure))
            return 2;
        return 1;
    }
    if (nbytes > 0)
        memcpy(data, result->payload, (size_t)nbytes);
    return 0;
}

static int run_check(int schedule, int comm, stage_t *stage, unsigned char *data, Py_ssize_t nbytes, int kind, int op,
                     long long count, long long digest, long long tag, int rank, int size, double deadline,
                     PyObject **failure) {
    if (schedule == 1)
        return check_by_recursive_doubling(comm, stage, data, nbytes, kind, op, count, digest, tag, rank, size,
                                           deadline, failure);
    return check(comm, stage, data, nbytes, kind, op, count, digest, tag, deadline, failure);
}

PyObject *checked(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError,
                        "checked(comm, stage, data, nbytes, kind, op, count, digest, tag, schedule, rank, size, deadline)");
        return NULL;
    }
    if (!bound())
        return NULL;
    int comm = handle(args[0]);
    stage_t *stage = (stage_t *)PyLong_AsVoidPtr(args[1]);
    unsigned char *data = (unsigned char *)PyLong_AsVoidPtr(args[2]);
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[3]);
    long kind = PyLong_AsLong(args[4]), op = PyLong_AsLong(args[5]);
    long long count = PyLong_AsLongLong(args[6]), digest = PyLong_AsLongLong(args[7]), tag = PyLong_AsLongLong(args[8]);
    long schedule = PyLong_AsLong(args[9]), rank = PyLong_AsLong(args[10]), size = PyLong_AsLong(args[11]);
    double deadline = args[12] == Py_None ? -1.0 : PyFloat_AsDouble(args[12]);
    if (PyErr_Occurred())
        return NULL;
    if (nbytes < 0 || nbytes > PAYLOAD_BYTES || (nbytes > 0 && data == NULL)) {
        PyErr_Format(PyExc_ValueError, "checked: %zd bytes do not fit the %d-byte payload", nbytes, PAYLOAD_BYTES);
        return NULL;
    }
    if ((schedule != 0 && schedule != 1) || size < 1 || rank < 0 || rank >= size || tag < 0 || tag > 0x7fffffffLL) {
        PyErr_Format(PyExc_ValueError, "checked: schedule %ld, rank %ld of %ld or tag %lld unknown", schedule, rank, size,
                     tag);
        return NULL;
    }
    PyObject *failure = NULL;
    int outcome = run_check((int)schedule, comm, stage, data, nbytes, (int)kind, (int)op, count, digest, tag, (int)rank,
                            (int)size, deadline, &failure);
    return outcome == 2 ? failure : PyLong_FromLong(outcome);
}

PyObject *checks(PyObject *self, PyObject *unused) { return PyLong_FromUnsignedLongLong(checks_run); }
