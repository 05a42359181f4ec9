"""Collectives of picklable Python objects, built on the tensor collectives.

Objects travel as pickled bytes in uint8 tensors: first their lengths (one int64
each), then the bytes padded to the longest.  As in torch, unpickling runs
arbitrary code: only exchange objects between processes you trust.

Those tensors are made on the group's device (``_device``): the CPU for gloo and
MPI, this rank's CUDA device for NCCL, which moves CUDA tensors only.  Received
bytes are copied back to the CPU once, to unpickle.
"""
from __future__ import annotations

import io
import pickle
from typing import Any, List, Optional

import torch

from . import api, topology, validate
from .api import resolve_group
from .group import NON_GROUP_MEMBER


def _device(g, requested=None) -> torch.device:
    """The device whose tensors the group moves (``requested`` if the caller named one)."""
    return torch.device(requested) if requested is not None else g.device()


def _encode(obj: Any, device: torch.device) -> torch.Tensor:
    buffer = io.BytesIO()
    pickle.dump(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8).to(device)


def _decode(data: torch.Tensor, length: int) -> Any:
    return pickle.loads(data[:length].cpu().numpy().tobytes())


def _all_gather_bytes(payload: torch.Tensor, group) -> List[torch.Tensor]:
    """Every rank's ``payload`` (1-D uint8 on the group's device), as CPU tensors in rank order."""
    g = resolve_group(group, "all_gather_object")
    device = payload.device
    lengths = torch.zeros(g.size(), dtype=torch.int64, device=device)
    api.all_gather_into_tensor(lengths, torch.tensor([payload.numel()], dtype=torch.int64, device=device), group=g)
    lengths = lengths.tolist()
    longest = max(lengths)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[:payload.numel()] = payload
    everyone = torch.empty(g.size() * longest, dtype=torch.uint8, device=device)
    api.all_gather_into_tensor(everyone, padded, group=g)
    everyone = everyone.cpu()
    return [everyone[r * longest:(r + 1) * longest][:lengths[r]] for r in range(g.size())]


def all_gather_object(object_list, obj, group=None):
    """``object_list[r]`` ← rank r's ``obj`` on every rank; ``object_list`` has one slot per rank."""
    g = resolve_group(group, "all_gather_object")
    validate.check_list_length(object_list, g.size(), "object_list", "all_gather_object", g)
    for index, data in enumerate(_all_gather_bytes(_encode(obj, _device(g)), g)):
        object_list[index] = _decode(data, data.numel())


def gather_object(obj: Any, object_gather_list: Optional[List[Any]] = None, dst: Optional[int] = None, group=None,
                  group_dst: Optional[int] = None):
    """``object_gather_list[r]`` on ``dst`` ← rank r's ``obj``; the list is given on ``dst`` only."""
    g = resolve_group(group, "gather_object")
    dst = 0 if dst is None and group_dst is None else dst
    root = validate.group_rank_of(g, dst, group_dst, "dst", "gather_object")
    if g.rank == root:
        validate.check_list_length(object_gather_list, g.size(), "object_gather_list", "gather_object", g)
    # Lengths differ by rank, so gather goes through the all_gather of bytes; objects are small.
    for index, data in enumerate(_all_gather_bytes(_encode(obj, _device(g)), g)):
        if g.rank == root:
            object_gather_list[index] = _decode(data, data.numel())


def broadcast_object_list(object_list: List[Any], src: Optional[int] = None, group=None, device=None,
                          group_src: Optional[int] = None):
    """Every rank's ``object_list`` ← ``src``'s (the lists have the same length on every rank)."""
    g = resolve_group(group, "broadcast_object_list")
    src = 0 if src is None and group_src is None else src
    root = validate.group_rank_of(g, src, group_src, "src", "broadcast_object_list")
    where = _device(g, device)
    payloads = [_encode(obj, where) for obj in object_list] if g.rank == root else []
    lengths = torch.tensor([p.numel() for p in payloads] if payloads else [0] * len(object_list), dtype=torch.int64,
                           device=where)
    api.broadcast(lengths, group=g, group_src=root)
    lengths = lengths.tolist()
    data = torch.cat(payloads) if payloads else torch.empty(sum(lengths), dtype=torch.uint8, device=where)
    api.broadcast(data, group=g, group_src=root)
    data = data.cpu()
    offset = 0
    for index, length in enumerate(lengths):
        object_list[index] = _decode(data[offset:offset + length], length)
        offset += length


def scatter_object_list(scatter_object_output_list: List[Any], scatter_object_input_list: Optional[List[Any]] = None,
                        src: Optional[int] = None, group=None, group_src: Optional[int] = None):
    """``scatter_object_output_list[0]`` on rank r ← ``scatter_object_input_list[r]`` of ``src``."""
    g = resolve_group(group, "scatter_object_list")
    src = 0 if src is None and group_src is None else src
    root = validate.group_rank_of(g, src, group_src, "src", "scatter_object_list")
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise validate.InvalidArgumentError(f"rank {g.my_global_rank}: scatter_object_list: "
                                            "Expected argument scatter_object_output_list to be a list of size at least 1.")
    where = _device(g)
    if g.rank == root:
        validate.check_list_length(scatter_object_input_list, g.size(), "scatter_object_input_list",
                                   "scatter_object_list", g)
        payloads = [_encode(obj, where) for obj in scatter_object_input_list]
        lengths = torch.tensor([p.numel() for p in payloads], dtype=torch.int64, device=where)
    else:
        payloads, lengths = [], torch.zeros(g.size(), dtype=torch.int64, device=where)
    api.broadcast(lengths, group=g, group_src=root)
    lengths = lengths.tolist()
    longest = max(lengths)
    mine = torch.zeros(longest, dtype=torch.uint8, device=where)
    chunks = None
    if g.rank == root:
        chunks = []
        for p in payloads:
            padded = torch.zeros(longest, dtype=torch.uint8, device=where)
            padded[:p.numel()] = p
            chunks.append(padded)
    api.scatter(mine, chunks, group=g, group_src=root)
    scatter_object_output_list[0] = _decode(mine, lengths[g.rank])


def get_host_names(group=None) -> tuple:
    """The host of every rank of ``group`` (index = group rank): ``$ZEROCOMM_HOST`` where a rank set it, else
    its hostname, as ``comm.topology`` names hosts.  Every rank of the group calls it (one all_gather of the
    names, read afresh on each call); a non-member gets ``()``."""
    if group is NON_GROUP_MEMBER:
        return ()
    g = resolve_group(group, "get_host_names")
    names = [None] * g.size()
    all_gather_object(names, topology.local_host(), group=group)
    return tuple(names)
