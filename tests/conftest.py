"""Shared fixtures: the session's rank pools and the ``world`` fixture (see support/worlds.py).

Only torch is imported here: the test process forks ranks, so it must stay light and must never
touch CUDA.  It also never starts torch's OpenMP thread team: a child forked after the parent ran a
parallel kernel hangs in its own first parallel kernel (GNU OpenMP is not fork-safe; seen as a
rank stuck in ``torch.full`` of 64K elements).  One intra-op thread, set before any kernel runs and
inherited by every forked rank, keeps every kernel off the team — and ranks that share 2 cores
gain nothing from more.
"""
import os
import sys
import time

import pytest
import torch

torch.set_num_threads(1)

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:  # makes `support` importable from every test folder
    sys.path.insert(0, _TESTS_DIR)

from support import mpich_segments  # noqa: E402
from support.worlds import TEST_TIMEOUT_S, TIMEOUT_MARGIN_S, PoolRegistry, time_limit_of, world_key  # noqa: E402


@pytest.fixture(scope="session")
def pool_registry(tmp_path_factory):
    started = time.time()
    registry = PoolRegistry(tmp_path_factory)
    yield registry
    registry.close()
    mpich_segments.remove_orphaned(started)


@pytest.fixture(scope="module", autouse=True)
def _mpich_segments_of_killed_jobs():
    """After each module: MPICH's segments its killed or aborted jobs left in /dev/shm (fault tests kill
    ranks on purpose; MPICH unlinks a segment only once every local rank has mapped it)."""
    started = time.time()
    yield
    mpich_segments.remove_orphaned(started)


@pytest.fixture
def world(request, pool_registry):
    """A pool of ranks with their default group initialized; parametrize indirectly with
    ``worlds(...)`` or ``("gloo", 2)``.  Its waits end before the test's pytest-timeout does, so
    a stuck test fails with the pool's message naming the stuck ranks."""
    if not hasattr(request, "param"):
        raise pytest.UsageError('use @pytest.mark.parametrize("world", worlds(...), indirect=True)')
    backend, world_size = request.param
    pool = pool_registry.get(backend, world_size)
    limit = time_limit_of(request.node)
    pool.deadline_limit = None if limit is None else time.monotonic() + limit - TIMEOUT_MARGIN_S
    yield pool
    pool.deadline_limit = None


def pytest_collection_modifyitems(config, items):
    """Run the tests of one world back to back, and give each a pytest-timeout of last resort."""
    for item in items:
        if "world" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S, method="signal"))
    order = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda item: (world_key(item) or (-1,), order[id(item)]))
