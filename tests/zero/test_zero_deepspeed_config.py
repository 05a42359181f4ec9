"""DeepSpeed config dicts: every documented key honoured, ignored (one logged line), fixed or refused; the batch
size checks; "auto"; and real configs (an RLHF script's, DeepSpeed's documented offload examples) training at n=2.
"""
import logging
import re
from pathlib import Path

import pytest

from support import zero_offload_checks
from support.worlds import worlds
from zerocomm.zero import ZeroConfig, ZeroConfigError
from zerocomm.zero.deepspeed_config import KEYS, Status
from zerocomm.zero.optim_factory import OptimizerConfig
from zerocomm.zero.schedulers import SchedulerConfig

ROOT = Path(__file__).resolve().parents[2]

# A value unlike DeepSpeed's default for every key that is not a plain bool flip, and what a HONOURED one becomes.
SAMPLES = {
    "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3.0,
    "steps_per_print": 10, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}, "gradient_clipping": 1.0,
    "gradient_predivide_factor": 2.0, "gradient_allreduce_op": "sum", "communication_data_type": "fp16",
    "seed": 1234, "log_level": "info", "data_types": {"grad_accum_dtype": "fp32"},
    "fp16.loss_scale": 128, "fp16.initial_scale_power": 12.0, "fp16.loss_scale_window": 100, "fp16.hysteresis": 3,
    "fp16.min_loss_scale": 0.5, "zero_optimization.stage": 3.0, "zero_optimization.reduce_bucket_size": 3e7,
    "zero_optimization.allgather_bucket_size": 2e7, "zero_optimization.sub_group_size": 1e6,
    "zero_optimization.stage3_prefetch_bucket_size": 3e7, "zero_optimization.prefetch_bucket_size": 3e7,
    "zero_optimization.stage3_param_persistence_threshold": 1e4,
    "zero_optimization.param_persistence_threshold": 1e4, "zero_optimization.stage3_max_live_parameters": 3e7,
    "zero_optimization.max_live_parameters": 3e7, "zero_optimization.stage3_model_persistence_threshold": 1e6,
    "zero_optimization.stage3_max_reuse_distance": 1e7, "zero_optimization.stage3_module_granularity_threshold": 10,
    "zero_optimization.zero_hpz_partition_size": 8, "zero_optimization.zeropp_loco_param": {"err_beta": 0.8},
    "zero_optimization.mics_shard_size": 8, "zero_optimization.leaf_module": {"classes": ["Block"]},
    "zero_optimization.offload_optimizer.device": "nvme",
    "zero_optimization.offload_optimizer.nvme_path": "/local_nvme",
    "zero_optimization.offload_optimizer.buffer_count": 5, "zero_optimization.offload_optimizer.buffer_size": 1e5,
    "zero_optimization.offload_optimizer.ratio": 0.3, "zero_optimization.offload_optimizer.cpuadam_cores_perc": 0.5,
    "zero_optimization.offload_param.device": "cpu", "zero_optimization.offload_param.nvme_path": "/local_nvme",
    "zero_optimization.offload_param.buffer_count": 4, "zero_optimization.offload_param.buffer_size": 1e7,
    "zero_optimization.offload_param.max_in_cpu": 1e8,
}
# What a HONOURED key's sample turns into, where the field does not simply take the value.
EXPECTED = {
    "gradient_accumulation_steps": 3, "fp16.enabled": ("precision", "fp16"), "bf16.enabled": ("precision", "bf16"),
    "fp16.initial_scale_power": 12, "zero_optimization.stage": 3, "zero_optimization.reduce_bucket_size": 30_000_000,
    "zero_optimization.cpu_offload": ("offload_optimizer", "cpu"), "zero_optimization.cpu_offload_param":
    ("offload_param", "cpu"), "zero_optimization.offload_optimizer.buffer_size": 100_000,
    "optimizer": OptimizerConfig(type="AdamW", params={"lr": 3e-4}),
    "scheduler": SchedulerConfig(type="WarmupLR", params={"warmup_num_steps": 10}),
}


def _sample(key):
    if key.path in SAMPLES:
        return SAMPLES[key.path]
    if key.kind is bool:
        return not key.default if key.default is not None else True
    return {"enabled": True}  # a whole section


def _config_with(path: str, value) -> dict:
    """A config dict holding ``path`` = ``value``, plus what the key needs around it to mean anything."""
    config: dict = {}
    node = config
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    if path.startswith("fp16.") and path != "fp16.enabled":
        config["fp16"]["enabled"] = True
    if path.startswith("bf16.") and path != "bf16.enabled":
        config["bf16"]["enabled"] = True
    for section in ("offload_optimizer", "offload_param"):
        block = config.get("zero_optimization", {}).get(section)
        if block is not None:
            block.setdefault("device", "nvme")
            if block["device"] == "nvme":
                block.setdefault("nvme_path", "/local_nvme")
    return config


