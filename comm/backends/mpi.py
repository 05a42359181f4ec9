"""The MPI backend: CPU tensors over mpi4py (torch's wheels have no MPI).

Buffers are zero-copy: a tensor's memory is handed to MPI as a numpy view.  MPI
has no bfloat16, so bfloat16 reductions use an MPI user-defined operator whose
body is zerocomm's own reduction kernel; float16 uses MPICH's ``MPIX_C_FLOAT16``
where the library has it, else the same user-defined operator.

[Note: no spinning]  MPICH's blocking calls busy-poll; with more ranks than cores
a spinning rank steals the core the rank it waits for needs (100–4000× tail
slowdowns).  So every operation here is nonblocking, and a wait polls
``MPI_Test`` with ``sched_yield`` in between for ``_YIELD_PHASE_S`` (a rank that
shares its core hands it over at each poll), then sleeps with a backoff capped at
``_MAX_SLEEP_S``.  The yield phase matters for MPI's own collectives: they advance
only inside ``MPI_Test``, round by round, so a rank asleep between rounds stalls
the others (measured at 4 ranks on 2 cores, 16-float all_reduce: 150 µs of
yielding gave 1.8 ms per call, 2 ms gave 0.09 ms).  The same loop gives every
wait a deadline, which MPI itself does not have.
"""
from __future__ import annotations

import os
import time
from typing import Dict, Optional, Sequence

import numpy as np
import torch

from ...ops.reduce import finalize_, reduce_
from ..transport import Request, Transport, remaining

#: Poll with sched_yield for this long, then sleep (see the note above).
_YIELD_PHASE_S = 2e-3
_FIRST_SLEEP_S = 20e-6
_MAX_SLEEP_S = 100e-6

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


class MpiRequest(Request):
    """An MPI request waited on without spinning (see the module note)."""

    def __init__(self, request, what: str, keep_alive=None, on_done=None, status=None):
        self._request = request
        self._status = status
        self._what = what
        self._keep = keep_alive
        self._on_done = on_done
        self._done = False

    def test(self) -> bool:
        if not self._done and (self._request.Test() if self._status is None else self._request.Test(self._status)):
            self._done = True
            if self._on_done is not None:
                self._on_done()
        return self._done

    def wait(self, timeout_s: Optional[float] = None) -> None:
        start = time.monotonic()
        deadline = None if timeout_s is None else start + timeout_s
        sleep = _FIRST_SLEEP_S
        while not self.test():
            now = time.monotonic()
            if deadline is not None and now > deadline:
                raise TimeoutError(self._what)
            if now - start < _YIELD_PHASE_S:
                os.sched_yield()  # hands the core to any runnable rank; returns at once on an idle core
            else:
                time.sleep(sleep)
                sleep = min(sleep * 2, _MAX_SLEEP_S)


