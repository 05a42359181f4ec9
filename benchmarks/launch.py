"""Starting the benchmark's ranks, and telling each how to join the group.

Three ways in:

* under a launcher (``torchrun`` sets ``RANK``/``WORLD_SIZE``; ``mpiexec`` sets
  ``PMI_RANK``/``PMI_SIZE`` (MPICH) or ``OMPI_COMM_WORLD_RANK``/``..._SIZE`` (Open MPI)),
  this process is one rank and the launcher's numbering is used;
* locally with gloo (or NCCL): fork ``nprocs`` ranks that meet in a ``FileStore`` in a
  temporary folder (forking costs ~0.1 s, against seconds of ``import torch`` per
  spawned rank);
* locally with MPI: re-run the same command under ``mpiexec -n nprocs``, because MPI
  ranks must be started by MPI's launcher to share a world.

Nothing here imports a communication module: it only says which ``init_process_group``
arguments each rank passes (:class:`InitSpec`).
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

#: Set on processes that ``relaunch_under_mpiexec`` started, so a launcher whose
#: variables go unrecognized fails instead of relaunching again and again.
RELAUNCHED_ENV = "ZEROCOMM_BENCH_RELAUNCHED"

# (rank variable, size variable, local rank variable or None), most specific first.
_LAUNCHER_VARS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("mpiexec", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("mpiexec", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("mpiexec", "PMIX_RANK", "PMIX_SIZE", None),
)


@dataclass(frozen=True, slots=True)
class Launched:
    """This process was started by ``launcher`` as ``rank`` of ``world_size``."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int


@dataclass(frozen=True, slots=True)
class InitSpec:
    """Arguments of this rank's ``init_process_group`` call.

    ``init_method`` ``None`` (with ``rank``/``world_size`` ``None``) means "let the
    backend find its world", as the MPI backend does from ``MPI.COMM_WORLD``.
    ``local_rank`` picks the CUDA device for NCCL.
    """

    backend: str
    init_method: Optional[str]
    rank: Optional[int]
    world_size: Optional[int]
    local_rank: int

    def kwargs(self) -> dict[str, object]:
        """Keyword arguments for ``init_process_group`` (without ``timeout``)."""
        kwargs: dict[str, object] = {"backend": self.backend}
        if self.init_method is not None:
            kwargs.update(init_method=self.init_method, rank=self.rank, world_size=self.world_size)
        return kwargs


def detect_launcher(environ: Mapping[str, str]) -> Optional[Launched]:
    """The launcher that started this process, from its environment, or ``None``.

    Raises ``ValueError`` naming the variable when a launcher's variables are malformed
    (not integers, or a rank outside ``[0, size)``).
    """
    for launcher, rank_var, size_var, local_var in _LAUNCHER_VARS:
        if rank_var in environ and size_var in environ:
            try:
                rank, size = int(environ[rank_var]), int(environ[size_var])
                local = int(environ[local_var]) if local_var and local_var in environ else rank
            except ValueError as exc:
                raise ValueError(f"{launcher} variables are not integers: {rank_var}={environ[rank_var]!r}, "
                                 f"{size_var}={environ[size_var]!r}") from exc
            if not 0 <= rank < size:
                raise ValueError(f"{rank_var}={rank} is not in [0, {size_var}={size})")
            return Launched(launcher, rank, size, local)
    return None


def launched_spec(launched: Launched, backend: str) -> InitSpec:
    """How a rank started by a launcher joins: env:// under torchrun, MPI's world under
    mpiexec with the MPI backend, a TCP store that rank 0 opens otherwise.
    """
    if backend == "mpi":
        if launched.launcher != "mpiexec":
            raise ValueError(f"backend 'mpi' needs ranks started by mpiexec, not {launched.launcher}")
        return InitSpec(backend, None, None, None, launched.local_rank)
    if launched.launcher == "torchrun":
        return InitSpec(backend, "env://", launched.rank, launched.world_size, launched.local_rank)
    return InitSpec(backend, _mpi_tcp_rendezvous(), launched.rank, launched.world_size, launched.local_rank)


def _free_port(address: str = "127.0.0.1") -> int:
    """A port free on ``address`` (loopback unless ranks span hosts: nothing is opened on other interfaces)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def _mpi_tcp_rendezvous() -> str:
    """A ``tcp://`` address for gloo/NCCL ranks started by mpiexec.

    ``MASTER_ADDR``/``MASTER_PORT`` win when set; otherwise rank 0 picks a free port
    and MPI itself tells everyone (loopback when all ranks share one host).
    """
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise RuntimeError("ranks started by mpiexec with a non-MPI backend need MASTER_ADDR and "
                           "MASTER_PORT, or mpi4py to agree on them: pip install 'zerocomm[mpi]'") from exc
    world = MPI.COMM_WORLD
    hosts = world.allgather(socket.gethostname())
    # One host: loopback, and the store then listens on loopback only (see comm.process_group).
    address = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
    port = world.bcast(_free_port("127.0.0.1" if address == "127.0.0.1" else "") if world.Get_rank() == 0 else None,
                       root=0)
    return f"tcp://{address}:{port}"


def find_mpiexec() -> str:
    """Path of ``mpiexec``: the one beside this Python first (a venv's MPICH), then ``PATH``."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError("mpiexec is neither beside this Python nor on PATH; "
                            "pip install 'zerocomm[mpi]' (MPICH) or start the ranks with your own launcher")


