"""The MPI backend: CPU tensors over mpi4py (torch's wheels have no MPI).

Buffers are zero-copy: MPI gets the address range of a tensor's memory.  MPI
has no bfloat16, so bfloat16 reductions use an MPI user-defined operator whose
body is zerocomm's own reduction kernel; float16 uses MPICH's ``MPIX_C_FLOAT16``
where the library has it, else the same user-defined operator.

[Note: waiting]  MPICH's blocking calls busy-poll; with more ranks than cores a
spinning rank steals the core the rank it waits for needs (100–4000× tail
slowdowns), and MPI waits have no deadline.  So every operation here is
nonblocking and waited by :func:`_wait`: it polls ``MPI_Test`` for
``_SPIN_S`` (a small message is usually done by then), then polls with
``sched_yield`` in between until ``_YIELD_PHASE_S`` (a rank that shares its core
hands it over at each poll; MPI's own collectives advance only inside
``MPI_Test``, so ranks must keep polling while a collective's rounds go by), then
sleeps between polls for 1/20 of the time waited so far, between
``_FIRST_SLEEP_S`` and ``_MAX_SLEEP_S``: a long wait costs a few wake-ups a
second instead of a core, and finishes at most ~5 % late.

[Note: requests left behind]  A wait that times out or fails leaves its MPI request
posted: MPI may still write into (or read from) the tensor's memory later, when the
peer catches up.  MPI forbids cancelling or freeing a nonblocking collective's
request, and dropping an mpi4py request object may free it.  So an unfinished
request is never dropped: the backend keeps it, with the tensors it points at, in
``_orphans`` (a wait that raised, or a ``MpiRequest`` garbage-collected before it
completed).  ``close`` cancels the orphaned receives (``MPI_Cancel`` is allowed
for point-to-point receives) and moves whatever is still unfinished to
``_ABANDONED``, which keeps the tensors alive for the rest of the process, so
MPI never writes into freed memory; entries leave it once MPI says they are
done.  The group above is poisoned after such a failure (see ``group.py``), so no later call reuses the
communicator; ``destroy_process_group`` frees it and a new ``init_process_group`` duplicates a fresh one.
A message the late peer sends after the cancel waits unreceived, and MPICH gives the freed context to a
later communicator: tags start at a random ``tag_origin`` (agreed at creation), so no later call takes it.

[Note: the C hot loop]  ``_mpifast`` (an optional C extension, built by ``pip install``) posts an
``MPI_Iallreduce`` and runs the same wait in C, with the GIL released while it yields or sleeps:
a small all_reduce then costs one Python-to-C call instead of mpi4py's buffer parsing, a request
object and a Python loop.  It is used for all_reduce, the mismatch check and ``exchange`` (the
whole-buffer step of recursive doubling and of a two-rank tree: both requests posted and waited in
one call) when it imports and the library is MPICH (whose handles are ints, so the extension needs no
mpi.h); otherwise (or with a backend's ``_fast`` set to ``None``, as the tests do) the same steps run
through mpi4py.  Both paths leave a timed-out request in ``_orphans`` with its buffers.

[Note: threads]  The executor thread and the caller's thread may both call MPI, so zerocomm needs
``MPI_THREAD_MULTIPLE``; ``init_process_group("mpi")`` asks for it and refuses a library that provides less.
"""
from __future__ import annotations

import os
import time
from typing import Dict, List, NoReturn, Optional, Sequence

import torch

from ...ops.flatten import joined
from ...ops.reduce import finalize_, reduce_
from ..errors import UnsupportedError
from ..transport import Backend, PeerFailure, Request, members_arrive
from .mpi_start import _mpifast, bind_extension  # _mpifast: the optional C hot loop (see the note), or None

#: The phases of a wait (see the note above).
_SPIN_S = 20e-6
_YIELD_PHASE_S = 2e-3
_FIRST_SLEEP_S = 50e-6
_MAX_SLEEP_S = 10e-3
#: Entries of a backend's buffer-description caches before they are cleared (a bound, not a tuning).
_SPEC_CACHE = 256
#: The largest count MPI_Iallreduce takes (a C int): larger all_reduces go through mpi4py.
_INT_MAX = (1 << 31) - 1