class MpiTransport(Transport):
    """One MPI communicator pair: ``comm`` for collectives, ``p2p`` (a duplicate) for tagged messages."""

    name = "mpi"
    device_type = "cpu"

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
            torch.int32: MPI.INT32_T, torch.int64: MPI.INT64_T, torch.uint8: MPI.UINT8_T,
            torch.bool: MPI.C_BOOL,
        }
        if getattr(MPI, "FLOAT16_T", MPI.DATATYPE_NULL) != MPI.DATATYPE_NULL:
            self._types[torch.float16] = MPI.FLOAT16_T
        self._ops = {"sum": MPI.SUM, "avg": MPI.SUM, "product": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
                     "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR}
        self._bool_ops = {"min": MPI.LAND, "max": MPI.LOR, "band": MPI.LAND, "bor": MPI.LOR, "bxor": MPI.LXOR}

    @classmethod
    def world(cls) -> "MpiTransport":
        MPI = _mpi()
        if not MPI.Is_initialized():
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
        return cls(MPI.COMM_WORLD.Dup())

    # -- buffers ----------------------------------------------------------------------
    def _buffer(self, tensor: torch.Tensor):
        """``[numpy view, count, MPI datatype]`` of a contiguous CPU tensor, without copying."""
        flat = tensor.reshape(-1)
        mpi_type = self._types.get(tensor.dtype)
        if mpi_type is None:  # bfloat16 (and float16 without MPIX_C_FLOAT16): 2-byte words
            return [_numpy_view(flat.view(torch.int16)), flat.numel(), self.MPI.INT16_T]
        if tensor.dtype == torch.bool:
            return [_numpy_view(flat.view(torch.uint8)), flat.numel(), mpi_type]
        return [_numpy_view(flat), flat.numel(), mpi_type]

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
    def isend(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        buf = _byte_array(tensor)
        return MpiRequest(self.p2p.Isend([buf, self.MPI.BYTE], dest=peer, tag=tag),
                          f"send to rank {peer} (tag {tag})", (tensor, buf))

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        buf = _byte_array(tensor)
        return MpiRequest(self.p2p.Irecv([buf, self.MPI.BYTE], source=peer, tag=tag),
                          f"recv from rank {peer} (tag {tag})", (tensor, buf))

    def irecv_any(self, tensor: torch.Tensor, tag: int) -> Request:
        """Receive from whichever rank sends with ``tag``; the request's ``source()`` says who."""
        buf = _byte_array(tensor)
        status = self.MPI.Status()
        request = MpiRequest(self.p2p.Irecv([buf, self.MPI.BYTE], source=self.MPI.ANY_SOURCE, tag=tag),
                             f"recv from any rank (tag {tag})", (tensor, buf), status=status)
        request.source = status.Get_source
        return request

    def split(self, ranks: Sequence[int], key: str) -> Optional["MpiTransport"]:
        group = self.comm.Get_group().Incl(list(ranks))
        comm = self.comm.Create_group(group)
        group.Free()
        if comm == self.MPI.COMM_NULL:
            return None
        return MpiTransport(comm)

    def close(self) -> None:
        for comm in (self.p2p, self.comm):
            try:
                comm.Free()
            except Exception:  # finalized already, or a predefined communicator
                pass
        for user_op in self._user_ops.values():
            try:
                user_op.Free()
            except Exception:
                pass
        self._user_ops.clear()

    # -- what MPI supports ------------------------------------------------------------
    @classmethod
    def native_support(cls, collective: str, dtype: torch.dtype, op: Optional[str]) -> Optional[str]:
        return None  # every admitted (dtype, op) cell: MPI types, or a zerocomm user-defined op

    @classmethod
    def native_table(cls) -> dict:
        return dict(NATIVE_TABLE)

    # -- native collectives: same arguments as the algorithms, blocking ---------------
    def _finish(self, request, what: str, deadline: Optional[float], keep=None) -> None:
        MpiRequest(request, f"MPI {what}", keep).wait(remaining(deadline))

    def native_all_reduce(self, tensor, op, *, tag, deadline, segment_bytes) -> None:
        if tensor.numel() == 0:
            return
        buf = self._buffer(tensor)
        self._finish(self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self._op(op, tensor.dtype)), "Iallreduce",
                     deadline, buf)
        finalize_(tensor, op, self.size)

    def native_broadcast(self, tensor, root, *, tag, deadline, segment_bytes) -> None:
        if tensor.numel() == 0:
            return
        buf = self._buffer(tensor)
        self._finish(self.comm.Ibcast(buf, root=root), "Ibcast", deadline, buf)

    def native_reduce(self, tensor, op, root, *, tag, deadline, segment_bytes) -> None:
        if tensor.numel() == 0:
            return
        buf = self._buffer(tensor)
        mpi_op = self._op(op, tensor.dtype)
        if self.rank == root:
            request = self.comm.Ireduce(self.MPI.IN_PLACE, buf, op=mpi_op, root=root)
        else:
            request = self.comm.Ireduce(buf, None, op=mpi_op, root=root)
        self._finish(request, "Ireduce", deadline, buf)
        if self.rank == root:
            finalize_(tensor, op, self.size)

    def native_all_gather(self, output, input, *, tag, deadline, segment_bytes) -> None:
        if input.numel() == 0:
            return
        out = self._buffer(output)
        out[1] = input.numel()  # count per rank
        own = output.reshape(-1)[self.rank * input.numel():(self.rank + 1) * input.numel()]
        send = self.MPI.IN_PLACE if own.data_ptr() == input.data_ptr() else self._buffer(input)
        self._finish(self.comm.Iallgather(send, out), "Iallgather", deadline, (out, send))

    def native_gather(self, output, input, root, *, tag, deadline, segment_bytes) -> None:
        if input.numel() == 0:
            return
        send = self._buffer(input)
        recv = None
        if self.rank == root:
            recv = self._buffer(output)
            recv[1] = input.numel()
        self._finish(self.comm.Igather(send, recv, root=root), "Igather", deadline, (send, recv))

    def native_scatter(self, output, input, root, *, tag, deadline, segment_bytes) -> None:
        if output.numel() == 0:
            return
        recv = self._buffer(output)
        send = None
        if self.rank == root:
            send = self._buffer(input)
            send[1] = output.numel()
        self._finish(self.comm.Iscatter(send, recv, root=root), "Iscatter", deadline, (send, recv))

    def native_reduce_scatter(self, output, input, op, *, tag, deadline, segment_bytes) -> None:
        if output.numel() == 0:
            return
        if _overlaps(output, input):
            input = input.clone()
        send, recv = self._buffer(input), self._buffer(output)
        send[1] = output.numel()
        self._finish(self.comm.Ireduce_scatter_block(send, recv, op=self._op(op, output.dtype)),
                     "Ireduce_scatter_block", deadline, (send, recv))
        finalize_(output, op, self.size)

    def native_all_to_all(self, output, input, out_counts, in_counts, *, tag, deadline, segment_bytes) -> None:
        if _overlaps(output, input):
            input = input.clone()
        send, recv = self._buffer(input), self._buffer(output)
        send_spec = [send[0], (list(in_counts), _displacements(in_counts)), send[2]]
        recv_spec = [recv[0], (list(out_counts), _displacements(out_counts)), recv[2]]
        self._finish(self.comm.Ialltoallv(send_spec, recv_spec), "Ialltoallv", deadline, (send, recv))

    def native_barrier(self, *, tag, deadline, segment_bytes) -> None:
        self._finish(self.comm.Ibarrier(), "Ibarrier", deadline)


def _byte_array(tensor: torch.Tensor):
    """The tensor's bytes as a numpy uint8 view (an empty tensor, whatever its strides, as an empty array)."""
    if tensor.numel() == 0:
        return np.empty(0, dtype=np.uint8)
    return _numpy_view(tensor.reshape(-1).view(torch.uint8))


class _Memory:
    """Describes a tensor's memory to numpy through ``__array_interface__``."""

    __slots__ = ("__array_interface__",)


_NUMPY_TYPES = {torch.float32: "<f4", torch.float64: "<f8", torch.float16: "<f2", torch.int8: "|i1",
                torch.int16: "<i2", torch.int32: "<i4", torch.int64: "<i8", torch.uint8: "|u1"}


def _numpy_view(flat: torch.Tensor) -> np.ndarray:
    """A numpy array over a contiguous 1-D CPU tensor's memory, without ``Tensor.numpy()``.

    ``Tensor.numpy()`` marks the storage unresizable for good, which would stop ZeRO stage 3 from
    freeing parameters (``untyped_storage().resize_(0)``) after MPI touched them.  The array holds
    no reference to the tensor: callers keep the tensor alive until MPI is done with it.
    """
    if flat.numel() == 0:
        return np.empty(0, dtype=_NUMPY_TYPES[flat.dtype])
    memory = _Memory()
    memory.__array_interface__ = {"shape": (flat.numel(),), "typestr": _NUMPY_TYPES[flat.dtype],
                                  "data": (flat.data_ptr(), False), "version": 3}
    return np.asarray(memory)


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
