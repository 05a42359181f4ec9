"""What each ZeRO stage is: a row of choices, one per part of the optimizer, naming the classes that build them.

``ZeroOptimizer`` (optimizer.py) is one wrapper built from three parts (their interfaces: parts.py); a stage's
row says which implementation of each part to build:

============  =====================  =====================  ========================  ===============
stage         gradients              reduction              parameters                optimizer state
============  =====================  =====================  ========================  ===============
0 data par.   ``FullGradients``      ``ALL_REDUCE``         ``ReplicatedParameters``  full, on device
1             ``FullGradients``      ``REDUCE_SCATTER``     ``ReplicatedParameters``  shard, on device
2             ``ShardedGradients``,  ``REDUCE_SCATTER``     ``ReplicatedParameters``  shard, on device
              buffers kept between
              steps
3             ``ShardedGradients``   ``REDUCE_SCATTER``     ``ShardedParameters``     shard, on device
============  =====================  =====================  ========================  ===============

* gradients (gradients.py): ``FullGradients`` keeps one full-size gradient buffer between steps and reduces
  each bucket in place; ``ShardedGradients`` fills a bucket buffer, reduces it into this rank's gradient shard
  and reuses it for the next bucket.  Stage 2 keeps those buffers (at most ``max_inflight_buckets``)
  from one step to the next, which spares its backward the page faults of memory freed and mapped
  again; stage 3, and any stage that offloads its optimizer state, frees them after each step, so
  between its steps only shards remain (``ZeroConfig.keep_bucket_buffers`` overrides either).  Under
  ``zero_quantized_gradients`` the ``ShardedGradients`` row builds ZeRO++'s qgZ reduce-scatter (zeropp.py).
* reduction: ``ALL_REDUCE`` gives every rank the whole averaged bucket; ``REDUCE_SCATTER`` gives each
  rank only its chunk.  ``ZeroConfig.reduce_scatter = False`` turns stages 1 and 2 into
  ``ALL_REDUCE`` (DeepSpeed's schedule: all_reduce, then keep the chunk).  In every stage a backward
  that does not end a gradient-accumulation cycle reduces nothing: gradients accumulate locally
  until the boundary.
* parameters (replicated.py, sharded.py): ``ReplicatedParameters`` keeps a full copy on every rank (when the
  optimizer state is sharded, each rank's updated chunks are all-gathered after the step);
  ``ShardedParameters`` keeps only this rank's shard and gathers each unit of modules around its use.
* optimizer state (optimizer_state.py, offload.py, offload_nvme.py): ``DEVICE`` keeps the float32
  masters and the optimizer's state on the parameters' device, ``HOST`` in host memory (the step runs
  on the CPU), ``DISK`` in files; ``STATE_PARTS`` names the class that builds each.  Any stage may take any
  of them: ``ZeroConfig.offload_optimizer`` replaces the last column of the table.
* where stage 3's parameter shard lives (offload_param.py) is not a column: ``ZeroConfig.offload_param``
  picks the store ``ShardedParameters`` keeps its shard in (beside the model, in host memory, or in files).
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Optional, Sequence

import torch

from .config import ZeroConfig
from .gradients import FullGradients, ShardedGradients
from .offload import HostOptimizerState
from .offload_nvme import NvmeOptimizerState
from .optimizer_state import DeviceOptimizerState
from .parts import GradientsPart, OptimizerState, ParametersPart, ParamStore, Reduction, StateFactory
from .replicated import ReplicatedParameters
from .sharded import ShardedParameters


class Stage(enum.IntEnum):
    """The ZeRO stages by what they shard (``ZeroConfig.stage`` holds the number)."""

    DATA_PARALLEL = 0
    OPTIMIZER_STATE = 1
    GRADIENTS = 2
    PARAMETERS = 3


class StatePlacement(enum.Enum):
    """Where the float32 masters and the optimizer's state live."""

    DEVICE = "device"
    """On the parameters' device (CPU tensors on gloo/MPI, CUDA tensors on NCCL)."""
    HOST = "cpu"
    """In host memory, stepped by the CPU (``offload_optimizer: cpu``); for CPU models the same as ``DEVICE``."""
    DISK = "nvme"
    """In files under ``nvme_path``, read and written piece by piece around the step (``offload_optimizer: nvme``)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StagePlan:
    """One row of ``STAGES``: the parts a stage is made of."""

    stage: Stage
    shard_optimizer_state: bool
    """Whether each rank updates only its chunk of every bucket (False: the whole bucket)."""
    reduction: Reduction
    gradients: type[GradientsPart]
    """The class that builds the gradients part (``gradients.build(...)``)."""
    parameters: type[ParametersPart]
    """The class that plans the buckets and builds the parameters part (``parameters.plan(...)``, ``.build(...)``)."""
    optimizer_state: StatePlacement = StatePlacement.DEVICE
    """Where the optimizer state lives; ``STATE_PARTS[optimizer_state]`` builds it."""
    keep_bucket_buffers: bool = False
    """Gradients whose bucket buffers are ``transient_buffers``: keep them from one step to the next (False: free
    them after each step)."""


STAGES: dict[Stage, StagePlan] = {
    Stage.DATA_PARALLEL: StagePlan(stage=Stage.DATA_PARALLEL, shard_optimizer_state=False,
                                   reduction=Reduction.ALL_REDUCE, gradients=FullGradients,
                                   parameters=ReplicatedParameters),
    Stage.OPTIMIZER_STATE: StagePlan(stage=Stage.OPTIMIZER_STATE, shard_optimizer_state=True,
                                     reduction=Reduction.REDUCE_SCATTER, gradients=FullGradients,
                                     parameters=ReplicatedParameters),
    Stage.GRADIENTS: StagePlan(stage=Stage.GRADIENTS, shard_optimizer_state=True,
                               reduction=Reduction.REDUCE_SCATTER, gradients=ShardedGradients,
                               parameters=ReplicatedParameters, keep_bucket_buffers=True),
    Stage.PARAMETERS: StagePlan(stage=Stage.PARAMETERS, shard_optimizer_state=True,
                                reduction=Reduction.REDUCE_SCATTER, gradients=ShardedGradients,
                                parameters=ShardedParameters),
}

STATE_PARTS: dict[StatePlacement, StateFactory] = {
    StatePlacement.DEVICE: DeviceOptimizerState.build,
    StatePlacement.HOST: HostOptimizerState.build,  # for a CPU model the host is the device: DeviceOptimizerState
    StatePlacement.DISK: NvmeOptimizerState.build,
}
"""The class that builds the optimizer-state part of each placement (``OptimizerState.build``)."""


def build_optimizer_state(placement: StatePlacement, param_shards: Sequence[torch.Tensor],
                          full32: Optional[Sequence[torch.Tensor]], factory, rank: int, config: ZeroConfig, *,
                          device: Optional[torch.device] = None,
                          param_store: Optional[ParamStore] = None) -> OptimizerState:
    """The optimizer-state part for ``placement`` (``STATE_PARTS``; arguments: ``OptimizerState.build``)."""
    return STATE_PARTS[placement](param_shards, full32, factory, rank, config, device=device, param_store=param_store)


_OFFLOAD = {"none": StatePlacement.DEVICE, "cpu": StatePlacement.HOST, "nvme": StatePlacement.DISK}


def plan_for(config: ZeroConfig) -> StagePlan:
    """The stage's row, with ``reduce_scatter = False`` applied (stages 1 and 2 only: stage 3's
    gradients reach no rank in full, so it always reduce-scatters), ``offload_optimizer`` as its
    optimizer-state placement (an offload also frees the bucket buffers after each step: it is chosen
    to save memory) and ``keep_bucket_buffers`` where it is set."""
    plan = STAGES[Stage(config.stage)]
    if config.offload_optimizer != "none":
        plan = dataclasses.replace(plan, optimizer_state=_OFFLOAD[config.offload_optimizer], keep_bucket_buffers=False)
    if config.keep_bucket_buffers is not None and plan.gradients.transient_buffers:
        plan = dataclasses.replace(plan, keep_bucket_buffers=config.keep_bucket_buffers)
    if not config.reduce_scatter and plan.stage in (Stage.OPTIMIZER_STATE, Stage.GRADIENTS):
        plan = dataclasses.replace(plan, reduction=Reduction.ALL_REDUCE)
    return plan
