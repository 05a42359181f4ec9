"""Initialization, groups and rank queries, with torch.distributed's names and defaults.

Backends: ``gloo`` (CPU, torch's gloo; rendezvous through torch's ``init_method``
or ``store``), ``mpi`` (CPU, mpi4py; ranks from the MPI launcher) and ``nccl``
(CUDA); torch's device maps ``"cpu:gloo,cuda:nccl"`` make one world of both.  ``backend=None`` takes
``mpi`` when the process was started by an MPI launcher without torch's ``RANK`` variable, else
``"cpu:gloo,cuda:nccl"`` where every local rank has a GPU of its own, else ``gloo``.

Rendezvous as torch's: ``env://`` (the default), ``tcp://``, ``file://``, a ``store``, or the MPI
launcher.  Under torchrun (torch 2.x) the agent already serves the job's TCPStore on
``MASTER_PORT`` (``TORCHELASTIC_USE_AGENT_STORE``): every rank connects as a client, under a key
prefix of its restart attempt.  After init, torch's own default group stands for zerocomm's
world (``c10d.make_torch_default``), so torch's API and the libraries on it see the same ranks.
Under ``srun`` without torchrun, ``env://`` takes torch's variables left unset from Slurm's (``comm.slurm``).

Init has a deadline like every other blocking call (``timeout``, else ``ZEROCOMM_TIMEOUT``,
else five minutes): a rank that never joins makes the others raise ``CommTimeoutError``
naming the rendezvous; a store that cannot be reached raises ``PeerError``.  The TCP store
rank 0 opens for ``env://`` and ``tcp://`` listens on loopback only when ``MASTER_ADDR`` is a
loopback address (every rank on this machine), so a single-host run is not reachable from
the network.  ``init_process_group("mpi")`` in a process that no MPI launcher started
raises, unless ``world_size=1`` asks for a world of one.
"""
from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
import socket
import sys
import time
import urllib.parse
from typing import List, Optional

import torch
import torch.distributed as td

from . import flight, slurm
from .backends import BACKENDS, STAND_INS, backend_class
from .config import CommConfig
from .errors import CommError, CommTimeoutError, InvalidArgumentError, PeerError, UnsupportedError
from .group import NON_GROUP_MEMBER, WORLD, Group
from .transport import USER_TAG_LIMIT, PeerFailure

#: Variables an MPI launcher sets in every rank (MPICH/hydra, PMIx, Open MPI, Intel MPI).
_MPI_LAUNCH_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID", "PMI_FD", "PMI_PORT")

def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return WORLD.default is not None


def _started_by_mpi_launcher() -> bool:
    return any(key in os.environ for key in _MPI_LAUNCH_VARS)


def _launched_by_mpi() -> bool:
    return "RANK" not in os.environ and _started_by_mpi_launcher()


def _default_backend() -> str:
    """The backend of ``init_process_group()`` without one: "mpi" under an MPI launcher (no torch ``RANK``);
    else "cpu:gloo,cuda:nccl" (torch's default there: one world, CPU tensors over gloo, CUDA tensors over NCCL)
    where CUDA gives every local rank a GPU of its own, else "gloo".
    Several local ranks sharing one GPU take gloo, as NCCL refuses two ranks on one device."""
    if _launched_by_mpi():
        return "mpi"
    if torch.cuda.is_available():
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        if torch.cuda.device_count() >= local_ranks:
            return CPU_AND_CUDA
    return "gloo"


#: torch's default where every local rank has a GPU: one world, CPU tensors over gloo, CUDA tensors over NCCL.
CPU_AND_CUDA = "cpu:gloo,cuda:nccl"
#: What each device's half of a ``"cpu:X,cuda:Y"`` world may be: the world is the CPU half's; its CUDA tensors
#: go to an NCCL twin of each group (``staging.offer_nccl``; "nccl-standin" tests that on a machine without a
#: GPU), or with "gloo" are staged through host memory.
_DEVICE_HALVES = {"cpu": ("gloo",), "cuda": ("nccl", "nccl-standin", "gloo")}


