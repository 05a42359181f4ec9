/* What the two halves of the _mpifast extension share: _mpifast.c (binding MPICH, the wait, the native
 * all_reduce and exchange) and _mpicheck.c (the mismatch check's stage, with a small all_reduce riding in
 * MPI's collective or in recursive doubling's own messages).  See each file's comment. */
#ifndef ZEROCOMM_MPIFAST_H
#define ZEROCOMM_MPIFAST_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

/* MPICH's ABI: handles are ints (see _mpifast.c). */
typedef int (*iallreduce_fn)(const void *, void *, int, int, int, int, int *);
typedef int (*test_fn)(int *, int *, void *);
typedef int (*isend_fn)(const void *, int, int, int, int, int, int *);
typedef int (*irecv_fn)(void *, int, int, int, int, int, int *);
typedef int (*iprobe_fn)(int, int, int, int *, void *);
typedef int (*recv_fn)(void *, int, int, int, int, int, void *);

extern iallreduce_fn mpi_iallreduce;
extern test_fn mpi_test;
extern isend_fn mpi_isend;
extern irecv_fn mpi_irecv;
extern iprobe_fn mpi_iprobe;
extern recv_fn mpi_recv;
extern int byte_type;               /* MPI_BYTE's handle, given to bind() */
extern int stage_type, stage_op;    /* the check's MPI type and op, made once by bind() */
extern int status_source;           /* the index of MPI_SOURCE among an MPI_Status's ints, given to bind() */

#define MPI_IN_PLACE_ ((const void *)-1)
#define MPI_STATUS_IGNORE_ ((void *)1)
#define MPI_REQUEST_NULL_ 0x2c000000
#define MPI_ANY_SOURCE_ (-2)
#define STATUS_INTS 16  /* room for any MPI_Status (MPICH's has 5 ints) */
/* A request handle as mpi4py writes MPICH's handles (see allreduce), for MPI.Request.fromhandle. */
#define HANDLE(request) ((unsigned long long)(long long)(request))

/* The mismatch check's stage: a header and up to PAYLOAD_BYTES of a small tensor (see _mpicheck.c). */
#define PAYLOAD_BYTES 224
#define STAGE_BYTES (32 + PAYLOAD_BYTES)

typedef struct {
    int64_t high, negated_low;  /* the largest digest, and the largest negated digest */
    int32_t kind, op;           /* the payload's element type and reduction (see KINDS and OPS in mpi.py) */
    int64_t count;              /* elements in the payload */
    unsigned char payload[PAYLOAD_BYTES];
} stage_t;

/* What a rank that waits in the check's MPI_Iallreduce answers peers that check in point-to-point
 * messages (see _mpicheck.c); NULL for every other wait. */
typedef struct answering answering_t;

double now(void);
int wait_request(int *request, double deadline, int *error, answering_t *answering);
void answer_peers(answering_t *answering);
PyObject *failed(int outcome, PyObject *requests, int error);
int run(void *address, int count, int datatype, int op, int comm, double deadline, answering_t *answering,
        PyObject **failure);
int message(int comm, const void *send, void *recv, int nbytes, int peer, int tag, double deadline,
            PyObject **failure);
int handle(PyObject *value);
int bound(void);
void combine(void *in_, void *inout_, int *len, int *datatype);

/* _mpicheck.c's functions for the module table. */
PyObject *checked(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *checks(PyObject *self, PyObject *unused);

#endif
