"""The mismatch check: every rank of a group makes the same call, checked by one object per group.

A collective whose ranks disagree -- a different collective, size, dtype, op, root or algorithm --
gives garbage, a hang or an abort on the wire.  So before a call moves a byte, every rank of its
group takes part in one small round that compares a :data:`DIGEST_BITS`-bit :func:`digest` of the call's
fingerprint ``(tag, numel, collective, op, dtype, root, algorithm)``; where the digests differ, every
rank all-gathers the whole fingerprints and raises ``CollectiveMismatchError`` naming the first two
ranks that differ (:meth:`MismatchCheck.name_mismatch`).  On by default; ``ZEROCOMM_CHECK=0`` turns it
off and ``ZEROCOMM_DEBUG=1`` all-gathers the fingerprints on every call.

Each group owns one :class:`MismatchCheck` (``Group.check``).  A plan (``plan.py``) asks it once per row
which of its checkers wraps the row's calls (:meth:`MismatchCheck.checker_for`); ``Group.execute`` runs
that checker before the call's function -- the check wraps the plan, no route carries it inside.  The
object owns the digest, the stage's format and the comparison; what it asks of the ways ranks meet is a
round of one of two kinds:

* the **stage** (see [Note: the stage]): :data:`STAGE` float64s holding the digest's pieces and a small
  all_reduce's payload, SUM-reduced by the one primitive a backend offers the check,
  ``Backend.reduce_stage`` (gloo's, MPI's and NCCL's own small all_reduce), or by the hierarchical
  algorithm across hosts;
* the **segment round**: ranks sharing a shared-memory segment (``topology.shares_memory``) write the
  digest into their line of the arena and compare every peer's (``shm.Arena``; in C, ``_shmfast``), a few
  µs; a small all_reduce of any dtype and op the C round reduces rides in that round.

The checkers, one per place a group's ranks can meet:

* :meth:`~MismatchCheck.in_segment` -- every rank on one host, sharing a segment: one segment round.  A small
  all_reduce (at most ``RIDE_BYTES``, a dtype and op the C round reduces: the plan's ``ride``) of "shm"
  (whose small all_reduce is that round) or "native", or at two ranks of any algorithm whose bits the round
  reproduces, rides in that round and is done by it; at more ranks a ridden "native" call's result can
  differ from the backend's own in the last bit (another order of summation), the same on every rank.  So
  does a small "shm" call of the other collectives (``algorithms.shm.ROUND_COPIES``): its one round of copies.
* :meth:`~MismatchCheck.in_first_sync` -- an "shm" call on such a group: armed here, compared in the call's
  own first sync (no round of its own); :meth:`~MismatchCheck.settle` after the call runs it if the call
  never synced.
* :meth:`~MismatchCheck.across_hosts` -- CPU ranks on several hosts, each host's ranks sharing a segment:
  the stage, reduced by the hierarchical algorithm -- inside each host through its segment, across hosts
  once among one rank per host (between two hosts one round trip of the link, where a flat all_reduce of
  every rank crosses it at several of its steps).
* :meth:`~MismatchCheck.through_backend` -- any other group: the stage, reduced by ``Backend.reduce_stage``.
* :meth:`~MismatchCheck.full` -- debug: the whole fingerprints, all-gathered on every call.

[Note: split sizes]  An all_to_all whose ranks' splits may differ (``all_to_all_single`` with split sizes, the
list form) has no element count that every rank shares: what must agree is each pair's, rank ``r`` sending ``p``
as many elements as ``p`` expects from ``r``.  Its checker (:meth:`~MismatchCheck.with_splits`) adds one integer
per rank, its *balance* ``b_r = sum_p w(r, p) * sent_r[p] - w(p, r) * expected_r[p]`` modulo the prime
:data:`SPLITS_PRIME` (``w``: fixed pseudo-random weights of the pair): summed over the ranks, the balances are 0
modulo the prime where every pair agrees, and otherwise are not, but for odds of one in the prime.  The sum rides
in the stage (its first payload element) where the check reduces one; in a segment group it takes one small
SUM round of its own, after the digests.  Where it is not 0, every rank all-gathers the splits and raises
``CollectiveMismatchError`` naming the first pair that disagrees, before any byte of the call moves.

[Note: one place per group]  Where "shm" calls can run, every call of the group checks in the
segment, whatever its algorithm: a call checked through the backend could not meet a peer that
made an "shm" call in its place, and both would wait out the deadline.  Across hosts no call runs
as "shm", and every call of a group checks the same way (across hosts, or through the backend
from the first call on where the hosts cannot all share a segment: every rank learns that alike).

A checker is ``checker(call, tag, deadline) -> bool``: True when the call's all_reduce rode in the
check and is done (``Group.execute`` then skips the call's function).  It raises
``TimeoutError`` or ``PeerFailure`` as a collective would, ``shm.CallMismatch`` from a segment round
(typed by :meth:`MismatchCheck.mismatch_error`), or ``CollectiveMismatchError``.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from . import shm
from .algorithms import ALGORITHM_NAMES, COLLECTIVES
from .algorithms.hierarchical import all_reduce_hierarchical, host_communicator
from .algorithms.shm import all_reduce_shm
from .algorithms.tree import all_reduce_recursive_doubling
from .errors import CollectiveMismatchError, UnsupportedError
from .reduce_op import SUPPORTED_DTYPES
from .topology import shares_memory
from .transport import USER_TAG_LIMIT


# -- the digest --------------------------------------------------------------------------------------

#: The digest's width: an int in ``[0, 2**DIGEST_BITS)``, so that it and its negation fit an int64, and its
#: pieces (:data:`PIECE_BITS` each) sum exactly in float64 (see [Note: the stage]).
DIGEST_BITS = 62
DIGEST_MASK = (1 << DIGEST_BITS) - 1
_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    x ^= x >> 30
    x = x * 0xBF58476D1CE4E5B9 & _M64
    x ^= x >> 27
    x = x * 0x94D049BB133111EB & _M64
    return x ^ (x >> 31)


def digest_twin(tag: int, numel: int, cell_code: int) -> int:
    """The hash of one call: its tag (the group's sequence number), its element count and its cell code (the
    hash of :func:`fingerprint_cell`'s tuple), mixed by splitmix64's finalizer modulo 2**64 and kept to
    :data:`DIGEST_BITS` bits.  ``_shmfast``'s ``digest`` (and its segment round, which hashes in C) give the
    same bits: the C form is used where built."""
    x = (tag * 0x9E3779B97F4A7C15 + _mix64((numel + 0x632BE59BD9B4E019) & _M64)) & _M64 ^ (cell_code & _M64)
    return _mix64(x) & DIGEST_MASK


#: ``digest(tag, numel, cell_code)``: in C beside the segment round where built, else its Python twin.
digest = shm.digest_in_c or digest_twin


# [Note: the stage]  Every check that meets through a reduction SUM-reduces one stage of STAGE float64s, the
# same size for every call (a transport may abort a receive of an unexpected size, and ranks that called
# different things must still make the same call on the wire): a header of the digest's four pieces p of
# PIECE_BITS bits (the last has 14), each as (p, p*p), then up to STAGE_PAYLOAD elements of a small
# all_reduce.  Sums of integers below 2**53 are exact, so a rank holding p sees sum(p) == n*p and
# sum(p*p) == n*p*p exactly when every rank holds p (Cauchy-Schwarz): the verdict is the same on every rank,
# below EXACT_RANKS ranks (beyond, the check all-gathers the fingerprints).  The payload is summed in float64
# (AVG divided there too) and rounded once into the tensor (a SUM at two ranks: the dtype's own sum bit for bit);
# whether a call rides depends on its cell and size alone, which the digest compares.
PIECE_BITS = 16
STAGE_HEADER = 8
#: Elements of a small all_reduce that ride in the stage.
STAGE_PAYLOAD = 8
#: float64 elements of the stage.
STAGE = STAGE_HEADER + STAGE_PAYLOAD
#: Below this many ranks, n*p*p stays below 2**53: the stage's sums are exact.
EXACT_RANKS = 1 << (53 - 2 * PIECE_BITS)
_PIECE = (1 << PIECE_BITS) - 1
_STAGE_DTYPES = frozenset((torch.float32, torch.float64, torch.float16, torch.bfloat16))
_STAGE_ALGORITHMS = frozenset(("native", "hierarchical"))


def stage_header(code: int) -> tuple:
    """The stage's header for digest ``code``: ``(p0, p0*p0, p1, p1*p1, p2, p2*p2, p3, p3*p3)``, its pieces from the
    low bits (written out: this runs on every check through a reduction)."""
    p0, p1, p2, p3 = code & _PIECE, code >> 16 & _PIECE, code >> 32 & _PIECE, code >> 48
    return (p0, p0 * p0, p1, p1 * p1, p2, p2 * p2, p3, p3 * p3)


def stage_agrees(reduced: list, header: tuple, n: int) -> bool:
    """Whether a stage's reduced header (its first :data:`STAGE_HEADER` values, summed over ``n`` ranks) says every
    rank held this rank's ``header``."""
    return (reduced[0] == n * header[0] and reduced[1] == n * header[1] and reduced[2] == n * header[2]
            and reduced[3] == n * header[3] and reduced[4] == n * header[4] and reduced[5] == n * header[5]
            and reduced[6] == n * header[6] and reduced[7] == n * header[7])


#: The split sizes' balances are summed modulo this prime (see [Note: split sizes]).
SPLITS_PRIME = (1 << 31) - 1


def split_weight(sender: int, receiver: int, n: int) -> int:
    """The weight of the pair ``(sender, receiver)`` of group ranks in a group of ``n``: in ``[1, SPLITS_PRIME)``."""
    return _mix64(sender * n + receiver + 1) % (SPLITS_PRIME - 1) + 1


def split_balance(weights: tuple, out_counts, in_counts) -> int:
    """This rank's balance (see [Note: split sizes]) of ``in_counts`` (elements sent to each rank) and ``out_counts``
    (expected from each); ``weights``: ``(w(rank, p) for p, w(p, rank) for p)``."""
    sent, expected = weights
    return (sum(map(int.__mul__, sent, in_counts)) - sum(map(int.__mul__, expected, out_counts))) % SPLITS_PRIME


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


def _fingerprint(call, tag: int) -> tuple:
    return (tag, call.numel, *call.check[1])


def _reached(call, tag: int, error: TimeoutError) -> TimeoutError:
    return TimeoutError(f"every rank to reach the mismatch check of {describe(_fingerprint(call, tag))} ({error}); "
                        "a rank that never arrives is alive but stuck, or called something else first")


class MismatchCheck:
    """The mismatch check of one group (``Group.check``): its checkers, the stage it reduces, the verdict.

    Every rank of the group runs the same checker for the same call (see [Note: one place per group]).  The
    checkers are bound once, here, so that a plan can tell them apart by identity (:meth:`rides_in_segment`).
    """

    def __init__(self, group):
        self.group = group
        #: The stage (host memory; see [Note: the stage]), made once: a call allocates nothing.
        self.stage = torch.zeros(STAGE, dtype=torch.float64)
        self._words = self.stage.numpy()
        self._balance = torch.zeros(1, dtype=torch.int64)  # a segment group's split-size round (with_splits)
        self._split_weights: Optional[tuple] = None
        # Each checker bound once (an attribute read then returns the same object): plans compare them by identity.
        for name in ("in_segment", "in_first_sync", "across_hosts", "through_backend", "full"):
            setattr(self, name, getattr(self, name))

    # -- choosing a checker, once per plan row -------------------------------------------------------
    def checker_for(self, algorithm: str, config) -> Optional[Checker]:
        """The checker of the group's calls by ``algorithm`` under ``config`` (``CommConfig``), or ``None``: the
        check is off, or the group has one rank (no peer to differ from)."""
        group = self.group
        if group.communicator.size == 1 or not (config.check or config.debug):
            return None
        if config.debug or group.size() >= EXACT_RANKS:
            return self.full
        if shares_memory(group.communicator):
            return self.in_first_sync if algorithm == "shm" else self.in_segment
        local = group.communicator.local
        if local.one_host is False and not local.no_segment and group.on_cpu:
            return self.across_hosts
        return self.through_backend

    def with_splits(self, checker: Checker) -> Checker:
        """``checker``, and the agreement of the ranks' split sizes (see [Note: split sizes]): the checker of an
        all_to_all whose splits may differ between ranks."""
        def checked(call, tag: int, deadline: Optional[float]) -> bool:
            return self._splits_agree(checker, call, tag, deadline)
        return checked

    def _splits_agree(self, checker: Checker, call, tag: int, deadline: Optional[float]) -> bool:
        weights = self._split_weights
        if weights is None:
            n, r = self.group.size(), self.group.rank
            weights = self._split_weights = (tuple(split_weight(r, p, n) for p in range(n)),
                                             tuple(split_weight(p, r, n) for p in range(n)))
        balance = split_balance(weights, call.args[2], call.args[3])
        if checker == self.through_backend or checker == self.across_hosts:
            return checker(call, tag, deadline, balance=balance)
        checker(call, tag, deadline)
        if checker == self.full:  # debug: the splits themselves, every call
            self.name_splits(call, deadline)
            return False
        self._balance[0] = balance  # a segment group: one small SUM round, after the digests compared
        try:
            all_reduce_shm(self.group.communicator, self._balance, "sum", tag=tag, deadline=deadline, segment_bytes=0)
        except TimeoutError as error:
            raise _reached(call, tag, error) from None
        if int(self._balance[0]) % SPLITS_PRIME:
            self.name_splits(call, deadline)
        return False

    def name_splits(self, call, deadline: Optional[float]) -> None:
        """All-gather every rank's split sizes over the group's backend; raise ``CollectiveMismatchError`` naming the
        first pair of ranks that disagree (a rank sending another more or fewer elements than it expects).  Every
        rank of the group calls it."""
        group = self.group
        backend = group.communicator
        n = backend.size
        out_counts, in_counts = call.args[2], call.args[3]
        row = torch.tensor(list(in_counts) + list(out_counts), dtype=torch.int64, device=group.device_type)
        everyone = torch.empty(n * row.numel(), dtype=row.dtype, device=row.device)
        backend.NATIVE["all_gather"](backend, everyone, row, tag=0, deadline=deadline, segment_bytes=0)
        rows = everyone.view(n, -1).tolist()
        for sender in range(n):
            for receiver in range(n):
                sent, expected = rows[sender][receiver], rows[receiver][n + sender]
                if sent != expected:
                    raise CollectiveMismatchError(
                        f"rank {group.my_global_rank}: {call.collective} on {group.describe()}: the ranks' split "
                        f"sizes disagree: rank {group.ranks[sender]} sends {sent} elements to rank "
                        f"{group.ranks[receiver]}, which expects {expected} from it")

    def rides_in_segment(self, checker: Optional[Checker]) -> bool:
        """Whether ``checker`` meets in the segment round, where a small all_reduce can ride (``plan.py``)."""
        return checker is self.in_segment or checker is self.in_first_sync

    # -- the segment round ---------------------------------------------------------------------------
    def _arena(self, call, tag: int, deadline: Optional[float], refuse: bool):
        """The group's arena, made by its first check (every rank together).  Where the ranks turn out unable to
        share a segment (every rank alike) the group's plans are made again from the next call on, and this
        call raises ``UnsupportedError`` (``refuse``: an "shm" call, which no segment refuses) or gets ``None``."""
        try:
            return shm.arena(self.group.communicator, tag=tag, deadline=deadline)
        except UnsupportedError:
            self.group.forget_plans()
            if refuse:
                raise
            return None

    def in_segment(self, call, tag: int, deadline: Optional[float]) -> bool:
        """One segment round comparing the digests; a small all_reduce asked of the backend ("native", a dtype
        and op the C round reduces, at most ``RIDE_BYTES``) rides in it and is done."""
        arena = self.group.communicator.local.arena
        try:
            if arena is None:
                arena = self._arena(call, tag, deadline, refuse=call.algorithm == "shm")
                if arena is None:
                    return self.through_backend(call, tag, deadline)
            ride = call.ride
            if shm.FAST_ROUNDS:  # the round and its digest in one C call (Arena.checked_round, without its frame)
                numel = call.numel
                if ride is None:
                    answer = arena.rounds.check(tag, numel, call.check[0], 0, 0, 0, 0)
                else:
                    copies = None if ride[3] is None else ride[3](arena, call.args)
                    if copies is None:  # an all_reduce (or a reduce's root): the round reduces its tensor
                        answer = arena.rounds.check(tag, numel, call.check[0], call.args[0].data_ptr(), numel,
                                                    ride[0], ride[1])
                    else:  # a small data movement: the round's copies (kept alive here until it settled)
                        copies = arena.move_words(*copies)
                        answer = arena.rounds.check(tag, numel, call.check[0], copies.buffer_info()[0], 0, 4, 9)
                if answer:
                    arena.settle_check(answer, deadline)
                return ride is not None
            arena.checked_round((tag, call.numel, call.check[0]), digest(tag, call.numel, call.check[0]), None,
                                0, 0, 0, 0, deadline)
        except TimeoutError as error:
            raise _reached(call, tag, error) from None
        except shm.CallMismatch:  # the fingerprint, made only now: every call would pay for it
            raise shm.CallMismatch(_fingerprint(call, tag)) from None
        return False

    def in_first_sync(self, call, tag: int, deadline: Optional[float]) -> bool:
        """Arm the check of an "shm" call: its first sync compares the digests (no round of its own).  A small
        all_reduce (the plan's ``ride``) is that one round: the plan checks it with ``in_segment`` instead."""
        arena = self.group.communicator.local.arena
        if arena is None:
            try:
                arena = self._arena(call, tag, deadline, refuse=True)
            except TimeoutError as error:
                raise _reached(call, tag, error) from None
        arena.expect(digest(tag, call.numel, call.check[0]), (tag, call.numel, *call.check[1]))
        return False

    def settle(self, call, deadline: Optional[float]) -> None:
        """After an "shm" call armed by ``in_first_sync``: run its check if the call never synced."""
        arena = self.group.communicator.local.arena
        if arena is not None and arena.armed is not None:
            arena.settle(deadline)

    # -- the stage: across hosts, or through the backend ----------------------------------------------
    def across_hosts(self, call, tag: int, deadline: Optional[float], balance: Optional[int] = None) -> bool:
        """The stage, reduced by the hierarchical algorithm: inside each host through its segment, across hosts
        once among one rank per host."""
        t = self.group.communicator
        try:
            if not t.local.host_segments and not _hosts_share_segments(t, tag, deadline):
                self.group.forget_plans()  # every rank alike: from now on the group checks through the backend
                return self.through_backend(call, tag, deadline, balance=balance)
        except TimeoutError as error:
            raise _reached(call, tag, error) from None
        return self.through_backend(call, tag, deadline, self._reduce_across_hosts, balance)

    def _reduce_across_hosts(self, stage: torch.Tensor, *, tag: int, deadline: Optional[float]) -> None:
        all_reduce_hierarchical(self.group.communicator, stage, "sum", tag=tag, deadline=deadline, segment_bytes=0)

    def through_backend(self, call, tag: int, deadline: Optional[float], reduce: Optional[Callable[..., None]] = None,
                        balance: Optional[int] = None) -> bool:
        """The digests meet in the stage (see [Note: the stage]), SUM-reduced by ``reduce(stage, tag=, deadline=)``:
        the backend's own primitive (``Backend.reduce_stage``) unless another is given (``across_hosts``'s).  A small
        SUM/AVG all_reduce of floats by "native" or "hierarchical" rides in it and is done, where the backend's
        tensors live beside the stage (``Backend.STAGE_RIDES``).  ``balance``: the call's split sizes' (see
        [Note: split sizes]), in the payload's first element."""
        header = stage_header(digest(tag, call.numel, call.check[0]))
        words = self._words
        words[:STAGE_HEADER] = header
        numel = call.numel
        rides = (0 < numel <= STAGE_PAYLOAD and call.collective == "all_reduce" and call.options is None
                 and call.op in ("sum", "avg") and call.algorithm in _STAGE_ALGORITHMS and call.dtype in _STAGE_DTYPES
                 and self.group.backend_type.STAGE_RIDES)
        if rides:
            self.stage[STAGE_HEADER:STAGE_HEADER + numel] = call.args[0]
        elif balance is not None:
            words[STAGE_HEADER] = balance
        try:
            (self.group.communicator.reduce_stage if reduce is None else reduce)(self.stage, tag=tag, deadline=deadline)
        except TimeoutError as error:
            raise _reached(call, tag, error) from None
        n = self.group.communicator.size
        if not stage_agrees(words[:STAGE_HEADER].tolist(), header, n):
            self.name_mismatch(_fingerprint(call, tag), deadline)  # raises, or the digests collided: the call runs
            return False
        if balance is not None and int(words[STAGE_HEADER]) % SPLITS_PRIME:
            self.name_splits(call, deadline)
        if rides:
            reduced = self.stage[STAGE_HEADER:STAGE_HEADER + numel]
            call.args[0].copy_(reduced / n if call.op == "avg" else reduced)
        return rides

    # -- naming the ranks that differ ----------------------------------------------------------------
    def full(self, call, tag: int, deadline: Optional[float]) -> bool:
        """Debug: all-gather every rank's whole fingerprint, on every call."""
        try:
            self.name_mismatch(_fingerprint(call, tag), deadline)
        except TimeoutError as error:
            raise _reached(call, tag, error) from None
        return False

    def name_mismatch(self, mine: tuple, deadline: Optional[float]) -> None:
        """All-gather every rank's fingerprint ``mine`` (``(tag, numel, *cell)``) over the group's backend; raise
        ``CollectiveMismatchError`` naming the first two ranks that differ.  Every rank of the group calls it."""
        group = self.group
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

    def mismatch_error(self, collective: str, mismatch: "shm.CallMismatch",
                       deadline: Optional[float]) -> CollectiveMismatchError:
        """The error of a segment round whose digests differed (on every rank at once): every rank all-gathers the
        fingerprints (:meth:`name_mismatch`).  Raises ``TimeoutError``/``PeerFailure`` from that all-gather (a peer
        that called something else had left)."""
        try:
            self.name_mismatch(mismatch.fingerprint, deadline)
        except CollectiveMismatchError as error:
            return error
        return CollectiveMismatchError(f"rank {self.group.my_global_rank}: {collective} on {self.group.describe()}: "
                                       f"the ranks' call digests differed")


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


def checker_for(group, algorithm: str, config) -> Optional[Checker]:
    """``group.check.checker_for(algorithm, config)``: the checker a plan row of ``group`` runs."""
    return group.check.checker_for(algorithm, config)
