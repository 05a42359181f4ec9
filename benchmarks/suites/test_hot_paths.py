"""pytest-benchmark suite of the single-process hot paths: local reductions, 1-bit packing,
flattening and partitioning, bucket fill.

    python -m pytest benchmarks/suites -p no:cacheprovider --benchmark-only

Kept out of the test run (`python -m pytest tests` does not collect it).  Each case runs on one
thread (ranks share the cores in real runs) on 4 Mi elements unless it says otherwise.
"""
import pytest
import torch

from zerocomm.ops import (ErrorFeedback, flatten_tensors, onebit_padded_numel, pack_signs, partition_bounds,
                          reduce_, unpack_signs, unflatten_into)
from zerocomm.zero.gradients import GradientBucket
from zerocomm.zero.partition import plan_buckets

N = 1 << 22


@pytest.fixture(autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32], ids=str)
@pytest.mark.parametrize("op", ["sum", "max", "product"])
def test_reduce(benchmark, dtype, op):
    dst, src = torch.ones(N, dtype=dtype), torch.ones(N, dtype=dtype)
    benchmark(reduce_, dst, src, op)


def test_pack_signs(benchmark):
    x = torch.randn(N)
    benchmark(pack_signs, x)


def test_unpack_signs(benchmark):
    packed = pack_signs(torch.randn(N))
    benchmark(unpack_signs, packed, N)


def test_error_feedback_worker_step(benchmark):
    state = ErrorFeedback("bench")
    x = torch.randn(onebit_padded_numel(N, 4))
    benchmark(state.compensate_and_compress, x)


def test_onebit_fused_worker_step(benchmark):
    """The compressed all_reduce's worker step (one fused pass), sized for 4 ranks."""
    state = ErrorFeedback("bench")
    x = torch.randn(N)
    benchmark(state.worker_step, x, 4, 0)


def test_flatten_and_unflatten(benchmark):
    tensors = [torch.randn(1024, 256) for _ in range(16)]  # 4 Mi elements in 16 tensors

    def round_trip():
        unflatten_into(flatten_tensors(tensors, pad_to_multiple=64), tensors)

    benchmark(round_trip)


def test_partition_plan(benchmark):
    shapes = [(f"layer{i}.weight", (512, 512)) for i in range(64)] + [(f"layer{i}.bias", (512,)) for i in range(64)]
    benchmark(plan_buckets, shapes, 1 << 22, 8, 16)
    benchmark.extra_info["buckets"] = len(plan_buckets(shapes, 1 << 22, 8, 16))


def test_partition_bounds(benchmark):
    benchmark(partition_bounds, N + 7, 8)


def test_bucket_fill(benchmark):
    """Copy 16 gradients into one 4 Mi-element bucket, as the backward hooks do."""
    shapes = [(f"p{i}", (1024, 256)) for i in range(16)]
    layout = plan_buckets(shapes, N, 4, 16)[0]
    grads = [torch.randn(1024, 256) for _ in range(16)]
    buffer = torch.empty(layout.padded_numel)
    bucket = GradientBucket(layout, acquire=lambda _layout: buffer, reduce=lambda _layout, _buffer: None,
                            persistent=True)

    def fill():
        bucket.reset()
        bucket.begin()
        for position, grad in enumerate(grads):
            bucket.add(position, grad)

    benchmark(fill)
