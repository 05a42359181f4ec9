"""Rank-side checks of stage 3's parameter offload (``offload_param``): runs against stage 3 without it, what
lives where, checkpoints, and the resident memory it saves."""
from __future__ import annotations

import gc

import torch

from zerocomm.benchmarks.models import batch_for, build_model, loss_fn
from zerocomm.zero import ZeroConfig, initialize

from .dist import dist
from .zero_checks import adam, max_relative_error, zero_run


def nvme_fields(folder: str, params: bool = True) -> dict:
    """Both offloads in files (small pieces: every bucket spans several)."""
    fields = {"offload_optimizer": "nvme", "nvme_path": folder, "offload_buffer_numel": 700,
              "offload_buffer_count": 2}
    return {**fields, "offload_param": "nvme"} if params else fields


def equivalence(cases: list, folder: str, steps: int = 6) -> list:
    """For each ``(model, precision, accum, clip)``: (case, loss error, parameter error, the store's class, bytes
    read from the parameter files) of stage 3 with ``offload_param: nvme`` against stage 3 without it."""
    out = []
    for model_name, precision, accum, clip in cases:
        common = dict(steps=steps, accum=accum, clip=clip, stage=3, algorithm="native", precision=precision)
        plain = zero_run(model_name, **common)
        plain["optimizer"].remove_hooks()
        offloaded = zero_run(model_name, **common, **nvme_fields(folder))
        optimizer = offloaded["optimizer"]
        optimizer.remove_hooks()
        store = optimizer.parameters.store
        out.append(((model_name, precision, accum, clip),) + max_relative_error(offloaded, plain)
                   + (type(store).__name__, store.read_bytes))
    return out


def placement(folder: str, precision: str) -> dict:
    """The memory report after two steps with parameters in files, and the numbers it should follow."""
    run = zero_run("lm", steps=2, accum=1, clip=0.0, stage=3, algorithm="native", precision=precision,
                   **nvme_fields(folder))
    optimizer = run["optimizer"]
    optimizer.remove_hooks()
    parameters = optimizer.parameters
    persistent = sum(full.untyped_storage().nbytes() for full in parameters.full)  # what stays gathered
    return {"report": optimizer.memory_report(), "persistent": persistent,
            "shard_bytes": sum(layout.chunk_numel for layout in optimizer.layouts) * parameters.dtype.itemsize,
            "files": sorted(p.name for p in parameters.store.folder.iterdir())}


def _vm(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _return_freed_memory() -> None:
    """The resident set follows live memory: large freed blocks go back to the system at once, and the free pages
    the heap already holds go back now. Without the trim, heap an earlier test freed but glibc kept stays resident
    before the baseline and is reused after it without raising the resident set, so a peak reads low (seen in CI:
    one rank's peak without files 14 MiB below the other's)."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD = 64 KiB
    libc.malloc_trim(0)  # every arena's free pages, not only the top of the main heap


def training_peak(folder: str, params_offloaded: bool, width: int = 1024, layers: int = 16, steps: int = 2) -> dict:
    """Peak resident bytes during training (steps after a warm-up step), above the resident set before the model
    was built, of stage 3 with both state and gradients in files, with or without the parameter shards in files
    too, on an MLP of ``layers`` units of ``width`` x ``width``; and the shard bytes that should leave memory."""
    gc.collect()
    _return_freed_memory()
    base = _vm("VmRSS:")
    model = build_model("mlp", 0, sizes=(width,) * (layers + 1))
    config = ZeroConfig(stage=3, algorithm="native", reduce_bucket_numel=1 << 22, allgather_bucket_numel=1 << 22,
                        offload_buffer_numel=1 << 16, offload_buffer_count=2, stage3_param_persistence_threshold=0,
                        **{k: v for k, v in nvme_fields(folder, params_offloaded).items() if "buffer" not in k})
    model, optimizer = initialize(model, adam, config)
    rank = dist.get_rank()

    def step(index: int) -> None:
        x, y = batch_for(model, seed=0, rank=rank, step=index)
        loss_fn(model, model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    step(0)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # VmHWM := VmRSS: construction's peak (the whole model, flattened) is left out
    for index in range(1, steps + 1):
        step(index)
    peak = _vm("VmHWM:") - base
    unit_shard = max(layout.chunk_numel for layout in optimizer.layouts) * 4
    shard = sum(layout.chunk_numel for layout in optimizer.layouts) * 4
    optimizer.remove_hooks()
    del model, optimizer
    gc.collect()
    return {"peak": peak, "shard": shard, "unit_shard": unit_shard}


def forced_host_shards(steps: int = 4) -> dict:
    """``offload_param: cpu`` with ``HostShards`` forced onto a CPU model (as a CUDA model builds it, without
    pinning), with host optimizer offload forced too: against stage 3 without offload, and the bytes each gather
    copied "to the device"."""
    from zerocomm.zero import sharded
    from zerocomm.zero.offload_param import HostShards

    from .zero_offload_checks import forced_host_state

    original = sharded.build_param_store

    def build(config, layouts, *, dtype, device, rank):
        if config.offload_param == "cpu":
            return HostShards([layout.chunk_numel for layout in layouts], dtype=dtype, device=device, pin_memory=False)
        return original(config, layouts, dtype=dtype, device=device, rank=rank)

    common = dict(steps=steps, accum=1, clip=0.0, stage=3, algorithm="native")
    plain = zero_run("lm", **common)
    plain["optimizer"].remove_hooks()
    sharded.build_param_store = build
    try:
        with forced_host_state():
            run = zero_run("lm", **common, offload_param="cpu", offload_optimizer="cpu")
    finally:
        sharded.build_param_store = original
    optimizer = run["optimizer"]
    optimizer.remove_hooks()
    store = optimizer.parameters.store
    return {"errors": max_relative_error(run, plain), "store": type(store).__name__,
            "to_device": store.to_device_bytes, "shard_bytes": store.flat.numel() * store.flat.element_size(),
            "state": type(optimizer.optimizer_state).__name__, "report": optimizer.memory_report()["params"]}
