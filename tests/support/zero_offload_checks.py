"""Rank-side offload checks: offloaded runs against the same run without offload, the data movement of
host offload, the files and memory of NVMe offload, checkpoints of offloaded state, DeepSpeed configs.

Host offload (``offload_optimizer: cpu``) means nothing new for CPU models, so ``forced_host_state`` makes
the wrapper build ``HostOptimizerState`` over CPU tensors: the copies it makes are then real copies
between separate storages, and its counters say how many bytes crossed (what would cross the bus on a GPU).
"""
from __future__ import annotations

import contextlib
import gc
import os
import time

import torch

from zerocomm.benchmarks.models import build_model
from zerocomm.zero import ZeroConfig, initialize
from zerocomm.zero import optimizer as optimizer_module
from zerocomm.zero.offload import HostOptimizerState
from zerocomm.zero.stages import StatePlacement

from .dist import dist
from .zero_checks import adam, max_relative_error, zero_run
from .zero_ckpt_checks import _global_step, _params


@contextlib.contextmanager
def forced_host_state():
    """Within the block, ``offload_optimizer: cpu`` builds ``HostOptimizerState`` even for CPU parameters."""
    original = optimizer_module.build_optimizer_state

    def build(placement, param_shards, full32, factory, rank, config, **where):
        if placement is StatePlacement.HOST:
            return HostOptimizerState(param_shards, full32, factory, rank, pin_memory=config.pin_memory,
                                      device=where.get("device"))
        return original(placement, param_shards, full32, factory, rank, config, **where)

    optimizer_module.build_optimizer_state = build
    try:
        yield
    finally:
        optimizer_module.build_optimizer_state = original


def _offload_fields(kind: str, folder: str) -> dict:
    if kind == "cpu":
        return {"offload_optimizer": "cpu"}
    # Small pieces and the fewest slots, so that every bucket spans several pieces and slots are reused.
    return {"offload_optimizer": "nvme", "nvme_path": folder, "offload_buffer_numel": 700, "offload_buffer_count": 2}


def offload_equivalence(cases: list, folder: str, steps: int = 8) -> list:
    """For each ``(model, stage, precision, accum, clip, kind)``: (case, loss error, parameter error, kind of the
    optimizer-state part) of the offloaded run against the same run without offload."""
    out = []
    for model_name, stage, precision, accum, clip, kind in cases:
        common = dict(steps=steps, accum=accum, clip=clip, stage=stage, algorithm="native", precision=precision)
        plain = zero_run(model_name, **common)
        plain["optimizer"].remove_hooks()
        with forced_host_state():
            offloaded = zero_run(model_name, **common, **_offload_fields(kind, folder))
        offloaded["optimizer"].remove_hooks()
        out.append(((model_name, stage, precision, accum, clip, kind),) + max_relative_error(offloaded, plain)
                   + (type(offloaded["optimizer"].optimizer_state).__name__,))
    return out


def host_data_movement(stage: int, steps: int = 3) -> dict:
    """Host offload of the LM (forced onto CPU tensors): bytes each way per step, when the gradient copies
    started relative to the end of backward, and whether masters and parameters share storage."""
    with forced_host_state():
        run = zero_run("lm", steps=steps, accum=1, clip=0.0, stage=stage, algorithm="native",
                       bucket_numel=1000, offload_optimizer="cpu", max_inflight_buckets=1)
    optimizer = run["optimizer"]
    state = optimizer.optimizer_state
    stamps = []
    ready = state.gradient_ready

    def recording(index, grad, factor):
        stamps.append(time.perf_counter())
        ready(index, grad, factor)

    state.gradient_ready = recording
    before = (state.to_host_bytes, state.to_device_bytes)
    model = run["model"]
    from .zero_checks import loss_of, make_batch
    x, y = make_batch(model, seed=0, rank=dist.get_rank(), step=steps)
    loss_of(model, x, y, steps).backward()
    backward_end = optimizer.timeline.backward_end_s
    optimizer.step()
    optimizer.zero_grad()
    shard_numel = sum(m.numel() for m in state.masters)
    param_storages = {p.untyped_storage().data_ptr() for p in optimizer.params}
    report = optimizer.memory_report()
    optimizer.remove_hooks()
    return {"to_host": state.to_host_bytes - before[0], "to_device": state.to_device_bytes - before[1],
            "shard_numel": shard_numel, "buckets": len(optimizer.layouts),
            "copies_before_backward_end": sum(1 for s in stamps if s < backward_end), "copies": len(stamps),
            "shared_storage": any(m.untyped_storage().data_ptr() in param_storages for m in state.masters),
            "masters_on": str(state.masters[0].device), "report": report}


