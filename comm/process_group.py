"""``init_process_group``: joining the default group, with torch.distributed's names and defaults.

The ranks meet and the world's communicator is made (``bootstrap.py``: the default backend, torch's device
maps such as ``"cpu:gloo,cuda:nccl"``, ``env://``/``tcp://``/``file://``/a store/the MPI launcher); the ranks
learn which host each is on and whether they can share memory; the world's group enters the registry
(``group.WORLD``; the other groups and the rank queries are ``world.py``'s, the configuration ``settings.py``'s).
After init, torch's own default group stands for zerocomm's world (``c10d.make_torch_default``), so torch's API
and the libraries on it see the same ranks.  Under ``srun`` without torchrun, ``env://`` takes torch's
variables left unset from Slurm's (``comm.slurm``).

Init has a deadline like every other blocking call (``timeout``, else ``ZEROCOMM_TIMEOUT``,
else five minutes): a rank that never joins makes the others raise ``CommTimeoutError``
naming the rendezvous; a store that cannot be reached raises ``PeerError``.
"""
from __future__ import annotations

import datetime
import sys
import time
from typing import Optional

import torch.distributed as td

from . import c10d, flight, shm, slurm, topology
from .algorithms.ring import all_gather_ring
from .bootstrap import default_backend, device_backends, init_failure, make_communicator
from .config import CommConfig
from .errors import CommError, InvalidArgumentError
from .group import WORLD, Group
from .profiler import Profiler
from .transport import USER_TAG_LIMIT, PeerFailure
from .world import group_timeout, offer_cuda_twin


def init_process_group(backend: Optional[str] = None, init_method: Optional[str] = None, timeout=None,
                       world_size: int = -1, rank: int = -1, store=None, group_name: str = "", pg_options=None,
                       device_id=None, _ranks=None) -> None:
    """Join the default group. Every process of the job calls it once."""
    if WORLD.default is not None:
        raise InvalidArgumentError("init_process_group: the default process group is already initialized; "
                                   "call destroy_process_group() first")
    if store is None and (init_method or "env://").startswith("env:"):
        slurm.fill_torch_env(backend)  # under srun: torch's RANK, MASTER_ADDR... from Slurm's, where unset
    backend = default_backend() if backend is None else str(backend).lower()
    world_backend, cuda_backend = device_backends(backend)
    config = CommConfig.from_env()  # before any rendezvous: a bad variable fails at once, naming itself
    timeout = (datetime.timedelta(seconds=config.timeout_s) if timeout is None
               else group_timeout(timeout, "init_process_group"))
    start = time.monotonic()
    try:
        communicator = make_communicator(world_backend, init_method, timeout, world_size, rank, store,
                                          start + timeout.total_seconds())
    except CommError:
        raise
    except (RuntimeError, OSError, td.DistError) as error:  # torch's store and gloo's connect: typed here
        raise init_failure(error, backend, rank, timeout, time.monotonic() - start) from error
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
        tag, deadline = USER_TAG_LIMIT + communicator.tag_origin, start + timeout.total_seconds()
        try:
            topology.hosts(communicator, tag=tag, deadline=deadline, all_gather=all_gather_ring)
            if topology.one_host(communicator):  # and whether they can share memory: before "auto" offers "shm"
                shm.probe_shared_memory(communicator, tag=tag, deadline=deadline)
        except (TimeoutError, PeerFailure) as error:  # a rank that left between connecting and this exchange
            communicator.close(abandon=True)
            raise init_failure(error, backend, communicator.rank, timeout, time.monotonic() - start) from None
    WORLD.default = WORLD.add_group(list(range(communicator.size)), communicator.rank, communicator, timeout,
                                    world_backend, "world")
    if cuda_backend is not None:  # one world for CPU and CUDA tensors, as torch's "cpu:gloo,cuda:nccl"
        offer_cuda_twin(WORLD.default, communicator, cuda_backend, backend)
    store = getattr(communicator, "store", None)
    if config.torch_default_group:
        store = _make_torch_default(WORLD.default, communicator, timeout) or store
    # The flight recorder's heads go through the store the ranks met through (for MPI, the one served for
    # torch's default group; none where that is off: peers then say a rank's record is unavailable).
    flight.start(store, communicator.rank, communicator.size, WORLD.groups, world_backend)
    if WORLD.config.profile_path:
        WORLD.observers.append(Profiler())


def _make_torch_default(world: Group, communicator, timeout: datetime.timedelta):
    """torch's default group becomes ``world`` (``c10d.make_torch_default``), its store the world's: the one
    the ranks met through, or for MPI one served by rank 0.  Returns that store (``None`` where the program
    made torch's group itself)."""
    if td.is_initialized():  # the program made torch's group itself and keeps it (before an MPI store is served)
        return None
    store = getattr(communicator, "store", None)
    if store is None:
        from .backends.mpi_start import shared_store  # MPI's modules: imported only for an MPI world
        store = shared_store(communicator.comm, topology.one_host(communicator), timeout)
    try:
        c10d.make_torch_default(world, store)
    except (RuntimeError, OSError, td.DistError) as error:
        raise init_failure(error, world.backend, world.rank, timeout, 0.0) from error
    return store
