"""CUDA tensors on host backends: several ranks on one GPU over zerocomm's gloo (staged through pinned host
memory), ZeRO 1-3 at 2 and 3 such ranks against data-parallel training, and torch's DDP on the c10d backend
"zerocomm" at 2 ranks on one GPU (staged) and at world size 1 (NCCL).

Ranks are started with spawn (CUDA cannot be forked) and all use cuda:0.  Without a CUDA device the module skips
at collection, decided without initializing CUDA.  The rank-side code is in support/cuda_staging_checks.py.
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

from support import cuda_staging_checks  # noqa: E402


def _spawn(n: int, check: str) -> list:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    store_path = os.path.join(tempfile.mkdtemp(), "store")
    processes = [context.Process(target=cuda_staging_checks.rank_main, args=(r, n, store_path, queue, check))
                 for r in range(n)]
    for process in processes:
        process.start()
    try:
        results = dict(queue.get(timeout=600) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    return [f"rank {rank}: {failure}" for rank, failures in sorted(results.items()) for failure in failures]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("n", [2, 3])
def test_cuda_collectives_on_gloo_ranks_sharing_one_gpu(n):
    failures = _spawn(n, "collectives")
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("n", [2, 3])
def test_cuda_zero_stages_on_gloo_ranks_sharing_one_gpu_match_data_parallel(n):
    failures = _spawn(n, "zero_against_data_parallel")
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("n", [1, 2], ids=["nccl-world-of-one", "two-ranks-one-gpu-staged"])
def test_cuda_ddp_on_the_zerocomm_c10d_backend(n):
    failures = _spawn(n, "ddp_on_c10d")
    assert not failures, "\n".join(failures)
