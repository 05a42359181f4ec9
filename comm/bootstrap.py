"""How the ranks meet and the world's communicator is made: the backend ``init_process_group`` takes when given
none, torch's device maps ("cpu:gloo,cuda:nccl"), the rendezvous (``env://``, ``tcp://``, ``file://``, a store, or
the MPI launcher) and the typed errors of a rendezvous that fails.

Under torchrun (torch 2.x) the agent already serves the job's TCPStore on ``MASTER_PORT``
(``TORCHELASTIC_USE_AGENT_STORE``): every rank connects as a client, under a key prefix of its restart attempt.
The TCP store rank 0 opens for ``env://`` and ``tcp://`` listens on loopback only when ``MASTER_ADDR`` is a
loopback address (every rank on this machine), so a single-host run is not reachable from the network.
``init_process_group("mpi")`` in a process that no MPI launcher started raises, unless ``world_size=1`` asks
for a world of one.  What follows the rendezvous (learning the hosts, registering the world) is
``process_group.py``'s.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import time
import urllib.parse

import torch
import torch.distributed as td

from .backends import BACKENDS, STAND_INS, backend_class
from .errors import CommError, CommTimeoutError, InvalidArgumentError, PeerError, UnsupportedError


#: Variables an MPI launcher sets in every rank (MPICH/hydra, PMIx, Open MPI, Intel MPI).
MPI_LAUNCH_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID", "PMI_FD", "PMI_PORT")


def started_by_mpi_launcher() -> bool:
    """Whether an MPI launcher started this process (one of :data:`MPI_LAUNCH_VARS` is set)."""
    return any(key in os.environ for key in MPI_LAUNCH_VARS)


def _launched_by_mpi() -> bool:
    return "RANK" not in os.environ and started_by_mpi_launcher()


def default_backend() -> str:
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


def device_backends(backend: str) -> tuple:
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


def make_communicator(backend: str, init_method, timeout, world_size, rank, store, deadline: float):
    """The world's communicator of ``backend`` (one of ``backends.BACKENDS``), made by ``deadline``
    (``time.monotonic()`` seconds)."""
    if backend not in BACKENDS and backend not in STAND_INS:
        raise InvalidArgumentError(f"init_process_group: backend must be one of {tuple(BACKENDS)}, got {backend!r}")
    cls = backend_class(backend)
    if backend == "mpi":
        if not started_by_mpi_launcher() and world_size != 1:
            raise InvalidArgumentError(
                "init_process_group: backend 'mpi' in a process that no MPI launcher started (none of "
                f"{', '.join(MPI_LAUNCH_VARS)} is set): start the job with mpiexec -n N, or pass world_size=1 "
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
        raise init_failure(error, backend, rank, timeout, time.monotonic() + timeout.total_seconds() - deadline)


def setup_failure(error: BaseException, where: str, timeout: datetime.timedelta, waited_s: float,
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


def init_failure(error: BaseException, backend: str, rank: int, timeout: datetime.timedelta,
                  waited_s: float) -> CommError:
    return setup_failure(error, f"rank {rank if rank >= 0 else '?'}: init_process_group({backend!r})", timeout,
                          waited_s, "not every rank joined the rendezvous")
