"""The mismatch check: every rank of a group makes the same call, checked in this one module.

A collective whose ranks disagree -- a different collective, size, dtype, op, root or algorithm --
gives garbage, a hang or an abort on the wire.  So before a call moves a byte, every rank of its
group takes part in one small round that compares a 62-bit :func:`digest` of the call's
fingerprint ``(tag, numel, collective, op, dtype, root, algorithm)``; where the digests differ, every
rank all-gathers the whole fingerprints and raises ``CollectiveMismatchError`` naming the first two
ranks that differ (:func:`name_mismatch`).  On by default; ``ZEROCOMM_CHECK=0`` turns it off and
``ZEROCOMM_DEBUG=1`` all-gathers the fingerprints on every call.

A plan (``plan.py``) picks its row's checker once, with :func:`checker_for`; ``Group.execute``
runs it before the call's function -- the check wraps the plan, no route carries it inside.  The
checkers, one per way a group's ranks can meet:

* :func:`in_segment` -- every rank on one host, sharing a segment (``topology.shares_memory``):
  one round of the shared-memory arena's step words (a few µs).  A small all_reduce (at most
  ``RIDE_BYTES``, a dtype and op the C round reduces: the plan's ``ride``) of "shm" (whose small
  all_reduce is that round) or "native", or at two ranks of any algorithm whose bits the round
  reproduces, rides in that round and is done by it; at more ranks a ridden "native" call's result can
  differ from the backend's own in the last bit (another order of summation), the same on every rank.
* :func:`in_first_sync` -- an "shm" call on such a group: armed here, compared in the call's own
  first sync (no round of its own); :func:`settle` after the call runs it if the call never synced.
* :func:`across_hosts` -- CPU ranks on several hosts, each host's ranks sharing a segment: the
  digests meet in one small hierarchical all_reduce -- inside each host through its segment, across
  hosts once among one rank per host (between two hosts, one round trip of the link, where a flat
  all_reduce of every rank crosses it at several of its steps); a small SUM/AVG all_reduce of floats
  by "native" or "hierarchical" rides in it.
* :func:`through_backend` -- any other group spanning hosts, or whose ranks share no segment:
  ``Backend.agree``, the backend's own round trip (about one small native all_reduce), where the
  backend may carry a small all_reduce too.
* :func:`full` -- debug: the whole fingerprints, all-gathered on every call.

[Note: one place per group]  Where "shm" calls can run, every call of the group checks in the
segment, whatever its algorithm: a call checked through the backend could not meet a peer that
made an "shm" call in its place, and both would wait out the deadline.  Across hosts no call runs
as "shm", and every call of a group checks the same way (:func:`across_hosts`, or through the backend
from the first call on where the hosts cannot all share a segment: every rank learns that alike).

A checker is ``checker(call, tag, deadline) -> bool``: True when the call's all_reduce rode in the
check and is done (``Group.execute`` then skips the call's function).  It raises
``TimeoutError`` or ``PeerFailure`` as a collective would, ``shm.CallMismatch`` from a segment round,
or ``CollectiveMismatchError``.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from . import shm
from .shm import digest  # the call digest: in C beside the rounds that compare it
from .algorithms import ALGORITHM_NAMES, COLLECTIVES
from .algorithms.hierarchical import all_reduce_hierarchical, host_communicator
from .algorithms.tree import all_reduce_recursive_doubling
from .errors import CollectiveMismatchError, UnsupportedError
from .reduce_op import SUPPORTED_DTYPES
from .topology import shares_memory
from .transport import AGREE_AND_REDUCED, DISAGREE, USER_TAG_LIMIT


#: The largest all_reduce (bytes) that rides in the segment's check round instead of running on the backend.
RIDE_BYTES = 4096

_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")
_DTYPES = frozenset(SUPPORTED_DTYPES)

Checker = Callable[..., bool]


def fingerprint_cell(collective: str, op: Optional[str], dtype: torch.dtype, root: int, algorithm: str) -> tuple:
    """(collective, op, dtype, root, algorithm) as small ints: a call's fingerprint is ``(tag, numel, *cell)``."""
    dtype_id = SUPPORTED_DTYPES.index(dtype) if dtype in _DTYPES else -1
    return (COLLECTIVES.index(collective), _OPS.index(op) if op else -1, dtype_id, root,
            ALGORITHM_NAMES.index(algorithm))


