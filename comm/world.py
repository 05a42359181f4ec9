"""The world registry's public face: whether the default group exists, the groups made from it
(``new_group``, ``new_subgroups``), their destruction, and rank queries with torch.distributed's names.

The registry itself is ``group.WORLD`` (one per process); ``init_process_group`` (``process_group.py``)
puts the default group there, and every function here reads or adds to it (``World.add_group``).
"""
from __future__ import annotations

import datetime
import time
from typing import List, Optional

import torch
import torch.distributed as td

from . import c10d, flight, objects, staging, topology
from .api import barrier
from .bootstrap import setup_failure
from .errors import InvalidArgumentError, UnsupportedError
from .group import NON_GROUP_MEMBER, WORLD, Group
from .profiler import Profiler, merge_chrome_traces
from .transport import PeerFailure
from .validate import resolve_group


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return WORLD.default is not None


def group_timeout(timeout, what: str) -> datetime.timedelta:
    """A group's deadline: ``timeout`` (timedelta or seconds, > 0), else the configuration's default."""
    if timeout is None:
        return datetime.timedelta(seconds=WORLD.config.timeout_s)
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
        raise InvalidArgumentError(f"{what}: timeout must be a positive, finite datetime.timedelta or number of "
                                   f"seconds, got {timeout!r}")
    return timeout if isinstance(timeout, datetime.timedelta) else datetime.timedelta(seconds=seconds)


def offer_cuda_twin(group: Group, communicator, cuda_backend: str, backend_string: str) -> None:
    """Let ``group`` (of a "cpu:X,cuda:Y" world) move its CUDA tensors through a ``cuda_backend`` twin
    (``staging.offer_cuda_twin``; the members' GPUs exchanged with zerocomm's ``all_gather_object``)."""
    staging.offer_cuda_twin(group, communicator.store, objects.all_gather_object, cuda_backend, backend_string)


def _write_env_profiles() -> None:
    """Write the ZEROCOMM_PROFILE recorder's files for this rank (JSON summary, Chrome trace), and rank 0
    the trace merging every rank's (``PATH.trace.json``)."""
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
    barrier()
    if rank == 0:
        merge_chrome_traces(path, f"{path}.trace.json")


def destroy_process_group(group=None) -> None:
    """Destroy ``group``, or every group and the default one when ``group`` is None."""
    if group is None:
        _write_env_profiles()
        flight.dump()  # ZEROCOMM_FLIGHT_DUMP: every group's record, before the groups go
        flight.stop()  # its last head published, its thread ended
        c10d.release_torch_default()
        WORLD.reset()
        return
    g = getattr(group, "zerocomm_group", group)  # the handle new_group returned, or the group
    if isinstance(g, Group) and WORLD.groups.get(g.name) is g:
        flight.closing(g)  # its record written (ZEROCOMM_FLIGHT_DUMP), its last call still published
        g.close()
        WORLD.groups.pop(g.name, None)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization: bool = False,
              group_desc=None, device_id=None, sort_ranks: bool = True):
    """A group over the global ``ranks``. Every process of the world calls it, in the same order.

    Returns the group's torch ``ProcessGroup`` (``c10d.handle_of``: torch's DDP takes it) on members and
    ``NON_GROUP_MEMBER`` elsewhere.
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
    if backend is not None and str(backend).lower() not in (world.backend, world.backend_string):
        raise UnsupportedError(f"rank {world.my_global_rank}: new_group: backend {backend!r} differs from the default "
                               f"group's {world.backend!r}; zerocomm groups share the default group's backend")
    timeout = world.timeout if timeout is None else group_timeout(timeout, "new_group")
    WORLD.group_count += 1
    name = f"g{WORLD.group_count}"
    start = time.monotonic()
    try:
        communicator = world.communicator.split(members, name, deadline=start + world.timeout.total_seconds())
    except (TimeoutError, PeerFailure, RuntimeError, OSError) as error:  # a member that never came, or left
        raise setup_failure(error, f"rank {world.my_global_rank}: new_group({members})", world.timeout,
                             time.monotonic() - start, "not every member called it") from None
    if communicator is None:
        return NON_GROUP_MEMBER
    topology.inherit(communicator, world.communicator, members)
    group = WORLD.add_group(members, members.index(world.my_global_rank), communicator, timeout, world.backend, name)
    if world.twin_backend is not None:  # a subgroup of a CPU-and-CUDA world moves both, as its world does
        offer_cuda_twin(group, communicator, world.twin_backend, world.backend_string)
    return c10d.handle_of(group)


def group_or_world(group, what: str) -> Optional[Group]:
    """``group`` as a zerocomm ``Group`` (``None``: the default one; ``None`` returned for
    ``NON_GROUP_MEMBER``); raises ``NotInitializedError`` before init and ``InvalidArgumentError`` for
    anything that is not a group."""
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
    g = group_or_world(group, "get_rank")
    return -1 if g is None else g.rank


def get_world_size(group=None) -> int:
    """Number of processes in ``group``; -1 if this process is not a member."""
    g = group_or_world(group, "get_world_size")
    return -1 if g is None else g.size()


def get_backend(group=None) -> td.Backend:
    g = group_or_world(group, "get_backend")
    if g is None:
        raise InvalidArgumentError(f"rank {WORLD.default.my_global_rank}: get_backend: Invalid process group "
                                   "specified (this process is not a member of the group)")
    return td.Backend(g.backend_string)


def get_global_rank(group, group_rank: int) -> int:
    """The global rank of ``group``'s rank ``group_rank``."""
    g = group_or_world(group, "get_global_rank")
    if g is None or not 0 <= group_rank < g.size():
        raise InvalidArgumentError(f"get_global_rank: group rank {group_rank} is not in the group")
    return g.ranks[group_rank]


