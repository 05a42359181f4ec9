"""Which communication module the benchmarks drive, read from the environment in one place.

By default that is ``zerocomm.comm``, through its public, ``torch.distributed``-shaped
API only.  ``ZEROCOMM_BENCH_STANDIN=torch`` substitutes ``torch.distributed`` itself, and
``ZEROCOMM_BENCH_STANDIN=mpi4py`` MPICH's own collectives through mpi4py (``mpi4py_standin``):
baselines to compare against.  A stand-in knows no ``algorithm=`` keyword, so
:func:`algorithm_kwargs` leaves it out of the stand-in's ``"native"`` calls.
"""
from __future__ import annotations

import dataclasses
import os
from types import ModuleType
from typing import Mapping, Optional

#: Environment variable that selects the module under measurement.
STANDIN_ENV = "ZEROCOMM_BENCH_STANDIN"
_CHOICES = ("zerocomm", "torch", "mpi4py")


def target_name(environ: Optional[Mapping[str, str]] = None) -> str:
    """``"zerocomm"``, ``"torch"`` or ``"mpi4py"``, from ``ZEROCOMM_BENCH_STANDIN`` (unset or empty = zerocomm)."""
    environ = os.environ if environ is None else environ
    name = environ.get(STANDIN_ENV, "").strip().lower() or "zerocomm"
    if name not in _CHOICES:
        raise ValueError(f"{STANDIN_ENV}={environ.get(STANDIN_ENV)!r}; expected one of "
                         f"{', '.join(_CHOICES)} (or unset for zerocomm)")
    return name


def comm_module() -> ModuleType:
    """The module whose collectives are measured (``zerocomm.comm``, ``torch.distributed`` or MPICH's)."""
    if target_name() == "torch":
        import torch.distributed as dist

        return dist
    if target_name() == "mpi4py":
        from . import mpi4py_standin

        return mpi4py_standin
    from .. import comm

    if not hasattr(comm, "init_process_group"):
        raise RuntimeError(f"zerocomm.comm has no init_process_group yet; set {STANDIN_ENV}=torch "
                           f"to benchmark torch.distributed instead")
    return comm


def is_standin(dist: ModuleType) -> bool:
    """True when ``dist`` is a stand-in (torch.distributed, mpi4py) rather than zerocomm.comm."""
    return dist.__name__ in ("torch.distributed", f"{__package__}.mpi4py_standin")


def default_algorithms(dist: ModuleType) -> tuple[str, ...]:
    """Algorithms a run compares when ``--algorithms`` is not given: a stand-in has only its own."""
    return ("native",) if is_standin(dist) else ("native", "ring", "tree")


def algorithm_kwargs(dist: ModuleType, algorithm: str) -> dict[str, str]:
    """Keyword arguments that select ``algorithm`` on a collective call of ``dist``.

    Always explicit for zerocomm, whose calls without ``algorithm=`` follow the process
    default (``ZEROCOMM_ALGORITHM``, "auto" when unset), not the backend's own; none for
    torch's ``"native"``, since torch knows no such keyword.
    """
    return {} if is_standin(dist) and algorithm == "native" else {"algorithm": algorithm}


def unsupported_errors(dist: ModuleType) -> tuple[type[BaseException], ...]:
    """Exception types meaning "this cell is not supported", raised alike on every rank
    before any byte moves, so a benchmark may skip the cell and go on.  torch has none
    such: its errors end the run.
    """
    error = getattr(dist, "UnsupportedError", None)
    return (error,) if isinstance(error, type) and issubclass(error, BaseException) else ()


def check_algorithms(dist: ModuleType, names) -> None:
    """Raise ``ValueError`` naming every entry of ``names`` that ``dist`` does not accept as
    ``algorithm=``; checked in the parent, before any rank starts.

    torch accepts only its own (``"native"``, no keyword).  zerocomm's list is its config's: each
    name is tried on a copy of the process-wide config (``dist.configure()`` with no fields
    returns it unchanged), whose validation quotes the accepted values.
    """
    if is_standin(dist):
        bad = [name for name in names if name != "native"]
        if bad:
            raise ValueError(f"unknown algorithm(s) {', '.join(map(repr, bad))} on the {target_name()} stand-in "
                             f"({STANDIN_ENV}={target_name()}); expected native")
        return
    config = dist.configure()
    complaints = []
    for name in names:
        try:
            dataclasses.replace(config, algorithm=name)
        except ValueError as exc:
            complaints.append((name, str(exc)))
    if complaints:
        raise ValueError(f"unknown algorithm(s) {', '.join(repr(name) for name, _ in complaints)}: "
                         f"{complaints[0][1]}")


def check_comm_environment(dist: ModuleType, environ: Optional[Mapping[str, str]] = None) -> None:
    """Read zerocomm.comm's environment variables as every rank will at init, here in the parent.

    Raises ``ValueError`` quoting every ``ZEROCOMM_*`` variable that is set, with the comm layer's
    own complaint, so that ``ZEROCOMM_ALGORITHM=foo`` stops the benchmark before any rank starts.
    The reader is the one ``init_process_group`` uses: ``from_env`` of the config class that the
    public ``configure()`` returns.
    """
    environ = os.environ if environ is None else environ
    try:
        type(dist.configure()).from_env(environ)
    except (ValueError, TypeError) as exc:
        settings = ", ".join(f"{k}={v!r}" for k, v in sorted(environ.items()) if k.startswith("ZEROCOMM_"))
        raise ValueError(f"zerocomm.comm rejects its environment ({settings}): {exc}") from None


def check_cuda(backend: str, device: str, local_ranks: int) -> None:
    """Refuse, before any rank starts, a run that needs more CUDA devices than this host shows.

    Counted with ``torch.cuda.device_count()``, which asks NVML and so leaves CUDA uninitialized in
    this process (ranks are forked from it afterwards).
    """
    import torch

    what = "--backend nccl" if backend == "nccl" else "--device cuda"
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        raise ValueError(f"{what} needs CUDA, but this torch build ({torch.__version__}) has none; "
                         f"use --backend gloo or --backend mpi on CPU")
    count = torch.cuda.device_count()
    if count == 0:
        raise ValueError(f"{what} needs a CUDA device, but none is visible "
                         f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r}); "
                         f"use --backend gloo or --backend mpi on CPU")
    if backend == "nccl" and count < local_ranks:
        raise ValueError(f"{what} needs one CUDA device per local rank: {local_ranks} ranks, {count} device(s) "
                         f"visible; pass --nprocs {count} or fewer")