def describe(row) -> str:
    """A fingerprint ``(tag, numel, *cell)`` in words, for error messages."""
    tag, numel, coll, op, dtype_id, root, alg = (int(v) for v in row)
    dtype = SUPPORTED_DTYPES[dtype_id] if 0 <= dtype_id < len(SUPPORTED_DTYPES) else "?"
    return (f"call #{tag - USER_TAG_LIMIT} {COLLECTIVES[coll]}{'' if op < 0 else f' {_OPS[op].upper()}'} of "
            f"{'per-rank' if numel < 0 else numel} elements of {dtype}{'' if root < 0 else f' with root {root}'} "
            f"(algorithm {ALGORITHM_NAMES[alg]})")


# -- choosing a checker, once per plan row -----------------------------------------------------------

def checker_for(group, algorithm: str, config) -> Optional[Checker]:
    """The checker of ``group``'s calls by ``algorithm`` under ``config`` (``CommConfig``), or ``None``: the
    check is off, or the group has one rank (no peer to differ from)."""
    if group.communicator.size == 1 or not (config.check or config.debug):
        return None
    if config.debug:
        return full
    if shares_memory(group.communicator):
        return in_first_sync if algorithm == "shm" else in_segment
    local = group.communicator.local
    if local.one_host is False and not local.no_segment and group.on_cpu and group.size() < _EXACT_RANKS:
        return across_hosts
    return through_backend


def _fingerprint(call, tag: int) -> tuple:
    return (tag, call.numel, *call.check[1])


def _reached(call, tag: int, error: TimeoutError) -> TimeoutError:
    return TimeoutError(f"every rank to reach the mismatch check of {describe(_fingerprint(call, tag))} ({error}); "
                        "a rank that never arrives is alive but stuck, or called something else first")


def _arena(call, tag: int, deadline: Optional[float]):
    """The group's arena, made by its first check (every rank together); ``None`` where the ranks turned out
    unable to share a segment (every rank alike): the group's plans are then made again, checking through
    the backend."""
    try:
        return shm.arena(call.group.communicator, tag=tag, deadline=deadline)
    except UnsupportedError:
        call.group.forget_plans()
        return None


def in_segment(call, tag: int, deadline: Optional[float]) -> bool:
    """One round of the arena's step words comparing the digests; a small all_reduce asked of the backend
    ("native", a dtype and op the C round reduces, at most ``RIDE_BYTES``) rides in it and is done."""
    arena = call.group.communicator.local.arena
    try:
        if arena is None and call.algorithm == "shm":  # a riding "shm" call: no segment refuses it, as "shm" does
            arena = _shm_arena(call, tag, deadline)
        elif arena is None:
            arena = _arena(call, tag, deadline)
            if arena is None:
                return through_backend(call, tag, deadline)
        ride = call.ride
        if shm.FAST_ROUNDS:  # the round and its digest in one C call (Arena.checked_round, without its frame)
            numel = call.numel
            answer = (arena.rounds.check(tag, numel, call.check[0], 0, 0, 0, 0) if ride is None
                      else arena.rounds.check(tag, numel, call.check[0], call.args[0].data_ptr(), numel, ride[0],
                                              ride[1]))
            if answer:
                arena.settle_check(answer, deadline)
            return ride is not None
        arena.checked_round((tag, call.numel, call.check[0]), None, 0, 0, 0, 0, deadline)
    except TimeoutError as error:
        raise _reached(call, tag, error) from None
    except shm.CallMismatch:  # the fingerprint, made only now: every call would pay for it
        raise shm.CallMismatch(_fingerprint(call, tag)) from None
    return False


