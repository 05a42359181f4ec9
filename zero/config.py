"""ZeRO configuration: one frozen dataclass, and the reader of DeepSpeed-style dicts.

Sizes are element counts, as in DeepSpeed (``reduce_bucket_size: 5e8`` means 5e8 elements), so
the same number means the same thing at every precision.  ``ZeroConfig.from_deepspeed`` accepts
the keys listed in ``DEEPSPEED_KEYS`` and raises ``ZeroConfigError`` naming any other key, rather
than ignoring a setting the user believes is in force.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from .errors import ZeroConfigError

PRECISIONS = ("fp32", "bf16", "fp16")
COMM_ALGORITHMS = ("native", "ring", "tree", "auto")


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
    shard_alignment: int = 16
    """Each rank's chunk of a bucket is a multiple of this many elements (buckets are zero-padded)."""
    algorithm: Optional[str] = None
    """Communication algorithm for every ZeRO collective ("native", "ring", "tree", "auto"); None
    uses the process default of zerocomm.comm."""
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
    debug: bool = False
    """Stage 3: before each unit's gather and reduction, check that every rank is at the same unit
    and phase, and raise ``ZeroStateError`` naming both ranks at the first divergence (one small
    all_gather per check)."""

    def __post_init__(self) -> None:
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
        for name in ("overlap_comm", "reduce_scatter", "debug", "wait_per_module"):
            if not isinstance(getattr(self, name), bool):
                raise ZeroConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
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

    @classmethod
    def from_deepspeed(cls, config: Mapping[str, Any], **overrides) -> "ZeroConfig":
        """Read a DeepSpeed-style dict (see ``DEEPSPEED_KEYS``); ``overrides`` set fields directly.

        Raises ``ZeroConfigError`` naming every key zerocomm does not support, and for settings
        zerocomm implements one way only (``contiguous_gradients: false``) or both fp16 and bf16.
        """
        if not isinstance(config, Mapping):
            raise ZeroConfigError(f"a DeepSpeed config must be a dict, got {type(config).__name__}")
        fields: dict[str, Any] = {}
        _reject_unknown(config, DEEPSPEED_KEYS[""], "")
        for key, field in _TOP_LEVEL.items():
            if key in config:
                fields[field] = _number(config[key], key)
        zero = config.get("zero_optimization", {})
        if not isinstance(zero, Mapping):
            raise ZeroConfigError(f"zero_optimization must be a dict, got {type(zero).__name__}")
        _reject_unknown(zero, DEEPSPEED_KEYS["zero_optimization"], "zero_optimization.")
        for key, field in _ZERO_KEYS.items():
            if key in zero:
                fields[field] = _number(zero[key], f"zero_optimization.{key}")
        for key, required in _FIXED_ZERO_KEYS.items():
            if key in zero and _number(zero[key], f"zero_optimization.{key}") is not required:
                raise ZeroConfigError(f"zero_optimization.{key} = {zero[key]!r} is not supported: zerocomm always "
                                      f"behaves as {key} = {required} (remove the key or set it to {required})")
        enabled = []
        for section in ("fp16", "bf16"):
            block = config.get(section, {})
            if not isinstance(block, Mapping):
                raise ZeroConfigError(f"{section} must be a dict, got {type(block).__name__}")
            _reject_unknown(block, DEEPSPEED_KEYS[section], f"{section}.")
            if _number(block.get("enabled", False), f"{section}.enabled"):
                enabled.append(section)
            elif section == "fp16" and set(block) - {"enabled"}:
                raise ZeroConfigError(f"fp16 settings {sorted(set(block) - {'enabled'})} given but fp16.enabled "
                                      f"is not true")
        if len(enabled) > 1:
            raise ZeroConfigError("fp16.enabled and bf16.enabled are both true; enable one of them")
        if enabled:
            fields["precision"] = enabled[0]
        if "fp16" in enabled:
            for key in DEEPSPEED_KEYS["fp16"] - {"enabled"}:
                if key in config["fp16"]:
                    fields[key] = _number(config["fp16"][key], f"fp16.{key}")
        fields.update(overrides)
        try:
            return cls(**fields)
        except TypeError as error:  # an override that is not a field
            raise ZeroConfigError(str(error)) from None


_TOP_LEVEL = {"gradient_accumulation_steps": "gradient_accumulation_steps",
              "gradient_clipping": "gradient_clipping"}
_ZERO_KEYS = {"stage": "stage", "reduce_bucket_size": "reduce_bucket_numel",
              "allgather_bucket_size": "allgather_bucket_numel", "overlap_comm": "overlap_comm",
              "reduce_scatter": "reduce_scatter", "stage3_prefetch_bucket_size": "stage3_prefetch_bucket_numel",
              "stage3_param_persistence_threshold": "stage3_param_persistence_threshold",
              "stage3_max_live_parameters": "stage3_max_live_parameters"}
#: DeepSpeed switches that zerocomm implements one way only: accepted when they ask for that way.
_FIXED_ZERO_KEYS = {"contiguous_gradients": True, "allgather_partitions": True}

#: Every key ``from_deepspeed`` reads, per section ("" is the top level).
DEEPSPEED_KEYS: dict[str, frozenset] = {
    "": frozenset({"zero_optimization", "gradient_accumulation_steps", "gradient_clipping", "fp16", "bf16"}),
    "zero_optimization": frozenset(_ZERO_KEYS) | frozenset(_FIXED_ZERO_KEYS),
    "fp16": frozenset({"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                       "min_loss_scale"}),
    "bf16": frozenset({"enabled"}),
}

_HINTS = {
    "optimizer": "pass an optimizer_factory to zerocomm.zero.initialize instead",
    "scheduler": "build a torch.optim.lr_scheduler on optimizer.optimizer instead",
    "train_batch_size": "zerocomm.zero does not load data; the batch size is the caller's",
    "train_micro_batch_size_per_gpu": "zerocomm.zero does not load data; the batch size is the caller's",
    "offload_optimizer": "CPU/NVMe offload is not implemented",
    "offload_param": "CPU/NVMe offload is not implemented",
}


def _reject_unknown(section: Mapping, allowed: frozenset, prefix: str) -> None:
    unknown = sorted(str(key) for key in section if key not in allowed)
    if unknown:
        hints = "; ".join(f"{prefix}{key}: {_HINTS[key]}" for key in unknown if key in _HINTS)
        raise ZeroConfigError(
            f"unsupported DeepSpeed key{'s' if len(unknown) > 1 else ''} {[prefix + k for k in unknown]}"
            f"{' (' + hints + ')' if hints else ''}; zerocomm reads only {sorted(prefix + k for k in allowed)}")


def _number(value: Any, key: str) -> Any:
    """DeepSpeed configs write sizes as floats (5e8) and may say "auto": normalize or refuse."""
    if isinstance(value, str):
        raise ZeroConfigError(f"{key} = {value!r}: zerocomm needs a concrete value (resolve 'auto' first)")
    if isinstance(value, float) and value.is_integer() and key.endswith(("_size", "stage", "_steps",
                                                                           "threshold", "parameters", "power",
                                                                           "window", "hysteresis")):
        return int(value)
    return value


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if isinstance(value, bool) or value not in choices:
        raise ZeroConfigError(f"{name} must be one of {choices}, got {value!r}")


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ZeroConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
