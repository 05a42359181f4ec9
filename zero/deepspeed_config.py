"""Reading DeepSpeed config dicts: the table of every key DeepSpeed documents, and what zerocomm does with it.

``KEYS`` is the one table.  Each documented key is

* ``HONOURED``: it sets a ``ZeroConfig`` field, with DeepSpeed's meaning;
* ``FIXED``: zerocomm works one way only; the key is accepted when it asks for that way and refused
  (naming the alternative) when it asks for another;
* ``IGNORED``: accepted with one logged line saying why nothing changes (a performance knob of DeepSpeed's
  own kernels, a logging switch);
* ``LOOP``: a training-loop key (batch sizes, data loading, seeding): zerocomm does not
  own the loop, so it only checks what can be checked (``train_batch_size`` against the micro-batch,
  the accumulation steps and the world size, as DeepSpeed does);
* ``REFUSED``: a key that would change results and is not implemented: refused naming the alternative.

A whole config or only its ``zero_optimization`` part may be passed.  ``"auto"`` values are resolved the
way DeepSpeed's Hugging Face integration resolves them where zerocomm knows the inputs (batch sizes from
the others and the world size; bucket sizes from the model's ``config.hidden_size``), and refused with
that explanation where only the Hugging Face Trainer's arguments could say (``gradient_clipping``,
``fp16.enabled``).  Numbers written as floats (``3e7``) are accepted wherever DeepSpeed takes an int.
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
import logging
from typing import Any, Mapping, Optional, Sequence

from .errors import ZeroConfigError

log = logging.getLogger("zerocomm.zero.config")


class Status(enum.Enum):
    HONOURED = "honoured"
    FIXED = "fixed"
    IGNORED = "ignored"
    LOOP = "training loop"
    REFUSED = "refused"


@dataclasses.dataclass(frozen=True, slots=True)
class Key:
    """One documented DeepSpeed key (``path`` dotted from the top level)."""

    path: str
    status: Status
    field: Optional[str] = None
    """HONOURED: the ``ZeroConfig`` field it sets."""
    why: str = ""
    """What zerocomm does with it (IGNORED/LOOP: why nothing changes; FIXED/REFUSED: the alternative)."""
    default: Any = None
    """DeepSpeed's default (FIXED: the only value accepted)."""
    kind: type = object
    """int, float, bool or str: the type DeepSpeed validates it as (floats like 3e7 pass as int)."""


H, F, I, L, R = Status.HONOURED, Status.FIXED, Status.IGNORED, Status.LOOP, Status.REFUSED
_KERNEL = "selects among DeepSpeed's own kernels or schedules; zerocomm's results and memory do not depend on it"
_PARAM_BUFFERS = ("offloaded parameter shards are read one unit at a time into a buffer of the unit's size (one "
                  "unit ahead of the gathers in flight), so there is no separate buffer pool to size")

