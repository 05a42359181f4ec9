"""Ray Train on zerocomm: ``TorchTrainer(..., torch_config=ZerocommConfig())``.

    from ray.train.torch import TorchTrainer
    from zerocomm.integrations.ray import ZerocommConfig

    trainer = TorchTrainer(train_loop, torch_config=ZerocommConfig(),
                           scaling_config=ray.train.ScalingConfig(num_workers=4))

Ray's own ``TorchConfig`` makes every worker call ``torch.distributed.init_process_group``.  With
:class:`ZerocommConfig` every worker calls ``zerocomm.comm.init_process_group`` instead, meeting at an address
and free port of worker 0's node as Ray's does.  That makes zerocomm's world (``zerocomm.zero.initialize``
and ``zerocomm.comm``'s collectives need it) and makes torch's default group stand for it (its backend is then
``"zerocomm"``), so ``DistributedDataParallel``, FSDP2 and ``ray.train.torch.prepare_model`` in the training
loop run on zerocomm as well.  When the run ends (or fails) every worker calls
``zerocomm.comm.destroy_process_group``, which ends both.

Workers see the variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) before they join, as under Ray's ``TorchConfig``; the NCCL
backend takes its GPU from ``LOCAL_RANK``.  Other ``ZEROCOMM_*`` settings are read in each worker, so set them
through Ray's ``runtime_env={"env_vars": {...}}``.

Only this module imports Ray; ``import zerocomm`` never does.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import socket
from typing import List, Optional, Tuple

import ray
from ray.exceptions import GetTimeoutError
from ray.train.backend import Backend
from ray.train.torch import TorchConfig

import zerocomm.comm as dist

__all__ = ["ZerocommConfig"]

logger = logging.getLogger(__name__)

#: zerocomm backends a Ray worker can start (``"mpi"`` needs an MPI launcher, which Ray is not); the last is one
#: world for CPU and CUDA tensors, as torch's default on GPU machines.
BACKENDS = ("gloo", "nccl", "cpu:gloo,cuda:nccl")
#: How long the driver waits for the workers' ``destroy_process_group`` (Ray's own default for torch's).
SHUTDOWN_TIMEOUT_S = 30.0


@dataclasses.dataclass
class ZerocommConfig(TorchConfig):
    """Ray Train's ``TorchConfig`` with zerocomm's world in every worker (see the module's docstring).

    The fields are ``TorchConfig``'s, read as zerocomm reads them."""

    backend: Optional[str] = None
    """zerocomm's backend of the world: "gloo" (CPU tensors), "nccl" (CUDA tensors) or "cpu:gloo,cuda:nccl"
    (both, each over its own transport, as torch's default on GPU machines).  None: ``TorchTrainer``
    picks "nccl" when ``ScalingConfig(use_gpu=True)``, else "gloo".  torch's default group is named
    ``"zerocomm"`` either way."""
    init_method: str = "env"
    """How the workers meet at worker 0's address and port: "env" (``MASTER_ADDR``/``MASTER_PORT``, ``env://``)
    or "tcp" (``tcp://address:port``)."""
    timeout_s: Optional[float] = None
    """Deadline in seconds of joining and of every collective (zerocomm's group timeout).  None: the
    worker's ``ZEROCOMM_TIMEOUT``, else 300 s (Ray's ``TorchConfig`` defaults to 1800 s)."""

    def __post_init__(self):
        if self.backend is not None and self.backend not in BACKENDS:
            raise dist.InvalidArgumentError(f"ZerocommConfig: backend must be one of {BACKENDS} or None, got "
                                            f"{self.backend!r}")
        if self.init_method not in ("env", "tcp"):
            raise dist.InvalidArgumentError(f"ZerocommConfig: init_method must be 'env' or 'tcp', got "
                                            f"{self.init_method!r}")
        timeout = self.timeout_s
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0 < timeout < float("inf")):
            raise dist.InvalidArgumentError(f"ZerocommConfig: timeout_s must be a positive finite number of "
                                            f"seconds or None, got {timeout!r}")

    @property
    def backend_cls(self):
        return _ZerocommBackend


class _ZerocommBackend(Backend):
    """Ray's hooks around a run: ``on_start`` joins every worker to zerocomm's world, ``on_shutdown`` leaves it."""

    share_cuda_visible_devices: bool = True  # as Ray's torch backend: NCCL needs the node's other GPUs in view

    def on_start(self, worker_group, backend_config: ZerocommConfig) -> None:
        if backend_config.backend not in BACKENDS:  # TorchTrainer fills None in; another trainer may not
            raise dist.InvalidArgumentError(f"ZerocommConfig: backend must be one of {BACKENDS} when the run "
                                            f"starts, got {backend_config.backend!r}")
        world_size = len(worker_group)
        address, port = worker_group.execute_single(0, _address_and_port)
        local = _local_ranks(worker_group.execute(_node_id))
        host = f"[{address}]" if ":" in address else address
        init_method = "env://" if backend_config.init_method == "env" else f"tcp://{host}:{port}"
        futures = [worker_group.execute_single_async(rank, _join_world, backend=backend_config.backend,
                                                     init_method=init_method, world_rank=rank, world_size=world_size,
                                                     local=local[rank], address=address, port=port,
                                                     timeout_s=backend_config.timeout_s)
                   for rank in range(world_size)]
        ray.get(futures)

    def on_shutdown(self, worker_group, backend_config: ZerocommConfig) -> None:
        futures = worker_group.execute_async(_leave_world)
        try:
            ray.get(futures, timeout=SHUTDOWN_TIMEOUT_S)
        except GetTimeoutError:  # Ray is ending the workers anyway; a raise here would hide the run's own error
            logger.warning("zerocomm: destroy_process_group did not finish on every Ray worker within %.0f s",
                           SHUTDOWN_TIMEOUT_S)


# -- run in the workers --------------------------------------------------------------------------------

def _address_and_port() -> Tuple[str, int]:
    """This node's address as Ray knows it, and a port free on it now (worker 0 serves the store there)."""
    address = ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return address, probe.getsockname()[1]


def _node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def _local_ranks(node_ids: List[str]) -> List[Tuple[int, int, int]]:
    """``(local rank, local world size, node rank)`` of each worker from the node each runs on: the workers
    of a node numbered in the group's order, the nodes in the order their first worker appears."""
    nodes = list(dict.fromkeys(node_ids))
    return [(node_ids[:rank].count(node), node_ids.count(node), nodes.index(node))
            for rank, node in enumerate(node_ids)]


def _join_world(*, backend: str, init_method: str, world_rank: int, world_size: int, local: Tuple[int, int, int],
                address: str, port: int, timeout_s: Optional[float]) -> None:
    """Set torchrun's variables, then join zerocomm's world (``"zerocomm"`` is registered with torch by the
    import of ``zerocomm.comm`` above).  Every worker of the group calls it once.  ``world_rank``: this worker's
    index in Ray's worker group (Ray's world rank; the keyword ``rank`` is taken by Ray's ``execute_single``)."""
    local_rank, local_world_size, node_rank = local
    os.environ.update(RANK=str(world_rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank),
                      LOCAL_WORLD_SIZE=str(local_world_size), NODE_RANK=str(node_rank), MASTER_ADDR=address,
                      MASTER_PORT=str(port))
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, init_method=init_method, rank=world_rank, world_size=world_size,
                            timeout=timeout)


def _leave_world() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
