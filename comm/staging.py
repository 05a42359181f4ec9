"""Tensors a collective cannot move as they are, run on copies it can: CUDA tensors on the host backends (gloo,
MPI, shm), staged through pinned host memory as torch's gloo does, and tensors that are not contiguous.

A collective called with such tensors runs as three steps:

1. every such tensor the collective reads is copied into a buffer of its shape and dtype -- pinned host memory
   for a CUDA tensor on a group whose backend moves CPU tensors (on the current CUDA stream, and the host waits
   for that stream: the collective reads host memory next), a contiguous tensor on the same device for one that
   is not contiguous (``x.t()``, ``x[:, ::2]``); a tensor the collective only writes gets an empty buffer;
2. the same collective runs on the buffers, through the same public function (so validation, the
   algorithm choice, the mismatch check and tags are the contiguous call's, unchanged);
3. every tensor the collective writes gets its buffer back, in place (its strides kept): for a blocking call at
   once (``non_blocking`` on the current stream for a CUDA tensor: stream-ordered, as an NCCL call's result
   is); for ``async_op=True`` when the inner call completes, on the thread that completes it, before the
   returned ``Work`` completes, so whatever waits for it sees the data.

List arguments (``all_gather``'s ``tensor_list``, ``scatter_list``, ...) need no contiguous copy: the call packs
them into a flat buffer of its own and copies results back item by item (``validate.py``); their CUDA tensors on
a host group are staged like the others.

Groups that the c10d backend "zerocomm" makes (``c10d.create``) take the other road for CUDA tensors where they
can, as torch's device-to-backend map does: at the group's first CUDA call its members show one another which GPU
they hold (host name and device UUID, an ``all_gather_object`` over the group), and where every member has a GPU
of its own, an NCCL twin of the group (same ranks, through the same store) moves the CUDA tensors as they are from
then on; where two share one (NCCL refuses that), they are staged.

Pinned buffers come from torch's caching host allocator: a buffer released while its copy is in flight is
not reused before the copy ends (torch records the copy's stream), and the next call of the same size gets
it back without pinning again.

The public collectives hand over to :func:`retry` when validation refused their tensors with an
``UnsupportedError`` (``validate.check_tensor`` refuses a CUDA tensor on a CPU backend and a tensor that is not
contiguous so), so a call on contiguous tensors the backend moves runs exactly as before, with no test of its
own.  Any other refusal is raised as it was.
"""
from __future__ import annotations

import concurrent.futures
import socket
import weakref
from typing import Callable, List, Sequence

import torch

from .backends import backend_class
from .group import WORLD
from .validate import resolve_group
from .work import Work

#: Per collective: the positions of the arguments it reads, of those it writes (a tensor or a list of tensors;
#: ``None`` entries, such as ``gather_list`` off the root, are left alone), and of its ``group``.
ROLES = {
    "broadcast": ((0,), (0,), 2),
    "all_reduce": ((0,), (0,), 2),
    "reduce": ((0,), (0,), 3),
    "all_gather_into_tensor": ((1,), (0,), 2),
    "all_gather": ((1,), (0,), 2),
    "gather": ((0,), (1,), 3),
    "scatter": ((1,), (0,), 3),
    "reduce_scatter_tensor": ((1,), (0,), 3),
    "reduce_scatter": ((1,), (0,), 3),
    "all_to_all_single": ((1,), (0,), 4),
    "all_to_all": ((1,), (0,), 2),
}

#: Host groups whose CUDA tensors go over NCCL when every member has a GPU of its own (``offer_nccl``).
_ROUTES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _NcclRoute:
    """A host group's NCCL twin, made at the group's first CUDA call once its members have shown one another
    which GPU they hold (all members make that call, in the same order); ``None`` where two share one.

    ``backend`` names the twin's backend: "nccl", or "nccl-standin" (NCCL's own methods over gloo and host
    memory, ``backends.STAND_INS``), which tests the route on a machine without a GPU: it needs no GPU of
    each member's own, so no GPUs are exchanged."""

    def __init__(self, store, all_gather_object, backend: str = "nccl"):
        self.store = store
        self.all_gather_object = all_gather_object  # given by the caller: staging sits below the object collectives
        self.backend = backend
        self.decided = False
        self.twin = None

    def resolve(self, group):
        if self.decided:
            return self.twin
        store = torch.distributed.PrefixStore(f"zerocomm-cuda/{group.name}/", self.store)
        if self.backend != "nccl":  # the stand-in: host tensors, nothing to exchange
            communicator = backend_class(self.backend)(store, group.rank, group.size(), group.timeout)
        else:
            device = torch.cuda.current_device()
            mine = (socket.gethostname(), str(torch.cuda.get_device_properties(device).uuid))
            everyone = [None] * group.size()
            self.all_gather_object(everyone, mine, group=group)
            if len(set(everyone)) != len(everyone):
                self.decided = True
                return None
            communicator = backend_class("nccl")(store, group.rank, group.size(), group.timeout,
                                                 torch.device("cuda", device))
        self.decided = True
        # Registered as new_group registers its groups: closed with the world's other groups.
        self.twin = WORLD.add_group(group.ranks, group.rank, communicator, group.timeout, self.backend,
                                    f"{group.name}-cuda")
        return self.twin


def offer_nccl(group, store, all_gather_object, backend: str = "nccl") -> None:
    """Let ``group`` (a host group) move CUDA tensors over NCCL, through ``store``, when every member has a GPU of
    its own (decided at its first CUDA call, the members' GPUs exchanged with ``all_gather_object``, zerocomm's);
    staged through host memory otherwise.  ``backend="nccl-standin"`` makes the twin NCCL's stand-in (tests)."""
    if backend != "nccl" or (torch.distributed.is_nccl_available() and torch.cuda.is_available()):
        _ROUTES[group] = _NcclRoute(store, all_gather_object, backend)