NATIVE_TABLE = {
    "broadcast": "native (MPI_Ibcast)",
    "scatter": "native (MPI_Iscatter)",
    "reduce": "native (MPI_Ireduce; bfloat16 through a zerocomm user-defined op)",
    "all_reduce": "native (MPI_Iallreduce; bfloat16 through a zerocomm user-defined op; AVG = SUM, then divide)",
    "gather": "native (MPI_Igather)",
    "all_gather": "native (MPI_Iallgather)",
    "reduce_scatter": "native (MPI_Ireduce_scatter_block)",
    "all_to_all": "native (MPI_Ialltoallv)",
    "barrier": "native (MPI_Ibarrier)",
    "send/recv": "native (MPI_Isend/MPI_Irecv on a duplicated communicator)",
}


def _mpi():
    from mpi4py import MPI  # imported lazily: `import zerocomm.comm` must not need mpi4py
    return MPI


def mpi_available() -> Optional[str]:
    """``None`` if mpi4py imports, else why not (for skips and capability rows)."""
    try:
        _mpi()
    except Exception as error:  # ImportError, or an MPI library that fails to load
        return f"mpi4py is not usable ({error}); pip install 'zerocomm[mpi]'"
    return None


#: Requests that outlived their communicator unfinished, with the tensors they point at (see the note).
_ABANDONED: List[tuple] = []


def _wait(request, what, deadline: Optional[float], status=None, orphans=None, keep=None) -> None:
    """Wait for an MPI request until done or ``deadline`` (``time.monotonic()`` seconds); see the note.

    ``what`` names the request in errors: a string, or a ``(format, *args)`` tuple formatted only then
    (a send's description would cost more to build than a small send).  When the wait raises and
    ``orphans`` is a list, ``(request, keep, False)`` goes into it: the request stays posted and
    ``keep`` (the tensors MPI reads or writes) stays alive (see the note on requests left behind)."""
    try:
        if request.Test(status):
            return
        start = time.monotonic()
        now = start
        while now - start < _SPIN_S:
            if request.Test(status):
                return
            now = time.monotonic()
        while True:
            if deadline is not None and now > deadline:
                raise TimeoutError(_describe(what))
            waited = now - start
            if waited < _YIELD_PHASE_S:
                os.sched_yield()  # hands the core to any runnable rank; returns at once on an idle core
            else:
                time.sleep(min(max(waited / 20, _FIRST_SLEEP_S), _MAX_SLEEP_S))
            if request.Test(status):
                return
            now = time.monotonic()
    except BaseException as error:
        if orphans is not None:
            orphans.append((request, keep, False))
        if isinstance(error, _mpi().Exception):
            raise PeerFailure(f"{_describe(what)}: {error.Get_error_string()}") from None
        raise


def _finished(request, MPI, patience_s: float = 0.0) -> bool:
    """Whether MPI is done with ``request`` (completed, cancelled, or failed), testing for up to ``patience_s``."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            if request == MPI.REQUEST_NULL or request.Test():
                return True
        except Exception:  # the request failed (a peer went away), or MPI is finalized: nothing writes any more
            return True
        if time.monotonic() >= deadline:
            return False
        os.sched_yield()


def _describe(what) -> str:
    return what if isinstance(what, str) else what[0].format(*what[1:])


class MpiRequest(Request):
    """A posted MPI send or receive, waited on without spinning (see the module note)."""

    __slots__ = ("_request", "_status", "_what", "_keep", "_peer", "_done", "_orphans", "_receive")

    def __init__(self, request, what, keep_alive, orphans: list, status=None, peer: Optional[int] = None,
                 receive: bool = False):
        self._request = request
        self._status = status
        self._what = what
        self._keep = keep_alive  # the buffers MPI reads or writes until completion
        self._peer = peer
        self._done = False
        self._orphans = orphans  # the backend's list of unfinished requests (see the note)
        self._receive = receive  # receives may be cancelled; sends are left to complete

    def __del__(self) -> None:
        # Dropped unfinished (a wait raised, or an algorithm bailed out before waiting): keep the
        # request and its tensors until the backend closes (see the note on requests left behind).
        if not self._done:
            try:
                done = self._request.Test()
            except Exception:  # failed, or MPI is finalized: nothing writes any more
                done = True
            if not done:
                self._orphans.append((self._request, self._keep, self._receive))

    def test(self) -> bool:
        if not self._done:
            self._done = self._request.Test(self._status)
        return self._done

    def wait(self, timeout_s: Optional[float] = None) -> None:
        if self._done:
            return
        try:
            _wait(self._request, self._what, None if timeout_s is None else time.monotonic() + timeout_s,
                  self._status)
        except PeerFailure as failure:
            failure.peer = self._peer
            raise
        self._done = True

    def source(self) -> int:
        """The sender's rank (receives from any source)."""
        return self._status.Get_source()


