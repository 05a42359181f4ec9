"""The NCCL backend: CUDA tensors over torch's ``ProcessGroupNCCL``.

Nothing here touches CUDA or NCCL at import time; ``NcclBackend.create`` does,
when ``init_process_group("nccl")`` runs.  One device per rank, from ``LOCAL_RANK``
(else the global rank modulo the device count).

[Note: streams]  NCCL work runs on torch's internal NCCL streams.  ``wait()`` on a
torch NCCL ``Work`` makes the *current* stream wait for it without blocking the
host, which is what a ring needs: the local reduction that follows a receive is
queued on the current stream after it.  A deadline is therefore enforced by the
process group's own timeout (its watchdog aborts a stuck collective), not by a
host-side poll.

[Note: tags]  NCCL point-to-point has no tags: messages between two ranks match in
issue order.  Algorithms use their own communicator (``pg``) and user send/recv
another (``p2p_pg``), so the two streams of messages never cross.
"""
from __future__ import annotations

import datetime
import operator
import os
from typing import Optional, Sequence

import torch
import torch.distributed as td

from ...ops.flatten import as_chunks
from ...ops.reduce import finalize_
from ..environment import gloo_socket_interfaces
from ..errors import UnsupportedError
from ..transport import Backend, Request
from .gloo import make_devices

NATIVE_TABLE = {
    "broadcast": "native",
    "scatter": "native (torch composes it from NCCL send/recv)",
    "reduce": "native",
    "all_reduce": "native (AVG native for floating dtypes)",
    "gather": "native (torch composes it from NCCL send/recv)",
    "all_gather": "native",
    "reduce_scatter": "native",
    "all_to_all": "native (NCCL grouped send/recv)",
    "barrier": "native (an all_reduce of one element)",
    "send/recv": "native (in issue order per pair; no tags in NCCL)",
}

_UNSUPPORTED_OPS = {"band", "bor", "bxor"}


def nccl_available() -> Optional[str]:
    """``None`` if this process can run NCCL, else why not (decided without creating a CUDA context)."""
    if not td.is_nccl_available():
        return "this torch build has no NCCL"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    return None


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A uint8 view of a contiguous tensor's bytes (a tensor of one element may carry any stride, which ``view``
    refuses as bytes: a unit-stride view of it then)."""
    if tensor.numel() == 1:
        return tensor.as_strided((1,), (1,)).view(torch.uint8)
    return tensor.reshape(-1).view(torch.uint8)


class NcclRequest(tuple, Request):
    """``NcclRequest((work, keep_alive))``: a torch NCCL ``Work`` as a :class:`Request`, with what must stay alive
    until it completes (the byte view a send or receive was given), or ``None``.  A tuple, so that making one
    runs no Python ``__init__``: it is made on every issued collective's path."""

    __slots__ = ()
    STREAM_ORDERED = True
    stream_work = property(operator.itemgetter(0))  # C all the way: reading it runs no Python frame

    def test(self) -> bool:
        return self[0].is_completed()

    def wait(self, timeout_s: Optional[float] = None) -> None:
        # Stream-ordered wait (see the module note); the group's timeout bounds it.
        self[0].wait()


