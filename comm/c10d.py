"""zerocomm's groups as torch c10d process groups, and zerocomm as a c10d backend
(``init_process_group(backend="zerocomm")`` in plain torch code).

``register()`` (called on ``import zerocomm.comm``) registers the name ``"zerocomm"`` with
``torch.distributed.Backend.register_backend`` for CPU and CUDA tensors.  torch then calls
:func:`create` for the world and for every ``new_group``; it returns a
:class:`ZerocommProcessGroup`, a Python subclass of ``torch.distributed.ProcessGroup`` whose
methods are the ones torch's Python API, DDP, FSDP2 and ZeroRedundancyOptimizer call.  Each
method hands its tensors to zerocomm's public collectives on a zerocomm ``Group`` of the
same ranks (so every call still goes validate → ``Group.run``), with ``async_op=True``, and
returns a c10d ``Work`` made from the zerocomm ``Work``'s future: the future completes when
the data is in the output tensors.

Choosing the transport and the algorithm (see :class:`Options`):

* ``pg_options=zerocomm.comm.c10d.Options(transport="mpi", algorithm="ring")`` given to
  ``init_process_group`` / ``new_group``, else
* ``ZEROCOMM_TRANSPORT`` ("gloo", the default, or "mpi") and ``ZEROCOMM_ALGORITHM`` (read by
  zerocomm's configuration like every other ``ZEROCOMM_*`` variable).

Under ``mpiexec`` with ``ZEROCOMM_TRANSPORT=mpi`` this gives a pip-installed torch an MPI
backend: torch's store only serves the rendezvous (each member writes its MPI rank there, so
torch's rank numbering need not match MPI's), the bytes move over MPI.

[Note: handles]  What zerocomm's own ``new_group`` and ``group.WORLD`` return is a
:class:`ZerocommProcessGroup` too (:func:`handle_of`, one per group), so torch's
``DistributedDataParallel`` takes a zerocomm group as it is.  The group itself stays a plain
Python object (``Group``): zerocomm's calls read ``handle.zerocomm_group`` once, when they resolve
the group, and every later attribute read on the call path is a plain object's.  (A ``Group``
that subclassed torch's ``ProcessGroup`` would pay pybind11's attribute lookup on every one of
those reads.)  zerocomm's ``Group`` attributes (``ranks``, ``backend``, ``timeout``, ...) read
through the handle; ``rank()``, ``size()`` and ``name()`` are torch's methods there.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from typing import List, Optional

import torch
import torch.distributed as td
from torch._C._distributed_c10d import _create_work_from_future

from . import api, compat, environment, objects, p2p, staging, topology
from .backends import backend_class
from .errors import InvalidArgumentError, UnsupportedError
from .group import WORLD, Group
from .validate import resolve_group
from .work import Work

BACKEND_NAME = "zerocomm"
TRANSPORTS = ("gloo", "mpi")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Options:
    """``pg_options`` of a zerocomm c10d group."""

    transport: Optional[str] = None
    """"gloo" or "mpi"; None: ``ZEROCOMM_TRANSPORT``, else "gloo"."""
    algorithm: Optional[str] = None
    """Algorithm of every collective of this group ("native", "ring", "tree", ...); None: zerocomm's default
    (``ZEROCOMM_ALGORITHM``, else "auto")."""

    def __post_init__(self):
        if self.transport is not None and self.transport not in TRANSPORTS:
            raise InvalidArgumentError(f"zerocomm c10d Options: transport must be one of {TRANSPORTS}, "
                                       f"got {self.transport!r}")


_mpi_world = None


def _mpi_communicator(store, rank: int, size: int, name: str):
    """An MPI communicator over the processes that called this with the same ``store`` (every member does)."""
    global _mpi_world
    from .backends.mpi import MpiBackend, mpi_available
    reason = mpi_available()
    if reason:
        raise UnsupportedError(f"rank {rank}: zerocomm c10d backend: transport 'mpi' is unavailable: {reason}")
    if _mpi_world is None:
        _mpi_world = MpiBackend.world()
    store.set(f"zerocomm/mpi_rank/{rank}", str(_mpi_world.rank))
    mpi_ranks = [int(store.get(f"zerocomm/mpi_rank/{r}")) for r in range(size)]
    if mpi_ranks == list(range(_mpi_world.size)):
        return MpiBackend(_mpi_world.comm)
    communicator = _mpi_world.split(mpi_ranks, name)
    if communicator is None:  # this process wrote its rank above, so it is a member
        raise InvalidArgumentError(f"rank {rank}: zerocomm c10d backend: MPI rank {_mpi_world.rank} is not in "
                                   f"the group's MPI ranks {mpi_ranks}")
    return communicator


#: While :func:`make_torch_default` runs: the zerocomm world that torch's default group is to stand for.
_adopting: Optional[Group] = None
#: The zerocomm world whose ``init_process_group`` made torch's default group (see :func:`make_torch_default`).
_owner: Optional[Group] = None


def make_torch_default(world: Group, store) -> bool:
    """Make torch's default process group stand for zerocomm's ``world`` (no new connection), so that
    ``torch.distributed.get_rank()``, ``DistributedSampler`` and torch's own collectives see the same ranks and
    run through zerocomm.  Called by ``zerocomm.comm.init_process_group`` on every rank.

    A program that initialized torch's default group itself keeps it: this then changes nothing and returns
    False.  ``store`` becomes torch's default store (torch's ``new_group`` and libraries read it).
    """
    global _adopting, _owner
    if td.is_initialized():
        return False
    register()
    _adopting = world
    try:
        td.init_process_group(BACKEND_NAME, store=store, rank=world.rank, world_size=world.size(),
                              timeout=world.timeout)
    finally:
        _adopting = None
    _owner = world
    return True


def release_torch_default() -> None:
    """End torch's default group if :func:`make_torch_default` made it (``destroy_process_group``)."""
    global _owner
    if _owner is not None:
        _owner = None
        if td.is_initialized():
            td.destroy_process_group()


