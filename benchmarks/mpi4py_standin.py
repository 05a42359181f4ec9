"""MPICH through mpi4py, behind the ``torch.distributed``-shaped calls the collective benchmark makes.

``ZEROCOMM_BENCH_STANDIN=mpi4py`` (what ``zerocomm-bench --peers`` sets for its MPICH world) measures
this module instead of ``zerocomm.comm``: every collective is one mpi4py buffer call (``Allreduce``,
``Allgather``, ``Reduce_scatter_block``, ...) on the tensor's own memory, so its numbers are MPI's
own, as a C program would see them, plus one Python call.  CPU tensors of the types MPI reduces
natively only (``DTYPES``); ranks are started by ``mpiexec``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

#: The element types measured here: numpy and MPI know them natively.
DTYPES = ("float32", "float64", "int8", "int32", "int64", "uint8")
#: The reduce ops (by the benchmark's names) measured here.
OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")

_comm = None


class ReduceOp:
    """The benchmark's reduce ops, by the names ``torch.distributed.ReduceOp`` uses."""

    SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR = OPS


def _mpi():
    from mpi4py import MPI

    return MPI


def _op(op: str):
    MPI = _mpi()
    return {"sum": MPI.SUM, "avg": MPI.SUM, "product": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
            "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR}[op]


def _world():
    if _comm is None:
        raise RuntimeError("the mpi4py stand-in is not initialized: call init_process_group first")
    return _comm


def _array(tensor: torch.Tensor):
    if tensor.device.type != "cpu":
        raise ValueError(f"the mpi4py stand-in moves CPU tensors only, got one on {tensor.device}")
    return tensor.numpy()


def _joined(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The list's tensors as one buffer: a view when they lie back to back in memory, else a copy."""
    first, step = parts[0], parts[0].numel() * parts[0].element_size()
    if all(p.is_contiguous() and p.data_ptr() == first.data_ptr() + i * step for i, p in enumerate(parts)):
        return first.as_strided((first.numel() * len(parts),), (1,))
    return torch.cat(list(parts))


def _average(tensor: torch.Tensor, op: str) -> None:
    if op == "avg":
        tensor.div_(get_world_size())


def is_available() -> bool:
    return True


def is_mpi_available() -> bool:
    return True


def init_process_group(backend: str = "mpi", **_ignored) -> None:
    """Join ``MPI.COMM_WORLD`` (a duplicate of it); ``backend`` must be ``"mpi"``."""
    global _comm
    if backend != "mpi":
        raise ValueError(f"the mpi4py stand-in runs only backend 'mpi', got {backend!r}")
    _comm = _mpi().COMM_WORLD.Dup()


def destroy_process_group() -> None:
    global _comm
    if _comm is not None:
        _comm.Free()
        _comm = None


def get_backend() -> str:
    return "mpi"


def get_rank() -> int:
    return _world().Get_rank()


def get_world_size() -> int:
    return _world().Get_size()


def barrier() -> None:
    _world().Barrier()


def broadcast(tensor: torch.Tensor, src: int) -> None:
    _world().Bcast(_array(tensor), root=src)


def all_reduce(tensor: torch.Tensor, op: str = ReduceOp.SUM) -> None:
    _world().Allreduce(_mpi().IN_PLACE, _array(tensor), op=_op(op))
    _average(tensor, op)


def reduce(tensor: torch.Tensor, dst: int, op: str = ReduceOp.SUM) -> None:
    comm = _world()
    if comm.Get_rank() == dst:
        comm.Reduce(_mpi().IN_PLACE, _array(tensor), op=_op(op), root=dst)
        _average(tensor, op)
    else:
        comm.Reduce(_array(tensor), None, op=_op(op), root=dst)


def scatter(tensor: torch.Tensor, scatter_list: Optional[list] = None, src: int = 0) -> None:
    comm = _world()
    send = _array(_joined(scatter_list)) if comm.Get_rank() == src else None
    comm.Scatter(send, _array(tensor), root=src)


def gather(tensor: torch.Tensor, gather_list: Optional[list] = None, dst: int = 0) -> None:
    comm = _world()
    if comm.Get_rank() != dst:
        comm.Gather(_array(tensor), None, root=dst)
        return
    out = _joined(gather_list)
    comm.Gather(_array(tensor), _array(out), root=dst)
    if out.data_ptr() != gather_list[0].data_ptr():  # a copy: hand the pieces back
        for part, piece in zip(gather_list, out.split(tensor.numel())):
            part.copy_(piece)


def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor) -> None:
    comm = _world()
    mine = output.data_ptr() + comm.Get_rank() * input.numel() * input.element_size()
    send = _mpi().IN_PLACE if input.data_ptr() == mine else _array(input)
    comm.Allgather(send, _array(output))


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: str = ReduceOp.SUM) -> None:
    comm = _world()
    inside = input.data_ptr() <= output.data_ptr() < input.data_ptr() + input.numel() * input.element_size()
    target = torch.empty_like(output) if inside else output  # MPI forbids a receive buffer inside the send buffer
    comm.Reduce_scatter_block(_array(input), _array(target), op=_op(op))
    if inside:
        output.copy_(target)
    _average(output, op)


def all_to_all_single(output: torch.Tensor, input: torch.Tensor) -> None:
    _world().Alltoall(_array(input), _array(output))
