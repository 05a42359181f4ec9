"""Initialization, groups and rank queries, with torch.distributed's names and defaults.

Backends: ``gloo`` (CPU, torch's gloo; rendezvous through torch's ``init_method``
or ``store``), ``mpi`` (CPU, mpi4py; ranks from the MPI launcher) and ``nccl``
(CUDA).  ``backend=None`` takes ``mpi`` when the process was started by an MPI
launcher without torch's ``RANK`` variable, else ``gloo``.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import List, Optional

import torch
import torch.distributed as td

from .backends import BACKENDS, backend_class
from .config import CommConfig
from .errors import InvalidArgumentError, UnsupportedError
from .group import DEFAULT_TIMEOUT, NON_GROUP_MEMBER, WORLD, Group
from .transport import USER_TAG_LIMIT

def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return WORLD.default is not None


def _launched_by_mpi() -> bool:
    return "RANK" not in os.environ and any(
        key in os.environ for key in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID"))


def _make_communicator(backend: str, init_method, timeout, world_size, rank, store):
    """The world's communicator of ``backend`` (one of ``backends.BACKENDS``)."""
    if backend not in BACKENDS:
        raise InvalidArgumentError(f"init_process_group: backend must be one of {tuple(BACKENDS)}, got {backend!r}")
    cls = backend_class(backend)
    if backend == "mpi":
        from .backends.mpi import mpi_available
        reason = mpi_available()
        if reason:
            raise UnsupportedError(f"init_process_group: backend 'mpi' is unavailable: {reason}")
        return cls.world()
    if backend == "nccl":
        return cls.create(init_method, timeout, world_size, rank, store)
    if store is None:
        store, rank, world_size = next(td.rendezvous(init_method or "env://", rank, world_size, timeout=timeout))
        store.set_timeout(timeout)
    elif rank < 0 or world_size < 1:
        raise InvalidArgumentError(f"init_process_group: with a store, rank ({rank}) and world_size "
                                   f"({world_size}) must be given")
    return cls(td.PrefixStore("zerocomm/world/", store), rank, world_size, timeout)


def init_process_group(backend: Optional[str] = None, init_method: Optional[str] = None, timeout=None,
                       world_size: int = -1, rank: int = -1, store=None, group_name: str = "", pg_options=None,
                       device_id=None, _ranks=None) -> None:
    """Join the default group. Every process of the job calls it once."""
    if WORLD.default is not None:
        raise InvalidArgumentError("init_process_group: the default process group is already initialized; "
                                   "call destroy_process_group() first")
    if backend is None:
        backend = "mpi" if _launched_by_mpi() else "gloo"
    backend = str(backend).lower()
    timeout = timeout or DEFAULT_TIMEOUT
    config = CommConfig.from_env()  # before any rendezvous: a bad variable fails at once, naming itself
    communicator = _make_communicator(backend, init_method, timeout, world_size, rank, store)
    if world_size > 0 and communicator.size != world_size:
        raise InvalidArgumentError(f"init_process_group: world_size {world_size} does not match the launcher's "
                                   f"{communicator.size}")
    WORLD.config = config
    if config.switch_interval_s > 0:
        sys.setswitchinterval(config.switch_interval_s)
    if communicator.device_type == "cpu" and communicator.size > 1:
        # Which host each rank is on, learnt once (selection offers "shm" only where all ranks share one);
        # the tag is below every collective's, and nothing else is in flight yet.
        from . import topology
        topology.hosts(communicator, tag=USER_TAG_LIMIT, deadline=time.monotonic() + timeout.total_seconds())
    WORLD.default = Group(list(range(communicator.size)), communicator.rank, communicator, timeout, backend, "world")
    WORLD.groups["world"] = WORLD.default
    if WORLD.config.profile_path:
        from .profiler import Profiler
        WORLD.observers.append(Profiler())


def _write_env_profiles() -> None:
    """Write the ZEROCOMM_PROFILE recorder's files for this rank (JSON summary, Chrome trace), and rank 0
    the trace merging every rank's (``PATH.trace.json``)."""
    from .profiler import Profiler
    path = WORLD.config.profile_path
    profilers = [o for o in WORLD.observers if isinstance(o, Profiler)]
    for observer in profilers:
        WORLD.observers.remove(observer)
    world = WORLD.default
    if not (path and profilers and world is not None):
        return
    rank = world.my_global_rank
    for observer in profilers:
        observer.export_json(f"{path}.rank{rank}.json")
        observer.export_chrome_trace(f"{path}.rank{rank}.trace.json")
    # Every rank's file is written once all have passed the barrier: rank 0 merges them into one trace.
    from .api import barrier
    barrier()
    if rank == 0:
        from .profiler import merge_chrome_traces
        merge_chrome_traces(path, f"{path}.trace.json")