def _device_backends(backend: str) -> tuple:
    """``(the world's backend, its CUDA twin's or None)`` for a backend string as torch takes it: a name
    ("gloo"), or devices mapped to names ("cpu:gloo,cuda:nccl", "cuda:nccl", "cpu:gloo")."""
    if ":" not in backend:
        return backend, None
    halves = {}
    for part in backend.split(","):
        device, _, name = part.strip().partition(":")
        if device not in _DEVICE_HALVES or name not in _DEVICE_HALVES[device] or device in halves:
            raise InvalidArgumentError(
                f"init_process_group: backend {backend!r}: expected 'device:backend' pairs with device in "
                f"{tuple(_DEVICE_HALVES)} and backend one of {_DEVICE_HALVES}, each device once; got {part!r}")
        halves[device] = name
    if "cpu" not in halves:
        return halves["cuda"], None  # "cuda:nccl": NCCL alone, as torch's
    cuda = halves.get("cuda")
    return halves["cpu"], None if cuda in (None, "gloo") else cuda


def _group_timeout(timeout, what: str) -> datetime.timedelta:
    """A group's deadline: ``timeout`` (timedelta or seconds, > 0), else the configuration's default."""
    if timeout is None:
        return datetime.timedelta(seconds=WORLD.config.timeout_s)
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
        raise InvalidArgumentError(f"{what}: timeout must be a positive, finite datetime.timedelta or number of "
                                   f"seconds, got {timeout!r}")
    return timeout if isinstance(timeout, datetime.timedelta) else datetime.timedelta(seconds=seconds)


