"""ZeRO on CUDA tensors over NCCL: stages 0-3 x fp32/bf16/fp16 x clipping on/off against a data-parallel
reference, checkpoint save/load, optimizer offload to the host (ZeRO-Offload), stage 3's parameter shards in
host memory (offload_param "cpu"), and the object collectives.

World size 1 on one GPU, and world size = the number of GPUs when there are at least 2; ranks are started
with spawn (CUDA cannot be forked).  Without a CUDA device the module skips at collection, decided
without initializing CUDA (torch's CPU wheel has no CUDA at all).  The rank-side code is in
support/zero_cuda_checks.py.
"""
from __future__ import annotations

import multiprocessing
import os
import tempfile

import pytest
import torch

GPUS = torch.cuda.device_count() if torch.backends.cuda.is_built() else 0
if GPUS < 1:
    pytest.skip(reason="needs a CUDA device (none on this machine)", allow_module_level=True)

from support import zero_cuda_checks  # noqa: E402

CHECKS = ("training", "checkpoint", "offload", "param_offload", "objects")


def _spawn(n: int, checks: tuple) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    store_path = os.path.join(tempfile.mkdtemp(), "store")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, inherited by the ranks
    processes = [context.Process(target=zero_cuda_checks.rank_main, args=(r, n, store_path, queue, checks))
                 for r in range(n)]
    for process in processes:
        process.start()
    results = dict(queue.get(timeout=900) for _ in processes)
    for process in processes:
        process.join(timeout=60)
    return results


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("check", CHECKS)
def test_zero_on_one_gpu_with_nccl(check):
    failures = _spawn(1, (check,))[0]
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(1200)
@pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA devices ({GPUS} on this machine)")
@pytest.mark.parametrize("check", CHECKS)
def test_zero_on_every_gpu_with_nccl(check):
    results = _spawn(GPUS, (check,))
    failures = [f"rank {rank}: {f}" for rank, fs in results.items() for f in fs]
    assert not failures, "\n".join(failures)