def relaunch_under_mpiexec(nprocs: int, argv: list[str], *, module: str = "zerocomm.benchmarks",
                           env: Optional[Mapping[str, str]] = None) -> int:
    """Run ``python -m module *argv`` as ``nprocs`` MPI ranks (with ``env`` added); its exit status."""
    if os.environ.get(RELAUNCHED_ENV):
        raise RuntimeError("started by mpiexec but no rank variable (PMI_RANK, OMPI_COMM_WORLD_RANK, "
                           "PMIX_RANK) is set; this mpiexec is not supported")
    command = [find_mpiexec(), "-n", str(nprocs), sys.executable, "-m", module, *argv]
    return subprocess.call(command, env={**os.environ, **(env or {}), RELAUNCHED_ENV: "1"})


RankBody = Callable[[InitSpec], int]


def _child(body: RankBody, spec: InitSpec) -> None:
    """A forked rank: run ``body`` and leave with its status, never through the parent's exit path."""
    status = 1
    try:
        status = body(spec)
    except BaseException:  # a rank must report every failure, KeyboardInterrupt included
        sys.stderr.write(f"[rank {spec.rank}] " + traceback.format_exc())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _describe_exit(rank: int, exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        return f"rank {rank} was killed by signal {signal.Signals(-exitcode).name}"
    return f"rank {rank} exited with status {exitcode}"


def run_forked(nprocs: int, backend: str, body: RankBody, grace_s: float = 10.0) -> int:
    """Fork ``nprocs`` ranks that run ``body(spec)``; the worst exit status (0 if all succeeded).

    The ranks meet in a FileStore in a fresh temporary folder.  Once one rank fails the
    others get ``grace_s`` seconds to finish (they may be blocked in a collective with
    it), then are terminated; every failure is described on stderr.  Fork only from a
    process that has not initialized CUDA.
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="zerocomm-bench-") as folder:
        init_method = f"file://{os.path.join(folder, 'store')}"
        processes = {}
        for rank in range(nprocs):
            spec = InitSpec(backend, init_method, rank, nprocs, rank)
            process = context.Process(target=_child, args=(body, spec), name=f"rank {rank}")
            process.start()
            processes[process.sentinel] = (rank, process)
        try:
            return _wait_ranks(processes, grace_s)
        finally:
            for _, process in processes.values():
                if process.is_alive():
                    process.kill()
                process.join()


def _wait_ranks(processes: dict, grace_s: float) -> int:
    """Block until every rank exits, or ``grace_s`` after the first failure; the worst status."""
    pending = dict(processes)
    failures: list[str] = []
    first_failure: Optional[float] = None
    while pending:
        timeout = None if first_failure is None else max(0.0, first_failure + grace_s - time.monotonic())
        ready = multiprocessing.connection.wait(list(pending), timeout)
        if not ready:
            break
        for sentinel in ready:
            rank, process = pending.pop(sentinel)
            process.join()
            if process.exitcode != 0:
                failures.append(_describe_exit(rank, process.exitcode))
                first_failure = first_failure or time.monotonic()
    for rank, process in sorted(pending.values(), key=lambda item: item[0]):
        process.terminate()
        process.join(5.0)
        failures.append(f"rank {rank} was still running {grace_s:g} s after the first failure; terminated")
    for line in failures:
        sys.stderr.write(f"zerocomm-bench: {line}\n")
    return 1 if failures else 0


def run_world(command: str, args, body: Callable[[InitSpec], int]) -> int:
    """Run ``body(spec)`` on every rank of a ``--backend``/``--nprocs`` world; the worst exit status.

    Under a launcher this process is one rank; with MPI and no launcher the ``zerocomm-bench command``
    line (``args.argv``) runs again under ``mpiexec``; otherwise ``args.nprocs`` ranks are forked.
    """
    launched = detect_launcher(os.environ)
    if launched is not None:
        return body(launched_spec(launched, args.backend))
    if args.backend == "mpi":
        return relaunch_under_mpiexec(args.nprocs, [command, *args.argv])
    return run_forked(args.nprocs, args.backend, body)


def module_main(module, argv: Optional[list] = None) -> int:
    """``python -m zerocomm.benchmarks.<module>``: parse ``module``'s arguments and run it, as the CLI would."""
    import argparse
    name = module.__spec__.name if module.__spec__ is not None else module.__name__  # not "__main__" under -m
    parser = argparse.ArgumentParser(prog=f"python -m {name}", description=module.HELP)
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    return module.run(args)