def _tcp_store(host: str, port: int, rank: int, world_size: int, timeout: datetime.timedelta):
    """torch's TCPStore.  When ``host`` is a loopback address (every rank on this machine), rank 0's server
    listens on loopback only; torch's own would listen on every interface.  Any other ``host`` keeps torch's
    behaviour: a host name may resolve differently here (``127.0.1.1`` in ``/etc/hosts``) than on the peers."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    if rank != 0 or not ipaddress.ip_address(address[0]).is_loopback:
        return td.TCPStore(host, port, world_size, rank == 0, timeout)
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(address)
        listener.listen(max(128, world_size))
    except BaseException:
        listener.close()
        raise
    # The store's server takes the descriptor over: detach it, so that Python never closes it.
    return td.TCPStore(host, port, world_size, True, timeout, master_listen_fd=listener.detach())


def _launched_by_torchelastic_agent() -> bool:
    """Whether torchrun's agent hosts the job's TCPStore on ``MASTER_ADDR:MASTER_PORT`` (torch 2.x's default):
    then every rank, rank 0 included, connects to it as a client."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _agent_store(host: str, port: int, world_size: int, timeout: datetime.timedelta):
    """A client of torchrun's agent store, its keys under this restart attempt's prefix: the agent's store
    outlives a worker group, so a restarted group must not read the keys its predecessor left."""
    client = td.TCPStore(host, port, world_size, False, timeout)
    return td.PrefixStore(f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", client)


def _rendezvous(init_method: str, rank: int, world_size: int, timeout: datetime.timedelta):
    """``(store, rank, world_size)`` for ``init_method``: env:// and tcp:// through :func:`_tcp_store` (or, under
    torchrun, the agent's store), the rest (file://) through torch's rendezvous."""
    url = urllib.parse.urlparse(init_method)
    if url.scheme not in ("env", "tcp"):
        store, rank, world_size = next(td.rendezvous(init_method, rank, world_size, timeout=timeout))
        return store, rank, world_size
    query = dict(urllib.parse.parse_qsl(url.query))
    if url.scheme == "env":
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            raise InvalidArgumentError(f"init_process_group: init_method env:// needs the environment variables "
                                       f"MASTER_ADDR and MASTER_PORT; {', '.join(missing)} not set")
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        rank = rank if rank >= 0 else int(os.environ.get("RANK", -1))
        world_size = world_size if world_size > 0 else int(os.environ.get("WORLD_SIZE", -1))
    else:
        host, port = url.hostname, url.port
        rank = rank if rank >= 0 else int(query.get("rank", -1))
        world_size = world_size if world_size > 0 else int(query.get("world_size", -1))
    if rank < 0 or world_size < 1 or not host or not port:
        raise InvalidArgumentError(f"init_process_group: {init_method!r} with rank {rank} and world_size "
                                   f"{world_size}: rank, world_size, a host and a port must be known (arguments, "
                                   "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or ?rank=&world_size= in the URL)")
    if url.scheme == "env" and _launched_by_torchelastic_agent():
        return _agent_store(host, port, world_size, timeout), rank, world_size
    return _tcp_store(host, port, rank, world_size, timeout), rank, world_size


def _make_communicator(backend: str, init_method, timeout, world_size, rank, store, deadline: float):
    """The world's communicator of ``backend`` (one of ``backends.BACKENDS``), made by ``deadline``
    (``time.monotonic()`` seconds)."""
    if backend not in BACKENDS and backend not in STAND_INS:
        raise InvalidArgumentError(f"init_process_group: backend must be one of {tuple(BACKENDS)}, got {backend!r}")
    cls = backend_class(backend)
    if backend == "mpi":
        if not _started_by_mpi_launcher() and world_size != 1:
            raise InvalidArgumentError(
                "init_process_group: backend 'mpi' in a process that no MPI launcher started (none of "
                f"{', '.join(_MPI_LAUNCH_VARS)} is set): start the job with mpiexec -n N, or pass world_size=1 "
                "to run a world of one on purpose")
        from .backends.mpi import mpi_available
        from .backends.mpi_start import init_mpi_within
        init_mpi_within(timeout.total_seconds())  # a rank that never starts: CommTimeoutError, not a hang
        reason = mpi_available()
        if reason:
            raise UnsupportedError(f"init_process_group: backend 'mpi' is unavailable: {reason}")
        return cls.world()
    if backend == "nccl":
        return cls.create(init_method, timeout, world_size, rank, store)
    if store is None:
        store, rank, world_size = _rendezvous(init_method or "env://", rank, world_size, timeout)
        store.set_timeout(timeout)
    elif rank < 0 or world_size < 1:
        raise InvalidArgumentError(f"init_process_group: with a store, rank ({rank}) and world_size "
                                   f"({world_size}) must be given")
    try:
        return cls(td.PrefixStore("zerocomm/world/", store), rank, world_size, timeout, deadline=deadline)
    except (RuntimeError, OSError, td.DistError) as error:  # the rank is known here: the error names it
        raise _init_failure(error, backend, rank, timeout, time.monotonic() + timeout.total_seconds() - deadline)


def _setup_failure(error: BaseException, where: str, timeout: datetime.timedelta, waited_s: float,
                   missing: str) -> CommError:
    """A failure while ranks meet (torch's store and connections, MPI's waits) as zerocomm's type: a timeout,
    saying ``missing``, or an unreachable peer or store.  ``where`` is "rank R: the call"."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    # gloo says "timed out connecting: ... Connection refused" after a few quick retries: a peer's address
    # that nothing listens on (its host bound another interface) is unreachable, not late.
    timed_out = (isinstance(error, TimeoutError) or waited_s >= timeout.total_seconds()
                 or (("timeout" in text.lower() or "timed out" in text.lower()) and "refused" not in text.lower()))
    if timed_out:
        return CommTimeoutError(f"{where} timed out after {waited_s * 1000:.0f} ms (deadline "
                                f"{timeout.total_seconds() * 1000:.0f} ms): {missing} ({text})")
    return PeerError(f"{where} failed after {waited_s * 1000:.0f} ms: the store or a peer could not be reached "
                     f"({type(error).__name__}: {text})")


def _init_failure(error: BaseException, backend: str, rank: int, timeout: datetime.timedelta,
                  waited_s: float) -> CommError:
    return _setup_failure(error, f"rank {rank if rank >= 0 else '?'}: init_process_group({backend!r})", timeout,
                          waited_s, "not every rank joined the rendezvous")


def init_process_group(backend: Optional[str] = None, init_method: Optional[str] = None, timeout=None,
                       world_size: int = -1, rank: int = -1, store=None, group_name: str = "", pg_options=None,
                       device_id=None, _ranks=None) -> None:
    """Join the default group. Every process of the job calls it once."""
    if WORLD.default is not None:
        raise InvalidArgumentError("init_process_group: the default process group is already initialized; "
                                   "call destroy_process_group() first")
    if store is None and (init_method or "env://").startswith("env:"):
        slurm.fill_torch_env(backend)  # under srun: torch's RANK, MASTER_ADDR... from Slurm's, where unset
    backend = _default_backend() if backend is None else str(backend).lower()
    world_backend, cuda_backend = _device_backends(backend)
    config = CommConfig.from_env()  # before any rendezvous: a bad variable fails at once, naming itself
    timeout = (datetime.timedelta(seconds=config.timeout_s) if timeout is None
               else _group_timeout(timeout, "init_process_group"))
    start = time.monotonic()
    try:
        communicator = _make_communicator(world_backend, init_method, timeout, world_size, rank, store,
                                          start + timeout.total_seconds())
    except CommError:
        raise
    except (RuntimeError, OSError, td.DistError) as error:  # torch's store and gloo's connect: typed here
        raise _init_failure(error, backend, rank, timeout, time.monotonic() - start) from error
    if world_size > 0 and communicator.size != world_size:
        raise InvalidArgumentError(f"init_process_group: world_size {world_size} does not match the launcher's "
                                   f"{communicator.size}")
    WORLD.config = config
    if config.switch_interval_s > 0:
        sys.setswitchinterval(config.switch_interval_s)
    if communicator.device_type == "cpu" and communicator.size > 1:
        # Which host each rank is on, learnt once (selection offers "shm" only where all ranks share one).
        # Nothing else is in flight yet; the tag is the group's call 0 (its calls start at 1), from the
        # communicator's origin, so that no message of an earlier world matches it (MPI reuses contexts).
        from . import shm, topology
        tag, deadline = USER_TAG_LIMIT + communicator.tag_origin, start + timeout.total_seconds()
        try:
            topology.hosts(communicator, tag=tag, deadline=deadline)
            if topology.one_host(communicator):  # and whether they can share memory: before "auto" offers "shm"
                shm.probe_shared_memory(communicator, tag=tag, deadline=deadline)
        except (TimeoutError, PeerFailure) as error:  # a rank that left between connecting and this exchange
            communicator.close(abandon=True)
            raise _init_failure(error, backend, communicator.rank, timeout, time.monotonic() - start) from None
    WORLD.default = Group(list(range(communicator.size)), communicator.rank, communicator, timeout, world_backend,
                          "world")
    WORLD.groups["world"] = WORLD.default
    if cuda_backend is not None:  # one world for CPU and CUDA tensors, as torch's "cpu:gloo,cuda:nccl"
        _offer_cuda_twin(WORLD.default, communicator, cuda_backend, backend)
    store = getattr(communicator, "store", None)
    if config.torch_default_group:
        store = _make_torch_default(WORLD.default, communicator, timeout) or store
    # The flight recorder's heads go through the store the ranks met through (for MPI, the one served for
    # torch's default group; none where that is off: peers then say a rank's record is unavailable).
    flight.start(store, communicator.rank, communicator.size, WORLD.groups, world_backend)
    if WORLD.config.profile_path:
        from .profiler import Profiler
        WORLD.observers.append(Profiler())


def _offer_cuda_twin(group: Group, communicator, cuda_backend: str, backend_string: str) -> None:
    from . import objects, staging  # both sit above the groups this module makes: late imports
    staging.offer_cuda_twin(group, communicator.store, objects.all_gather_object, cuda_backend, backend_string)


def _make_torch_default(world: Group, communicator, timeout: datetime.timedelta):
    """torch's default group becomes ``world`` (``c10d.make_torch_default``), its store the world's: the one
    the ranks met through, or for MPI one served by rank 0.  Returns that store (``None`` where the program
    made torch's group itself)."""
    from . import c10d  # c10d imports the modules above this one: a late import
    if td.is_initialized():  # the program made torch's group itself and keeps it (before an MPI store is served)
        return None
    store = getattr(communicator, "store", None)
    if store is None:
        from . import topology
        from .backends.mpi_start import shared_store
        store = shared_store(communicator.comm, topology.one_host(communicator), timeout)
    try:
        c10d.make_torch_default(world, store)
    except (RuntimeError, OSError, td.DistError) as error:
        raise _init_failure(error, world.backend, world.rank, timeout, 0.0) from error
    return store


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
        flight.dump()  # ZEROCOMM_FLIGHT_DUMP: every group's record, before the groups go
        flight.stop()  # its last head published, its thread ended
        from . import c10d
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
    timeout = world.timeout if timeout is None else _group_timeout(timeout, "new_group")
    WORLD.group_count += 1
    name = f"g{WORLD.group_count}"
    start = time.monotonic()
    try:
        communicator = world.communicator.split(members, name, deadline=start + world.timeout.total_seconds())
    except (TimeoutError, PeerFailure, RuntimeError, OSError) as error:  # a member that never came, or left
        raise _setup_failure(error, f"rank {world.my_global_rank}: new_group({members})", world.timeout,
                             time.monotonic() - start, "not every member called it") from None
    if communicator is None:
        return NON_GROUP_MEMBER
    from . import topology
    topology.inherit(communicator, world.communicator, members)
    group = Group(members, members.index(world.my_global_rank), communicator, timeout, world.backend, name)
    WORLD.groups[name] = group
    if world.twin_backend is not None:  # a subgroup of a CPU-and-CUDA world moves both, as its world does
        _offer_cuda_twin(group, communicator, world.twin_backend, world.backend_string)
    from .c10d import handle_of  # c10d imports this module's users: a late import
    return handle_of(group)


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
    return td.Backend(g.backend_string)


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
    """``group.WORLD`` as in torch: the default group's torch ``ProcessGroup`` once initialized, else None."""

    @property
    def WORLD(self):  # noqa: N802  (torch's name)
        if WORLD.default is None:
            return None
        from .c10d import handle_of
        return handle_of(WORLD.default)


class _GroupMemberNamespace(_GroupNamespace):
    NON_GROUP_MEMBER = NON_GROUP_MEMBER


group = _GroupNamespace()
GroupMember = _GroupMemberNamespace()


def set_default_algorithm(algorithm: str) -> None:
    """Default ``algorithm=`` of this world's calls ("native", "ring", "tree",
    "recursive_doubling", "shm", "hierarchical", "auto").

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
    """The algorithm a call of ``collective`` on ``tensor`` would use (without running it); for "all_to_all", a
    call on ``tensor`` split evenly (with uneven splits, a call runs the table's choice for unbounded sizes)."""
    from .reduce_op import op_name
    from .validate import choose_algorithm
    g = _group_or_world(group, "which_algorithm")
    name = None if op is None else op_name(op, collective=collective, rank=g.my_global_rank)
    nbytes = tensor.numel() * tensor.element_size()
    return choose_algorithm(collective, g, tensor.dtype, name, nbytes, algorithm, "which_algorithm")[0]


# -- subgroups ---------------------------------------------------------------------------------------

def new_subgroups(group_size=None, group=None, timeout=None, backend=None, pg_options=None, group_desc=None):
    """Split ``group`` (the default one if None) into consecutive subgroups of ``group_size`` ranks.

    Returns ``(this rank's subgroup, every subgroup)``; every process of the world calls it.
    """
    from .validate import resolve_group
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