_TABLE = [
    # -- batch and loop ----------------------------------------------------------------------------------
    Key("train_batch_size", L, why="checked: micro-batch x accumulation steps x world size", kind=int),
    Key("train_micro_batch_size_per_gpu", L, why="checked against train_batch_size; the caller loads the data",
        kind=int),
    Key("gradient_accumulation_steps", H, "gradient_accumulation_steps", default=1, kind=int),
    Key("managed_gradient_accumulation", F, why="zerocomm always counts micro-steps (step() is a no-op before the "
        "boundary)", default=True, kind=bool),
    Key("steps_per_print", H, "steps_per_print", why="step, skips, lr and momentum logged on rank 0 (the "
        "zerocomm.zero logger, INFO); unset: no progress lines, as in DeepSpeed's code", kind=int),
    Key("wall_clock_breakdown", L, why="time steps with zerocomm.comm.profile() instead", default=False, kind=bool),
    Key("dump_state", L, why="print(optimizer) instead", default=False, kind=bool),
    Key("optimizer", H, "optimizer", why="built by initialize when no optimizer factory is passed (Adam, AdamW, "
        "Adagrad, elementwise torch.optim classes)"),
    Key("scheduler", H, "scheduler", why="built by initialize and stepped after each applied update (WarmupLR, "
        "WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest, torch.optim.lr_scheduler classes)"),
    Key("gradient_clipping", H, "gradient_clipping", default=0.0, kind=float),
    Key("prescale_gradients", I, why="zerocomm averages with ReduceOp.AVG; dividing before or after the sum gives "
        "the same mean up to rounding", default=False, kind=bool),
    Key("gradient_predivide_factor", I, why="zerocomm averages with ReduceOp.AVG; splitting the division around "
        "the sum gives the same mean up to rounding", default=1.0, kind=float),
    Key("gradient_allreduce_op", F, why="gradients are averaged over ranks", default="mean", kind=str),
    Key("communication_data_type", F, why="gradients travel in the compute dtype (fp32/bf16/fp16)", default=None),
    Key("sparse_gradients", F, why="gradients are dense", default=False, kind=bool),
    Key("zero_allow_untested_optimizer", I, why="any elementwise torch optimizer is allowed", kind=bool),
    Key("zero_force_ds_cpu_optimizer", I, why="offloaded steps run torch's own CPU optimizer", kind=bool),
    Key("memory_breakdown", I, why="use optimizer.memory_report()", kind=bool),
    Key("disable_allgather", F, why="updated parameters are all-gathered", default=False, kind=bool),
    Key("dataloader_drop_last", L, why="the caller loads the data", kind=bool),
    Key("seed", L, why="seed torch yourself; ZeRO broadcasts rank 0's initial parameters", kind=int),
    Key("log_level", I, why="configure the zerocomm loggers with logging", kind=str),
    # -- whole sections that do not touch the math --------------------------------------------------------
    Key("aio", I, why="zerocomm's disk I/O uses threads over os.pread/os.pwrite; see offload_optimizer"),
    Key("tensorboard", I, why="monitoring is the caller's"),
    Key("wandb", I, why="monitoring is the caller's"),
    Key("csv_monitor", I, why="monitoring is the caller's"),
    Key("comet", I, why="monitoring is the caller's"),
    Key("monitor_config", I, why="monitoring is the caller's"),
    Key("flops_profiler", I, why="profile with zerocomm.comm.profile() or torch.profiler"),
    Key("comms_logger", I, why="count bytes with zerocomm.comm.count_bytes()"),
    Key("autotuning", I, why="zerocomm does not autotune"),
    Key("elasticity", I, why="checkpoints load at any world size instead"),
    Key("checkpoint", I, why="optimizer.save()/load() write zerocomm's own sharded format"),
    Key("hybrid_engine", I, why="an inference engine for generation; training is unaffected"),
    Key("activation_checkpointing", I, why="use torch.utils.checkpoint in the model"),
    Key("data_types", F, why="gradients accumulate in the compute dtype", default=None),
    # -- whole sections that would change results: accepted only when not enabled ---------------------------
    Key("amp", R, why="use bf16 or fp16 (zerocomm's mixed precision)"),
    Key("torch_autocast", R, why="use bf16 or fp16, or call torch.autocast in the model yourself"),
    Key("sparse_attention", R, why="not implemented; build the attention into the model"),
    Key("progressive_layer_drop", R, why="not implemented"),
    Key("curriculum_learning", R, why="not implemented; order the data yourself"),
    Key("data_efficiency", R, why="not implemented; sample the data yourself"),
    Key("compression_training", R, why="not implemented"),
    Key("eigenvalue", R, why="not implemented"),
    Key("pipeline", R, why="pipeline parallelism is not implemented"),
    # -- fp16 -----------------------------------------------------------------------------------------
    Key("fp16.enabled", H, "precision", default=False, kind=bool),
    Key("fp16.auto_cast", I, why="zerocomm always casts floating-point inputs to the compute dtype (a no-op for "
        "inputs already in fp16)", default=False, kind=bool),
    Key("fp16.loss_scale", H, "loss_scale", default=0.0, kind=float),
    Key("fp16.initial_scale_power", H, "initial_scale_power", default=16, kind=int),
    Key("fp16.loss_scale_window", H, "loss_scale_window", default=1000, kind=int),
    Key("fp16.hysteresis", H, "hysteresis", default=2, kind=int),
    Key("fp16.consecutive_hysteresis", H, "consecutive_hysteresis", default=False, kind=bool),
    Key("fp16.min_loss_scale", H, "min_loss_scale", default=1, kind=float),
    Key("fp16.fp16_master_weights_and_grads", F, why="masters and gradients are float32", default=False, kind=bool),
    # -- bf16 ("bfloat16" is DeepSpeed's older name of the section) ------------------------------------------
    Key("bf16.enabled", H, "precision", default=False, kind=bool),
    Key("bf16.immediate_grad_update", I, why=_KERNEL, default=False, kind=bool),
    Key("bf16.check_grad_overflow", I, why="bf16 has fp32's range; zerocomm checks overflow only under fp16",
        default=True, kind=bool),
    Key("bf16.check_overflow", I, why="bf16 has fp32's range; zerocomm checks overflow only under fp16",
        kind=bool),
    Key("bf16.bf16_master_weights_and_grads", F, why="masters and gradients are float32", default=False, kind=bool),
    Key("bf16.bf16_optimizer_states", F, why="optimizer state is float32", default=False, kind=bool),
    # -- zero_optimization ----------------------------------------------------------------------------
    Key("zero_optimization.stage", H, "stage", default=0, kind=int),
    Key("zero_optimization.contiguous_gradients", F, why="gradients are always copied into contiguous buckets",
        default=True, kind=bool),
    Key("zero_optimization.reduce_scatter", H, "reduce_scatter", default=True, kind=bool),
    Key("zero_optimization.reduce_bucket_size", H, "reduce_bucket_numel", why="absent: zerocomm's 4M elements",
        default=500_000_000, kind=int),
    Key("zero_optimization.use_multi_rank_bucket_allreduce", I, why=_KERNEL, default=True, kind=bool),
    Key("zero_optimization.allgather_partitions", F, why="updated chunks are all-gathered (no broadcasts)",
        default=True, kind=bool),
    Key("zero_optimization.allgather_bucket_size", H, "allgather_bucket_numel", why="absent: zerocomm's 4M elements",
        default=500_000_000, kind=int),
    Key("zero_optimization.overlap_comm", H, "overlap_comm", why="absent: zerocomm overlaps (DeepSpeed: only in "
        "stage 3); results are the same either way", kind=bool),
    Key("zero_optimization.load_from_fp32_weights", F, why="checkpoints always restore the float32 masters",
        default=True, kind=bool),
    Key("zero_optimization.elastic_checkpoint", I, why="zerocomm checkpoints load at any world size anyway",
        default=False, kind=bool),
    Key("zero_optimization.sub_group_size", H, "offload_buffer_numel", why="with NVMe offload, the most elements "
        "stepped at once (the smaller of it and offload_optimizer.buffer_size)", default=1_000_000_000, kind=int),
    Key("zero_optimization.cpu_offload", H, "offload_optimizer", default=False, kind=bool),
    Key("zero_optimization.cpu_offload_param", H, "offload_param", default=False, kind=bool),
    Key("zero_optimization.cpu_offload_use_pin_memory", H, "pin_memory", default=False, kind=bool),
    Key("zero_optimization.stage3_prefetch_bucket_size", H, "stage3_prefetch_bucket_numel", default=50_000_000,
        kind=int),
    Key("zero_optimization.prefetch_bucket_size", H, "stage3_prefetch_bucket_numel", kind=int),
    Key("zero_optimization.stage3_param_persistence_threshold", H, "stage3_param_persistence_threshold",
        default=100_000, kind=int),
    Key("zero_optimization.param_persistence_threshold", H, "stage3_param_persistence_threshold", kind=int),
    Key("zero_optimization.stage3_model_persistence_threshold", I, why="zerocomm bounds persistence per parameter "
        "(stage3_param_persistence_threshold) only", kind=int),
    Key("zero_optimization.stage3_max_live_parameters", H, "stage3_max_live_parameters", default=1_000_000_000,
        kind=int),
    Key("zero_optimization.max_live_parameters", H, "stage3_max_live_parameters", kind=int),
    Key("zero_optimization.stage3_max_reuse_distance", I, why="zerocomm releases a unit after each use and "
        "prefetches by recorded order (stage3_prefetch_bucket_size)", default=1_000_000_000, kind=int),
    Key("zero_optimization.stage3_gather_16bit_weights_on_model_save", I, why="use zerocomm.zero.consolidate() "
        "or optimizer.gathered_parameters() for a full state_dict", default=False, kind=bool),
    Key("zero_optimization.stage3_gather_fp16_weights_on_model_save", I, why="use zerocomm.zero.consolidate()",
        default=False, kind=bool),
    Key("zero_optimization.stage3_module_granularity_threshold", I, why="units are the children of "
        "ModuleList/Sequential containers (see zero/units.py)", default=0, kind=int),
    Key("zero_optimization.stage3_use_all_reduce_for_fetch_params", F, why="units are fetched with all_gather",
        default=False, kind=bool),
    Key("zero_optimization.stage3_allgather_sequential", I, why=_KERNEL, default=False, kind=bool),
    Key("zero_optimization.ignore_unused_parameters", F, why="parameters that get no gradient count as zero "
        "gradients", default=True, kind=bool),
    Key("zero_optimization.legacy_stage1", F, why="there is one stage 1", default=False, kind=bool),
    Key("zero_optimization.round_robin_gradients", I, why="a copy schedule for DeepSpeed's CPU offload; zerocomm "
        "copies each bucket's own shard", default=False, kind=bool),
    Key("zero_optimization.zero_hpz_partition_size", H, "zero_hpz_partition_size", why="ZeRO++ hpZ: backward "
        "gathers stage 3's units from a secondary partition inside the host", default=1, kind=int),
    Key("zero_optimization.zero_quantized_weights", H, "zero_quantized_weights", why="ZeRO++ qwZ: stage 3's "
        "parameter gathers move int8 blocks", default=False, kind=bool),
    Key("zero_optimization.zero_quantized_nontrainable_weights", F, why="ZeRO++ quantized weights are not "
        "implemented", default=False, kind=bool),
    Key("zero_optimization.zero_quantized_gradients", H, "zero_quantized_gradients", why="ZeRO++ qgZ: gradients "
        "are reduced by int4 all_to_alls, inside each host and then across", default=False, kind=bool),
    Key("zero_optimization.zeropp_loco_param", F, why="ZeRO++ LoCo is not implemented", default=None),
    Key("zero_optimization.mics_shard_size", F, why="MiCS is not implemented: pass a subgroup as group=",
        default=-1, kind=int),
    Key("zero_optimization.mics_hierarchical_params_gather", F, why="MiCS is not implemented", default=False,
        kind=bool),
    Key("zero_optimization.memory_efficient_linear", I, why="a DeepSpeed replacement of torch.nn.functional.linear "
        "that saves activation memory; zerocomm leaves the model's layers as they are", default=True, kind=bool),
    Key("zero_optimization.pipeline_loading_checkpoint", I, why=_KERNEL, default=False, kind=bool),
    Key("zero_optimization.override_module_apply", I, why="zerocomm does not patch Module.apply", default=True,
        kind=bool),
    Key("zero_optimization.log_trace_cache_warnings", I, why="zerocomm has no trace cache", default=False,
        kind=bool),
    Key("zero_optimization.enable_sanity_checks", H, "debug", why="stage 3 checks every rank is at the same unit",
        default=False, kind=bool),
    Key("zero_optimization.save_muon_momentum_buffer_in_memory", I, why="Muon is not built in; offloaded state "
        "is whatever the optimizer_factory's optimizer keeps", default=False, kind=bool),
    Key("zero_optimization.leaf_module", I, why="units are chosen by zero/units.py"),
    Key("zero_optimization.zenflow", R, why="ZenFlow (stale-gradient updates) is not implemented"),
    Key("zero_optimization.grad_hooks", F, why="gradients are reduced from backward hooks", default=True, kind=bool),
    # -- offload_optimizer / offload_param --------------------------------------------------------------
    Key("zero_optimization.offload_optimizer.device", H, "offload_optimizer", why="\"cpu\": masters, state and "
        "step in host memory (CPU models: as \"none\"); \"nvme\": state in files under nvme_path",
        default="none", kind=str),
    Key("zero_optimization.offload_optimizer.nvme_path", H, "nvme_path", kind=str),
    Key("zero_optimization.offload_optimizer.buffer_count", H, "offload_buffer_count", default=4, kind=int),
    Key("zero_optimization.offload_optimizer.buffer_size", H, "offload_buffer_numel", why="a zerocomm addition "
        "(DeepSpeed has it under offload_param only): elements per NVMe piece", kind=int),
    Key("zero_optimization.offload_optimizer.pin_memory", H, "pin_memory", default=True, kind=bool),
    Key("zero_optimization.offload_optimizer.pipeline_read", I, why="zerocomm always reads the next piece while "
        "the current one steps", default=False, kind=bool),
    Key("zero_optimization.offload_optimizer.pipeline_write", I, why="zerocomm always writes pieces behind the "
        "step", default=False, kind=bool),
    Key("zero_optimization.offload_optimizer.pipeline", I, why="zerocomm always pipelines reads and writes",
        kind=bool),
    Key("zero_optimization.offload_optimizer.fast_init", I, why="state files are created on the first step",
        default=False, kind=bool),
    Key("zero_optimization.offload_optimizer.ratio", F, why="partial offload is not implemented: the whole "
        "optimizer state is offloaded", default=1.0, kind=float),
    Key("zero_optimization.offload_optimizer.super_offload", I, why=_KERNEL, default=False, kind=bool),
    Key("zero_optimization.offload_optimizer.cpuadam_cores_perc", I, why="torch's CPU optimizer uses "
        "torch.get_num_threads() threads", default=0.8, kind=float),
    Key("zero_optimization.offload_param.device", H, "offload_param", why="stage 3: \"cpu\" keeps the parameter "
        "shards in host memory beside a CUDA model (CPU models: as \"none\"); \"nvme\" keeps them in files under "
        "nvme_path, read a unit ahead of each gather (needs offload_optimizer \"nvme\")", default="none", kind=str),
    Key("zero_optimization.offload_param.nvme_path", H, "param_nvme_path", kind=str),
    Key("zero_optimization.offload_param.buffer_count", I, why=_PARAM_BUFFERS, default=5, kind=int),
    Key("zero_optimization.offload_param.buffer_size", I, why=_PARAM_BUFFERS, default=100_000_000, kind=int),
    Key("zero_optimization.offload_param.max_in_cpu", I, why="with parameters in files only the units in flight "
        "are in memory", default=1_000_000_000, kind=int),
    Key("zero_optimization.offload_param.pin_memory", H, "pin_memory", default=True, kind=bool),
]

