"""Which host each rank of a communicator runs on.

A *host* is the set of processes that can share memory: by default every process that
reports the same ``socket.gethostname()``.  ``ZEROCOMM_HOST`` overrides the name (for
containers that share ``/dev/shm`` under different host names, or to split one machine
into several pretend hosts in tests).  torchrun and mpiexec leave the hostname alone, so
both give the right answer without configuration.

:func:`hosts` learns every rank's host once per communicator, with one all_gather of the
names over the communicator's own point-to-point transport, and keeps the answer on the
transport object: a second call costs nothing.  Every rank of the communicator must call
it at the same point of its sequence of collectives (it moves bytes under ``tag``).

Reporting one host is not yet sharing memory: ``shm.probe_shared_memory`` (run by
``init_process_group``) checks that the ranks can map one segment together, and selection reads
:func:`shares_memory`, so "auto" never offers "shm" to ranks that cannot.
"""
from __future__ import annotations

import os
import socket
from typing import Callable, Optional

import torch

from . import environment
from .errors import UnsupportedError
from .transport import Transport

#: Environment variable naming this process's host; unset or empty: the hostname.
HOST_ENV = "ZEROCOMM_HOST"

#: Bytes of a host name moved per rank (names are truncated to this, UTF-8).
_NAME_BYTES = 256


def local_host() -> str:
    """This process's host name: ``$ZEROCOMM_HOST`` if set and not empty, else the hostname."""
    return environment.get(HOST_ENV) or socket.gethostname()


#: ``f(t, out, inp, *, tag, deadline, segment_bytes)``: an all_gather of equal uint8 records over ``t``'s point to
#: point (the algorithms' ring).  This module sits below the algorithms and imports none: its all_gather is
#: handed to it, per call (``hosts(all_gather=)``) or once (:func:`use_all_gather`, by ``comm.algorithms``).
AllGather = Callable[..., None]
_handed: list = []


def use_all_gather(all_gather: AllGather) -> None:
    """Hand :func:`hosts` the all_gather it runs when its caller passes none (``comm.algorithms`` hands its ring
    at import; callers below the algorithms, ``shm.arena``, then need not pass one)."""
    _handed[:] = [all_gather]


def hosts(t: Transport, *, tag: int, deadline: Optional[float], name: Optional[str] = None,
          all_gather: Optional[AllGather] = None) -> tuple[str, ...]:
    """The host of every rank of ``t`` (index = rank), learnt once and cached on ``t``.

    All ranks of ``t`` must call it together, passing the tag of the collective they are in.
    ``name`` is this rank's host (default :func:`local_host`).  ``all_gather`` moves the ranks' records
    (:data:`AllGather`); ``None``: the one handed to :func:`use_all_gather`.
    """
    known = t.local.hosts
    if known is not None:
        return known
    if all_gather is None:
        if not _handed:
            raise RuntimeError("topology.hosts: no all_gather was passed or handed (import zerocomm.comm, whose "
                               "algorithms package hands its ring to topology.use_all_gather)")
        all_gather = _handed[0]

    record = _RECORD_BYTES
    mine = torch.zeros(record, dtype=torch.uint8)
    _put(mine, 0, (local_host() if name is None else name).encode()[:_NAME_BYTES])
    _put(mine, _NAME_BYTES, _this_process())
    every = torch.empty(t.size * record, dtype=torch.uint8)
    all_gather(t, every, mine, tag=tag, deadline=deadline, segment_bytes=1 << 20)
    rows = [bytes(every[r * record:(r + 1) * record].tolist()) for r in range(t.size)]
    names = tuple(row[:_NAME_BYTES].rstrip(b"\0").decode(errors="replace") for row in rows)
    t.local.hosts = names
    t.local.one_host = len(set(names)) == 1
    me = _this_process()
    # The pid of every rank whose process this one can see (same machine, same pid namespace), else 0.
    t.peer_pids = tuple(int.from_bytes(row[-8:], "little") if row[_NAME_BYTES:-8] == me[:-8] else 0
                             for row in rows)
    return names


def _put(buffer: torch.Tensor, offset: int, data: bytes) -> None:
    if data:
        buffer[offset:offset + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)


#: What a rank tells its peers of its process, after its host name: the machine's real hostname (64 bytes),
#: its pid namespace's inode and its pid (8 bytes each).  A peer that sees the same machine and namespace can
#: tell whether the process still runs (``Transport.peer_pids``).
_PROCESS_BYTES = 64 + 8 + 8
_RECORD_BYTES = _NAME_BYTES + _PROCESS_BYTES


def _this_process() -> bytes:
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return (socket.gethostname().encode()[:64].ljust(64, b"\0") + namespace.to_bytes(8, "little")
            + os.getpid().to_bytes(8, "little"))


def one_host(t: Transport) -> Optional[bool]:
    """Whether every rank of ``t`` is on one host: ``None`` until :func:`hosts` (or :func:`inherit`) learnt it.

    Costs an attribute lookup (selection asks it on every call).
    """
    return t.local.one_host


def inherit(sub: Transport, parent: Transport, members) -> None:
    """Give ``sub`` (a communicator over ``members``, ranks of ``parent``) its hosts from ``parent``'s, if known:
    a sub-communicator learns its topology without moving a byte."""
    known = parent.local.hosts
    if known is not None:
        names = tuple(known[m] for m in members)
        sub.local.hosts = names
        sub.local.one_host = len(set(names)) == 1
    if parent.peer_pids is not None:
        sub.peer_pids = tuple(parent.peer_pids[m] for m in members)
    if parent.local.no_segment:
        sub.local.no_segment = True  # some ranks of the parent share no segment: kept off "shm" (conservative)


def require_one_host(t: Transport, *, tag: int, deadline: Optional[float], what: str = "shm") -> None:
    """Raise ``UnsupportedError`` unless every rank of ``t`` is on this rank's host (learnt once, cached)."""
    names = hosts(t, tag=tag, deadline=deadline)
    if len(set(names)) > 1:
        spread = ", ".join(f"{h} (ranks {[r for r, x in enumerate(names) if x == h]})" for h in dict.fromkeys(names))
        raise UnsupportedError(f"rank {t.rank}: {what} needs every rank of the group on one host, but they run on "
                               f"{spread}; use algorithm='hierarchical' (shared memory within each host) or "
                               f"algorithm='ring'")


def shares_memory(t: Transport) -> Optional[bool]:
    """:func:`one_host`, except ``None`` (unknown: "auto" offers no "shm" and reads the plain table) once the
    ranks could not share a segment (``shm.probe_shared_memory``, or an arena that could not be made)."""
    local = t.local
    return None if local.no_segment else local.one_host


def local_ranks(t: Transport, *, tag: int, deadline: Optional[float]) -> tuple[int, ...]:
    """The ranks of ``t`` on this process's host, in rank order (this rank included)."""
    names = hosts(t, tag=tag, deadline=deadline)
    return tuple(r for r, h in enumerate(names) if h == names[t.rank])