class MpiBackend(Backend):
    """One MPI communicator pair: ``comm`` for collectives, ``p2p`` (a duplicate) for tagged messages."""

    name = "mpi"
    device_type = "cpu"
    ANY_SOURCE = True

    def __init__(self, comm):
        MPI = _mpi()
        self.MPI = MPI
        self.comm = comm
        self.p2p = comm.Dup()
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._user_ops: Dict[str, object] = {}
        self._types = {
            torch.float32: MPI.FLOAT, torch.float64: MPI.DOUBLE, torch.int8: MPI.INT8_T,
            torch.int16: MPI.INT16_T, torch.int32: MPI.INT32_T, torch.int64: MPI.INT64_T,
            torch.uint8: MPI.UINT8_T, torch.bool: MPI.C_BOOL,
        }
        if getattr(MPI, "FLOAT16_T", MPI.DATATYPE_NULL) != MPI.DATATYPE_NULL:
            self._types[torch.float16] = MPI.FLOAT16_T
        self._ops = {"sum": MPI.SUM, "avg": MPI.SUM, "product": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
                     "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR}
        self._bool_ops = {"min": MPI.LAND, "max": MPI.LOR, "band": MPI.LAND, "bor": MPI.LOR, "bxor": MPI.LXOR}
        self._fromaddress = MPI.buffer.fromaddress
        self._in_place = MPI.IN_PLACE
        #: Unfinished requests whose waits raised or whose MpiRequest was dropped: (request, tensors, receive).
        self._orphans: list = []
        #: (data_ptr, numel, dtype, op) -> (MPI buffer spec, MPI op, divide after, C arguments): see ``all_reduce``.
        self._specs: dict = {}
        #: ``_fast``: ``_mpifast.allreduce``, or None unless every rank can (they must all check the same way: the
        #: check's MPI type differs; see the note on the C hot loop).  ``tag_origin``: see requests left behind.
        bound = comm.allgather((int(bind_extension(MPI)), int.from_bytes(os.urandom(4), "little") >> 5))
        self._fast, self.tag_origin = _mpifast.allreduce if min(flag for flag, _ in bound) else None, bound[0][1]
        #: ``_mpifast.collective`` (all_gather, reduce_scatter, broadcast posted and waited for in C), or None; with
        #: the MPI datatype handles that move each dtype's bytes, and the (datatype, op) handles that reduce it.
        self._collective = _mpifast.collective if self._fast is not None else None
        self._moves = {dtype: self._buffer_type(dtype).handle for dtype in _MOVED}
        self._reduces = {}
        for dtype in self._types:
            for op in self._ops:
                try:
                    self._reduces[(dtype, op)] = (self._types[dtype].handle, self._op(op, dtype).handle)
                except KeyError:  # an op bool does not admit
                    pass
        self._exchange = _mpifast.exchange if self._fast is not None else None
        self._handle, self._p2p_handle = comm.handle, self.p2p.handle
        #: (data_ptr, nbytes) -> byte buffer spec, for point to point.
        self._byte_specs: dict = {}

    @classmethod
    def world(cls) -> "MpiBackend":
        """The communicator of every process of the MPI job (initializes MPI if needed)."""
        MPI = _mpi()
        if not MPI.Is_initialized():
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
        provided = MPI.Query_thread()
        if provided < MPI.THREAD_MULTIPLE:
            names = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
                     MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED"}
            raise UnsupportedError(
                f"init_process_group: backend 'mpi' needs MPI_THREAD_MULTIPLE (zerocomm's executor thread and the "
                f"caller's thread both call MPI), but MPI was initialized with {names.get(provided, provided)}; "
                "let zerocomm initialize MPI, or set mpi4py.rc.thread_level = 'multiple' before importing MPI")
        return cls(MPI.COMM_WORLD.Dup())

    # -- buffers ----------------------------------------------------------------------
    def _buffer(self, tensor: torch.Tensor, count: Optional[int] = None) -> list:
        """``[memory, count, MPI datatype]`` over a contiguous CPU tensor's bytes, without copying.

        The memory object only describes the address range (``MPI.buffer.fromaddress``): it
        neither copies nor marks the storage unresizable, as ``Tensor.numpy()`` would (ZeRO
        stage 3 frees parameters with ``untyped_storage().resize_(0)``).  Callers keep the
        tensor alive until MPI is done with it.
        """
        numel = tensor.numel()
        memory = self._fromaddress(tensor.data_ptr(), numel * tensor.element_size())
        mpi_type = self._types.get(tensor.dtype)
        if mpi_type is None:  # bfloat16 (and float16 without MPIX_C_FLOAT16): 2-byte words
            mpi_type = self.MPI.INT16_T
        return [memory, numel if count is None else count, mpi_type]

    def _buffer_type(self, dtype: torch.dtype):
        """The MPI datatype ``_buffer`` describes ``dtype``'s elements as (2-byte words for bfloat16)."""
        mpi_type = self._types.get(dtype)
        return self.MPI.INT16_T if mpi_type is None else mpi_type

    def _op(self, op: str, dtype: torch.dtype):
        if dtype not in self._types:
            return self._user_op(op, dtype)
        if dtype == torch.bool:
            return self._bool_ops[op]
        return self._ops[op]

    def _user_op(self, op: str, dtype: torch.dtype):
        key = f"{op}:{dtype}"
        if key not in self._user_ops:
            combine = "sum" if op == "avg" else op

            def reduce_words(inbuf, inoutbuf, datatype, _dtype=dtype, _op=combine):
                src = torch.frombuffer(inbuf, dtype=_dtype)
                dst = torch.frombuffer(inoutbuf, dtype=_dtype)
                reduce_(dst, src, _op)

            self._user_ops[key] = self.MPI.Op.Create(reduce_words, commute=True)
        return self._user_ops[key]

    # -- point to point ---------------------------------------------------------------
    def _bytes(self, tensor: torch.Tensor) -> list:
        nbytes = tensor.numel() * tensor.element_size()
        key = (tensor.data_ptr(), nbytes)
        spec = self._byte_specs.get(key)
        if spec is None:  # a description of an address range, nothing owned: reusing it is exact
            if len(self._byte_specs) >= _SPEC_CACHE:
                self._byte_specs.clear()
            spec = self._byte_specs[key] = [self._fromaddress(key[0], nbytes), self.MPI.BYTE]
        return spec

    def isend(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        return MpiRequest(self.p2p.Isend(self._bytes(tensor), peer, tag),
                          ("send to rank {} (tag {})", peer, tag), tensor, self._orphans, peer=peer)

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        return MpiRequest(self.p2p.Irecv(self._bytes(tensor), peer, tag),
                          ("recv from rank {} (tag {})", peer, tag), tensor, self._orphans, peer=peer, receive=True)

    def exchange(self, send: torch.Tensor, recv: torch.Tensor, peer: int, tag: int, deadline: Optional[float]) -> None:
        nbytes = send.numel() * send.element_size()
        if self._fast is None or nbytes > _INT_MAX:  # no C hot loop (or the tests turned it off)
            return super().exchange(send, recv, peer, tag, deadline)
        outcome = self._exchange(self._p2p_handle, send.data_ptr(), recv.data_ptr(), nbytes, peer, tag,
                                 -1.0 if deadline is None else deadline)
        if outcome:  # the C hot loop's exchange: one call instead of two requests and two waits
            self._fast_failed(outcome, ("exchange with rank {} (tag {})", peer, tag), (send, recv), peer)

    def irecv_any(self, tensor: torch.Tensor, tag: int) -> Request:
        status = self.MPI.Status()
        return MpiRequest(self.p2p.Irecv(self._bytes(tensor), source=self.MPI.ANY_SOURCE, tag=tag),
                          f"recv from any rank (tag {tag})", tensor, self._orphans, status=status, receive=True)

    def split(self, ranks: Sequence[int], key: str, deadline: Optional[float] = None) -> Optional["MpiBackend"]:
        if deadline is not None and self.rank in ranks:  # MPI_Comm_create_group waits with no deadline
            members_arrive(self, list(ranks), key, deadline)
        group = self.comm.Get_group().Incl(list(ranks))
        comm = self.comm.Create_group(group)
        group.Free()
        return None if comm == self.MPI.COMM_NULL else MpiBackend(comm)

    def close(self, abandon: bool = False) -> None:
        """Settle the requests left behind (see the note), then free the communicators and user ops."""
        self.settle_orphans()
        self.release_attached(abandon)  # what the layers above keep on it (Transport.on_close)
        for comm in (self.p2p, self.comm):
            try:
                comm.Free()  # legal with requests still posted: MPI frees it once they complete
            except Exception:  # finalized already, or a predefined communicator
                pass
        for user_op in self._user_ops.values():
            try:
                user_op.Free()
            except Exception:
                pass
        self._user_ops.clear()
        self._specs.clear()
        self._byte_specs.clear()

    def settle_orphans(self) -> int:
        """Cancel the orphaned receives, keep every request still unfinished (with its tensors) in
        ``_ABANDONED``, and forget those MPI is done with.  Returns how many stay abandoned."""
        orphans = self._orphans[:]  # the same list object: MpiRequests append to it
        del self._orphans[:len(orphans)]
        for request, keep, receive in orphans:
            if receive and not _finished(request, self.MPI):
                try:
                    request.Cancel()  # allowed for receives; completes locally once Test sees it
                except Exception:
                    pass
                _finished(request, self.MPI, patience_s=1.0)
            _ABANDONED.append((request, keep))
        _ABANDONED[:] = [entry for entry in _ABANDONED if not _finished(entry[0], self.MPI)]
        return len(_ABANDONED)

    # -- what MPI supports ------------------------------------------------------------
    @classmethod
    def native_support(cls, collective: str, dtype: torch.dtype, op: Optional[str]) -> Optional[str]:
        return None  # every admitted (dtype, op) cell: MPI types, or a zerocomm user-defined op

    @classmethod
    def native_table(cls) -> dict:
        return dict(NATIVE_TABLE)

    # -- the mismatch check's round ------------------------------------------------------------
    STAGE_RIDES = True

    def reduce_stage(self, stage: torch.Tensor, *, tag: int, deadline: Optional[float]) -> None:
        # MPI's own all_reduce of the stage (in C where bound): every check has this same type signature,
        # whatever each rank called, so ranks that disagree still make one valid MPI call.
        self.all_reduce(stage, "sum", tag=tag, deadline=deadline, segment_bytes=0)

    # -- native collectives: the algorithms' arguments, blocking until done or the deadline ----------
    def all_reduce(self, tensor, op, *, tag, deadline, segment_bytes) -> None:
        # The short path of a small blocking all_reduce: one dictionary lookup finds the MPI buffer
        # description, datatype and op of a tensor seen before (by address, length, dtype and op;
        # a description owns nothing, so one that matches is exact however old).
        key = (tensor.data_ptr(), tensor.numel(), tensor.dtype, op)
        spec = self._specs.get(key)
        if spec is None:
            spec = self._all_reduce_spec(tensor, op, key)
        if spec[0] is not None:
            self._run_all_reduce(spec, deadline, "MPI Iallreduce", tensor)
            if spec[2]:
                finalize_(tensor, "avg", self.size)

    def _run_all_reduce(self, spec: tuple, deadline: Optional[float], what: str, keep) -> None:
        """Post the in-place ``MPI_Iallreduce`` that ``spec`` describes and wait for it (in C where bound)."""
        fast = self._fast
        if fast is not None and spec[3] is not None:
            outcome = fast(*spec[3], -1.0 if deadline is None else deadline)
            if outcome:
                self._fast_failed(outcome, what, keep)
            return
        request = self.comm.Iallreduce(self._in_place, spec[0], spec[1])
        if not request.Test():
            _wait(request, what, deadline, None, self._orphans, keep)

    def _fast_failed(self, outcome: tuple, what, keep, peer: Optional[int] = None) -> NoReturn:
        """Raise what an ``_mpifast`` call's ``outcome`` says, keeping its posted requests (see the notes):
        one request, or a message's (send, receive)."""
        handles = outcome[1] if isinstance(outcome[1], tuple) else (outcome[1],)
        for k, handle in enumerate(handles):
            self._orphans.append((self.MPI.Request.fromhandle(handle), keep, k == 1))
        if outcome[0] == 1:
            raise TimeoutError(_describe(what))
        if outcome[0] == 2:
            raise PeerFailure(f"{_describe(what)}: {self.MPI.Get_error_string(outcome[2])}", peer)
        raise outcome[2]  # what a signal handler raised (KeyboardInterrupt)

    def _all_reduce_spec(self, tensor, op, key) -> tuple:
        """``(buffer spec or None when empty, MPI op, divide after, C arguments or None)`` of an all_reduce,
        remembered under ``key`` (``None``: not remembered)."""
        if len(self._specs) >= _SPEC_CACHE:
            self._specs.clear()
        numel = tensor.numel()
        buffer, mpi_op = (self._buffer(tensor) if numel else None), self._op(op, tensor.dtype)
        native = None
        if _mpifast is not None and buffer is not None and numel <= _INT_MAX:
            native = (self._handle, tensor.data_ptr(), numel, buffer[2].handle, mpi_op.handle)
        spec = (buffer, mpi_op, op == "avg", native)
        if key is not None:
            self._specs[key] = spec
        return spec

    def broadcast(self, tensor, root, *, tag, deadline, segment_bytes) -> None:
        if tensor.nbytes and self._collective is not None:  # posted and waited for in C
            outcome = self._collective(2, self._handle, 0, tensor.data_ptr(), tensor.nbytes // tensor.itemsize,
                                       self._moves[tensor.dtype], root, -1.0 if deadline is None else deadline)
            if outcome:
                self._fast_failed(outcome, "MPI Ibcast", tensor)
        elif tensor.nbytes:
            _wait(self.comm.Ibcast(self._buffer(tensor), root=root), "MPI Ibcast", deadline, None, self._orphans,
                  tensor)

    def reduce(self, tensor, op, root, *, tag, deadline, segment_bytes) -> None:
        if tensor.numel() == 0:
            return
        buf = self._buffer(tensor)
        mpi_op = self._op(op, tensor.dtype)
        if self.rank == root:
            request = self.comm.Ireduce(self.MPI.IN_PLACE, buf, op=mpi_op, root=root)
        else:
            request = self.comm.Ireduce(buf, None, op=mpi_op, root=root)
        _wait(request, "MPI Ireduce", deadline, None, self._orphans, tensor)
        if self.rank == root and op == "avg":
            finalize_(tensor, "avg", self.size)

    def all_gather(self, output, input, *, tag, deadline, segment_bytes) -> None:
        nbytes = input.nbytes
        if nbytes == 0:
            return
        if self._collective is not None:  # posted and waited for in C; in place where input is this rank's chunk
            into, mine = output.data_ptr(), input.data_ptr()
            outcome = self._collective(0, self._handle, 0 if into + self.rank * nbytes == mine else mine, into,
                                       nbytes // input.itemsize, self._moves[input.dtype], 0,
                                       -1.0 if deadline is None else deadline)
            if outcome:
                self._fast_failed(outcome, "MPI Iallgather", (output, input))
            return
        m = input.numel()
        out = self._buffer(output, count=m)  # count per rank
        own = output[self.rank * m:(self.rank + 1) * m]
        send = self.MPI.IN_PLACE if own.data_ptr() == input.data_ptr() else self._buffer(input)
        _wait(self.comm.Iallgather(send, out), "MPI Iallgather", deadline, None, self._orphans, (output, input))

    def gather(self, output, input, root, *, tag, deadline, segment_bytes) -> None:
        m = input.numel()
        if m == 0:
            return
        recv = self._buffer(output, count=m) if self.rank == root else None
        _wait(self.comm.Igather(self._buffer(input), recv, root=root), "MPI Igather", deadline, None, self._orphans,
              (output, input))

    def scatter(self, output, input, root, *, tag, deadline, segment_bytes) -> None:
        m = output.numel()
        if m == 0:
            return
        input = joined(input) if self.rank == root else None  # its chunks as one buffer, kept until MPI is done
        send = self._buffer(input, count=m) if self.rank == root else None
        _wait(self.comm.Iscatter(send, self._buffer(output), root=root), "MPI Iscatter", deadline, None,
              self._orphans, (output, input))

    def reduce_scatter(self, output, input, op, *, tag, deadline, segment_bytes) -> None:
        nbytes = output.nbytes
        if nbytes == 0:
            return
        handles = self._reduces.get((output.dtype, op)) if self._collective is not None else None
        if handles is not None:  # posted and waited for in C (MPI needs distinct buffers: a copy where they overlap)
            into, source = output.data_ptr(), input.data_ptr()
            if into < source + input.nbytes and source < into + nbytes:
                input = input.clone()
                source = input.data_ptr()
            outcome = self._collective(1, self._handle, source, into, nbytes // output.itemsize, handles[0],
                                       handles[1], -1.0 if deadline is None else deadline)
            if outcome:
                self._fast_failed(outcome, "MPI Ireduce_scatter_block", (output, input))
            if op == "avg":
                finalize_(output, "avg", self.size)
            return
        m = output.numel()
        if _overlaps(output, input):
            input = input.clone()
        _wait(self.comm.Ireduce_scatter_block(self._buffer(input, count=m), self._buffer(output),
                                              op=self._op(op, output.dtype)), "MPI Ireduce_scatter_block", deadline,
              None, self._orphans, (output, input))
        if op == "avg":
            finalize_(output, "avg", self.size)

    def all_to_all(self, output, input, out_counts, in_counts, *, tag, deadline, segment_bytes) -> None:
        if _overlaps(output, input):
            input = input.clone()
        send, recv = self._buffer(input), self._buffer(output)
        send_spec = [send[0], (list(in_counts), _displacements(in_counts)), send[2]]
        recv_spec = [recv[0], (list(out_counts), _displacements(out_counts)), recv[2]]
        _wait(self.comm.Ialltoallv(send_spec, recv_spec), "MPI Ialltoallv", deadline, None, self._orphans,
              (output, input))

    def barrier(self, *, tag, deadline, segment_bytes) -> None:
        _wait(self.comm.Ibarrier(), "MPI Ibarrier", deadline, None, self._orphans)

    NATIVE = {"all_reduce": all_reduce, "broadcast": broadcast, "reduce": reduce, "all_gather": all_gather,
              "gather": gather, "scatter": scatter, "reduce_scatter": reduce_scatter, "all_to_all": all_to_all,
              "barrier": barrier}


#: The dtypes whose bytes the C collectives move (``MpiBackend._moves``): every dtype zerocomm moves.
_MOVED = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.uint8, torch.bool)


def _displacements(counts) -> list:
    out, total = [], 0
    for count in counts:
        out.append(total)
        total += count
    return out


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, a1 = a.data_ptr(), a.data_ptr() + a.numel() * a.element_size()
    b0, b1 = b.data_ptr(), b.data_ptr() + b.numel() * b.element_size()
    return a0 < b1 and b0 < a1