#: Every documented key by its dotted path.
KEYS: dict[str, Key] = {key.path: key for key in _TABLE}
SECTIONS = {"zero_optimization", "fp16", "bf16", "zero_optimization.offload_optimizer",
            "zero_optimization.offload_param"}
"""Keys that hold dicts read key by key (others, like ``optimizer``, are taken whole)."""
DEVICES = ("none", "cpu", "nvme")
_ALIASES = {"bfloat16": "bf16"}


def read(config: Mapping[str, Any], *, world_size: Optional[int] = None, model=None) -> dict[str, Any]:
    """``ZeroConfig`` fields from a DeepSpeed dict (whole, or only its ``zero_optimization`` part).

    ``world_size`` lets the batch sizes be checked and derived (``train_batch_size`` = micro-batch x
    accumulation steps x world size); ``model`` lets ``"auto"`` bucket sizes follow ``model.config.hidden_size``.
    Logs one line per ignored key; raises ``ZeroConfigError`` naming the key for a refused one.
    """
    if not isinstance(config, Mapping):
        raise ZeroConfigError(f"a DeepSpeed config must be a dict, got {type(config).__name__}")
    if config and not set(config) & _TOP and set(config) <= _ZERO:
        config = {"zero_optimization": config}  # only the zero_optimization part was passed
    flat = _flatten(config)
    fields: dict[str, Any] = {"stage": 0}  # DeepSpeed's default stage (no zero_optimization: data parallel)
    autos = {path for path, value in flat.items() if value == "auto"}
    for path, value in flat.items():
        key = KEYS[path]
        section = path.rsplit(".", 1)[0]
        if path in autos or (section in _OFFLOAD and key.field != section.rsplit(".", 1)[1]
                             and flat.get(section + ".device", "none") == "none"):
            continue  # "auto": resolved below; an offload section whose device is "none" means no offload
        if key.status is Status.HONOURED:
            _honour(key, value, fields)
        elif key.status is Status.FIXED:
            _check_fixed(key, value)
        elif key.status is Status.IGNORED:
            shown = "{...}" if isinstance(value, Mapping) else repr(value)
            log.warning("DeepSpeed key %s = %s ignored: %s", path, shown, key.why)
        elif key.status is Status.REFUSED:
            if not (isinstance(value, Mapping) and not value.get("enabled", False)):
                raise ZeroConfigError(f"DeepSpeed key {path} would change results and is not implemented: {key.why}")
            log.info("DeepSpeed key %s accepted: not enabled", path)
        elif path not in ("train_batch_size", "train_micro_batch_size_per_gpu"):
            log.info("DeepSpeed key %s accepted: %s", path, key.why)
    _resolve_autos(autos, fields, model)
    _precision(flat, fields)
    _batch_sizes(flat, fields, world_size)
    return fields


