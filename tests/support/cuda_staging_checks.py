"""Rank-side checks of CUDA tensors on host backends (started by spawn from tests/comm/test_cuda_staging.py).

Every rank uses cuda:0, so several ranks share one GPU: zerocomm's gloo stages their tensors through pinned host
memory (comm/staging.py), and torch's NCCL, which refuses two ranks on one GPU, is not involved.  Each function
returns failure strings (empty: all passed).
"""
from __future__ import annotations

import datetime
import os
import traceback

import torch

DEVICE = torch.device("cuda", 0)


def collectives(rank: int, n: int) -> list:
    """The tensor collectives on CUDA tensors over gloo, blocking and async, against closed forms; the "shm"
    algorithm too (it runs on the staged host copies)."""
    import zerocomm.comm as dist
    failures = []
    for algorithm in ("native", "ring", "shm"):
        for async_op in (False, True):
            where = f"{algorithm} async={async_op}"

            def done(work):
                if async_op:
                    work.wait()

            t = torch.arange(5, dtype=torch.float32, device=DEVICE) + rank
            done(dist.all_reduce(t, async_op=async_op, algorithm=algorithm))
            want = torch.arange(5, dtype=torch.float32) * n + n * (n - 1) / 2
            if t.device != DEVICE or not torch.equal(t.cpu(), want):
                failures.append(f"all_reduce {where}: {t} != {want}")
            out = torch.empty(3 * n, device=DEVICE)
            done(dist.all_gather_into_tensor(out, torch.full((3,), float(rank), device=DEVICE), async_op=async_op,
                                             algorithm=algorithm))
            if not torch.equal(out.cpu(), torch.arange(n).repeat_interleave(3).float()):
                failures.append(f"all_gather_into_tensor {where}: {out}")
            rs = torch.empty(2, device=DEVICE)
            full = torch.arange(2.0 * n, device=DEVICE) + rank
            done(dist.reduce_scatter_tensor(rs, full, async_op=async_op, algorithm=algorithm))
            want = torch.arange(2.0 * rank, 2.0 * rank + 2) * n + n * (n - 1) / 2
            if not torch.equal(rs.cpu(), want):
                failures.append(f"reduce_scatter_tensor {where}: {rs} != {want}")
            b = torch.full((4,), float(rank), device=DEVICE)
            done(dist.broadcast(b, src=n - 1, async_op=async_op, algorithm=algorithm if algorithm != "shm" else None))
            if b.tolist() != [float(n - 1)] * 4:
                failures.append(f"broadcast {where}: {b}")
    parts = [torch.empty(2, device=DEVICE) for _ in range(n)]
    dist.all_gather(parts, torch.full((2,), float(rank), device=DEVICE))
    if [p.tolist() for p in parts] != [[float(r)] * 2 for r in range(n)] or any(p.device != DEVICE for p in parts):
        failures.append(f"all_gather: {parts}")
    mine = torch.empty(2, device=DEVICE)
    dist.scatter(mine, [torch.full((2,), 10.0 + r, device=DEVICE) for r in range(n)] if rank == 0 else None, src=0)
    if mine.tolist() != [10.0 + rank] * 2:
        failures.append(f"scatter: {mine}")
    gathered = [torch.empty(1, device=DEVICE) for _ in range(n)] if rank == 0 else None
    dist.gather(torch.full((1,), float(rank), device=DEVICE), gathered, dst=0)
    if rank == 0 and [g.item() for g in gathered] != [float(r) for r in range(n)]:
        failures.append(f"gather: {gathered}")
    try:  # a dtype no backend moves: the host call's refusal, naming it
        dist.all_reduce(torch.ones(2, dtype=torch.int16, device=DEVICE))
        failures.append("an int16 CUDA tensor was accepted")
    except dist.UnsupportedError as error:
        if "torch.int16" not in str(error):
            failures.append(f"the int16 refusal does not name the dtype: {error}")
    return failures


