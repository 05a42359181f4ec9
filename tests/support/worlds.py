"""pytest glue for the rank pools: ``worlds()`` parameter lists and the session's pool registry.

A test asks for ranks with the indirect fixture ``world``::

    @pytest.mark.parametrize("world", worlds(), indirect=True)
    def test_x(world):
        assert world.run(fn) == [...]

``world`` is a pool (see harness.py) from a registry keyed by (backend, world size), created on
first use and kept for the session: ``"gloo"`` gives a ``ForkPool``, ``"mpi"`` an
``MpiexecPool``.  conftest.py orders the tests so that each pool serves one contiguous run of
tests; the registry then keeps only the ``max_alive`` most recently used pools running.
"""
from __future__ import annotations

import collections
import os

import pytest

from .harness import ForkPool, MpiexecPool, MpiUnavailable

MPI_SKIP_REASON = "needs mpi4py and mpiexec: pip install 'zerocomm[mpi]'"
STANDIN_MPI_SKIP_REASON = "the torch.distributed stand-in (ZEROCOMM_TEST_STANDIN=torch) has no MPI backend"
BACKENDS = ("gloo", "mpi")
STANDIN = os.environ.get("ZEROCOMM_TEST_STANDIN") == "torch"  # read here, not via .dist: stays import-light

TEST_TIMEOUT_S = 600
"""pytest-timeout's limit for a test that uses ``world``.  It is a last resort: ``pool.run``'s own
deadline (60 s unless the test says otherwise) fires first and names the ranks that are stuck."""


TIMEOUT_MARGIN_S = 15.0
"""How long before the test's pytest-timeout the pool stops waiting (stacks and kill take time)."""


def time_limit_of(item) -> float | None:
    """The pytest-timeout seconds of a test item (its ``timeout`` marker), or None."""
    marker = item.get_closest_marker("timeout")
    if marker is None:
        return None
    value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    return float(value) if value else None


def worlds(backends=BACKENDS, sizes=(1, 2, 3, 4)) -> list:
    """Parameters for ``@pytest.mark.parametrize("world", ..., indirect=True)``: ids like ``gloo-3``."""
    return [pytest.param((backend, size), id=f"{backend}-{size}") for backend in backends for size in sizes]


def world_key(item) -> tuple | None:
    """(backend index, world size) of a collected test that uses ``world``, else None."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or "world" not in callspec.params:
        return None
    backend, size = callspec.params["world"]
    return (BACKENDS.index(backend) if backend in BACKENDS else len(BACKENDS), backend, size)


class PoolRegistry:
    """Pools keyed by (backend, world size); each created on first use, all closed by ``close()``."""

    def __init__(self, tmp_path_factory, *, max_alive: int = 2):
        self._tmp = tmp_path_factory
        self._max_alive = max_alive
        self._pools: collections.OrderedDict = collections.OrderedDict()  # least recently used first
        self._mpi_missing: str | None = None

    def get(self, backend: str, world_size: int):
        key = (backend, world_size)
        if key not in self._pools:
            self._pools[key] = self._create(backend, world_size)
        self._pools.move_to_end(key)
        alive = [k for k, pool in self._pools.items() if pool.started and k != key]
        for old in alive[: max(0, len(alive) - (self._max_alive - 1))]:
            self._pools[old].close()  # its processes only; it restarts if asked again
        return self._pools[key]

    def _create(self, backend: str, world_size: int):
        workdir = self._tmp.mktemp(f"pool-{backend}-{world_size}", numbered=True)
        if backend != "mpi":
            return ForkPool(world_size, backend, workdir=workdir)
        if STANDIN:
            pytest.skip(reason=STANDIN_MPI_SKIP_REASON)
        if self._mpi_missing is None:
            try:
                return MpiexecPool(world_size, workdir=workdir)
            except MpiUnavailable as exc:
                self._mpi_missing = str(exc)
        pytest.skip(reason=f"{MPI_SKIP_REASON} ({self._mpi_missing})")

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