class NcclBackend(Backend):
    name = "nccl"
    device_type = "cuda"

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta, device: torch.device):
        self.store, self.rank, self.size, self.timeout, self.device = store, rank, size, timeout, device
        self.pg = self._process_group(td.PrefixStore("coll/", store), rank, size, timeout)
        self.p2p_pg = self._process_group(td.PrefixStore("p2p/", store), rank, size, timeout)
        self._stage: Optional[torch.Tensor] = None  # the mismatch check's stage on this GPU (made at the first check)
        self._ops = {"sum": td.ReduceOp.SUM, "avg": td.ReduceOp.AVG, "product": td.ReduceOp.PRODUCT,
                     "min": td.ReduceOp.MIN, "max": td.ReduceOp.MAX}
        # Options made once per op for the issued calls (torch copies what it needs from them at each call).
        self._all_reduce_options, self._reduce_scatter_options = {}, {}
        for name, op in self._ops.items():
            self._all_reduce_options[name] = td.AllreduceOptions()
            self._all_reduce_options[name].reduceOp = op
            self._reduce_scatter_options[name] = td.ReduceScatterOptions()
            self._reduce_scatter_options[name].reduceOp = op

    @staticmethod
    def _process_group(store, rank: int, size: int, timeout: datetime.timedelta):
        """The process group under this backend's methods: torch's ``ProcessGroupNCCL`` (:class:`NcclHostStandIn`
        puts gloo's in its place)."""
        options = td.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return td.ProcessGroupNCCL(store, rank, size, options)

    @classmethod
    def create(cls, init_method, timeout, world_size, rank, store) -> "NcclBackend":
        reason = nccl_available()
        if reason is not None:
            raise UnsupportedError(f"init_process_group: backend 'nccl' is unavailable: {reason}; use 'gloo' or 'mpi'")
        if store is None:
            store, rank, world_size = next(td.rendezvous(init_method or "env://", rank, world_size, timeout=timeout))
        local_rank = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return cls(td.PrefixStore("zerocomm/world/", store), rank, world_size, timeout, device)

    # -- point to point ---------------------------------------------------------------
    def isend(self, tensor, peer, tag) -> Request:
        buf = _bytes(tensor)
        return NcclRequest((self.pg.send([buf], peer, 0), buf))

    def irecv(self, tensor, peer, tag) -> Request:
        buf = _bytes(tensor)
        return NcclRequest((self.pg.recv([buf], peer, 0), buf))

    def user_isend(self, tensor, peer, tag) -> Request:
        return NcclRequest((self.p2p_pg.send([tensor], peer, 0), tensor))

    def user_irecv(self, tensor, peer, tag) -> Request:
        return NcclRequest((self.p2p_pg.recv([tensor], peer, 0), tensor))

    def split(self, ranks: Sequence[int], key: str, deadline: Optional[float] = None) -> Optional["NcclBackend"]:
        if self.rank not in ranks:
            return None
        return type(self)(td.PrefixStore(f"zerocomm/{key}/", self.store), list(ranks).index(self.rank),
                          len(ranks), self.timeout, self.device)

    def close(self, abandon: bool = False) -> None:
        self.release_attached(abandon)  # what the layers above keep on it (Transport.on_close)
        for pg in (self.pg, self.p2p_pg):
            try:
                pg.shutdown()
            except Exception:  # already aborted
                pass

    # -- what NCCL supports -----------------------------------------------------------
    @classmethod
    def native_support(cls, collective: str, dtype: torch.dtype, op: Optional[str]) -> Optional[str]:
        if op in _UNSUPPORTED_OPS:
            return f"NCCL has no bitwise reductions ({op.upper()})"
        return None

    @classmethod
    def native_table(cls) -> dict:
        return dict(NATIVE_TABLE)

    # -- native collectives: each waits on its torch Work itself, stream-ordered (see the module note) --------
    @staticmethod
    def _movable(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view(torch.uint8) if tensor.dtype == torch.bool else tensor

    def reduce_stage(self, stage: torch.Tensor, *, tag: int, deadline) -> None:
        # The stage lives in host memory (check.py); it crosses to this rank's GPU and back, a SUM there.
        device_stage = self._stage
        if device_stage is None:
            device_stage = self._stage = torch.empty(stage.shape, dtype=stage.dtype, device=self.device)
        device_stage.copy_(stage, non_blocking=True)
        self.pg.allreduce([device_stage], self._all_reduce_options["sum"]).wait()  # all_reduce's own call, no frame
        stage.copy_(device_stage)

    def all_reduce(self, tensor, op, *, tag, deadline, segment_bytes) -> None:
        if not tensor.nbytes:
            return
        if tensor.dtype is torch.bool:
            tensor = tensor.view(torch.uint8)
        self.pg.allreduce([tensor], self._all_reduce_options[op]).wait()  # stream-ordered (see the module note)

    def broadcast(self, tensor, root, *, tag, deadline, segment_bytes) -> None:
        if not tensor.nbytes:
            return
        if tensor.dtype is torch.bool:
            tensor = tensor.view(torch.uint8)
        opts = td.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        self.pg.broadcast([tensor], opts).wait()

    def reduce(self, tensor, op, root, *, tag, deadline, segment_bytes) -> None:
        if not tensor.nbytes:
            return
        opts = td.ReduceOptions()
        opts.rootRank, opts.reduceOp = root, self._ops["sum" if op == "avg" else op]
        work_tensor = tensor if self.rank == root else tensor.clone()
        self.pg.reduce([self._movable(work_tensor)], opts).wait()
        if self.rank == root and op == "avg":
            finalize_(tensor, "avg", self.size)

    def all_gather(self, output, input, *, tag, deadline, segment_bytes) -> None:
        if not input.nbytes:
            return
        if input.dtype is torch.bool:
            output, input = output.view(torch.uint8), input.view(torch.uint8)
        self.pg._allgather_base(output, input).wait()

    def gather(self, output, input, root, *, tag, deadline, segment_bytes) -> None:
        if not input.nbytes:
            return
        opts = td.GatherOptions()
        opts.rootRank = root
        outputs = [list(self._movable(output).chunk(self.size))] if self.rank == root else []
        self.pg.gather(outputs, [self._movable(input)], opts).wait()

    def scatter(self, output, input, root, *, tag, deadline, segment_bytes) -> None:
        if not output.nbytes:
            return
        opts = td.ScatterOptions()
        opts.rootRank = root
        inputs = [[self._movable(chunk) for chunk in as_chunks(input, self.size)]] if self.rank == root else []
        self.pg.scatter([self._movable(output)], inputs, opts).wait()

    def reduce_scatter(self, output, input, op, *, tag, deadline, segment_bytes) -> None:
        if not output.nbytes:
            return
        if input.dtype is torch.bool:
            output, input = output.view(torch.uint8), input.view(torch.uint8)
        self.pg._reduce_scatter_base(output, input, self._reduce_scatter_options[op]).wait()

    def all_to_all(self, output, input, out_counts, in_counts, *, tag, deadline, segment_bytes) -> None:
        self.pg.alltoall_base(self._movable(output), self._movable(input), list(out_counts), list(in_counts),
                              td.AllToAllOptions()).wait()

    def barrier(self, *, tag, deadline, segment_bytes) -> None:
        one = torch.ones(1, device=self.device)
        self.pg.allreduce([one], td.AllreduceOptions()).wait()
        torch.cuda.current_stream(self.device).synchronize()

    NATIVE = {"all_reduce": all_reduce, "broadcast": broadcast, "reduce": reduce, "all_gather": all_gather,
              "gather": gather, "scatter": scatter, "reduce_scatter": reduce_scatter, "all_to_all": all_to_all,
              "barrier": barrier}

    # -- the same, posted without waiting (``Backend.ISSUE``): NCCL is asynchronous by itself; the Work's
    # wait orders the caller's current stream after it (see the module note) ------------------------------
    def issue_all_reduce(self, tensor, op, *, tag, deadline, segment_bytes) -> tuple:
        if not tensor.nbytes:
            return None, None
        if tensor.dtype is torch.bool:
            tensor = tensor.view(torch.uint8)
        return NcclRequest((self.pg.allreduce([tensor], self._all_reduce_options[op]), None)), None

    def issue_broadcast(self, tensor, root, *, tag, deadline, segment_bytes) -> tuple:
        if not tensor.nbytes:
            return None, None
        if tensor.dtype is torch.bool:
            tensor = tensor.view(torch.uint8)
        opts = td.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        return NcclRequest((self.pg.broadcast([tensor], opts), None)), None

    def issue_all_gather(self, output, input, *, tag, deadline, segment_bytes) -> tuple:
        if not input.nbytes:
            return None, None
        if input.dtype is torch.bool:
            output, input = output.view(torch.uint8), input.view(torch.uint8)
        return NcclRequest((self.pg._allgather_base(output, input), None)), None

    def issue_reduce_scatter(self, output, input, op, *, tag, deadline, segment_bytes) -> tuple:
        if not output.nbytes:
            return None, None
        if input.dtype is torch.bool:
            output, input = output.view(torch.uint8), input.view(torch.uint8)
        work = self.pg._reduce_scatter_base(output, input, self._reduce_scatter_options[op])
        return NcclRequest((work, None)), None

    def issue_all_to_all(self, output, input, out_counts, in_counts, *, tag, deadline, segment_bytes) -> tuple:
        work = self.pg.alltoall_base(self._movable(output), self._movable(input), list(out_counts),
                                     list(in_counts), td.AllToAllOptions())
        return NcclRequest((work, None)), None

    ISSUE = {"all_reduce": issue_all_reduce, "broadcast": issue_broadcast, "all_gather": issue_all_gather,
             "reduce_scatter": issue_reduce_scatter, "all_to_all": issue_all_to_all}


class NcclHostStandIn(NcclBackend):
    """:class:`NcclBackend`'s own methods over torch's ``ProcessGroupGloo`` and CPU tensors: the host path of an
    NCCL call on a machine without a GPU, for counting it (``zerocomm-bench call-counts --backend nccl-standin``).

    Only the process group under the methods is another (:meth:`_process_group`): gloo's takes the same calls
    (``allreduce([t], options)``, ``_allgather_base``, ``_reduce_scatter_base``, ``broadcast``, ``send``/``recv``)
    and returns a ``Work`` whose ``wait`` is one call, as NCCL's.  It is no backend to train with: gloo has no
    AVG, ``barrier`` synchronizes a CUDA stream, and its waits block the host where NCCL's order a stream.
    ``init_process_group("nccl-standin")`` makes one (``backends.STAND_INS``: no capability table lists it).

    An NCCL group's ranks never meet in a host segment (they hold GPU memory), so this one declares that it has
    none (``Attached.no_segment``): its calls are then planned and checked as an NCCL group's are -- the check
    through :meth:`Backend.reduce_stage`, no call riding in a segment round or in the stage -- though its tensors
    are in host memory.
    """

    device_type = "cpu"

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta, device=None,
                 deadline: Optional[float] = None):
        # ``deadline`` (the world's, as gloo's takes it) is not needed: a stand-in runs on one host, where every
        # rank's address is reachable, and gloo's own timeout bounds the connections.
        super().__init__(store, rank, size, timeout, torch.device("cpu"))
        self.local.no_segment = True

    @staticmethod
    def _process_group(store, rank: int, size: int, timeout: datetime.timedelta):
        options = td.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._threads = 1  # one collective after another, in the order given, as NCCL's stream runs them
        options._devices = make_devices(gloo_socket_interfaces())
        return td.ProcessGroupGloo(store, rank, size, options)