def destroy_process_group(group=None) -> None:
    """Destroy ``group``, or every group and the default one when ``group`` is None."""
    if group is None:
        _write_env_profiles()
        WORLD.reset()
        return
    if isinstance(group, Group):
        group.close()
        WORLD.groups.pop(group.name, None)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization: bool = False,
              group_desc=None, device_id=None, sort_ranks: bool = True):
    """A group over the global ``ranks``. Every process of the world calls it, in the same order.

    Returns the ``Group`` on members and ``NON_GROUP_MEMBER`` elsewhere.
    """
    world = WORLD.require("new_group")
    size = world.size()
    members: List[int] = list(range(size)) if ranks is None else [int(r) for r in ranks]
    if sort_ranks:
        members.sort()
    bad = [r for r in members if not 0 <= r < size]
    if bad or len(set(members)) != len(members) or not members:
        raise InvalidArgumentError(f"rank {world.my_global_rank}: new_group: ranks {list(ranks or [])} must be "
                                   f"distinct global ranks in [0, {size}); offending: {bad or 'duplicates/empty'}")
    if backend is not None and str(backend).lower() != world.backend:
        raise UnsupportedError(f"rank {world.my_global_rank}: new_group: backend {backend!r} differs from the default "
                               f"group's {world.backend!r}; zerocomm groups share the default group's backend")
    WORLD.group_count += 1
    name = f"g{WORLD.group_count}"
    communicator = world.communicator.split(members, name)
    if communicator is None:
        return NON_GROUP_MEMBER
    from . import topology
    topology.inherit(communicator, world.communicator, members)
    group = Group(members, members.index(world.my_global_rank), communicator, timeout or world.timeout,
                  world.backend, name)
    WORLD.groups[name] = group
    return group


def _group_or_world(group, what: str) -> Optional[Group]:
    if group is None:
        return WORLD.require(what)
    if group is NON_GROUP_MEMBER:
        WORLD.require(what)
        return None
    if isinstance(group, Group):
        return group
    inner = getattr(group, "zerocomm_group", None)  # a torch group made by init_process_group("zerocomm")
    if isinstance(inner, Group):
        return inner
    raise InvalidArgumentError(f"{what}: group must be a zerocomm group or None, got {type(group).__name__}")


def get_rank(group=None) -> int:
    """This process's rank in ``group`` (the default group if None); -1 if it is not a member."""
    g = _group_or_world(group, "get_rank")
    return -1 if g is None else g.rank


def get_world_size(group=None) -> int:
    """Number of processes in ``group``; -1 if this process is not a member."""
    g = _group_or_world(group, "get_world_size")
    return -1 if g is None else g.size()


def get_backend(group=None) -> td.Backend:
    g = _group_or_world(group, "get_backend")
    if g is None:
        raise InvalidArgumentError(f"rank {WORLD.default.my_global_rank}: get_backend: Invalid process group "
                                   "specified (this process is not a member of the group)")
    return td.Backend(g.backend)


def get_global_rank(group, group_rank: int) -> int:
    """The global rank of ``group``'s rank ``group_rank``."""
    g = _group_or_world(group, "get_global_rank")
    if g is None or not 0 <= group_rank < g.size():
        raise InvalidArgumentError(f"get_global_rank: group rank {group_rank} is not in the group")
    return g.ranks[group_rank]


def get_group_rank(group, global_rank: int) -> int:
    """``global_rank``'s rank within ``group``."""
    g = _group_or_world(group, "get_group_rank")
    if g is None or global_rank not in g.ranks:
        raise InvalidArgumentError(f"get_group_rank: global rank {global_rank} is not part of the group")
    return g.ranks.index(global_rank)


class _GroupNamespace:
    """``group.WORLD`` as in torch: the default group once initialized, else None."""

    @property
    def WORLD(self):  # noqa: N802  (torch's name)
        return WORLD.default


class _GroupMemberNamespace(_GroupNamespace):
    NON_GROUP_MEMBER = NON_GROUP_MEMBER


group = _GroupNamespace()
GroupMember = _GroupMemberNamespace()


def set_default_algorithm(algorithm: str) -> None:
    """Default ``algorithm=`` of this world's calls ("native", "ring", "tree", "recursive_doubling", "auto").

    Like :func:`configure`, it changes the initialized world's configuration; before
    ``init_process_group`` it raises (set ``ZEROCOMM_ALGORITHM`` instead, which init reads).
    """
    configure(algorithm=algorithm)


def get_default_algorithm() -> str:
    return WORLD.config.algorithm


def configure(**fields) -> CommConfig:
    """Replace fields of the world's ``CommConfig`` (``algorithm``, ``segment_bytes``, ``debug``, ...); return it.

    The configuration belongs to the initialized world: ``init_process_group`` reads it from the
    ``ZEROCOMM_*`` variables, this changes it, ``destroy_process_group`` drops it.  Called before
    init it raises ``NotInitializedError`` rather than being silently lost; ``configure()`` without arguments
    only reads (before init: the defaults the ``ZEROCOMM_*`` variables give).
    """
    if not fields:
        return WORLD.config  # reading is fine before init: the defaults the environment gives
    WORLD.require("configure")
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(CommConfig)})
    if unknown:
        raise InvalidArgumentError(f"configure: unknown settings {unknown}; CommConfig has "
                                   f"{[f.name for f in dataclasses.fields(CommConfig)]}")
    WORLD.config = dataclasses.replace(WORLD.config, **fields)
    return WORLD.config


def which_algorithm(collective: str, tensor: torch.Tensor, op=None, group=None, *,
                    algorithm: Optional[str] = None) -> str:
    """The algorithm a call of ``collective`` on ``tensor`` would use (without running it)."""
    from .reduce_op import op_name
    from .validate import choose_algorithm
    g = _group_or_world(group, "which_algorithm")
    name = None if op is None else op_name(op, collective=collective, rank=g.my_global_rank)
    nbytes = None if collective == "all_to_all" else tensor.numel() * tensor.element_size()  # as validate does
    return choose_algorithm(collective, g, tensor.dtype, name, nbytes, algorithm, "which_algorithm")[0]
