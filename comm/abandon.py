"""What a rank leaving a failed call leaves behind, so that every rank's call fails, and says why.

A rank whose call of a group fails (its deadline passed, or a peer failed) raises, and its group is unusable
after (``Group.run``).  Its peers may still be in the call, or not there yet: a rank stuck in Python that
arrives after the others left.  Two marks, made by :func:`leave` before the error is raised:

* in the group's shared-memory arena, where it has one (``shm.Arena.abandon``): the leaving rank is never seen
  to arrive again, and a peer that waits for it raises ``PeerFailure`` carrying the mark's code at once -- so a
  late rank's call fails too, instead of finishing with what the others left in their slots.  Every call of a
  group whose ranks share a segment meets there first (the mismatch check, ``check.py``), whatever its algorithm.
* a note in the communicator's store (``zerocomm-left/<group rank>``: pid, code, wall-clock time), read by a peer whose own call
  then fails on a closed connection or a timeout (:func:`notes`), so that its error says which rank left, in which
  call, and why -- not only that a connection closed.

Both are bounded: the store is written and read on a thread of its own, waited for at most ``STORE_S``.
"""
from __future__ import annotations

import os
import time
from typing import Optional

from . import best_effort
from .algorithms import COLLECTIVES
from .transport import USER_TAG_LIMIT

#: Longest wait for the store while leaving a call or naming why a peer left (each way).
STORE_S = 1.0
_KEY = "zerocomm-left/{}"
_TIMED_OUT, _PEER_FAILED = 1, 2


def encode(seq: int, collective: str, timed_out: bool) -> int:
    """A positive int63 naming a call (the group's sequence number ``seq``, its collective) and why it was left; of
    one call's codes, leaving at the deadline is the smallest (a late rank names that peer: ``shm.Arena._left``)."""
    index = COLLECTIVES.index(collective) + 1 if collective in COLLECTIVES else 0
    return ((seq & ((1 << 40) - 1)) << 16) | (index << 2) | (_TIMED_OUT if timed_out else _PEER_FAILED)


def describe(code: int) -> str:
    """``encode``'s code in words: "call #5 (all_reduce) at its deadline"."""
    seq, index, why = code >> 16, (code >> 2) & 0x3FFF, code & 3
    what = f" ({COLLECTIVES[index - 1]})" if 0 < index <= len(COLLECTIVES) else ""
    return f"call #{seq}{what} " + ("at its deadline" if why == _TIMED_OUT else "after a peer of it failed")


def _bounded(work) -> Optional[object]:
    """``work()`` within ``STORE_S`` (``best_effort.within``); its answer, or None (it failed or is slow)."""
    answer: list = []
    best_effort.within(lambda: answer.append(work()), STORE_S)
    return answer[0] if answer else None


def leave(group, tag: Optional[int], collective: str, timed_out: bool) -> None:
    """Mark ``group``'s failed call (``tag``: its tag, ``None``: the last call issued) as abandoned by this rank:
    in the arena, then in the store (see the module notes).  Called once, by the group's first failure."""
    communicator = group.communicator
    if communicator is None:
        return
    seq = (tag - USER_TAG_LIMIT) if tag is not None else group.seq
    code = encode(seq, collective, timed_out)
    arena = communicator.local.arena
    if arena is not None:
        try:
            arena.abandon(code)
        except (ValueError, TypeError):  # released under us (the group being destroyed): nothing left to mark
            pass
    store = getattr(communicator, "store", None)
    if store is not None:
        _bounded(lambda: store.set(_KEY.format(communicator.rank), f"{os.getpid()} {code} {time.time():.3f}"))


def notes(group, peer: Optional[int]) -> str:
    """What the store says of why ``peer`` (a group rank; ``None``: any peer) left: "; rank 0 [group rank 0] left
    call #4 (all_reduce) at its deadline", or "" where no note is found within ``STORE_S``."""
    communicator = group.communicator
    store = getattr(communicator, "store", None)
    if store is None:
        return ""
    pids, made_s = communicator.peer_pids, communicator.local.made_s
    peers = [peer] if peer is not None else [p for p in range(communicator.size) if p != communicator.rank]

    def read() -> list:
        found = []
        for p in peers:
            key = _KEY.format(p)
            if store.check([key]):
                pid, code, written_s = store.get(key).decode().split()
                # A note of this communicator's rank p, not one an earlier communicator over the same store left.
                if (not pids or not pids[p] or pids[p] == int(pid)) and float(written_s) >= made_s:
                    found.append((p, int(code)))
        return found

    found = _bounded(read) or []
    return "".join(f"; {group.peer_name(p)} left {describe(code)}" for p, code in found)