_OFFLOAD = ("zero_optimization.offload_optimizer", "zero_optimization.offload_param")
_TOP = {path for path in KEYS if "." not in path} | {"zero_optimization", "fp16", "bf16", "bfloat16"}
_ZERO = {path.split(".")[1] for path in KEYS if path.startswith("zero_optimization.")}


def _flatten(config: Mapping, prefix: str = "") -> dict[str, Any]:
    """Dotted path -> value for every key, descending into ``SECTIONS``; unknown keys are refused here."""
    out: dict[str, Any] = {}
    for raw, value in config.items():
        path = prefix + str(_ALIASES.get(raw, raw) if not prefix else raw)
        if path == "zero_optimization" and isinstance(value, bool):
            out["zero_optimization.stage"] = int(value)  # DeepSpeed's oldest form: true means stage 1
            continue
        if path in SECTIONS:
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ZeroConfigError(f"{path} must be a dict, got {type(value).__name__} {value!r}")
            out.update(_flatten(value, path + "."))
            continue
        if path not in KEYS:
            section = path.rsplit(".", 1)[0] + "." if "." in path else ""
            known = sorted(k[len(section):] for k in KEYS if k.startswith(section) and "." not in k[len(section):])
            raise ZeroConfigError(f"unknown DeepSpeed key {path!r} (DeepSpeed does not document it under "
                                  f"{section[:-1] or 'the top level'}); the keys there are {known}")
        out[path] = value
    return out


