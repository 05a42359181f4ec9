"""Tests of the rank pools themselves (support/harness.py), independent of zerocomm.

Forked pools initialize plain ``torch.distributed`` gloo through ``init=``; mpiexec pools
initialize nothing and use mpi4py directly, so these tests pass before ``zerocomm.comm`` exists.
Every function a pool runs is module-level: it travels pickled by reference.
"""
import os
import signal
import time

import pytest
import torch

from support.harness import ForkPool, MpiexecPool, MpiUnavailable, PoolTimeout, RankFailure, RankSetup
from support.worlds import MPI_SKIP_REASON

pytestmark = pytest.mark.timeout(300, method="signal")


# --- what the ranks run --------------------------------------------------------------------------

def init_torch_gloo(setup: RankSetup) -> None:
    """Initializes plain torch.distributed over the pool's FileStore (not zerocomm)."""
    torch.distributed.init_process_group("gloo", store=setup.store, rank=setup.rank,
                                         world_size=setup.world_size, timeout=setup.timeout)


def init_nothing(setup: RankSetup) -> None:
    """For mpiexec pools: the functions below import mpi4py themselves."""


def init_fails_on_rank_1(setup: RankSetup) -> None:
    if setup.rank == 1:
        raise OSError("rank 1 cannot initialize")


def rank_and_sum(scale):
    """Returns (rank, pid, sum over ranks of (rank + 1) * scale)."""
    if torch.distributed.is_initialized():
        rank = torch.distributed.get_rank()
        t = torch.tensor([(rank + 1) * scale])
        torch.distributed.all_reduce(t)
        return rank, os.getpid(), int(t.item())
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    return rank, os.getpid(), MPI.COMM_WORLD.allreduce((rank + 1) * scale)


def raise_on(bad_rank, message):
    rank = _rank()
    if rank == bad_rank:
        raise ValueError(f"{message} (rank {rank})")
    return rank


def signal_on(bad_rank, signum):
    if _rank() == bad_rank:
        os.kill(os.getpid(), signum)
        time.sleep(10)  # the signal arrives first
    return _rank()


def exit_on(bad_rank, code):
    if _rank() == bad_rank:
        os._exit(code)
    return _rank()


def sleep_on(slow_rank, seconds):
    if _rank() == slow_rank:
        time.sleep(seconds)
    return _rank()


def return_unpicklable():
    return lambda: None


def pid():
    return os.getpid()


def _rank():
    if torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))


# --- fixtures ----------------------------------------------------------------------------------

def _make_pool(kind, world_size, workdir, init=None):
    if kind == "fork":
        return ForkPool(world_size, workdir=workdir, init=init or init_torch_gloo, init_timeout_s=30)
    try:
        return MpiexecPool(world_size, workdir=workdir, init=init or init_nothing, init_timeout_s=60)
    except MpiUnavailable:
        pytest.skip(reason=MPI_SKIP_REASON)


@pytest.fixture(scope="module", params=["fork", "mpiexec"])
def pool(request, tmp_path_factory):
    """A pool of 2 ranks shared by the tests of this module (each test leaves it usable)."""
    with _make_pool(request.param, 2, tmp_path_factory.mktemp(f"harness-{request.param}")) as created:
        yield created


# --- tests -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fork", "mpiexec"])
@pytest.mark.parametrize("world_size", [1, 3])
def test_results_come_back_per_rank(kind, world_size, tmp_path):
    with _make_pool(kind, world_size, tmp_path) as pool:
        results = pool.run(rank_and_sum, 10)
        assert [rank for rank, _, _ in results] == list(range(world_size))
        assert {total for _, _, total in results} == {10 * world_size * (world_size + 1) // 2}
        assert [p for _, p, _ in results] == pool.pids
        assert len(set(pool.pids)) == world_size


def test_reuse_keeps_the_same_processes(pool):
    first = pool.run(pid)
    second = pool.run(rank_and_sum, scale=2)  # keyword arguments reach fn too
    assert first == [p for _, p, _ in second] == pool.pids
    assert [total for _, _, total in second] == [6, 6]


def test_an_exception_names_the_rank_and_carries_its_traceback(pool):
    before = pool.pids
    with pytest.raises(RankFailure) as caught:
        pool.run(raise_on, 1, "boom")
    failure = caught.value
    assert (failure.rank, failure.exc_type_name) == (1, "ValueError")
    assert set(failure.failures) == {1}
    text = str(failure)
    assert "rank 1" in text and "ValueError" in text and "boom (rank 1)" in text
    assert "Traceback" in text and "in raise_on" in text  # the rank's own traceback
    assert not pool.started  # killed, because ranks may be out of step after a failure
    assert pool.run(raise_on, 5, "unused") == [0, 1]  # recreated lazily
    assert set(pool.pids).isdisjoint(before)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSEGV])