def in_first_sync(call, tag: int, deadline: Optional[float]) -> bool:
    """Arm the check of an "shm" call: its first sync compares the digests (no round of its own).  A small
    all_reduce (the plan's ``ride``) is that one round: the plan checks it with :func:`in_segment` instead."""
    arena = call.group.communicator.local.arena
    if arena is None:
        try:
            arena = _shm_arena(call, tag, deadline)
        except TimeoutError as error:
            raise _reached(call, tag, error) from None
    arena.expect(digest(tag, call.numel, call.check[0]), (tag, call.numel, *call.check[1]))
    return False


def _shm_arena(call, tag: int, deadline: Optional[float]):
    """The arena of an "shm" call's group, made by its first call (every rank together); ``UnsupportedError``
    where the ranks cannot share a segment (every rank alike): "auto" chooses again from then on."""
    try:
        return shm.arena(call.group.communicator, tag=tag, deadline=deadline)
    except UnsupportedError:
        call.group.forget_plans()
        raise


def settle(call, deadline: Optional[float]) -> None:
    """After an "shm" call armed by :func:`in_first_sync`: run its check if the call never synced."""
    arena = call.group.communicator.local.arena
    if arena is not None and arena.armed is not None:
        arena.settle(deadline)


def across_hosts(call, tag: int, deadline: Optional[float]) -> bool:
    """The digests meet in a SUM all_reduce of a stage of float64s by the hierarchical algorithm (see
    [Note: the stage across hosts]); a small SUM/AVG all_reduce of floats by "native" or "hierarchical" rides
    in it and is done."""
    group = call.group
    t = group.communicator
    try:
        if not t.local.host_segments and not _hosts_share_segments(t, tag, deadline):
            group.forget_plans()  # every rank alike: from now on the group checks through the backend
            return through_backend(call, tag, deadline)
        code = digest(tag, call.numel, call.check[0])
        pieces = (code & 0xFFFF, (code >> 16) & 0xFFFF, (code >> 32) & 0xFFFF, code >> 48)
        stage = torch.zeros(_STAGE, dtype=torch.float64)
        stage[:_HEADER] = torch.tensor([x for piece in pieces for x in (piece, piece * piece)], dtype=torch.float64)
        numel = call.numel
        rides = (0 < numel <= STAGE_PAYLOAD and call.collective == "all_reduce" and call.options is None
                 and call.algorithm in _RIDE_ALGORITHMS and call.op in ("sum", "avg") and call.dtype in _RIDE_DTYPES)
        if rides:
            stage[_HEADER:_HEADER + numel] = call.args[0]
        all_reduce_hierarchical(t, stage, "sum", tag=tag, deadline=deadline, segment_bytes=0)
    except TimeoutError as error:
        raise _reached(call, tag, error) from None
    n, header = t.size, stage[:_HEADER].tolist()
    if any(header[2 * k] != n * piece or header[2 * k + 1] != n * piece * piece for k, piece in enumerate(pieces)):
        name_mismatch(group, _fingerprint(call, tag), deadline)  # raises, or the digests collided: the call runs
        return False
    if rides:
        reduced = stage[_HEADER:_HEADER + numel]
        call.args[0].copy_(reduced / n if call.op == "avg" else reduced)
    return rides