def _typed(key: Key, value: Any) -> Any:
    """``value`` as DeepSpeed validates ``key``: ints may be written as whole floats (5e8)."""
    if key.kind is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ZeroConfigError(f"DeepSpeed key {key.path} must be an integer, got {value!r}")
    elif key.kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ZeroConfigError(f"DeepSpeed key {key.path} must be a number, got {value!r}")
    elif key.kind is bool and not isinstance(value, bool):
        raise ZeroConfigError(f"DeepSpeed key {key.path} must be true or false, got {value!r}")
    elif key.kind is str and not isinstance(value, str):
        raise ZeroConfigError(f"DeepSpeed key {key.path} must be a string, got {value!r}")
    return value


def _honour(key: Key, value: Any, fields: dict) -> None:
    value = _typed(key, value)
    if key.path in ("fp16.enabled", "bf16.enabled"):
        return  # decided together by _precision
    if key.path in ("zero_optimization.cpu_offload", "zero_optimization.cpu_offload_param"):
        if value:  # DeepSpeed's older switches: the same as device "cpu"
            fields.setdefault(key.field, "cpu")
        return
    if key.field in ("offload_optimizer", "offload_param") and value not in DEVICES:
        raise ZeroConfigError(f"DeepSpeed key {key.path} must be one of {DEVICES}, got {value!r}")
    if key.field == "offload_buffer_numel":
        # sub_group_size and buffer_size both bound the elements stepped at once: the smaller one wins.
        value = min(value, fields.get(key.field, value))
    fields[key.field] = value


