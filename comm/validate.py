"""Checks made before any byte moves.

Local checks look only at this rank's arguments and raise at once.  In debug mode
(``ZEROCOMM_DEBUG=1``) each collective first all-gathers a small fingerprint —
sequence number, collective, element count, dtype, root, algorithm — and every rank
raises ``CollectiveMismatchError`` naming the first two ranks that disagree,
instead of the hang or abort a mismatched call gives on the wire.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .errors import CollectiveMismatchError, InvalidArgumentError, UnsupportedError
from .reduce_op import SUPPORTED_DTYPES

_COLLECTIVES = ("broadcast", "scatter", "reduce", "all_reduce", "gather", "all_gather", "reduce_scatter",
                "all_to_all", "barrier", "compressed_all_reduce")
_ALGORITHM_IDS = ("native", "ring", "tree", "recursive_doubling")


def check_tensor(tensor, what: str, collective: str, group) -> None:
    """``tensor`` is a contiguous tensor of a supported dtype on the backend's device."""
    rank = group.my_global_rank
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"rank {rank}: {collective}: {what} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise InvalidArgumentError(f"rank {rank}: {collective}: {what} must be contiguous (shape {tuple(tensor.shape)}, "
                                   f"strides {tensor.stride()}); call .contiguous() first")
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise UnsupportedError(f"rank {rank}: {collective}: {what} has dtype {tensor.dtype}, which backend "
                               f"{group.backend!r} does not move; use one of {[str(d) for d in SUPPORTED_DTYPES]}")
    device = group.transport.device_type
    if tensor.device.type != device:
        other = "nccl" if tensor.device.type == "cuda" else "gloo or mpi"
        raise UnsupportedError(f"rank {rank}: {collective}: {what} is on {tensor.device} but backend "
                               f"{group.backend!r} moves {device} tensors; move it to {device} or use backend {other!r}")


def check_same_dtype(tensors: Sequence[torch.Tensor], dtype: torch.dtype, collective: str, group) -> None:
    for index, tensor in enumerate(tensors):
        if tensor.dtype != dtype:
            raise InvalidArgumentError(f"rank {group.my_global_rank}: {collective}: expects uniform dtype {dtype} "
                                       f"but tensor {index} has {tensor.dtype}")


def check_numel(tensor: torch.Tensor, expected: int, what: str, collective: str, group) -> None:
    if tensor.numel() != expected:
        raise InvalidArgumentError(f"rank {group.my_global_rank}: {collective}: {what} has {tensor.numel()} elements, "
                                   f"expected {expected} (shape {tuple(tensor.shape)})")


def check_list_length(items, expected: int, what: str, collective: str, group) -> None:
    if items is None or len(items) != expected:
        got = "None" if items is None else f"{len(items)} items"
        raise InvalidArgumentError(f"rank {group.my_global_rank}: {collective}: {what} must hold one tensor per rank: "
                                   f"expecting {expected} items, got {got}")


def group_rank_of(group, global_rank: Optional[int], group_rank: Optional[int], role: str, collective: str) -> int:
    """Canonicalize torch's (``src``/``dst`` global rank, ``group_src``/``group_dst``) pair to a group rank."""
    rank = group.my_global_rank
    if group_rank is not None:
        if global_rank is not None:
            raise InvalidArgumentError(f"rank {rank}: {collective}: pass either {role} or group_{role}, not both")
        if not 0 <= group_rank < group.size():
            raise InvalidArgumentError(f"rank {rank}: {collective}: group_{role} {group_rank} is outside the group "
                                       f"(size {group.size()})")
        return group_rank
    if global_rank is None:
        raise InvalidArgumentError(f"rank {rank}: {collective}: {role} must be given")
    if global_rank not in group.ranks:
        raise InvalidArgumentError(f"rank {rank}: {collective}: {role} {global_rank} is not a member of "
                                   f"{group.describe()}")
    return group.ranks.index(global_rank)


def fingerprint(sequence: int, collective: str, numel: int, dtype: torch.dtype, root: int, algorithm: str) -> torch.Tensor:
    dtype_id = SUPPORTED_DTYPES.index(dtype) if dtype in SUPPORTED_DTYPES else -1
    return torch.tensor([sequence, _COLLECTIVES.index(collective), numel, dtype_id, root,
                         _ALGORITHM_IDS.index(algorithm) if algorithm in _ALGORITHM_IDS else -1], dtype=torch.int64)


def _describe(row) -> str:
    seq, coll, numel, dtype_id, root, alg = (int(v) for v in row)
    dtype = SUPPORTED_DTYPES[dtype_id] if 0 <= dtype_id < len(SUPPORTED_DTYPES) else "?"
    algorithm = _ALGORITHM_IDS[alg] if 0 <= alg < len(_ALGORITHM_IDS) else "?"
    return (f"call #{seq} {_COLLECTIVES[coll]} of {numel} elements of {dtype}"
            f"{'' if root < 0 else f' with root {root}'} (algorithm {algorithm})")


def cross_check(group, mine: torch.Tensor, deadline: Optional[float]) -> None:
    """All-gather every rank's fingerprint; raise on every rank if any two differ."""
    transport = group.transport
    everyone = torch.empty(transport.size * mine.numel(), dtype=mine.dtype)
    transport.native_all_gather(everyone, mine, tag=0, deadline=deadline, segment_bytes=1 << 20)
    rows = everyone.view(transport.size, -1)
    for other in range(1, transport.size):
        if not torch.equal(rows[0], rows[other]):
            raise CollectiveMismatchError(
                f"rank {group.my_global_rank}: mismatched collectives on {group.describe()}: rank {group.ranks[0]} "
                f"called {_describe(rows[0])}, but rank {group.ranks[other]} called {_describe(rows[other])}")
