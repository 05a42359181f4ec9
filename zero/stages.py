"""What each ZeRO stage is: a row of choices, one per part of the optimizer.

``ZeroOptimizer`` (optimizer.py) is one wrapper built from three parts; a stage only says which
implementation of each part to build:

============  ====================  =====================  ====================  ===============
stage         gradients             reduction              parameters            optimizer state
============  ====================  =====================  ====================  ===============
0 data par.   ``FULL`` buffer       ``ALL_REDUCE``         ``REPLICATED``        full, on device
1             ``FULL`` buffer       ``REDUCE_SCATTER``     ``REPLICATED``        shard, on device
2             ``SHARD``, buffers    ``REDUCE_SCATTER``     ``REPLICATED``        shard, on device
              kept between steps
3             ``SHARD`` only        ``REDUCE_SCATTER``     ``SHARDED``           shard, on device
============  ====================  =====================  ====================  ===============

* gradients (gradients.py): ``FULL`` keeps one full-size gradient buffer between steps and reduces
  each bucket in place; ``SHARD`` fills a bucket buffer, reduces it into this rank's gradient shard
  and reuses it for the next bucket.  Stage 2 keeps those buffers (at most ``max_inflight_buckets``)
  from one step to the next, which spares its backward the page faults of memory freed and mapped
  again; stage 3, and any stage that offloads its optimizer state, frees them after each step, so
  between its steps only shards remain (``ZeroConfig.keep_bucket_buffers`` overrides either).
* reduction: ``ALL_REDUCE`` gives every rank the whole averaged bucket; ``REDUCE_SCATTER`` gives each
  rank only its chunk.  ``ZeroConfig.reduce_scatter = False`` turns stages 1 and 2 into
  ``ALL_REDUCE`` (DeepSpeed's schedule: all_reduce, then keep the chunk).  In every stage a backward
  that does not end a gradient-accumulation cycle reduces nothing: gradients accumulate locally
  until the boundary.
* parameters (replicated.py, sharded.py): ``REPLICATED`` keeps a full copy on every rank (when the
  optimizer state is sharded, each rank's updated chunks are all-gathered after the step);
  ``SHARDED`` keeps only this rank's shard and gathers each unit of modules around its use.
* optimizer state (optimizer_state.py, offload.py, offload_nvme.py): ``DEVICE`` keeps the float32
  masters and the optimizer's state on the parameters' device, ``HOST`` in host memory (the step runs
  on the CPU), ``DISK`` in files.  Any stage may take any of them: ``ZeroConfig.offload_optimizer``
  replaces the last column of the table.
* where stage 3's parameter shard lives (offload_param.py) is not a column: ``ZeroConfig.offload_param``
  picks the store ``SHARDED`` keeps its shard in (beside the model, in host memory, or in files).
"""
from __future__ import annotations

import dataclasses
import enum

from .config import ZeroConfig


class Stage(enum.IntEnum):
    """The ZeRO stages by what they shard (``ZeroConfig.stage`` holds the number)."""

    DATA_PARALLEL = 0
    OPTIMIZER_STATE = 1
    GRADIENTS = 2
    PARAMETERS = 3


class Reduction(enum.Enum):
    """The collective that averages a filled gradient bucket across ranks."""

    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"


class GradientPlacement(enum.Enum):
    """What gradient memory a rank keeps between the end of backward and the step."""

    FULL = "full"
    """One persistent buffer of every bucket (bucket views of it)."""
    SHARD = "shard"
    """This rank's reduced gradient shard; bucket buffers live only while they are reduced."""


class ParameterPlacement(enum.Enum):
    """Where a rank's copy of the model's parameters lives."""

    REPLICATED = "replicated"
    SHARDED = "sharded"


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
    gradients: GradientPlacement
    parameters: ParameterPlacement
    optimizer_state: StatePlacement = StatePlacement.DEVICE
    keep_bucket_buffers: bool = False
    """``SHARD`` gradients: keep the bucket buffers from one step to the next (False: free them after each step)."""


STAGES: dict[Stage, StagePlan] = {
    Stage.DATA_PARALLEL: StagePlan(stage=Stage.DATA_PARALLEL, shard_optimizer_state=False,
                                   reduction=Reduction.ALL_REDUCE, gradients=GradientPlacement.FULL,
                                   parameters=ParameterPlacement.REPLICATED),
    Stage.OPTIMIZER_STATE: StagePlan(stage=Stage.OPTIMIZER_STATE, shard_optimizer_state=True,
                                     reduction=Reduction.REDUCE_SCATTER, gradients=GradientPlacement.FULL,
                                     parameters=ParameterPlacement.REPLICATED),
    Stage.GRADIENTS: StagePlan(stage=Stage.GRADIENTS, shard_optimizer_state=True,
                               reduction=Reduction.REDUCE_SCATTER, gradients=GradientPlacement.SHARD,
                               parameters=ParameterPlacement.REPLICATED, keep_bucket_buffers=True),
    Stage.PARAMETERS: StagePlan(stage=Stage.PARAMETERS, shard_optimizer_state=True,
                                reduction=Reduction.REDUCE_SCATTER, gradients=GradientPlacement.SHARD,
                                parameters=ParameterPlacement.SHARDED),
}


_OFFLOAD = {"none": StatePlacement.DEVICE, "cpu": StatePlacement.HOST, "nvme": StatePlacement.DISK}


def plan_for(config: ZeroConfig) -> StagePlan:
    """The stage's row, with ``reduce_scatter = False`` applied (stages 1 and 2 only: stage 3's
    gradients reach no rank in full, so it always reduce-scatters), ``offload_optimizer`` as its
    optimizer-state placement (an offload also frees the bucket buffers after each step: it is chosen
    to save memory) and ``keep_bucket_buffers`` where it is set."""
    plan = STAGES[Stage(config.stage)]
    if config.offload_optimizer != "none":
        plan = dataclasses.replace(plan, optimizer_state=_OFFLOAD[config.offload_optimizer], keep_bucket_buffers=False)
    if config.keep_bucket_buffers is not None and plan.gradients is GradientPlacement.SHARD:
        plan = dataclasses.replace(plan, keep_bucket_buffers=config.keep_bucket_buffers)
    if not config.reduce_scatter and plan.stage in (Stage.OPTIMIZER_STATE, Stage.GRADIENTS):
        plan = dataclasses.replace(plan, reduction=Reduction.ALL_REDUCE)
    return plan