def _check_fixed(key: Key, value: Any) -> None:
    if value == key.default or (key.default is None and value in (None, {}, "fp32", "float32")):
        return
    raise ZeroConfigError(f"DeepSpeed key {key.path} = {value!r} is not supported: {key.why} (remove the key or set "
                          f"it to {key.default!r})")


def _resolve_autos(autos: set, fields: dict, model) -> None:
    """``"auto"`` as the Hugging Face integration fills it in, where zerocomm can know the inputs."""
    hidden = _hidden_size(model)
    formulas = {"zero_optimization.reduce_bucket_size": lambda h: h * h,
                "zero_optimization.stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
                "zero_optimization.stage3_param_persistence_threshold": lambda h: 10 * h}
    for path in sorted(autos):
        key = KEYS[path]
        if path in formulas:
            if hidden is None:
                log.warning("DeepSpeed key %s = 'auto': the model has no config.hidden_size to derive it from "
                            "(as the Hugging Face integration does); zerocomm's default is used", path)
            else:
                fields[key.field] = formulas[path](hidden)
        elif path in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
            continue  # derived from the others by _batch_sizes
        elif key.status in (Status.IGNORED, Status.LOOP) or path.startswith(("optimizer", "scheduler")):
            log.info("DeepSpeed key %s = 'auto' accepted: %s", path, key.why or "not read by zerocomm")
        else:
            raise ZeroConfigError(
                f"DeepSpeed key {path} = 'auto': the Hugging Face Trainer fills this in from its TrainingArguments "
                f"(e.g. max_grad_norm, --fp16/--bf16), which zerocomm does not have; write the value")