def nvme_files_and_memory(folder: str, precision: str, steps: int = 3) -> dict:
    """NVMe offload of the LM: what lives in memory and on disk after ``steps`` steps, the bytes moved per step,
    and whether the state folder is removed with the optimizer."""
    run = zero_run("lm", steps=steps, accum=1, clip=0.0, stage=2, algorithm="native", precision=precision,
                   offload_optimizer="nvme", nvme_path=folder, offload_buffer_numel=500, offload_buffer_count=3)
    optimizer = run["optimizer"]
    state = optimizer.optimizer_state
    files = sorted(os.listdir(state.files.folder))
    sizes = {name: os.path.getsize(state.files.folder / name) for name in files}
    read_before, written_before = state.read_bytes, state.written_bytes
    model = run["model"]
    from .zero_checks import loss_of, make_batch
    x, y = make_batch(model, seed=0, rank=dist.get_rank(), step=steps)
    loss_of(model, x, y, steps).backward()
    optimizer.step()
    optimizer.zero_grad()
    out = {"files": files, "sizes": sizes, "shards": [m.numel() for m in state.masters],
           "read": state.read_bytes - read_before, "written": state.written_bytes - written_before,
           "state_bytes": optimizer.model_state_bytes(), "report": optimizer.memory_report(),
           "slot_rows": [len(rows) for rows in state._slots], "elementwise": state.elementwise}
    path = state.files.folder
    optimizer.remove_hooks()
    del state, optimizer, run
    gc.collect()
    out["removed"] = not path.exists()
    return out


def _nvme(folder: str, params: bool = False) -> dict:
    fields = {"offload_optimizer": "nvme", "nvme_path": folder, "offload_buffer_numel": 600, "offload_buffer_count": 2}
    return {**fields, "offload_param": "nvme"} if params else fields


def _fresh(stage: int, precision: str, fields: dict):
    config = ZeroConfig(stage=stage, reduce_bucket_numel=8000, allgather_bucket_numel=8000,
                        stage3_param_persistence_threshold=100, algorithm="native", precision=precision, **fields)
    return initialize(build_model("lm", 0), adam, config)


def nvme_checkpoint(folder: str, checkpoint: str, stage: int, precision: str, params: bool = False) -> dict:
    """Train 3 steps with NVMe offload (``params``: stage 3's parameter shards in files too), save, train 3 more
    (A); a fresh optimizer offloaded alike loads and trains the same 3 (B); a fresh optimizer without offload loads
    the same checkpoint and trains them too (C)."""
    model, optimizer = _fresh(stage, precision, _nvme(folder, params))
    for step in range(3):
        _global_step(model, optimizer, step)
    optimizer.save(checkpoint)
    losses_a = [_global_step(model, optimizer, step) for step in range(3, 6)]
    params_a = _params(model, optimizer)
    optimizer.remove_hooks()
    results = {}
    for name, fields in (("nvme", _nvme(folder, params)), ("plain", {})):
        model, optimizer = _fresh(stage, precision, fields)
        optimizer.load(checkpoint)
        losses = [_global_step(model, optimizer, step) for step in range(3, 6)]
        params = _params(model, optimizer)
        optimizer.remove_hooks()
        results[name] = {"same_losses": losses == losses_a,
                         "loss_err": max(abs(a - b) / abs(a) for a, b in zip(losses_a, losses)),
                         "same_params": all(torch.equal(params_a[n], params[n]) for n in params_a)}
    return results


def deepspeed_config_training(config: dict, folder: str, steps: int = 2) -> dict:
    """``initialize`` with a DeepSpeed config dict exactly as given (its ``nvme_path`` values pointed at
    ``folder``; Adam from a factory unless the config has an optimizer section), then ``steps`` optimizer steps
    of the LM with the plain per-micro-batch loop."""
    config = _with_nvme_path(config, folder)
    model = build_model("lm", 0)
    model, optimizer = initialize(model, None if "optimizer" in config else adam, config)
    rank = dist.get_rank()
    from .zero_checks import loss_of, make_batch
    losses = []
    accum = optimizer.config.gradient_accumulation_steps
    for step in range(steps):
        for micro in range(accum):
            x, y = make_batch(model, seed=0, rank=rank, step=step, micro=micro)
            loss = loss_of(model, x, y, step)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    optimizer.remove_hooks()
    config_seen = optimizer.config
    return {"losses": losses, "steps": optimizer.step_count + optimizer.skipped_steps, "stage": config_seen.stage,
            "precision": config_seen.precision, "accum": accum, "offload": config_seen.offload_optimizer,
            "state": type(optimizer.optimizer_state).__name__, "offload_param": config_seen.offload_param,
            "param_store": type(getattr(optimizer.parameters, "store", None)).__name__}


def _with_nvme_path(config, folder: str):
    if isinstance(config, dict):
        return {key: folder if key == "nvme_path" else _with_nvme_path(value, folder) for key, value in config.items()}
    return config


def memory_report_cases(folder: str, cases: list) -> list:
    """For each ``(stage, precision, offload)``: (case, Φ padded, buckets, memory_report()["optimizer_state"]) after
    two steps of the LM (host offload forced onto CPU tensors, as above)."""
    from .zero_checks import padded_size
    out = []
    for stage, precision, kind in cases:
        fields = {} if kind == "none" else _offload_fields(kind, folder)
        with forced_host_state():
            run = zero_run("lm", steps=2, accum=1, clip=0.0, stage=stage, algorithm="native", precision=precision,
                           **fields)
        optimizer = run["optimizer"]
        optimizer.remove_hooks()
        out.append(((stage, precision, kind), padded_size(optimizer), len(optimizer.layouts),
                    optimizer.memory_report()["optimizer_state"]))
    return out
