"""The gloo backend: CPU tensors over torch's ``ProcessGroupGloo``.

zerocomm builds its own ``ProcessGroupGloo`` from the store instead of calling
``torch.distributed.init_process_group``, so torch's global default group stays
free for the user (torch DDP beside zerocomm in one process works).

Point-to-point moves raw bytes (every dtype views as uint8), so rings and trees
run on any dtype.  Native collectives are torch's gloo ones; the few cells gloo
lacks are composed here and the table says how.
"""
from __future__ import annotations

import datetime
from typing import List, Optional, Sequence

import torch
import torch.distributed as td

from ...ops.reduce import finalize_
from ..traffic import bus_factor
from ..transport import Request, Transport, remaining

_C = torch._C._distributed_c10d

_TORCH_OPS = {
    "sum": td.ReduceOp.SUM, "product": td.ReduceOp.PRODUCT, "min": td.ReduceOp.MIN,
    "max": td.ReduceOp.MAX, "band": td.ReduceOp.BAND, "bor": td.ReduceOp.BOR, "bxor": td.ReduceOp.BXOR,
}

#: What gloo itself does for each collective, and what zerocomm adds (see ``native_table``).
NATIVE_TABLE = {
    "broadcast": "native",
    "scatter": "native",
    "reduce": "native (non-root inputs are protected by a copy: gloo overwrites them)",
    "all_reduce": "native (AVG on floats: gloo SUM, then divide)",
    "gather": "native",
    "all_gather": "native",
    "reduce_scatter": "composed by torch's gloo: a full all_reduce, then a copy of the rank's chunk",
    "all_to_all": "native",
    "barrier": "native",
    "send/recv": "native (tagged unbound buffers)",
}


def _seconds(timeout_s: Optional[float]) -> datetime.timedelta:
    return datetime.timedelta(seconds=timeout_s) if timeout_s is not None else datetime.timedelta(0)


class GlooRequest(Request):
    """A torch gloo ``Work`` with a bounded wait; ``what`` names it in a timeout."""

    def __init__(self, work, what: str, keep_alive=None):
        self._work = work
        self._what = what
        self._keep = keep_alive  # tensors gloo reads or writes until completion

    def test(self) -> bool:
        return self._work.is_completed()

    def wait(self, timeout_s: Optional[float] = None) -> None:
        try:
            if timeout_s is None:
                self._work.wait()
            else:
                # torch treats a zero timedelta as "no timeout": never pass it.
                self._work.wait(datetime.timedelta(seconds=max(timeout_s, 1e-3)))
        except RuntimeError as error:
            text = str(error)
            if "imed out" in text or "timeout" in text.lower():
                raise TimeoutError(f"{self._what} ({text.splitlines()[0]})") from None
            raise


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A uint8 view of a contiguous tensor's bytes (gloo p2p moves bytes, not values)."""
    if tensor.numel() == 0:  # an empty tensor may have any strides, which view() rejects
        return torch.empty(0, dtype=torch.uint8)
    return tensor.reshape(-1).view(torch.uint8)