def _warnings(caplog) -> list:
    return [r.getMessage() for r in caplog.records if r.name == "zerocomm.zero.config" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("path", sorted(KEYS))
def test_every_documented_key(path, caplog):
    key = KEYS[path]
    value = _sample(key)
    caplog.set_level(logging.INFO, logger="zerocomm.zero.config")
    if key.status is Status.REFUSED:
        with pytest.raises(ZeroConfigError, match=re.escape(path)):
            ZeroConfig.from_deepspeed(_config_with(path, value))
        ZeroConfig.from_deepspeed(_config_with(path, {"enabled": False}))  # a section that is off is accepted
        return
    if key.status is Status.FIXED:
        with pytest.raises(ZeroConfigError, match=re.escape(path)) as info:
            ZeroConfig.from_deepspeed(_config_with(path, value))
        assert "not supported" in str(info.value)
        caplog.clear()
        ZeroConfig.from_deepspeed(_config_with(path, key.default))  # the way zerocomm works: accepted, silently
        assert not [m for m in _warnings(caplog) if path in m]
        return
    config = ZeroConfig.from_deepspeed(_config_with(path, value))
    mentioned = [m for m in _warnings(caplog) if path in m]
    if key.status is Status.IGNORED:
        assert len(mentioned) == 1, f"{path}: expected one logged line, got {mentioned}"
        assert "ignored" in mentioned[0]
    elif key.status is Status.LOOP:
        assert not mentioned
    else:
        assert not mentioned
        spec = EXPECTED.get(path, value)
        field, want = spec if isinstance(spec, tuple) else (key.field, spec)
        if key.kind is int and isinstance(want, float):
            want = int(want)  # DeepSpeed's ints may be written as floats (3e7)
        got = getattr(config, field)
        assert got == want and type(got) is type(want), (path, got, want)


def test_table_covers_what_deepspeed_documents():
    """Keys from DeepSpeed's config-json documentation and its ZeRO config model, spot-checked by name."""
    for path in ("zero_optimization.round_robin_gradients", "zero_optimization.memory_efficient_linear",
                 "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                 "zero_optimization.zero_quantized_weights",
                 "zero_optimization.offload_optimizer.fast_init", "zero_optimization.offload_param.max_in_cpu",
                 "fp16.consecutive_hysteresis", "fp16.auto_cast", "bf16.immediate_grad_update", "prescale_gradients",
                 "wall_clock_breakdown", "steps_per_print", "train_micro_batch_size_per_gpu"):
        assert path in KEYS, path


def test_migration_page_lists_every_key_with_its_status():
    page = (ROOT / "docs" / "deepspeed-config-keys.md").read_text()
    rows = dict(re.findall(r"^\| `([\w.]+)` \| (honoured|fixed|ignored|training loop|refused) \|", page, re.M))
    assert rows == {path: key.status.value for path, key in KEYS.items()}


@pytest.mark.parametrize("config, world_size, accum", [
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 2, 4),  # DeepSpeed derives the third
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 4, 2),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 3, 2),
    ({"train_batch_size": 12, "gradient_accumulation_steps": 2}, 3, 2),
    ({"train_batch_size": 24}, 3, 1),
    ({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"},
     2, 1),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto"}, 2, 4),
])
def test_batch_sizes_are_derived_as_deepspeed_does(config, world_size, accum):
    assert ZeroConfig.from_deepspeed(config, world_size=world_size).gradient_accumulation_steps == accum


@pytest.mark.parametrize("config, world_size, words", [
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 2,
     ["train_batch_size (32)", "(4)", "(2)", "world size (2)", "= 16"]),
    ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, 2, ["train_batch_size (30)", "multiple"]),
    ({"train_batch_size": 10, "gradient_accumulation_steps": 4}, 2, ["train_batch_size (10)", "multiple"]),
    ({"train_batch_size": 0}, 2, ["train_batch_size", "> 0"]),
    ({"gradient_accumulation_steps": 2.5}, 2, ["gradient_accumulation_steps", "integer"]),
])
def test_inconsistent_batch_sizes_are_refused(config, world_size, words):
    with pytest.raises(ZeroConfigError) as info:
        ZeroConfig.from_deepspeed(config, world_size=world_size)
    for word in words:
        assert word in str(info.value)


