"""Starting MPI for zerocomm: ``MPI_Init_thread`` with a deadline, ``MPI_Abort`` on an uncaught exception,
and binding the backend's optional C hot loop (``_mpifast``) to the loaded MPICH library.

Called once, by ``init_process_group("mpi")`` and the MPI backend (``mpi.py``) as it makes its
communicator; nothing here is on a collective's path.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from typing import List, Optional

from ..errors import CommError, CommTimeoutError

try:
    from . import _mpifast  # the MPI backend's optional C hot loop (see mpi.py's note)
except ImportError:  # not built (no compiler at install time): everything runs through mpi4py
    _mpifast = None


def _mpi():
    from mpi4py import MPI  # imported lazily: `import zerocomm.comm` must not need mpi4py
    return MPI


def loaded_libmpi() -> Optional[str]:
    """The path of the MPI library this process has loaded (mpi4py's), or ``None``."""
    with open("/proc/self/maps") as maps:
        return next((line.split()[-1] for line in maps if "/libmpi" in line and ".so" in line), None)


def bind_extension(MPI) -> bool:
    """Whether ``_mpifast`` is bound to the loaded MPICH library (see the note on the C hot loop); tried once."""
    if not _BOUND:
        _BOUND.append(_mpifast is not None and _try_to_bind(MPI))
    return _BOUND[0]


_BOUND: List[bool] = []


def _try_to_bind(MPI) -> bool:
    path = loaded_libmpi()
    # MPICH's int handles (mpi4py writes a negative one sign-extended to 64 bits, as unsigned).
    handles = (MPI.COMM_WORLD.handle, MPI.FLOAT.handle, MPI.SUM.handle, MPI.BYTE.handle)
    ints = all(isinstance(h, int) and (h < 2**31 or h >= 2**64 - 2**31) for h in handles)
    if path is None or not MPI.Get_library_version().startswith("MPICH") or not ints or \
            MPI.REQUEST_NULL.handle != 0x2c000000:
        return False  # another ABI (Open MPI's handles are pointers)
    try:
        _mpifast.bind(path, MPI.BYTE.handle)
    except OSError:
        return False
    return True


# -- init with a deadline, and abort on an uncaught exception (see docs/failures.md) ------------------------

def init_mpi_within(seconds: float) -> None:
    """Initialize MPI (``MPI_THREAD_MULTIPLE``) unless it is, raising ``CommTimeoutError`` after ``seconds``.

    ``MPI_Init`` waits for every rank of the job to start, forever, and mpi4py calls it without
    releasing the GIL; so it is called here through ``ctypes`` (which releases it) on a daemon
    thread, and this thread waits with the deadline.  A rank that never starts then makes the
    others fail by the deadline instead of hanging in init.  Also installs the abort hook.
    """
    if "mpi4py.MPI" not in sys.modules:
        try:
            import mpi4py
        except ImportError:
            return  # mpi_available() says why
        mpi4py.rc.initialize = False  # zerocomm initializes, below; mpi4py still finalizes at exit
        mpi4py.rc.finalize = True
        mpi4py.rc.thread_level = "multiple"
    try:
        MPI = _mpi()
    except Exception:
        return  # mpi_available() says why
    if not MPI.Is_initialized():
        _init_thread_multiple(MPI, seconds)
    _install_abort_hook()


def _init_thread_multiple(MPI, seconds: float) -> None:
    path = loaded_libmpi()
    if path is None:  # no loaded library to call: mpi4py's own call, without a deadline
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        return
    library = ctypes.CDLL(path)
    provided = ctypes.c_int(-1)
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(library.MPI_Init_thread(
        None, None, MPI.THREAD_MULTIPLE, ctypes.byref(provided))), name="zerocomm-mpi-init", daemon=True)
    start = time.monotonic()
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMIX_RANK")
        raise CommTimeoutError(
            f"rank {rank if rank is not None else '?'}: init_process_group('mpi') timed out after "
            f"{(time.monotonic() - start) * 1000:.0f} ms (deadline {seconds * 1000:.0f} ms) in MPI_Init: not every "
            "rank of the MPI job started MPI (a rank that crashed or hangs before init_process_group)")
    if outcome != [0]:
        raise CommError(f"init_process_group('mpi'): MPI_Init_thread failed with error code {outcome}")


def _install_abort_hook() -> None:
    """Make an uncaught exception end the whole MPI job (``MPI_Abort``) instead of leaving the other ranks
    waiting for this one until their deadline; the previous ``sys.excepthook`` runs first (it prints)."""
    if getattr(sys.excepthook, "zerocomm_mpi_abort", False):
        return
    previous = sys.excepthook

    def abort_on_uncaught(kind, value, traceback) -> None:
        previous(kind, value, traceback)
        MPI = _mpi()
        if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
            sys.stderr.write(f"zerocomm: uncaught {kind.__name__} on MPI rank {MPI.COMM_WORLD.Get_rank()}: "
                             "calling MPI_Abort so that the other ranks do not wait for this one\n")
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(1)

    abort_on_uncaught.zerocomm_mpi_abort = True
    sys.excepthook = abort_on_uncaught


def shared_store(comm, one_host: bool, timeout):
    """A TCPStore that every rank of ``comm`` (an mpi4py communicator) reaches: rank 0 serves it on a free port
    (on loopback when every rank is on its host), the address travels by ``MPI_Bcast``.  torch's default
    group, made over an MPI world, keeps it as its store (torch's ``new_group`` and libraries read it)."""
    import socket
    import torch.distributed as td
    if comm.Get_rank() == 0:
        host = "127.0.0.1" if one_host else socket.getfqdn()
        store = td.TCPStore(host, 0, comm.Get_size(), True, timeout, wait_for_workers=False)
        comm.bcast((host, store.port), root=0)
        return store
    host, port = comm.bcast(None, root=0)
    return td.TCPStore(host, port, comm.Get_size(), False, timeout)
