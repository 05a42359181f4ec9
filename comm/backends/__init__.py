"""The backends zerocomm runs on, registered in one table.

Each backend module implements :class:`zerocomm.comm.transport.Backend`; it is imported
only when asked for, so ``import zerocomm.comm`` needs neither mpi4py nor CUDA.
``init_process_group``, ``new_group``, the capability matrix and the docs all read
:data:`BACKENDS`.
"""
from __future__ import annotations

import importlib

#: ``{name: (module, class)}``, in the order tables list them.
BACKENDS = {
    "gloo": ("gloo", "GlooBackend"),
    "mpi": ("mpi", "MpiBackend"),
    "nccl": ("nccl", "NcclBackend"),
}

#: Stand-ins, ``{name: (module, class)}``: a registered backend's own methods over another transport, to count its
#: host path on a machine without its device (``zerocomm-bench call-counts --backend nccl-standin``).
#: ``init_process_group`` takes their names; tables, the capability matrix and the docs list only :data:`BACKENDS`.
STAND_INS = {
    "nccl-standin": ("nccl", "NcclHostStandIn"),
}


def backend_class(name: str):
    """The backend class registered as ``name`` (imported now, without starting MPI or touching CUDA)."""
    try:
        module, cls = BACKENDS[name] if name in BACKENDS else STAND_INS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; expected one of {tuple(BACKENDS)}") from None
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)