class GlooTransport(Transport):
    """One gloo communicator; ``pg`` is the ``ProcessGroupGloo`` over its members."""

    name = "gloo"
    device_type = "cpu"

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        self.store = store
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.pg = td.ProcessGroupGloo(store, rank, size, timeout)

    # -- point to point ---------------------------------------------------------------
    def isend(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        buf = _bytes(tensor)
        return GlooRequest(self.pg.send([buf], peer, tag), f"send to rank {peer} (tag {tag})", buf)

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        buf = _bytes(tensor)
        return GlooRequest(self.pg.recv([buf], peer, tag), f"recv from rank {peer} (tag {tag})", buf)

    def irecv_any(self, tensor: torch.Tensor, tag: int) -> Request:
        """Receive from whichever rank sends with ``tag``; the request's ``source()`` says who."""
        buf = _bytes(tensor)
        work = self.pg.recv_anysource([buf], tag)
        request = GlooRequest(work, f"recv from any rank (tag {tag})", buf)
        request.source = work._source_rank
        return request

    def split(self, ranks: Sequence[int], key: str) -> Optional["GlooTransport"]:
        if self.rank not in ranks:
            return None
        store = td.PrefixStore(f"zerocomm/{key}/", self.store)
        return GlooTransport(store, list(ranks).index(self.rank), len(ranks), self.timeout)

    def close(self) -> None:
        self.pg = None

    # -- what gloo supports -----------------------------------------------------------
    @classmethod
    def native_support(cls, collective: str, dtype: torch.dtype, op: Optional[str]) -> Optional[str]:
        return None  # torch's gloo serves every dtype and op zerocomm admits (probed; see NATIVE_TABLE)

    @classmethod
    def native_table(cls) -> dict:
        return dict(NATIVE_TABLE)

    @staticmethod
    def native_bus_factor(collective: str, n: int) -> float:
        """Bytes per byte of S that gloo's own collective moves per rank (for ``count_bytes``)."""
        if collective == "reduce_scatter":  # torch's gloo runs a full all_reduce (NATIVE_TABLE)
            return bus_factor("all_reduce", n)
        return bus_factor(collective, n)

    # -- native collectives: same arguments as the algorithms, blocking ---------------
    def _finish(self, work, what: str, deadline: Optional[float]) -> None:
        GlooRequest(work, f"gloo {what}").wait(remaining(deadline))

    def native_all_reduce(self, tensor, op, *, tag, deadline, segment_bytes) -> None:
        if tensor.numel() == 0:
            return
        opts = _C.AllreduceOptions()
        opts.reduceOp = _TORCH_OPS["sum" if op == "avg" else op]
        self._finish(self.pg.allreduce([tensor], opts), "allreduce", deadline)
        finalize_(tensor, op, self.size)

    def native_broadcast(self, tensor, root, *, tag, deadline, segment_bytes) -> None:
        if tensor.numel() == 0:
            return
        opts = _C.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        self._finish(self.pg.broadcast([tensor], opts), "broadcast", deadline)

    def native_reduce(self, tensor, op, root, *, tag, deadline, segment_bytes) -> None:
        if tensor.numel() == 0:
            return
        opts = _C.ReduceOptions()
        opts.rootRank, opts.reduceOp = root, _TORCH_OPS["sum" if op == "avg" else op]
        work_tensor = tensor if self.rank == root else tensor.clone()
        self._finish(self.pg.reduce([work_tensor], opts), "reduce", deadline)
        if self.rank == root:
            finalize_(tensor, op, self.size)

    def native_all_gather(self, output, input, *, tag, deadline, segment_bytes) -> None:
        if input.numel() == 0:
            return
        self._finish(self.pg._allgather_base(output, input), "allgather", deadline)

    def native_gather(self, output, input, root, *, tag, deadline, segment_bytes) -> None:
        if input.numel() == 0:
            return
        opts = _C.GatherOptions()
        opts.rootRank = root
        outputs: List[List[torch.Tensor]] = [list(output.chunk(self.size))] if self.rank == root else []
        self._finish(self.pg.gather(outputs, [input], opts), "gather", deadline)

    def native_scatter(self, output, input, root, *, tag, deadline, segment_bytes) -> None:
        if output.numel() == 0:
            return
        opts = _C.ScatterOptions()
        opts.rootRank = root
        inputs = [list(input.chunk(self.size))] if self.rank == root else []
        self._finish(self.pg.scatter([output], inputs, opts), "scatter", deadline)

    def native_reduce_scatter(self, output, input, op, *, tag, deadline, segment_bytes) -> None:
        if output.numel() == 0:
            return
        opts = _C.ReduceScatterOptions()
        opts.reduceOp = _TORCH_OPS["sum" if op == "avg" else op]
        self._finish(self.pg._reduce_scatter_base(output, input, opts), "reduce_scatter", deadline)
        finalize_(output, op, self.size)

    def native_all_to_all(self, output, input, out_counts, in_counts, *, tag, deadline, segment_bytes) -> None:
        if input.numel() == 0 and output.numel() == 0 and not any(out_counts) and not any(in_counts):
            return
        self._finish(self.pg.alltoall_base(output, input, list(out_counts), list(in_counts), _C.AllToAllOptions()),
                     "alltoall", deadline)

    def native_barrier(self, *, tag, deadline, segment_bytes) -> None:
        self._finish(self.pg.barrier(_C.BarrierOptions()), "barrier", deadline)