# [Note: the stage across hosts]  The check of a group spanning hosts all-reduces (SUM) _STAGE float64s, the
# same size for every call (a transport may abort a receive of an unexpected size): a header of the digest's
# four pieces p of 16 bits, each as (p, p*p), then up to STAGE_PAYLOAD elements of a small all_reduce.
# Sums of integers below 2**53 are exact, so a rank holding p sees sum(p) == n*p and sum(p*p) == n*p*p exactly
# when every rank holds p (Cauchy-Schwarz): the verdict is the same on every rank.  The hierarchical algorithm
# meets inside each host through its segment and across hosts once, among one rank per host: between two hosts
# one round trip of the link, where a flat all_reduce of every rank crosses it at several of its steps.  The
# payload is summed in float64 and rounded once into the tensor (AVG divided before), the same bits on every
# rank; whether a call rides depends on its cell and size alone, which the digest compares.
_HEADER = 8
#: Elements of a small all_reduce that ride in the check of a group spanning hosts.
STAGE_PAYLOAD = 8
_STAGE = _HEADER + STAGE_PAYLOAD
_RIDE_ALGORITHMS = frozenset(("native", "hierarchical"))
#: ... and n*p*p stays below 2**53.
_EXACT_RANKS = 1 << 21
_RIDE_DTYPES = frozenset((torch.float32, torch.float64, torch.float16, torch.bfloat16))


def _hosts_share_segments(t, tag: int, deadline: Optional[float]) -> bool:
    """Whether every host's ranks of ``t`` share a segment: each host makes its communicator's arena (where it
    has several ranks), then every rank of ``t`` learns the verdict of all (a MIN all_reduce over ``t``).
    Every rank calls it, once; the answer is kept on ``t`` (``host_segments``, else ``no_segment``)."""
    mine = host_communicator(t, tag=tag, deadline=deadline)
    shared = 1
    if mine is not None:
        try:
            shm.arena(mine, tag=tag, deadline=deadline)
        except UnsupportedError:  # the same on every rank of this host
            shared = 0
    verdict = torch.tensor([shared], dtype=torch.int64)
    all_reduce_recursive_doubling(t, verdict, "min", tag=tag, deadline=deadline, segment_bytes=0)
    if verdict.item():
        t.local.host_segments = True
        return True
    t.local.no_segment = True
    return False


def through_backend(call, tag: int, deadline: Optional[float]) -> bool:
    """``Backend.agree``: the backend's own round trip; an all_reduce's tensor goes along (the backend may
    carry a small one in that round and answer ``AGREE_AND_REDUCED``)."""
    group = call.group
    rides = call.collective == "all_reduce" and call.options is None
    try:
        agreed = group.communicator.agree(digest(tag, call.numel, call.check[0]), deadline,
                                          call.args[0] if rides else None, call.op, tag=tag,
                                          algorithm=call.algorithm)
    except TimeoutError as error:
        raise _reached(call, tag, error) from None
    if agreed == DISAGREE:
        name_mismatch(group, _fingerprint(call, tag), deadline)
        return False  # the digests collided, the fingerprints are the same: the call runs
    return agreed == AGREE_AND_REDUCED


def full(call, tag: int, deadline: Optional[float]) -> bool:
    """Debug: all-gather every rank's whole fingerprint, on every call."""
    try:
        name_mismatch(call.group, _fingerprint(call, tag), deadline)
    except TimeoutError as error:
        raise _reached(call, tag, error) from None
    return False


def name_mismatch(group, mine: tuple, deadline: Optional[float]) -> None:
    """All-gather every rank's fingerprint ``mine`` (``(tag, numel, *cell)``) over the group's backend; raise
    ``CollectiveMismatchError`` naming the first two ranks that differ.  Every rank of the group calls it."""
    backend = group.communicator
    row = torch.tensor(mine, dtype=torch.int64, device=group.device_type)
    everyone = torch.empty(backend.size * row.numel(), dtype=row.dtype, device=row.device)
    backend.NATIVE["all_gather"](backend, everyone, row, tag=0, deadline=deadline, segment_bytes=0)
    rows = everyone.view(backend.size, -1).tolist()
    for other in range(1, backend.size):
        if rows[0] != rows[other]:
            raise CollectiveMismatchError(
                f"rank {group.my_global_rank}: mismatched collectives on {group.describe()}: rank {group.ranks[0]} "
                f"called {describe(rows[0])}, but rank {group.ranks[other]} called {describe(rows[other])}")
