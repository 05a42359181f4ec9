"""Rank-side ZeRO checks on CUDA tensors over NCCL (started by spawn from tests/zero/test_zero_cuda.py).

Each rank takes the CUDA device of its rank, builds the seeded small TinyLM there and trains it through
``zerocomm.zero.initialize`` for every (stage, precision, clipping); it returns failure strings (empty:
all passed).  The fp32 reference is data-parallel training of the same model on the same device
(all_reduce AVG of the flattened gradients, float64 global norm for clipping), as in zero_checks.py.
"""
from __future__ import annotations

import datetime
import math
import os
import tempfile
import traceback

import torch

STEPS = 6
LR = 3e-3
FP32_REL = 1e-4
"""fp32 losses against the reference: ZeRO reduces buckets instead of one flat buffer, and CUDA kernels
may change summation order between launches, so the bound is 10x the CPU tests' 1e-5."""
MIXED_REL = 2e-2
"""bf16/fp16 losses against the fp32 reference, over the first few steps of a small model."""


def _adam(params):
    return torch.optim.Adam(params, lr=LR)


def _model(device):
    from zerocomm.benchmarks.models import build_model
    return build_model("lm", 0).to(device)


def _batch(model, rank, step, device):
    from zerocomm.benchmarks.models import batch_for
    x, y = batch_for(model, seed=0, rank=rank, step=step)
    return x.to(device), y.to(device)


