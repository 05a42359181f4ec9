"""The one place ``zerocomm.comm`` reads the process environment for its own settings.

:data:`VARIABLES` lists every ``ZEROCOMM_*`` variable the library reads, with what it does (``docs`` name only
these: a test holds them to this table).  ``init_process_group`` turns the configuration's variables into a
``CommConfig`` (``config.py``); the others are read where their value is needed, through :func:`get`, because a
program may change them between groups: ``ZEROCOMM_HOST`` when a group learns its hosts, ``ZEROCOMM_TRANSPORT``
when torch makes a "zerocomm" group, and torch's ``GLOO_SOCKET_IFNAME`` whenever a gloo communicator is made
(torch reads it at each ``ProcessGroupGloo`` too).  Launchers' variables (torchrun's ``RANK``..., Slurm's, MPI's)
are read by the modules that speak for each launcher (``bootstrap.py``, ``slurm.py``, ``backends``).
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

#: Every ``ZEROCOMM_*`` variable the library reads: what it sets.
VARIABLES = {
    "ZEROCOMM_ALGORITHM": "default algorithm= of every collective (\"auto\" if unset)",
    "ZEROCOMM_SEGMENT_BYTES": "pipeline segment size of ring and tree algorithms",
    "ZEROCOMM_TIMEOUT": "seconds: the default deadline of every blocking call (default 300)",
    "ZEROCOMM_CHECK": "\"0\": skip the per-call mismatch check",
    "ZEROCOMM_DEBUG": "\"1\": the full check (every rank's whole fingerprint all-gathered)",
    "ZEROCOMM_PROFILE": "a path: record every collective from init to destroy and write per-rank files",
    "ZEROCOMM_FLIGHT_DUMP": "a folder: each rank writes its flight record (flight-rank<R>.json) on a timeout or "
                            "lost peer and at destroy_process_group",
    "ZEROCOMM_FLIGHT_CALLERS": "\"1\": the flight recorder notes every call's caller (file:line), at a frame "
                               "walk per call",
    "ZEROCOMM_SWITCH_INTERVAL": "seconds; if set, sys.setswitchinterval at init",
    "ZEROCOMM_MAX_QUEUED": "calls a group may have queued behind the running one before a caller waits",
    "ZEROCOMM_TORCH_DEFAULT_GROUP": "\"0\": init_process_group leaves torch's default process group alone",
    "ZEROCOMM_HOST": "this rank's host name for topology (default: socket.gethostname()); one per shared /dev/shm",
    "ZEROCOMM_TRANSPORT": "the transport of groups torch makes on the \"zerocomm\" c10d backend: gloo or mpi",
}


def get(variable: str, environ: Optional[Mapping[str, str]] = None) -> str:
    """The value of ``variable`` (one of :data:`VARIABLES`), or "" where it is unset."""
    if variable not in VARIABLES:
        raise KeyError(f"{variable} is not one of zerocomm's variables: {sorted(VARIABLES)}")
    return (os.environ if environ is None else environ).get(variable, "")


def gloo_socket_interfaces(environ: Optional[Mapping[str, str]] = None) -> tuple:
    """The network interfaces torch's ``GLOO_SOCKET_IFNAME`` names, in order (empty: none named): every gloo
    communicator binds one transport device to each, as torch's ``ProcessGroupGloo`` does; unset, gloo binds the
    address this host's name resolves to (loopback, with a warning, where it does not resolve).  torch ignores
    a value of one character; so does this."""
    text = (os.environ if environ is None else environ).get("GLOO_SOCKET_IFNAME", "")
    if len(text) <= 1:
        return ()
    return tuple(name.strip() for name in text.split(",") if name.strip())