def zero_against_data_parallel(rank: int, n: int) -> list:
    """ZeRO stages 1-3 (fp32 and bf16) on CUDA over gloo against data-parallel training (all_reduce AVG of the
    gradients, the same bounds as the NCCL checks)."""
    from support import zero_cuda_checks as checks
    failures = []
    reference = checks.reference_losses(DEVICE, 0.0)
    for stage in (1, 2, 3):
        for precision in ("fp32", "bf16"):
            where = f"stage {stage} {precision} at {n} ranks"
            try:
                losses, _, optimizer = checks.zero_losses(DEVICE, stage, precision, 0.0)
                optimizer.remove_hooks()
            except Exception:  # noqa: BLE001 - reported as a failure string
                failures.append(f"{where}: {traceback.format_exc()}")
                continue
            bound = checks.FP32_REL if precision == "fp32" else checks.MIXED_REL
            worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
            if not worst <= bound:
                failures.append(f"{where}: losses {losses} differ from data-parallel {reference} by {worst:.2e}")
    # ZeRO++ (int8 weight gathers, secondary partitions, int4 gradients) on CUDA tensors: at 2 ranks on two pretend
    # hosts (the gradients' all_to_all crosses), at 3 on one host (a secondary partition of 3); losses within 1%.
    fields = {"zero_quantized_weights": True, "zero_quantized_gradients": True,
              "zero_hpz_partition_size": 1 if n == 2 else n}
    if n == 2:
        os.environ["ZEROCOMM_HOST"] = f"host{rank}"
    try:
        losses, _, optimizer = checks.zero_losses(DEVICE, 3, "fp32", 0.0, **fields)
        optimizer.remove_hooks()
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
        if not worst <= 0.01:
            failures.append(f"ZeRO++ at {n} ranks: losses {losses} differ from data-parallel {reference} by {worst:.2e}")
    except Exception:  # noqa: BLE001 - reported as a failure string
        failures.append(f"ZeRO++ at {n} ranks: {traceback.format_exc()}")
    finally:
        os.environ.pop("ZEROCOMM_HOST", None)
    return failures


def _ddp_reference(n: int, steps: int) -> list:
    """Rank 0's losses of data-parallel training over n ranks, in one process: the mean of the n ranks' losses'
    gradients, as DDP averages them."""
    from support import zero_cuda_checks as checks
    from zerocomm.benchmarks.models import loss_fn
    model = checks._model(DEVICE)
    optimizer = checks._adam(model.parameters())
    losses = []
    for step in range(steps):
        total = 0.0
        for r in range(n):
            x, y = checks._batch(model, r, step, DEVICE)
            loss = loss_fn(model, model(x), y)
            (loss / n).backward()
            if r == 0:
                losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()
    return losses


def ddp_on_c10d(rank: int, n: int) -> list:
    """torch's DDP over ``init_process_group("zerocomm")`` on CUDA tensors: rank 0's losses against data-parallel
    training in one process; the route the group took (NCCL twin where every rank has a GPU of its own)."""
    import torch.distributed as td
    from torch.nn.parallel import DistributedDataParallel

    from support import zero_cuda_checks as checks
    from zerocomm.benchmarks.models import loss_fn
    from zerocomm.comm import staging
    failures = []
    steps = 4
    model = checks._model(DEVICE)
    ddp = DistributedDataParallel(model, device_ids=[DEVICE] if DEVICE.type == "cuda" else None)
    optimizer = checks._adam(ddp.parameters())
    losses = []
    for step in range(steps):
        x, y = checks._batch(model, rank, step, DEVICE)
        loss = loss_fn(model, ddp(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    group = td.group.WORLD.zerocomm_group
    route = staging._ROUTES.get(group)
    twin = None if route is None else route.twin
    want_nccl = n == 1 and td.is_nccl_available()
    if (twin is not None) != want_nccl or (twin is not None and twin.backend != "nccl"):
        failures.append(f"{n} ranks on one GPU: NCCL twin {twin!r}, expected {'one' if want_nccl else 'none'}")
    if rank == 0:
        reference = _ddp_reference(n, steps)
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
        if not worst <= checks.FP32_REL:
            failures.append(f"DDP on zerocomm at {n} ranks: losses {losses} differ from {reference} by {worst:.2e}")
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(n)]
    td.all_gather(everyone, flat)
    if not all(torch.equal(e, everyone[0]) for e in everyone):
        failures.append("DDP on zerocomm: the ranks' parameters differ after training")
    return failures


def rank_main(rank: int, n: int, store_path: str, queue, check: str) -> None:
    try:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        if DEVICE.type == "cuda":
            torch.cuda.set_device(DEVICE)
        store = torch.distributed.FileStore(store_path, n)
        timeout = datetime.timedelta(seconds=120)
        if check == "ddp_on_c10d":
            import torch.distributed as td

            import zerocomm.comm  # noqa: F401  (registers the backend)
            td.init_process_group("zerocomm", store=store, rank=rank, world_size=n, timeout=timeout)
            failures = ddp_on_c10d(rank, n)
            td.destroy_process_group()
        else:
            import zerocomm.comm as dist
            dist.init_process_group("gloo", store=store, rank=rank, world_size=n, timeout=timeout)
            failures = globals()[check](rank, n) if check == "collectives" else zero_against_data_parallel(rank, n)
            dist.destroy_process_group()
        queue.put((rank, failures))
    except Exception:  # noqa: BLE001 - reported by the parent
        queue.put((rank, [traceback.format_exc()]))