def _hidden_size(model) -> Optional[int]:
    config = getattr(model, "config", None)
    if config is None:
        return None
    if getattr(config, "hidden_size", None):
        return int(config.hidden_size)
    sizes = getattr(config, "hidden_sizes", None)
    return int(max(sizes)) if sizes else None


def _precision(flat: dict, fields: dict) -> None:
    enabled = [section for section in ("fp16", "bf16") if flat.get(f"{section}.enabled") is True]
    if len(enabled) > 1:
        raise ZeroConfigError("fp16.enabled and bf16.enabled are both true; enable one of them")
    if enabled:
        fields["precision"] = enabled[0]
    elif any(path.startswith("fp16.") and path != "fp16.enabled" for path in flat):
        for name in ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale",
                     "consecutive_hysteresis"):
            fields.pop(name, None)  # DeepSpeed reads these only when fp16 is enabled
        log.info("fp16 settings given but fp16.enabled is not true: they are not used")


def _batch_sizes(flat: dict, fields: dict, world_size: Optional[int]) -> None:
    """DeepSpeed's rule: train_batch_size = micro-batch x gradient_accumulation_steps x world size; any two
    give the third.  Unknown world size (no process group yet): only the accumulation steps are read."""
    batch = _concrete(flat, "train_batch_size")
    micro = _concrete(flat, "train_micro_batch_size_per_gpu")
    accum = fields.get("gradient_accumulation_steps")
    for name, value in (("train_batch_size", batch), ("train_micro_batch_size_per_gpu", micro),
                        ("gradient_accumulation_steps", accum)):
        if value is not None and value <= 0:
            raise ZeroConfigError(f"DeepSpeed key {name} must be > 0, got {value}")
    if world_size is None or batch is None:
        return
    if micro is not None and accum is not None:
        if batch != micro * accum * world_size:
            raise ZeroConfigError(
                f"train_batch_size ({batch}) must equal train_micro_batch_size_per_gpu ({micro}) x "
                f"gradient_accumulation_steps ({accum}) x world size ({world_size}) = {micro * accum * world_size}")
        return
    if micro is not None:
        accum, rest = divmod(batch, micro * world_size)
        if rest or not accum:
            raise ZeroConfigError(
                f"train_batch_size ({batch}) is not a multiple of train_micro_batch_size_per_gpu ({micro}) x world "
                f"size ({world_size}): no whole number of gradient_accumulation_steps gives it")
        fields["gradient_accumulation_steps"] = accum
        log.info("gradient_accumulation_steps = %d, from train_batch_size %d / (micro-batch %d x %d ranks)",
                 accum, batch, micro, world_size)
        return
    accum = accum or 1
    if batch % (accum * world_size):
        raise ZeroConfigError(f"train_batch_size ({batch}) is not a multiple of gradient_accumulation_steps "
                              f"({accum}) x world size ({world_size})")


