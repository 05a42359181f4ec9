"""The NCCL backend on CUDA tensors: native, ring and tree against numpy.

Runs unchanged on a machine with GPUs: world size 1 on one GPU, and world size = the number of
GPUs (at least 2) for the multi-rank cases, started with the spawn method (CUDA cannot be
forked).  Without a CUDA device the GPU tests skip with that reason; whether there is one is
decided without initializing CUDA.  The import-cost test runs everywhere.
"""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import pytest
import torch

GPUS = torch.cuda.device_count() if torch.backends.cuda.is_built() else 0
needs_gpu = pytest.mark.skipif(GPUS < 1, reason="needs 1 CUDA device (none on this machine)")
needs_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA devices ({GPUS} on this machine)")


def test_import_touches_neither_cuda_nor_cupy():
    code = ("import sys, torch, zerocomm.comm, zerocomm.comm.capabilities, zerocomm.ops;"
            "assert 'cupy' not in sys.modules, 'cupy imported';"
            "assert not torch.cuda.is_initialized(), 'CUDA initialized at import'")
    subprocess.run([sys.executable, "-c", code], check=True)


def _checks(rank: int, n: int) -> list:
    """Every collective with every algorithm on CUDA tensors; returns failure strings."""
    import zerocomm.comm as dist
    device = torch.device("cuda", torch.cuda.current_device())
    failures = []
    everyone = [np.arange(7, dtype=np.float32) + r for r in range(n)]
    for algorithm in ("native", "ring", "tree"):
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
            t = torch.tensor(everyone[rank], device=device).to(dtype)
            try:
                dist.all_reduce(t, algorithm=algorithm)
                expected = np.sum(everyone, axis=0)
                if not np.allclose(t.float().cpu().numpy(), expected, rtol=1e-2):
                    failures.append(f"all_reduce {algorithm} {dtype}: {t.tolist()} != {expected.tolist()}")
            except dist.UnsupportedError as error:
                failures.append(f"all_reduce {algorithm} {dtype} refused: {error}")
        out = torch.empty(n * 7, device=device)
        dist.all_gather_into_tensor(out, torch.tensor(everyone[rank], device=device), algorithm=algorithm)
        if not np.array_equal(out.cpu().numpy(), np.concatenate(everyone)):
            failures.append(f"all_gather {algorithm}")
        rs = torch.empty(7, device=device)
        full = torch.arange(7.0 * n, device=device) + rank
        dist.reduce_scatter_tensor(rs, full, algorithm=algorithm)
        expected = (np.arange(7.0 * n)[None, :] + np.arange(n)[:, None]).sum(0)[rank * 7:(rank + 1) * 7]
        if not np.allclose(rs.cpu().numpy(), expected):
            failures.append(f"reduce_scatter {algorithm}: {rs.tolist()} != {expected.tolist()}")
        b = torch.full((5,), float(rank), device=device)
        dist.broadcast(b, src=n - 1, algorithm=algorithm)
        if b.tolist() != [float(n - 1)] * 5:
            failures.append(f"broadcast {algorithm}: {b.tolist()}")
    bits = torch.tensor([1 << rank], dtype=torch.int32, device=device)
    try:
        dist.all_reduce(bits, op=dist.ReduceOp.BOR, algorithm="native")
        failures.append("native BOR on NCCL should be refused")
    except dist.UnsupportedError:
        pass
    dist.all_reduce(bits, op=dist.ReduceOp.BOR, algorithm="ring")
    if bits.item() != (1 << n) - 1:
        failures.append(f"ring BOR: {bits.item()}")
    dist.barrier()
    return failures


def _rank_main(rank: int, n: int, store_path: str, queue) -> None:
    try:
        import zerocomm.comm as dist
        os.environ["LOCAL_RANK"] = str(rank)
        store = torch.distributed.FileStore(store_path, n)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=60))
        queue.put((rank, _checks(rank, n)))
        dist.destroy_process_group()
    except Exception:
        queue.put((rank, [traceback.format_exc()]))


def _spawn(n: int) -> dict:
    import multiprocessing
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    store_path = os.path.join(tempfile.mkdtemp(), "store")
    processes = [context.Process(target=_rank_main, args=(r, n, store_path, queue)) for r in range(n)]
    for process in processes:
        process.start()
    results = dict(queue.get(timeout=300) for _ in processes)
    for process in processes:
        process.join(timeout=60)
    return results


@needs_gpu
def test_nccl_world_of_one():
    results = _spawn(1)
    assert results[0] == []


@needs_gpus
def test_nccl_every_gpu():
    results = _spawn(GPUS)
    failures = [f"rank {r}: {f}" for r, fs in results.items() for f in fs]
    assert not failures, "\n".join(failures)