def test_a_rank_killed_by_a_signal_is_reported(pool, signum):
    with pytest.raises(RankFailure) as caught:
        pool.run(signal_on, 1, signum)
    failure = caught.value
    name = signal.Signals(signum).name
    assert failure.rank == 1 and failure.exc_type_name is None
    assert failure.signal_name == name, str(failure)
    assert "rank 1" in str(failure) and f"died from signal {name}" in str(failure)
    if signum == signal.SIGSEGV:
        assert "signal_on" in str(failure)  # the stack faulthandler wrote as the rank crashed
    assert pool.run(pid) == pool.pids


def test_an_exit_code_is_reported(pool):
    with pytest.raises(RankFailure) as caught:
        pool.run(exit_on, 0, 3)
    assert caught.value.rank == 0
    text = str(caught.value)
    assert "rank 0" in text
    # mpiexec reports an exit code only once every rank ended; the idle rank 1 has not
    assert ("exited with code 3" in text) if pool.kind == "fork" else ("closed its connection" in text)
    assert pool.run(pid) == pool.pids


def test_a_timeout_names_the_silent_ranks_and_shows_their_stacks(pool):
    before = pool.pids
    started = time.monotonic()
    with pytest.raises(PoolTimeout) as caught:
        pool.run(sleep_on, 1, 60, timeout=1.0)
    assert time.monotonic() - started < 15
    failure = caught.value
    assert failure.ranks == [1] and failure.rank == 1
    text = str(failure)
    assert "timed out after 1.0 s" in text and "ranks [1] had not answered" in text
    assert "sleep_on" in text  # the Python stack the rank wrote on SIGUSR1
    assert set(pool.run(pid)).isdisjoint(before)  # a fresh pool
    assert all(_gone(old) for old in before)  # and the old processes are dead


def _gone(process_id, timeout=5.0):
    """True once ``process_id`` no longer runs (absent, or a zombie awaiting its reaper)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{process_id}/stat") as stat:
                if stat.read().rsplit(") ", 1)[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_an_unpicklable_function_is_refused_before_sending(pool):
    before = pool.pids
    with pytest.raises(TypeError, match="module-level function"):
        pool.run(lambda: 1)
    assert pool.pids == before  # nothing was sent, so the pool lives on


def test_an_unpicklable_result_is_reported(pool):
    with pytest.raises(RankFailure, match="cannot be pickled"):
        pool.run(return_unpicklable)
    assert pool.run(pid) == pool.pids


@pytest.mark.parametrize("kind", ["fork", "mpiexec"])
def test_an_initialization_failure_names_the_rank(kind, tmp_path):
    with _make_pool(kind, 2, tmp_path, init=init_fails_on_rank_1) as pool:
        with pytest.raises(RankFailure) as caught:
            pool.run(pid)
        assert caught.value.rank == 1 and caught.value.exc_type_name == "OSError"
        assert "init failed: rank 1 cannot initialize" in str(caught.value)
        assert "init_fails_on_rank_1" in str(caught.value)


def test_the_test_time_limit_caps_every_wait(pool):
    pool.deadline_limit = time.monotonic() + 2.0
    try:
        started = time.monotonic()
        with pytest.raises(PoolTimeout, match="what the test's pytest-timeout left of timeout=60"):
            pool.run(sleep_on, 0, 60, timeout=60)
        assert time.monotonic() - started < 10
    finally:
        pool.deadline_limit = None
    assert pool.run(pid) == pool.pids


@pytest.mark.timeout(100, method="signal")
@pytest.mark.parametrize("world", [("gloo", 1)], indirect=True)
def test_the_world_fixture_stops_waiting_before_pytest_timeout(world):
    """Only reads the pool's limit: starts no process, so it needs no zerocomm."""
    from support.worlds import TIMEOUT_MARGIN_S

    assert 0 < world.deadline_limit - time.monotonic() <= 100 - TIMEOUT_MARGIN_S
