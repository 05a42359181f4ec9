"""pytest-benchmark suite of collectives on long-lived ranks: 2 gloo ranks, all_reduce.

    python -m pytest benchmarks/suites -p no:cacheprovider --benchmark-only

The ranks are a ``ForkPool`` of the tests' harness, started once for the module and kept: one
benchmark round sends a task to both ranks, which meet at a barrier and make ``CALLS`` back-to-back
all_reduces (nccl-tests' loop).  pytest-benchmark's time is that round seen from this process:
``CALLS`` calls plus one dispatch to the pool (``extra_info["dispatch_us"]``, a round of an empty
task, measured alike; tens to hundreds of µs against milliseconds of calls).
``extra_info["per_call_us"]`` is the number to compare with ``zerocomm-bench``: the mean per call
measured inside the ranks, the maximum over ranks; ``busbw_GBps`` follows from it.
"""
import datetime
import time

import pytest
import torch

from support.harness import ForkPool, RankSetup

WORLD = 2
ROUNDS = 5
CASES = [  # (bytes, calls per round): enough calls that a round takes tens of ms
    (8, 50),
    (1 << 20, 20),
]


def init_rank(setup: RankSetup) -> None:
    """One torch thread per rank (they share the cores), then zerocomm's default group."""
    import zerocomm.comm as dist

    torch.set_num_threads(1)
    dist.init_process_group(setup.backend, store=setup.store, rank=setup.rank, world_size=setup.world_size,
                            timeout=setup.timeout)


def timed_all_reduces(numel: int, algorithm: str, calls: int) -> float:
    """One round on a rank: a barrier, then ``calls`` back-to-back all_reduces; seconds per call."""
    import zerocomm.comm as dist

    tensor = torch.ones(numel)
    dist.all_reduce(tensor, algorithm=algorithm)  # first call: buffers and algorithm state warm
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(tensor, algorithm=algorithm)
    return (time.perf_counter() - start) / calls


def nothing() -> None:
    return None


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    pool = ForkPool(WORLD, "gloo", workdir=tmp_path_factory.mktemp("suite-pool"), init=init_rank,
                    op_timeout_s=datetime.timedelta(seconds=120).total_seconds())
    with pool:
        pool.start()
        yield pool
        # Every benchmark ran on the ranks started here: a restart (after a failure) would have
        # timed a launch again, so it fails the suite.
        assert pool.generation == 1, f"the ranks were started {pool.generation} times"


def _dispatch_us(pool) -> float:
    """The pool's own cost of one round (an empty task), median of 20, in µs."""
    samples = []
    for _ in range(20):
        start = time.perf_counter()
        pool.run(nothing)
        samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2] * 1e6


@pytest.mark.parametrize("size, calls", CASES, ids=[f"{size}B" for size, _ in CASES])
@pytest.mark.parametrize("algorithm", ["native", "ring", "tree", "recursive_doubling"])
def test_all_reduce_two_ranks(benchmark, ranks, algorithm, size, calls):
    numel = max(1, size // 4)
    per_round: list[float] = []

    def one_round() -> None:
        per_round.append(max(ranks.run(timed_all_reduces, numel, algorithm, calls)))

    benchmark.pedantic(one_round, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    per_call = sorted(per_round)[len(per_round) // 2]
    assert per_call > 0
    benchmark.extra_info.update(calls_per_round=calls, per_call_us=per_call * 1e6,
                                busbw_GBps=numel * 4 / per_call / 1e9 * 2 * (WORLD - 1) / WORLD,
                                dispatch_us=_dispatch_us(ranks))
