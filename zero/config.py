"""ZeRO configuration: one frozen dataclass.

Sizes are element counts, as in DeepSpeed (``reduce_bucket_size: 5e8`` means 5e8 elements), so
the same number means the same thing at every precision.  ``ZeroConfig.from_deepspeed`` reads a
DeepSpeed config dict through deepspeed_config.py, which holds the table of every documented key.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional

from . import deepspeed_config
from .errors import ZeroConfigError
from .optim_factory import OptimizerConfig
from .schedulers import SchedulerConfig

PRECISIONS = ("fp32", "bf16", "fp16")
COMM_ALGORITHMS = ("native", "ring", "tree", "recursive_doubling", "shm", "hierarchical", "auto")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ZeroConfig:
    stage: int = 2
    """A ``Stage`` or its number.  0: data parallel (all_reduce of gradient buckets); 1: shard optimizer state;
    2: also shard gradients; 3: also shard parameters."""
    reduce_bucket_numel: int = 1 << 22
    """Elements per gradient bucket (a group of gradients reduced in one collective).  Parameters
    are never split across buckets, so a larger parameter makes a bucket of its own."""
    allgather_bucket_numel: int = 1 << 22
    """Elements per post-step all_gather of updated parameters: consecutive buckets are gathered
    together up to this size (through a staging buffer when more than one bucket is gathered)."""
    overlap_comm: bool = True
    """Launch each bucket's reduction from the backward hook that completes it (overlapping the
    rest of backward), and let the post-step all_gather overlap the next forward.  False: reduce
    everything at the end of backward and wait for the all_gather inside ``step``."""
    reduce_scatter: bool = True
    """Stages 1-2: reduce gradients with reduce_scatter (each rank receives only its shard: 2Φ
    traffic per step with the all_gather).  False: all_reduce then keep the shard (3Φ, DeepSpeed's
    default schedule)."""
    gradient_accumulation_steps: int = 1
    """Backward passes per optimizer step.  Gradients are reduced only in the last backward (the
    boundary) and averaged over the micro-steps, so the user does not divide the loss."""
    gradient_clipping: float = 0.0
    """Clip gradients to this global L2 norm (0: off).  The norm is computed in float64 from
    per-shard sums of squares, so it does not depend on how the gradients are sharded."""
    precision: str = "fp32"
    """"fp32", "bf16" or "fp16": dtype of the model's parameters, gradients and communication.
    The optimizer always runs on float32 master shards."""
    loss_scale: float = 0.0
    """fp16 only: a fixed loss scale, or 0 for dynamic loss scaling."""
    initial_scale_power: int = 16
    """fp16 dynamic scaling starts at 2**initial_scale_power."""
    loss_scale_window: int = 1000
    """fp16: steps without overflow before the scale doubles."""
    hysteresis: int = 2
    """fp16: overflows tolerated before the scale is halved (each overflow skips its step)."""
    min_loss_scale: float = 1.0
    """fp16: the dynamic scale never falls below this."""
    max_inflight_buckets: int = 2
    """Stages 2 and 3: at most this many full-size bucket buffers exist at once; a hook that needs
    another waits for the oldest reduction to finish (0: unbounded)."""
    keep_bucket_buffers: Optional[bool] = None
    """Stages 2 and 3: keep the bucket buffers (at most ``max_inflight_buckets`` buffers of the largest bucket)
    from one step to the next instead of freeing them after each step.  None: the stage's choice (stage 2 keeps
    them; stage 3, and a stage whose optimizer state is offloaded, frees them).  Keeping them costs their
    memory through forward; freeing them costs page faults in the next backward when the allocator has handed
    the memory back to the kernel (see docs/zero.md)."""
    shard_alignment: int = 16
    """Each rank's chunk of a bucket is a multiple of this many elements (buckets are zero-padded)."""
    algorithm: Optional[str] = None
    """Communication algorithm for every ZeRO collective ("native", "ring", "tree", "shm", "auto", ...); None
    uses the process default of zerocomm.comm.  With None or "auto" on a CPU group whose ranks all share one
    host, the collectives of a training step use "shm" (see ``shared_memory``)."""
    shared_memory: bool = True
    """When ``algorithm`` is None or "auto" (and no other process default was set), the group moves CPU tensors
    and every rank is on one host: run the step's collectives (bucket reductions, parameter gathers, the
    gradient norm) with the "shm" algorithm, which reads peers' buffers through shared memory instead of
    sending them over the backend.  False: leave the choice to zerocomm.comm's "auto" table."""
    wait_per_module: bool = True
    """Stages 1-2: each module waits, in its forward pre-hook, only for the post-step all_gather of the
    buckets holding its own parameters, so later buckets keep gathering while the first modules compute.
    False: wait for every bucket before the model's forward (for models that read another module's
    parameters before calling that module)."""
    stage3_prefetch_depth: int = 2
    """Stage 3: how many units ahead of the one computing are gathered (0: no prefetch), in forward and
    in backward."""
    stage3_prefetch_bucket_numel: int = 1 << 22
    """Stage 3: at most this many parameter elements are prefetched ahead of the unit that is computing."""
    stage3_param_persistence_threshold: int = 10_000
    """Stage 3: parameters with fewer elements stay gathered on every rank."""
    stage3_max_live_parameters: int = 1 << 27
    """Stage 3: prefetching stops while more than this many gathered parameter elements are live."""
    offload_optimizer: str = "none"
    """Where the float32 masters, the optimizer state and the optimizer step live: "none" (with the
    parameters), "cpu" (host memory; for CUDA models gradients stream to the host per bucket and updated
    parameters stream back; for CPU models the same as "none") or "nvme" (files under ``nvme_path``, read
    and written in pieces of ``offload_buffer_numel`` elements while the optimizer steps)."""
    offload_param: str = "none"
    """Where stage 3's parameter shards live between gathers: "none" (with the model), "cpu" (host memory beside
    a CUDA model, copied to the device for each gather; for CPU models the same as "none") or "nvme" (files under
    ``param_nvme_path``, each unit read a unit ahead of its gather and written by the optimizer's step; needs
    offload_optimizer "nvme").  Stages 0-2 keep every parameter for forward: there it changes nothing."""
    nvme_path: Optional[str] = None
    """offload_optimizer "nvme": the folder holding the state files (one subfolder per process, removed at exit)."""
    param_nvme_path: Optional[str] = None
    """offload_param "nvme": the folder holding the parameter files (default: ``nvme_path``)."""
    pin_memory: bool = True
    """offload_optimizer "cpu" with CUDA models: host buffers are page-locked, so copies run asynchronously."""
    offload_buffer_count: int = 4
    """offload_optimizer "nvme": pieces in memory at once (one stepping, the next being read, the rest being
    written); at least 2, for double buffering."""
    offload_buffer_numel: int = 1 << 20
    """offload_optimizer "nvme": elements per piece; memory for buffers is about ``offload_buffer_count`` x
    this x 4 bytes x the state tensors per element (Adam: 2, 3 with a separate master)."""
    consecutive_hysteresis: bool = False
    """fp16: refill the hysteresis after every step without overflow (DeepSpeed's consecutive_hysteresis)."""
    optimizer: Optional[OptimizerConfig] = None
    """The optimizer ``initialize`` builds when it is given no factory (DeepSpeed's ``optimizer`` section; a dict
    ``{"type": ..., "params": {...}}`` is read as one).  None: a factory must be passed."""
    scheduler: Optional[SchedulerConfig] = None
    """A learning-rate schedule stepped by ``optimizer.step()`` after each applied update (DeepSpeed's
    ``scheduler`` section; a dict is read as one)."""
    steps_per_print: Optional[int] = None
    """Log ``step=…, skipped=…, lr=…, mom=…`` on rank 0 every this many optimizer steps (skipped ones included),
    at INFO level on the ``zerocomm.zero`` logger, as DeepSpeed does.  None: never."""
    zero_quantized_weights: bool = False
    """Stage 3 (ZeRO++'s qwZ): the parameter all_gathers of forward and backward move int8 codes in blocks of
    ``quantization_block`` elements, each block with a float32 scale, instead of the compute dtype (about a
    quarter of fp32's bytes, half of bf16's).  A rank's own chunk stays exact; the float32 masters, the optimizer
    and checkpoints are unchanged, and gathers outside the step (``gathered_parameters``) and of the persistent
    unit stay exact.  Other stages ignore it, as DeepSpeed does."""
    zero_hpz_partition_size: int = 1
    """Stage 3 (ZeRO++'s hpZ): ranks per secondary partition (1: off).  Forward's gather of a unit also leaves
    each rank a secondary shard (1 / this of the unit, from the gathered values), and backward gathers the
    unit from the secondary shards of its partition only, so those gathers never leave the host.  Partitions
    are consecutive slices of each host's ranks (``zerocomm.comm.get_host_names``): the size must divide the
    ranks of every host.  Costs the secondary shards' memory, counted in ``model_state_bytes()["params"]``
    (alone: ``optimizer.parameters.gathers.secondary_bytes()``)."""
    zero_quantized_gradients: bool = False
    """Stages 2 and 3 (ZeRO++'s qgZ): each gradient bucket's reduce-scatter becomes two all_to_alls of codes of
    ``quantized_gradient_bits`` bits (stage 1 and ``reduce_scatter=False`` ignore it): inside each host first (each rank sums its host's share of the chunks it
    will send across), then across hosts between ranks of the same local index.  Bytes over the link: about
    ``bits / 32`` of an fp32 reduce-scatter's, divided again by the ranks per host."""
    quantized_gradient_bits: int = 4
    """``zero_quantized_gradients``: 4 (two codes per byte, as ZeRO++) or 8."""
    quantization_block: int = 256
    """Elements per quantization block (one float32 scale each) for ``zero_quantized_weights`` and
    ``zero_quantized_gradients``; even."""
    debug: bool = False
    """Stage 3: before each unit's gather and reduction, check that every rank is at the same unit
    and phase, and raise ``ZeroStateError`` naming both ranks at the first divergence (one small
    all_gather per check)."""

    def __post_init__(self) -> None:
        for name, cls in (("optimizer", OptimizerConfig), ("scheduler", SchedulerConfig)):
            value = getattr(self, name)
            if isinstance(value, Mapping):
                object.__setattr__(self, name, cls.from_dict(value))  # a DeepSpeed section, read once here
            elif value is not None and not isinstance(value, cls):
                raise ZeroConfigError(f"{name} must be a {cls.__name__}, a DeepSpeed {name} section or None, "
                                      f"got {value!r}")
        if self.steps_per_print is not None:
            _check_int("steps_per_print", self.steps_per_print, minimum=1)
        _check_choice("stage", self.stage, (0, 1, 2, 3))
        _check_choice("precision", self.precision, PRECISIONS)
        if self.algorithm is not None:
            _check_choice("algorithm", self.algorithm, COMM_ALGORITHMS)
        for name in ("reduce_bucket_numel", "allgather_bucket_numel", "gradient_accumulation_steps",
                     "shard_alignment", "loss_scale_window", "hysteresis", "stage3_prefetch_bucket_numel",
                     "stage3_max_live_parameters"):
            _check_int(name, getattr(self, name), minimum=1)
        for name in ("max_inflight_buckets", "initial_scale_power", "stage3_param_persistence_threshold",
                     "stage3_prefetch_depth"):
            _check_int(name, getattr(self, name), minimum=0)
        _check_choice("offload_optimizer", self.offload_optimizer, OFFLOAD_DEVICES)
        _check_choice("offload_param", self.offload_param, OFFLOAD_DEVICES)
        _check_int("offload_buffer_count", self.offload_buffer_count, minimum=2)
        _check_int("offload_buffer_numel", self.offload_buffer_numel, minimum=1)
        if self.offload_optimizer == "nvme" and not self.nvme_path:
            raise ZeroConfigError("offload_optimizer 'nvme' needs nvme_path (a folder for the state files)")
        for name in ("nvme_path", "param_nvme_path"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), (str, os.PathLike)):
                raise ZeroConfigError(f"{name} must be a path, got {getattr(self, name)!r}")
        if self.offload_param == "nvme" and self.stage == 3:
            if not (self.param_nvme_path or self.nvme_path):
                raise ZeroConfigError("offload_param 'nvme' needs param_nvme_path or nvme_path (a folder for the "
                                      "parameter files)")
            if self.offload_optimizer != "nvme":
                raise ZeroConfigError(
                    f"offload_param 'nvme' needs offload_optimizer 'nvme', got {self.offload_optimizer!r}: the "
                    f"optimizer steps the parameter shards piece by piece from their files (with the optimizer "
                    f"state in memory, each fp32 master would be a whole in-memory copy of its parameter shard)")
        for name in ("overlap_comm", "reduce_scatter", "debug", "wait_per_module", "pin_memory",
                     "consecutive_hysteresis", "shared_memory", "zero_quantized_weights", "zero_quantized_gradients"):
            if not isinstance(getattr(self, name), bool):
                raise ZeroConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
        _check_int("zero_hpz_partition_size", self.zero_hpz_partition_size, minimum=1)
        _check_choice("quantized_gradient_bits", self.quantized_gradient_bits, (4, 8))
        _check_int("quantization_block", self.quantization_block, minimum=2)
        if self.quantization_block % 2:
            raise ZeroConfigError(f"quantization_block must be even (int4 codes pack two per byte), got "
                                  f"{self.quantization_block}")
        if self.keep_bucket_buffers is not None and not isinstance(self.keep_bucket_buffers, bool):
            raise ZeroConfigError(f"keep_bucket_buffers must be None or a bool, got {self.keep_bucket_buffers!r}")
        for name in ("gradient_clipping", "loss_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ZeroConfigError(f"{name} must be a number >= 0, got {value!r}")
        if isinstance(self.min_loss_scale, bool) or not isinstance(self.min_loss_scale, (int, float)) \
                or self.min_loss_scale <= 0:
            raise ZeroConfigError(f"min_loss_scale must be a number > 0, got {self.min_loss_scale!r}")
        if self.precision != "fp16" and self.loss_scale:
            raise ZeroConfigError(f"loss_scale ({self.loss_scale}) applies to precision 'fp16' only, "
                                  f"got precision {self.precision!r}")

    @property
    def dynamic_loss_scale(self) -> bool:
        return self.precision == "fp16" and self.loss_scale == 0

    @property
    def offloads_optimizer(self) -> bool:
        return self.offload_optimizer != "none"

    @classmethod
    def from_deepspeed(cls, config: Mapping[str, Any], *, world_size: Optional[int] = None, model=None,
                       **overrides) -> "ZeroConfig":
        """Read a DeepSpeed config dict, whole or only its ``zero_optimization`` part (see deepspeed_config.py
        for what each documented key does); ``overrides`` set fields directly.

        ``world_size`` checks and derives the batch sizes as DeepSpeed does; ``model`` resolves ``"auto"``
        bucket sizes from its ``config.hidden_size``.  Raises ``ZeroConfigError`` naming a refused key.
        """
        fields = deepspeed_config.read(config, world_size=world_size, model=model)
        fields.update(overrides)
        try:
            return cls(**fields)
        except TypeError as error:  # an override that is not a field
            raise ZeroConfigError(str(error)) from None


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if isinstance(value, bool) or value not in choices:
        raise ZeroConfigError(f"{name} must be one of {choices}, got {value!r}")


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ZeroConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