def offer_cuda_twin(group, store, all_gather_object, cuda_backend: str, backend_string: str) -> None:
    """``group`` (a gloo group of a world made for CPU and CUDA tensors, "cpu:gloo,cuda:nccl") moves its CUDA
    tensors through a ``cuda_backend`` twin (:func:`offer_nccl`) and answers ``backend_string`` to
    ``get_backend``; its subgroups are made alike (``twin_backend``)."""
    offer_nccl(group, store, all_gather_object, cuda_backend)
    group.backend_string, group.twin_backend = backend_string, cuda_backend


def cuda_twin(group):
    """The group that moves ``group``'s CUDA tensors: its NCCL twin, made now if this is the first call that asks
    (every member asks together), or ``None`` (staged through host memory, or ``group`` moves CUDA itself)."""
    route = _ROUTES.get(group) if _ROUTES else None
    return route.resolve(group) if route is not None else None


def _resolved(group):
    return resolve_group(group, "staging")


def host_group(group) -> bool:
    """True when ``group`` (None: the default group) moves CPU tensors, so CUDA tensors must be staged."""
    return _resolved(group).on_cpu


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)


class _Mirror:
    """Buffers for the tensors among a call's arguments that cannot move as they are, and the copies between them.

    ``to_host``: the call's group moves CPU tensors, so CUDA tensors (single or in lists) get pinned host buffers;
    single tensors that are not contiguous get contiguous ones either way."""

    def __init__(self, to_host: bool):
        self.to_host = to_host
        self.back: List[tuple] = []  # (caller's tensor, buffer) pairs to copy back
        self.streams: set = set()

    def host(self, value, read: bool, write: bool):
        if isinstance(value, torch.Tensor):
            return self._one(value, read, write)
        if self.to_host and isinstance(value, (list, tuple)) \
                and any(isinstance(v, torch.Tensor) and v.is_cuda for v in value):
            return [self._one(v, read, write) if isinstance(v, torch.Tensor) else v for v in value]
        return value

    def _one(self, tensor: torch.Tensor, read: bool, write: bool) -> torch.Tensor:
        if self.to_host and tensor.is_cuda:
            buffer = _pinned(tensor)
            if read:
                buffer.copy_(tensor, non_blocking=True)
                self.streams.add(torch.cuda.current_stream(tensor.device))
        elif tensor.is_contiguous() or tensor.layout is not torch.strided:
            return tensor  # moves as it is, or validation says why not
        else:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
            if read:
                buffer.copy_(tensor)  # on a CUDA device: on the current stream, which the collective follows
        if write:
            self.back.append((tensor, buffer))
        return buffer

    def wait_reads(self) -> None:
        for stream in self.streams:
            stream.synchronize()

    def copy_back(self, synchronize: bool) -> None:
        for tensor, buffer in self.back:
            tensor.copy_(buffer, non_blocking=tensor.is_cuda)
        if synchronize:
            for device in {tensor.device for tensor, _ in self.back if tensor.is_cuda}:
                torch.cuda.current_stream(device).synchronize()


def _has_cuda(args: Sequence) -> bool:
    for value in args:
        if isinstance(value, torch.Tensor) and value.is_cuda:
            return True
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) and v.is_cuda for v in value):
            return True
    return False


def _has_strided(args: Sequence, positions: tuple) -> bool:
    """Whether a single tensor argument at ``positions`` is strided but not contiguous (one a copy can serve)."""
    for index in positions:
        value = args[index] if index < len(args) else None
        if isinstance(value, torch.Tensor) and value.layout is torch.strided and not value.is_contiguous():
            return True
    return False


def retry(error: Exception, collective: Callable, args: Sequence, kwargs: dict, group, async_op: bool):
    """A public collective refused its tensors with ``error`` (an ``UnsupportedError``): when some are on a CUDA
    device and ``group`` moves CPU tensors, or some single tensor is not contiguous, run
    ``collective(*args, **kwargs)`` on buffers it can move (see the module's note) and return what that returns
    (``None``, or for ``async_op`` a ``Work`` that completes once the results are back in the caller's tensors);
    otherwise raise ``error``."""
    name = collective.__name__
    reads, writes, group_at = ROLES[name]
    to_host = _has_cuda(args) and host_group(group)
    if not to_host and not _has_strided(args, reads + writes):
        raise error
    if to_host:
        twin = cuda_twin(_resolved(group))
        if twin is not None:  # every member has a GPU of its own: NCCL moves the tensors as they are
            return collective(*args[:group_at], twin, *args[group_at + 1:], **kwargs)
    mirror = _Mirror(to_host)
    host_args = [mirror.host(value, index in reads, index in writes) for index, value in enumerate(args)]
    mirror.wait_reads()
    work = collective(*host_args, **kwargs)
    if not async_op:
        mirror.copy_back(synchronize=False)
        return None
    done: concurrent.futures.Future = concurrent.futures.Future()

    def finish(inner) -> None:
        error = inner.exception()
        if error is None:
            try:
                mirror.copy_back(synchronize=True)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                error = exc
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    work.add_done_callback(finish)
    callers = {id(buffer): tensor for tensor, buffer in mirror.back}
    outputs = [callers.get(id(tensor), tensor) for tensor in work.result()]
    how = "staged through host memory" if to_host else "through a contiguous copy"
    return Work(f"{name} ({how})", done, outputs, work.group)


__all__ = ["retry", "host_group", "ROLES", "offer_nccl", "offer_cuda_twin", "cuda_twin"]
