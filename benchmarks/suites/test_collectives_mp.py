"""A small multi-process pytest-benchmark suite: 2 forked gloo ranks, all_reduce of 1 MiB.

    python -m pytest benchmarks/suites -p no:cacheprovider --benchmark-only

One benchmark round starts a 2-rank world (fork + FileStore), runs ``CALLS`` all_reduces and exits,
so pytest-benchmark's own times include start-up; ``extra_info["per_call_us"]`` holds the per-call
time measured inside the ranks (mean of back-to-back calls, max over ranks), the number to compare.
"""
import datetime
import multiprocessing
import os
import tempfile
import time

import pytest
import torch

CALLS = 20
NUMEL = 1 << 18  # 1 MiB of float32


def _rank(rank: int, world: int, store_path: str, algorithm: str, queue) -> None:
    import zerocomm.comm as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=torch.distributed.FileStore(store_path, world), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    tensor = torch.ones(NUMEL)
    dist.all_reduce(tensor, algorithm=algorithm)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(CALLS):
        dist.all_reduce(tensor, algorithm=algorithm)
    queue.put((time.perf_counter() - start) / CALLS * 1e6)
    dist.destroy_process_group()


def _world(algorithm: str, world: int = 2) -> float:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    store_path = os.path.join(tempfile.mkdtemp(), "store")
    ranks = [context.Process(target=_rank, args=(r, world, store_path, algorithm, queue)) for r in range(world)]
    for process in ranks:
        process.start()
    per_call = max(queue.get(timeout=120) for _ in ranks)
    for process in ranks:
        process.join(timeout=60)
    return per_call


@pytest.mark.parametrize("algorithm", ["native", "ring", "tree", "recursive_doubling"])
def test_all_reduce_1mib_two_ranks(benchmark, algorithm):
    per_call = benchmark.pedantic(_world, args=(algorithm,), rounds=3, iterations=1)
    benchmark.extra_info["per_call_us"] = per_call
    benchmark.extra_info["busbw_GBps"] = NUMEL * 4 / (per_call * 1e-6) / 1e9  # 2(n-1)/n = 1 at n = 2