def create(dist_backend_opts, pg_options) -> "ZerocommProcessGroup":
    """torch's creator (``extended_api=True``): a ``ZerocommProcessGroup`` over the group's ranks.

    torch's default group made by :func:`make_torch_default` is the zerocomm world itself; a group torch's
    ``new_group`` makes under it is split from that world's communicator (members only, as torch calls this
    only on members).  Otherwise a new communicator meets through torch's store."""
    options = pg_options if isinstance(pg_options, Options) else Options()
    if _adopting is not None:
        handle = handle_of(_adopting)
        handle._name = str(dist_backend_opts.group_id)  # torch resolves groups by the name it registered
        return handle
    if _owner is not None and _owner.communicator is not None:
        return _split_of_owner(dist_backend_opts, options)
    transport = options.transport or (environment.get("ZEROCOMM_TRANSPORT") or "gloo").lower()
    if transport not in TRANSPORTS:
        raise InvalidArgumentError(f"zerocomm c10d backend: ZEROCOMM_TRANSPORT must be one of {TRANSPORTS}, "
                                   f"got {transport!r}")
    store = dist_backend_opts.store
    rank, size = dist_backend_opts.group_rank, dist_backend_opts.group_size
    timeout = dist_backend_opts.timeout
    name = f"c10d-{dist_backend_opts.group_id}"
    if transport == "gloo":
        communicator = backend_class("gloo")(td.PrefixStore("zerocomm/", store), rank, size, timeout)
    else:
        communicator = _mpi_communicator(store, rank, size, name)
    ranks = list(dist_backend_opts.global_ranks_in_group) or list(range(size))
    group = Group(ranks, rank, communicator, timeout, transport, name)
    staging.offer_nccl(group, store, objects.all_gather_object)  # CUDA tensors: NCCL where every rank has a GPU of its own, else staged
    group.handle = ZerocommProcessGroup(group, options.algorithm, str(dist_backend_opts.group_id))
    return group.handle


def _split_of_owner(dist_backend_opts, options: Options) -> "ZerocommProcessGroup":
    """torch's ``new_group`` under a default group that is a zerocomm world: a zerocomm group of the same
    members, split from the world's communicator, on the world's transport."""
    world = _owner
    ranks = list(dist_backend_opts.global_ranks_in_group) or list(range(world.size()))
    name = f"c10d-{dist_backend_opts.group_id}"
    timeout = dist_backend_opts.timeout
    communicator = world.communicator.split(ranks, name, deadline=time.monotonic() + timeout.total_seconds())
    topology.inherit(communicator, world.communicator, ranks)
    # Registered as new_group registers its groups: destroy_process_group() closes it with the world's other groups.
    group = WORLD.add_group(ranks, dist_backend_opts.group_rank, communicator, timeout, world.backend, name)
    if world.twin_backend is not None:  # a world for CPU and CUDA tensors: its groups move both
        staging.offer_cuda_twin(group, communicator.store, objects.all_gather_object, world.twin_backend,
                                world.backend_string)
    group.handle = ZerocommProcessGroup(group, options.algorithm, str(dist_backend_opts.group_id))
    return group.handle