class _HFConfig:
    hidden_size = 64


class _HFModel:
    config = _HFConfig()


def test_auto_is_resolved_as_the_hugging_face_integration_does_or_refused(caplog):
    zero = {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto"}
    config = ZeroConfig.from_deepspeed({"zero_optimization": zero}, model=_HFModel())
    assert (config.reduce_bucket_numel, config.stage3_prefetch_bucket_numel,
            config.stage3_param_persistence_threshold) == (64 * 64, int(0.9 * 64 * 64), 640)
    caplog.set_level(logging.INFO, logger="zerocomm.zero.config")
    plain = ZeroConfig.from_deepspeed({"zero_optimization": zero})  # no config.hidden_size: zerocomm's defaults
    assert plain.reduce_bucket_numel == ZeroConfig().reduce_bucket_numel
    assert any("hidden_size" in m for m in _warnings(caplog))
    for config in ({"fp16": {"enabled": "auto"}}, {"bf16": {"enabled": "auto"}}, {"gradient_clipping": "auto"},
                   {"zero_optimization": {"offload_optimizer": {"device": "auto"}}},
                   {"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}},  # initialize builds it: needs values
                   {"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}}}):
        with pytest.raises(ZeroConfigError, match="Hugging Face"):
            ZeroConfig.from_deepspeed(config)


def test_forms_deepspeed_accepts():
    # only the zero_optimization part; DeepSpeed's older "bfloat16" section name; the oldest boolean form
    assert ZeroConfig.from_deepspeed({"stage": 2, "offload_optimizer": {"device": "none"}}).stage == 2
    assert ZeroConfig.from_deepspeed({"offload_optimizer": {"device": "cpu"}}).offload_optimizer == "cpu"
    assert ZeroConfig.from_deepspeed({"bfloat16": {"enabled": True}}).precision == "bf16"
    assert ZeroConfig.from_deepspeed({"zero_optimization": True}).stage == 1
    assert ZeroConfig.from_deepspeed({}).stage == 0  # DeepSpeed's default: no ZeRO
    # device "none" means no offload, whatever else the section says
    none = ZeroConfig.from_deepspeed({"zero_optimization": {"stage": 2, "offload_optimizer": {
        "device": "none", "nvme_path": "/nowhere", "ratio": 0.5}, "offload_param": {"device": "none"}}})
    assert (none.offload_optimizer, none.offload_param, none.nvme_path) == ("none", "none", None)
    # fp16 settings are read only when fp16 is enabled, as in DeepSpeed
    assert ZeroConfig.from_deepspeed({"fp16": {"enabled": False, "loss_scale_window": 100}}).loss_scale_window == 1000
    with pytest.raises(ZeroConfigError, match="nvme_path"):
        ZeroConfig.from_deepspeed({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})
    with pytest.raises(ZeroConfigError, match="one of"):
        ZeroConfig.from_deepspeed({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})


def rlhf_config(device: str, stage: int) -> dict:
    """The config a well-known RLHF training script builds (its get_train_ds_config), fp16, 2 ranks."""
    return {
        "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10,
        "zero_optimization": {"stage": stage, "overlap_comm": True, "offload_param": {"device": device},
                              "offload_optimizer": {"device": device}, "stage3_param_persistence_threshold": 1e4,
                              "stage3_max_live_parameters": 3e7, "stage3_prefetch_bucket_size": 3e7,
                              "memory_efficient_linear": False},
        "fp16": {"enabled": True, "loss_scale_window": 100}, "gradient_clipping": 1.0, "prescale_gradients": False,
        "wall_clock_breakdown": False,
        "hybrid_engine": {"enabled": False, "max_out_tokens": 512, "inference_tp_size": 1,
                          "release_inference_cache": False, "pin_parameters": True, "tp_gather_partition_size": 8},
        "tensorboard": {"enabled": False, "output_path": "step3_tensorboard/ds_tensorboard_logs/",
                        "job_name": "step3_actor_tensorboard"},
    }


@pytest.mark.parametrize("world", worlds(backends=("gloo",), sizes=(2,)), indirect=True)
def test_rlhf_config_trains_unchanged(world, tmp_path):
    for device in ("none", "cpu"):
        for stage in (2, 3):
            for rank, seen in enumerate(world.run(zero_offload_checks.deepspeed_config_training,
                                                  rlhf_config(device, stage), str(tmp_path), timeout=120)):
                assert (seen["stage"], seen["precision"], seen["accum"], seen["offload"]) == (stage, "fp16", 4, device)
                assert seen["steps"] == 2 and len(seen["losses"]) == 8, seen