def reference_losses(device, clip: float) -> list:
    import zerocomm.comm as dist
    from zerocomm.benchmarks.models import loss_fn
    rank = dist.get_rank()
    model = _model(device)
    params = list(dict.fromkeys(model.parameters()))
    optimizer = _adam(params)
    losses = []
    for step in range(STEPS):
        x, y = _batch(model, rank, step, device)
        loss = loss_fn(model, model(x), y)
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.AVG)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        if clip:
            norm = math.sqrt(sum(float(torch.sum(p.grad.double() ** 2)) for p in params))
            coefficient = min(1.0, clip / (norm + 1e-6))
            for p in params:
                p.grad.mul_(coefficient)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def zero_losses(device, stage: int, precision: str, clip: float, **fields) -> tuple[list, object, object]:
    from zerocomm.benchmarks.models import loss_fn
    from zerocomm.zero import ZeroConfig, initialize
    import zerocomm.comm as dist
    rank = dist.get_rank()
    config = ZeroConfig(stage=stage, precision=precision, gradient_clipping=clip, reduce_bucket_numel=8000,
                        allgather_bucket_numel=8000, stage3_param_persistence_threshold=100,
                        debug=stage == 3, **fields)
    model, optimizer = initialize(_model(device), _adam, config)
    losses = []
    for step in range(STEPS):
        x, y = _batch(model, rank, step, device)
        loss = loss_fn(model, model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, model, optimizer


def training(device) -> list:
    failures = []
    for clip in (0.0, 0.05):
        reference = reference_losses(device, clip)
        for stage in (0, 1, 2, 3):
            for precision in ("fp32", "bf16", "fp16"):
                where = f"stage {stage} {precision} clip {clip}"
                try:
                    losses, model, optimizer = zero_losses(device, stage, precision, clip)
                except Exception:  # noqa: BLE001 - reported as a failure string
                    failures.append(f"{where}: {traceback.format_exc()}")
                    continue
                bound = FP32_REL if precision == "fp32" else MIXED_REL
                worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
                if not worst <= bound:
                    failures.append(f"{where}: losses {losses} differ from the reference {reference} by {worst:.2e}")
                devices = {p.device.type for p in optimizer.master} | {optimizer.gradients.reduced(l).device.type
                                                                     for l in optimizer.layouts}
                if devices != {device.type}:
                    failures.append(f"{where}: masters or gradient shards on {devices}, expected {device.type} only")
                if clip and optimizer.last_grad_norm is None:
                    failures.append(f"{where}: clipping on but no global norm computed")
                optimizer.remove_hooks()
    return failures


def checkpoint(device) -> list:
    """Save after 3 steps, train 3 more; a fresh optimizer loads and trains the same 3: equal losses."""
    import zerocomm.comm as dist
    from zerocomm.benchmarks.models import loss_fn
    from zerocomm.zero import ZeroConfig, initialize
    rank, failures = dist.get_rank(), []
    path = [tempfile.mkdtemp(prefix="zero-cuda-ckpt-") if rank == 0 else None]
    dist.broadcast_object_list(path, group_src=0)
    for stage in (0, 1, 2, 3):
        for precision in ("fp32", "fp16"):
            config = ZeroConfig(stage=stage, precision=precision, stage3_param_persistence_threshold=100,
                                reduce_bucket_numel=8000)
            runs = []
            for resumed in (False, True):
                model, optimizer = initialize(_model(device), _adam, config)
                if resumed:
                    optimizer.load(os.path.join(path[0], f"{stage}-{precision}"))
                losses = []
                for step in range(6):
                    if step < 3 and resumed:
                        continue
                    x, y = _batch(model, rank, step, device)
                    loss = loss_fn(model, model(x), y)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
                    losses.append(loss.item())
                    if step == 2 and not resumed:
                        optimizer.save(os.path.join(path[0], f"{stage}-{precision}"))
                runs.append(losses[-3:])
                optimizer.remove_hooks()
            worst = max(abs(a - b) / abs(b) for a, b in zip(*runs))
            if not worst <= 1e-6:
                failures.append(f"checkpoint stage {stage} {precision}: resumed losses {runs[1]} != {runs[0]}")
    return failures


def offload(device) -> list:
    """ZeRO-Offload: offload_optimizer "cpu" against the same stage on the device (losses within the fp32 bound;
    bf16 within its bound), masters and optimizer state on the host, one shard each way per step, a reload from a
    checkpoint; NVMe offload of CUDA parameters refused with the alternative named."""
    from zerocomm.zero import ZeroConfigError
    failures = []
    for stage in (1, 2, 3):
        for precision in ("fp32", "bf16"):
            where = f"offload stage {stage} {precision}"
            try:
                plain, _, plain_optimizer = zero_losses(device, stage, precision, 0.0)
                plain_optimizer.remove_hooks()
                losses, _, optimizer = zero_losses(device, stage, precision, 0.0, offload_optimizer="cpu")
            except Exception:  # noqa: BLE001 - reported as a failure string
                failures.append(f"{where}: {traceback.format_exc()}")
                continue
            state = optimizer.optimizer_state
            bound = FP32_REL if precision == "fp32" else MIXED_REL
            worst = max(abs(a - b) / abs(b) for a, b in zip(losses, plain))
            if not worst <= bound:
                failures.append(f"{where}: losses {losses} differ from no offload {plain} by {worst:.2e}")
            if type(state).__name__ != "HostOptimizerState" or {m.device.type for m in state.masters} != {"cpu"}:
                failures.append(f"{where}: {type(state).__name__} with masters on {[m.device for m in state.masters]}")
            shard = sum(m.numel() for m in state.masters)
            width = 4 if precision == "fp32" else 2  # gradients cross the bus in the compute dtype
            if state.to_host_bytes != width * shard * STEPS:
                failures.append(f"{where}: {state.to_host_bytes} bytes to the host, expected {width * shard * STEPS}")
            staged = [s for s in state._staged if s is not None]
            if precision != "fp32" and not (staged and all(s.dtype == torch.bfloat16 and s.is_pinned()
                                                           for s in staged)):
                failures.append(f"{where}: no pinned bf16 staging buffers {[(s.dtype, s.is_pinned()) for s in staged]}")
            report = optimizer.memory_report()["optimizer_state"]
            if report["device"] or not report["host"]:
                failures.append(f"{where}: memory report {report}")
            optimizer.remove_hooks()
    import zerocomm.comm as dist
    from zerocomm.benchmarks.models import loss_fn
    from zerocomm.zero import ZeroConfig, initialize
    path = [tempfile.mkdtemp(prefix="zero-cuda-offload-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(path, group_src=0)
    runs = []
    for resumed in (False, True):  # save after 3 steps with host offload; a fresh one loads and trains the same 3
        model, optimizer = initialize(_model(device), _adam, ZeroConfig(stage=2, offload_optimizer="cpu",
                                                                        reduce_bucket_numel=8000))
        if resumed:
            optimizer.load(path[0])
        losses = []
        for step in range(3 if resumed else 0, 6):
            x, y = _batch(model, dist.get_rank(), step, device)
            loss = loss_fn(model, model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            if step == 2 and not resumed:
                optimizer.save(path[0])
        runs.append(losses[-3:])
        optimizer.remove_hooks()
    if max(abs(a - b) / abs(b) for a, b in zip(*runs)) > 1e-6:
        failures.append(f"offload checkpoint: resumed losses {runs[1]} != {runs[0]}")
    try:
        zero_losses(device, 2, "fp32", 0.0, offload_optimizer="nvme", nvme_path=tempfile.mkdtemp())
        failures.append("nvme offload of CUDA parameters was accepted")
    except ZeroConfigError as error:
        if "offload_optimizer 'cpu'" not in str(error):
            failures.append(f"nvme refusal does not name the alternative: {error}")
    return failures


def param_offload(device) -> list:
    """Stage 3 with offload_param "cpu": parameter shards in pinned host memory, copied to the device for each
    gather, against stage 3 on the device (the fp32 / bf16 bounds); the pairs zerocomm refuses say why."""
    from zerocomm.zero import ZeroConfigError
    failures = []
    for precision in ("fp32", "bf16"):
        where = f"param offload {precision}"
        try:
            plain, _, plain_optimizer = zero_losses(device, 3, precision, 0.0)
            plain_optimizer.remove_hooks()
            losses, _, optimizer = zero_losses(device, 3, precision, 0.0, offload_param="cpu",
                                               offload_optimizer="cpu")
        except Exception:  # noqa: BLE001 - reported as a failure string
            failures.append(f"{where}: {traceback.format_exc()}")
            continue
        bound = FP32_REL if precision == "fp32" else MIXED_REL
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, plain))
        if not worst <= bound:
            failures.append(f"{where}: losses {losses} differ from no offload {plain} by {worst:.2e}")
        store = optimizer.parameters.store
        if type(store).__name__ != "HostShards" or store.flat.device.type != "cpu" or not store.flat.is_pinned():
            failures.append(f"{where}: store {type(store).__name__} on {store.flat.device}")
        if store.to_device_bytes < 2 * STEPS * store.flat.numel() * store.flat.element_size() // 2:
            failures.append(f"{where}: only {store.to_device_bytes} bytes copied to the device for gathers")
        report = optimizer.memory_report()["params"]
        if report["host"] != store.flat.numel() * store.flat.element_size():
            failures.append(f"{where}: memory report {report}")
        optimizer.remove_hooks()
    for fields, words in (({"offload_param": "cpu"}, "offload_optimizer 'cpu'"),
                          ({"offload_param": "nvme", "offload_optimizer": "nvme", "nvme_path": tempfile.mkdtemp()},
                           "offload_param 'cpu'")):
        try:
            zero_losses(device, 3, "fp32", 0.0, **fields)
            failures.append(f"{fields} on a CUDA model was accepted")
        except ZeroConfigError as error:
            if words not in str(error):
                failures.append(f"{fields}: the refusal does not name {words}: {error}")
    return failures


def objects(device) -> list:
    import zerocomm.comm as dist
    rank, n, failures = dist.get_rank(), dist.get_world_size(), []
    gathered = [None] * n
    dist.all_gather_object(gathered, {"rank": rank, "text": "x" * (rank + 3)})
    if gathered != [{"rank": r, "text": "x" * (r + 3)} for r in range(n)]:
        failures.append(f"all_gather_object: {gathered}")
    items = [f"from {rank}", [rank] * 3] if rank == 0 else [None, None]
    dist.broadcast_object_list(items, group_src=0)
    if items != ["from 0", [0] * 3]:
        failures.append(f"broadcast_object_list: {items}")
    out = [None] * n if rank == 0 else None
    dist.gather_object(("g", rank), out, group_dst=0)
    if rank == 0 and out != [("g", r) for r in range(n)]:
        failures.append(f"gather_object: {out}")
    mine = [None]
    dist.scatter_object_list(mine, [f"to {r}" for r in range(n)] if rank == 0 else None, group_src=0)
    if mine != [f"to {rank}"]:
        failures.append(f"scatter_object_list: {mine}")
    return failures


def rank_main(rank: int, n: int, store_path: str, queue, checks: tuple) -> None:
    try:
        import zerocomm.comm as dist
        os.environ["LOCAL_RANK"] = str(rank)
        torch.use_deterministic_algorithms(True, warn_only=True)
        store = torch.distributed.FileStore(store_path, n)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=120))
        device = torch.device("cuda", torch.cuda.current_device())
        failures = []
        for name in checks:
            failures += [f"{name}: {f}" for f in globals()[name](device)]
        dist.destroy_process_group()
        queue.put((rank, failures))
    except Exception:  # noqa: BLE001 - reported by the parent
        queue.put((rank, [traceback.format_exc()]))