def handle_of(group: Group) -> "ZerocommProcessGroup":
    """The c10d ``ProcessGroup`` that stands for ``group`` in user code: what ``new_group`` and
    ``group.WORLD`` return (made on first use, then the same object; see [Note: handles])."""
    handle = group.handle
    if handle is None:
        handle = group.handle = ZerocommProcessGroup(group, None, group.name)
    return handle


def as_process_group(group=None) -> "ZerocommProcessGroup":
    """The torch c10d ``ProcessGroup`` of a zerocomm ``group`` (the default one if None): the same members,
    communicator and order of calls, no new connection.  ``new_group`` and ``group.WORLD`` already return it;
    this also takes a ``Group`` or None.  torch's registry does not know it, so torch functions that look a
    group up there (``torch.distributed.get_rank(pg)``, ``DeviceMesh``, FSDP2, ``ZeroRedundancyOptimizer``)
    need a group made by ``init_process_group("zerocomm")`` or ``new_group(backend="zerocomm")`` instead."""
    return handle_of(resolve_group(group, "as_process_group"))


def register() -> None:
    """Register ``"zerocomm"`` with torch (for CPU and CUDA tensors; staging.py says how CUDA tensors move); done on
    ``import zerocomm.comm``, idempotent."""
    if BACKEND_NAME.upper() not in td.Backend._plugins:
        td.Backend.register_backend(BACKEND_NAME, create, extended_api=True, devices=["cpu", "cuda"])


# -- Work ---------------------------------------------------------------------------------------------

def _c10d_work(work: Work) -> td.Work:
    """A c10d ``Work`` whose future completes (with the output tensors) when ``work`` has written them."""
    return _create_work_from_future(work.get_future())