def _concrete(flat: dict, path: str) -> Optional[int]:
    value = flat.get(path)
    if value is None or value == "auto":
        return None
    return _typed(KEYS[path], value)


def check_params(what: str, target, params: Mapping, *, skip: Sequence[str] = ()) -> None:
    """For the optimizer and scheduler sections: refuse ``"auto"`` values and keyword arguments ``target`` does
    not take, quoting them."""
    autos = sorted(key for key, value in params.items() if isinstance(value, str) and value == "auto")
    if autos:
        raise ZeroConfigError(f"{what}: params {autos} are 'auto', which the Hugging Face Trainer fills in from its "
                              f"TrainingArguments; zerocomm has no such arguments: write the values")
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        return
    accepted = [name for name in signature.parameters if name not in skip and name not in ("self", "params")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ZeroConfigError(f"{what}: unknown params {unknown}; it takes {accepted}")


def section_of(name: str, section: Mapping) -> dict:
    """``{"type", "params"}`` of a DeepSpeed ``optimizer`` or ``scheduler`` section, checked."""
    if not isinstance(section, Mapping):
        raise ZeroConfigError(f"the {name} section must be a dict with 'type' and 'params', got {section!r}")
    unknown = sorted(set(section) - {"type", "params"})
    if unknown or "type" not in section:
        raise ZeroConfigError(f"the {name} section takes 'type' and 'params', got keys {sorted(section)}")
    params = section.get("params") or {}
    return {"type": section["type"], "params": dict(params) if isinstance(params, Mapping) else params}


def table() -> list[tuple[str, str, str, str]]:
    """(key, status, what zerocomm does, DeepSpeed's default) for every documented key: the rows of the table in
    docs/migrating-from-deepspeed.md."""
    rows = []
    for key in _TABLE:
        what = key.why
        if key.status is Status.HONOURED:
            what = f"sets `ZeroConfig.{key.field}`" + (f"; {key.why}" if key.why else "")
        rows.append((key.path, key.status.value, what, _shown(key.default)))
    return rows


def _shown(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, int) and value >= 10 ** 7 and value % 10 ** 7 == 0:
        mantissa, exponent = f"{value:e}".split("e")
        return f"`{float(mantissa):g}e{int(exponent)}`"
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def read_deepspeed_config(config, what: str = "config") -> dict:
    """A private copy of a DeepSpeed config: ``config`` is a dict (copied deeply) or the path of its JSON file.
    ``what`` names the argument in errors ("zero_config", "ZeroStrategy: config", ...); a file that cannot be
    read, is not JSON or holds no JSON object raises :class:`ZeroConfigError` naming it."""
    import copy
    import json
    import os
    from pathlib import Path

    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    if not isinstance(config, (str, os.PathLike)):
        raise ZeroConfigError(f"{what} must be a DeepSpeed config dict or the path of its JSON file, got "
                              f"{type(config).__name__}")
    path = Path(config)
    try:
        loaded = json.loads(path.read_text())
    except OSError as error:
        raise ZeroConfigError(f"{what}: cannot read the config file {path}: {error}") from None
    except json.JSONDecodeError as error:
        raise ZeroConfigError(f"{what}: the config file {path} is not JSON: {error}") from None
    if not isinstance(loaded, dict):
        raise ZeroConfigError(f"{what}: the config file {path} holds a {type(loaded).__name__}, not a JSON object")
    return loaded