def get_group_rank(group, global_rank: int) -> int:
    """``global_rank``'s rank within ``group``."""
    g = group_or_world(group, "get_group_rank")
    if g is None or global_rank not in g.ranks:
        raise InvalidArgumentError(f"get_group_rank: global rank {global_rank} is not part of the group")
    return g.ranks.index(global_rank)


class _GroupNamespace:
    """``group.WORLD`` as in torch: the default group's torch ``ProcessGroup`` once initialized, else None."""

    @property
    def WORLD(self):  # noqa: N802  (torch's name)
        if WORLD.default is None:
            return None
        return c10d.handle_of(WORLD.default)


class _GroupMemberNamespace(_GroupNamespace):
    NON_GROUP_MEMBER = NON_GROUP_MEMBER


group = _GroupNamespace()
GroupMember = _GroupMemberNamespace()


# -- subgroups ---------------------------------------------------------------------------------------


def new_subgroups(group_size=None, group=None, timeout=None, backend=None, pg_options=None, group_desc=None):
    """Split ``group`` (the default one if None) into consecutive subgroups of ``group_size`` ranks.

    Returns ``(this rank's subgroup, every subgroup)``; every process of the world calls it.
    """
    parent = resolve_group(group, "new_subgroups")
    if group_size is None:
        if not torch.cuda.is_available():
            raise ValueError("Default group size only takes effect when CUDA is available."
                             "If your subgroup using a backend that does not depend on CUDA,"
                             "please pass in 'group_size' correctly.")
        group_size = torch.cuda.device_count()
    if group_size <= 0:
        raise ValueError(f"The arg 'group_size' ({group_size}) must be positive")
    ranks = parent.ranks
    if group_size > len(ranks):
        raise ValueError(f"The arg 'group_size' ({group_size}) must not exceed the world size ({len(ranks)})")
    if len(ranks) % group_size != 0:
        raise ValueError(f"The world size ({len(ranks)}) must be divisible by 'group_size={group_size}'")
    lists = [ranks[start:start + group_size] for start in range(0, len(ranks), group_size)]
    return new_subgroups_by_enumeration(lists, timeout, backend, pg_options, group_desc)


def new_subgroups_by_enumeration(ranks_per_subgroup_list, timeout=None, backend=None, pg_options=None,
                                 group_desc=None):
    """One subgroup per list of global ranks; returns ``(this rank's subgroup or None, every subgroup)``.

    Every process of the world calls it with the same lists.  A rank may appear in one list only.
    """
    if ranks_per_subgroup_list is None or len(ranks_per_subgroup_list) == 0:
        raise ValueError("The arg 'ranks_per_subgroup_list' cannot be empty")
    me = WORLD.require("new_subgroups_by_enumeration").my_global_rank
    seen = {}
    current = None
    subgroups = []
    for index, ranks in enumerate(ranks_per_subgroup_list):
        for rank in ranks:
            if rank in seen:
                raise ValueError(f"Rank {rank} has appeared in both subgroup {ranks_per_subgroup_list[seen[rank]]} "
                                 f"and {list(ranks)}")
            seen[rank] = index
        subgroup = new_group(ranks=ranks, timeout=timeout, backend=backend, pg_options=pg_options,
                             group_desc=group_desc)
        subgroups.append(subgroup)
        if me in ranks:
            current = subgroup
    return current, subgroups