def _all_of(works: List[Work], outputs) -> td.Work:
    """One c10d ``Work`` that completes when every one of ``works`` has, with the first error if any."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    remaining = [len(works)]

    def one_done(_done) -> None:
        remaining[0] -= 1  # callbacks of one group run on its single executor thread, in order
        if remaining[0] == 0:
            errors = [w.exception() for w in works if w.exception() is not None]
            if errors:
                future.set_exception(errors[0])
            else:
                future.set_result(None)

    for w in works:
        w.add_done_callback(one_done)
    return _c10d_work(Work("coalesced", future, outputs))


def _splits(sizes) -> Optional[list]:
    return list(sizes) if sizes else None


def _reduce_op(opts):
    """The ``ReduceOp`` of ``opts``: an options struct, a ``ReduceOp`` (torch's short forms), or None (SUM)."""
    return td.ReduceOp.SUM if opts is None else getattr(opts, "reduceOp", opts)


class ZerocommProcessGroup(td.ProcessGroup):
    """A c10d process group whose collectives run on a zerocomm ``Group`` (see the module's docstring).

    Ranks in the methods' options (``rootRank``, ``dstRank``, ``srcRank``) are group ranks, as c10d
    passes them; they are handed on as ``group_src``/``group_dst``.  The methods user code calls directly
    (``allreduce``, ``broadcast``, ``allgather``, ``barrier``) also take torch's short forms: one tensor
    instead of a list, a ``ReduceOp`` or a root rank instead of the options struct.
    """

    def __init__(self, group: Group, algorithm: Optional[str] = None, name: str = ""):
        super().__init__(group.rank, group.size())
        self.zerocomm_group = group
        self._kw = {} if algorithm is None else {"algorithm": algorithm}
        self._name = name

    @property
    def group_name(self) -> str:
        """The name torch registered this group under (DeviceMesh, hence FSDP2, resolves groups by it).

        c10d's own ``group_name`` asks the group's backends, which a Python group does not have.
        """
        return self._name

    def getBackendName(self) -> str:  # noqa: N802  (c10d's name)
        return BACKEND_NAME

    def __repr__(self) -> str:
        g = self.zerocomm_group
        return f"<ZerocommProcessGroup {g.name} transport={g.backend} rank={g.rank} size={g.size()}>"

    def __getattr__(self, name: str):
        # Only names found nowhere else get here: zerocomm's Group attributes (ranks, backend, timeout, ...).
        if name.startswith("_") or name == "zerocomm_group":
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.zerocomm_group, name)

    def _one(self, tensors, what: str) -> torch.Tensor:
        if isinstance(tensors, torch.Tensor):
            return tensors
        if len(tensors) != 1:
            raise UnsupportedError(f"rank {self.zerocomm_group.my_global_rank}: {what}: zerocomm's c10d backend takes "
                                   f"one tensor per call (one CPU device), got {len(tensors)}")
        return tensors[0]

    # -- reductions ---------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        tensor = self._one(tensors, "allreduce")
        return _c10d_work(api.all_reduce(tensor, _reduce_op(opts), self.zerocomm_group, True, **self._kw))

    def allreduce_coalesced(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else td.ReduceOp.SUM
        if len({t.dtype for t in tensors}) == 1:
            return _c10d_work(compat.all_reduce_coalesced(list(tensors), op, self.zerocomm_group, True))
        works = [api.all_reduce(t, op, self.zerocomm_group, True, **self._kw) for t in tensors]
        return _all_of(works, list(tensors))

    def reduce(self, tensors, opts):
        tensor = self._one(tensors, "reduce")
        return _c10d_work(api.reduce(tensor, None, opts.reduceOp, self.zerocomm_group, True,
                                     group_dst=opts.rootRank, **self._kw))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = opts.reduceOp if opts is not None else td.ReduceOp.SUM
        output = self._one(output_tensors, "reduce_scatter")
        return _c10d_work(api.reduce_scatter(output, list(input_tensors[0]), op, self.zerocomm_group, True,
                                             **self._kw))

    def reduce_scatter_single(self, output, input, opts=None):
        op = opts.reduceOp if opts is not None else td.ReduceOp.SUM
        return _c10d_work(api.reduce_scatter_tensor(output, input, op, self.zerocomm_group, True, **self._kw))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = opts.reduceOp if opts is not None else td.ReduceOp.SUM
        works = [api.reduce_scatter_tensor(o, i, op, self.zerocomm_group, True, **self._kw)
                 for o, i in zip(outputs, inputs)]
        return _all_of(works, list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- data movement ----------------------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        tensor = self._one(tensors, "broadcast")
        root = getattr(opts, "rootRank", opts) or 0
        return _c10d_work(api.broadcast(tensor, None, self.zerocomm_group, True, group_src=root, **self._kw))

    def allgather(self, output_tensors, input_tensors, opts=None):
        tensor = self._one(input_tensors, "allgather")
        nested = output_tensors and isinstance(output_tensors[0], (list, tuple))
        outputs = list(output_tensors[0] if nested else output_tensors)
        return _c10d_work(api.all_gather(outputs, tensor, self.zerocomm_group, True, **self._kw))

    def all_gather_single(self, output, input, opts=None):
        return _c10d_work(api.all_gather_into_tensor(output, input, self.zerocomm_group, True, **self._kw))

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        outputs = [list(o) for o in output_lists]
        return _c10d_work(compat.all_gather_coalesced(outputs, list(input_tensors), self.zerocomm_group, True))

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [api.all_gather_into_tensor(o, i, self.zerocomm_group, True, **self._kw)
                 for o, i in zip(outputs, inputs)]
        return _all_of(works, list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_lists, input_tensors, opts):
        tensor = self._one(input_tensors, "gather")
        g = self.zerocomm_group
        gather_list = list(output_lists[0]) if g.rank == opts.rootRank else None
        return _c10d_work(api.gather(tensor, gather_list, None, g, True, group_dst=opts.rootRank, **self._kw))

    def scatter(self, output_tensors, input_lists, opts):
        tensor = self._one(output_tensors, "scatter")
        g = self.zerocomm_group
        scatter_list = list(input_lists[0]) if g.rank == opts.rootRank else None
        return _c10d_work(api.scatter(tensor, scatter_list, None, g, True, group_src=opts.rootRank, **self._kw))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return _c10d_work(api.all_to_all(list(output_tensors), list(input_tensors), self.zerocomm_group, True,
                                         **self._kw))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return _c10d_work(api.all_to_all_single(output, input, _splits(output_split_sizes),
                                                _splits(input_split_sizes), self.zerocomm_group, True, **self._kw))

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        timeout = getattr(opts, "timeout", None) if opts is not None else None
        if timeout is not None and timeout.total_seconds() <= 0:
            timeout = None
        return _c10d_work(api.barrier(self.zerocomm_group, True, timeout=timeout))

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        """``zerocomm.comm.monitored_barrier`` on this group (blocking, as torch's)."""
        compat.monitored_barrier(self.zerocomm_group, timeout, wait_all_ranks)

    # -- point to point -----------------------------------------------------------------------------------
    def send(self, tensors, dst_rank: int, tag: int):
        tensor = self._one(tensors, "send")
        return _c10d_work(p2p.isend(tensor, None, self.zerocomm_group, tag, group_dst=dst_rank))

    def recv(self, tensors, src_rank: int, tag: int):
        tensor = self._one(tensors, "recv")
        return _c10d_work(p2p.irecv(tensor, None, self.zerocomm_group, tag, group_src=src_rank))

    def recv_anysource(self, tensors, tag: int):
        tensor = self._one(tensors, "recv")
        return _c10d_work(p2p.irecv(tensor, None, self.zerocomm_group, tag))
