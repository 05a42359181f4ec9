"""The call path stays short: the zerocomm files one blocking collective enters, counted by tracing it.

A reader follows ``zerocomm.comm.all_reduce`` to the bytes moving through these files and no
others.  The first call of a cell passes the checks (validate), which admit the cell to the short
path; from then on a native call goes from the public function (api) to the group that orders and
runs it and checks that every rank makes the same call (group), then to the backend -- on one host
gloo's mismatch check is a sync of the shared segment (shm) -- and a ring call adds the ring.  A small
native call whose tensor rides in the check's own message (MPI's) runs the group's steps in C
(``_shortpath.c``), which calls the backend's C rider (the check in ``_mpicheck.c``, its wait in ``_mpifast.c``):
C files count like the others.  Each
rank traces one steady-state call (after a warm-up that fills the selection cache) with
``sys.setprofile`` and lists the files of every Python function it entered.
"""
import os
import sys

import pytest
import torch

from support.check_place import checks_through_the_backend
from support.worlds import worlds

import zerocomm
import zerocomm.comm as dist

PACKAGE = os.path.dirname(os.path.abspath(zerocomm.__file__))
MAX_FILES = {"native": 4, "ring": 5, "shm": 5}
#: A zerocomm C function the call entered -> its source file.  The short path in C calls the backend's
#: rider through a capsule, C to C, where no profile sees it: where the call ran in C, the rider's file counts.
C_SOURCES = {"zerocomm.comm._shortpath": ("comm/_shortpath.c",)}
C_RIDERS = {"mpi": ("comm/backends/_mpicheck.c", "comm/backends/_mpifast.c")}


def files_entered(algorithm: str, numel: int):
    """Relative paths of the zerocomm files one blocking all_reduce with ``algorithm`` enters."""
    tensor = torch.ones(numel)
    for _ in range(3):
        dist.all_reduce(tensor, algorithm=algorithm)
    seen = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith(".py"):  # not "<string>" (generated code)
            path = os.path.abspath(frame.f_code.co_filename)
            if path.startswith(PACKAGE + os.sep):
                seen.add(os.path.relpath(path, PACKAGE))
        elif event == "c_call" and getattr(arg, "__module__", None) in C_SOURCES:  # a zerocomm C extension
            seen.update(C_SOURCES[arg.__module__])

    sys.setprofile(profile)
    try:
        dist.all_reduce(tensor, algorithm=algorithm)
    finally:
        sys.setprofile(None)
    if "comm/_shortpath.c" in seen and "comm/group.py" not in seen:  # it ran in C: through the backend's rider
        seen.update(C_RIDERS[dist.get_backend()])
    return sorted(seen)


def call_paths():
    from zerocomm.comm.group import WORLD
    # Rows made afresh: a riding row an earlier test of this pool made (check off, or checks through the
    # backend) would route the world's calls through the C short path first; a riding row made now still does.
    WORLD.default.short.clear()
    WORLD.rides = False
    # 8 B, and 4 MiB in 64 KiB segments: the ring's multi-segment path too.
    dist.configure(segment_bytes=64 << 10)
    try:
        return {(algorithm, numel): files_entered(algorithm, numel) for algorithm in MAX_FILES
                for numel in (2, 1 << 20)}
    finally:
        dist.configure(segment_bytes=4 << 20)


@pytest.mark.parametrize("world", worlds(("gloo", "mpi"), (2,)), indirect=True)
def test_one_blocking_call_enters_few_files(world):
    for rank, paths in enumerate(world.run(call_paths)):
        for (algorithm, numel), files in paths.items():
            where = (rank, algorithm, numel, files)
            assert "comm/api.py" in files, where
            assert {"comm/group.py", "comm/_shortpath.c"} & set(files), where  # the short path, in Python or C
            if algorithm == "shm":  # steps in shared memory: the backend moved bytes only when the arena was made
                assert {"comm/algorithms/shm.py", "comm/shm.py"} <= set(files), where
            else:
                assert any(f.startswith("comm/backends/") for f in files), where
            assert len(files) <= MAX_FILES[algorithm], where
            if algorithm == "ring":
                assert "comm/algorithms/ring.py" in files, where


def small_native_path():
    from zerocomm.comm.group import WORLD
    built = sys.modules["zerocomm.comm.group"]._shortpath is not None and WORLD.default.communicator._fast is not None
    with checks_through_the_backend(WORLD.default):  # as across hosts (on one host the segment checks)
        return files_entered("native", 2), built


@pytest.mark.parametrize("world", worlds(("mpi",), (2,)), indirect=True)
def test_a_small_native_mpi_call_runs_in_c_from_the_public_function(world):
    """Where checks go through MPI (a group across hosts), the tensor rides in MPI's mismatch check: the group's
    steps and the check run in C, no Python between."""
    for rank, (files, built) in enumerate(world.run(small_native_path)):
        if not built:
            pytest.skip("the _shortpath or _mpifast extension was not built or bound (no compiler, or not MPICH)")
        assert files == ["comm/_shortpath.c", "comm/api.py", "comm/backends/_mpicheck.c", "comm/backends/_mpifast.c"], \
            (rank, files)
        assert len(files) <= MAX_FILES["native"], (rank, files)
