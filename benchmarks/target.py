"""Which communication module the benchmarks drive, read from the environment in one place.

By default that is ``zerocomm.comm``, through its public, ``torch.distributed``-shaped
API only.  ``ZEROCOMM_BENCH_STANDIN=torch`` substitutes ``torch.distributed`` itself: a
baseline to compare against, and what the benchmark ran on before ``zerocomm.comm``
existed.  torch knows no ``algorithm=`` keyword, so :func:`algorithm_kwargs` leaves it
out of the stand-in's ``"native"`` calls.
"""
from __future__ import annotations

import os
from types import ModuleType
from typing import Mapping, Optional

#: Environment variable that selects the module under measurement.
STANDIN_ENV = "ZEROCOMM_BENCH_STANDIN"
_CHOICES = ("zerocomm", "torch")


def target_name(environ: Optional[Mapping[str, str]] = None) -> str:
    """``"zerocomm"`` or ``"torch"``, from ``ZEROCOMM_BENCH_STANDIN`` (unset or empty = zerocomm)."""
    environ = os.environ if environ is None else environ
    name = environ.get(STANDIN_ENV, "").strip().lower() or "zerocomm"
    if name not in _CHOICES:
        raise ValueError(f"{STANDIN_ENV}={environ.get(STANDIN_ENV)!r}; expected one of "
                         f"{', '.join(_CHOICES)} (or unset for zerocomm)")
    return name


def comm_module() -> ModuleType:
    """The module whose collectives are measured (``zerocomm.comm`` or ``torch.distributed``)."""
    if target_name() == "torch":
        import torch.distributed as dist

        return dist
    from .. import comm

    if not hasattr(comm, "init_process_group"):
        raise RuntimeError(f"zerocomm.comm has no init_process_group yet; set {STANDIN_ENV}=torch "
                           f"to benchmark torch.distributed instead")
    return comm


def is_standin(dist: ModuleType) -> bool:
    """True when ``dist`` is torch.distributed rather than zerocomm.comm."""
    return dist.__name__ == "torch.distributed"


def default_algorithms(dist: ModuleType) -> tuple[str, ...]:
    """Algorithms a run compares when ``--algorithms`` is not given: torch has only its own."""
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
