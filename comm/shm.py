"""Shared memory between the ranks of a communicator that share a host: the arena and the heaps.

An *arena* is one segment mapped by every rank of a communicator, made at the first "shm" call
and kept with the communicator (``t.local.arena``) until the backend's ``close()``.  Layout::

    n control lines of LINE bytes (rank p's line is written only by rank p)
        u32 arrive      the last step rank p reached (a futex word)
        u32 sleeping    1 while some rank may sleep on p's ``arrive``
        u32 pid, u32 pid namespace     for the liveness check of a waiting peer
        i64 x 4, twice  per-call words (``publish``/``peer_word``), by call parity
        i64 probe       address of a private word, for the cross-memory check (``Arena.decide_cross_memory``)
        i64 readable    1 if this rank could read and write a peer's private memory (``process_vm_readv``/``writev``)
        i64 digest x 2  the mismatch check's digests, by check parity
        i64 abandoned   0, or the code of the call this rank abandoned (``Arena.abandon``)
    3 buffers x n slots of ``slot_bytes``   round ``k`` of any collective uses buffer ``k % 3``

[Note: steps and buffers]  Every rank calls the same collectives in the same order, so every
rank passes the same sequence of *steps*.  ``sync()`` is a barrier: this rank stores its next
step in its ``arrive`` word and waits until every peer's word reaches it — a flag per step
instead of a message.  A collective runs in *rounds*; round ``k`` writes only buffer ``k % 3``
before a sync -- this rank's slot, or any slot of a round where it alone writes (broadcast's and
scatter's root) -- and reads peers' slots of buffer ``k % 3`` after it, until the sync after the next.  Three buffers let a schedule overlap round ``k``'s reads with round
``k+1``'s writes with one sync per round, and let a call start writing before its peers have
finished reading the previous call's last round.  Rules every schedule keeps: before its first
sync a call writes only its first round's buffer; after its last sync it reads only its last
round's buffer.  Per-call words alternate between two sets by call parity for the same reason.

[Note: waiting]  A waiter spins briefly (yielding the core: ranks are oversubscribed), then
sets the peer's ``sleeping`` word and sleeps on its ``arrive`` word with ``FUTEX_WAIT``; the peer
wakes it after storing a step if ``sleeping`` is set.  Sleeps last at most ``SLEEP_SLICE_S`` so
the waiter checks the deadline (``TimeoutError``) and whether the peer process still exists
(``PeerFailure``: a rank killed while others wait is reported, not waited for).

[Note: nothing left behind]  A segment's name lives in ``/dev/shm`` only between its creation
by rank 0 and the moment every rank has mapped it (rank 0 unlinks it then, and in a ``finally``
on any failure).  A process killed inside that window leaves a file named
``zerocomm-<pid>-...``; the next arena or heap made on the host removes those whose creator
process is gone.  Mappings end when the last tensor viewing them is freed.

[Note: reading peers' private memory]  Where the kernel lets a process read and write another's
memory (``process_vm_readv``/``process_vm_writev``, "cross-memory attach": same user, no Yama
restriction, no seccomp filter against it), a large all_reduce reads each peer's own tensor directly
instead of having it copied into a slot first, and writes its reduced slice straight into the peers'
tensors: the traffic of one copy, as for tensors from :func:`shared_empty`.  Whether every rank can is
agreed once, when the arena is made (``Arena.decide_cross_memory``), so all ranks take the same schedule;
``CROSS_MEMORY = False`` turns it off.

[Note: an abandoned call]  A rank that leaves a call at its deadline (or because a peer failed) has
stored the call's steps; a late peer arriving afterwards would find every step reached and finish the
call with what the others left in their slots, the only rank to think it succeeded.  So the leaving rank
marks the call (:meth:`Arena.abandon`): it writes a code into its ``abandoned`` word and sets its
``arrive`` word far behind every step, so that no peer ever sees it arrive again.  A peer that waits for
it then sees the code between sleeps and raises ``PeerFailure`` carrying it (``abandoned``), at once: the
call fails on every rank, the late one too.  (A peer that still waits for another, missing rank waits on
to its deadline: that rank is the cause, and the timeout names it.)  The common round never reads the word:
only a peer that has to wait does.  (A peer that saw every step reached just before the mark finishes the call: the leaving
rank's deadline and the peer's arrival raced; its next call of the group then fails on the mark.)

*Heaps* (``shm_heap.py``) are segments for tensors that live in shared memory from the start;
they are kept on the backend object beside the arena and forgotten with it (:func:`release`).
"""
from __future__ import annotations

import ctypes
import mmap
import os
import platform
import secrets
import select
import threading
import time
from array import array
from typing import Optional, Sequence

import numpy as np
import torch

from . import topology
from .errors import UnsupportedError
from .transport import PeerFailure, Transport

try:
    from . import _shmfast  # rounds in C, optional (Arena.reduce_small_c, gather_round, move_round)
except ImportError:
    _shmfast = None

#: Whether a check round can carry a payload (``Arena.checked_round``): the C round is built.
FAST_ROUNDS = _shmfast is not None


def small_round_in_c() -> bool:
    """Whether a small all_reduce's round runs in C (:meth:`Arena.reduce_small_c`): ``_shmfast`` is built and in
    use (a test sets ``_shmfast`` to ``None`` to run the Python round)."""
    return _shmfast is not None

#: Where segments are created (a tmpfs on Linux), named ``PREFIX<creator's pid>-<random>``.
SHM_DIR, PREFIX = "/dev/shm", "zerocomm-"
#: Bytes of one rank's control line (two cache lines: no false sharing between ranks' words).
LINE = 128
#: Bytes of one rank's slot in one of the three round buffers (pieces of a message are at most this, or n times
#: this where one rank alone writes a round: broadcast's and scatter's root).
SLOT_BYTES = 2 << 20
#: Alignment of slots and heap regions (a cache line; every dtype's element size divides it).
ALIGN = 64
#: Seconds a waiter polls a peer's step word before sleeping, yielding the core between polls (another
#: runnable process takes it; an idle core comes straight back): a futex sleep and wake costs tens of µs.
SPIN_S = 50e-6
#: Longest single sleep: how often a waiter re-checks its deadline and the peer's liveness.
SLEEP_SLICE_S = 0.02
#: Read and write peers' private memory (``process_vm_readv``/``writev``) where every rank can (module notes).
CROSS_MEMORY = True
#: Most numpy arrays over small user tensors' memory an arena keeps (``Arena.numpy_view``).
_NUMPY_VIEWS = 16
_MISSING = object()
_NAME_BYTES = 64  # of a segment name as exchanged

_MASK = 0xFFFFFFFF
_WORDS = LINE // 4  # u32 words per line
_ARRIVE, _SLEEPING, _PID, _PIDNS = 0, 1, 2, 3
_PER_CALL = 2  # i64 index within the line where the per-call words start (byte 16)
PER_CALL_WORDS = 4
_PROBE, _READABLE = _PER_CALL + 2 * PER_CALL_WORDS, _PER_CALL + 2 * PER_CALL_WORDS + 1  # i64 indices
_DIGEST = _READABLE + 1  # i64 index of the mismatch check's two digest words (bytes 96-111 of the line)
_ABANDONED = _DIGEST + 2  # i64 index of the abandoned call's code (bytes 112-119; see [Note: an abandoned call])
#: How far behind its last step an abandoning rank sets its ``arrive`` word: no step a peer waits for is reached.
_BEHIND = 0x40000000

_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex_wait(address: int, expected: int, seconds: float) -> None:
    """Sleep while the u32 at ``address`` equals ``expected``, at most ``seconds`` (wakes early are fine)."""
    if _FUTEX is None:  # no futex number for this machine: a short sleep instead
        time.sleep(min(seconds, 1e-4))
        return
    whole = int(seconds)
    spec = _Timespec(whole, int((seconds - whole) * 1e9))
    _syscall(_FUTEX, ctypes.c_void_p(address), _FUTEX_WAIT, ctypes.c_uint32(expected), ctypes.byref(spec), None, 0)


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_readv = getattr(_libc, "process_vm_readv", None)
_writev = getattr(_libc, "process_vm_writev", None)
for _call in (_readv, _writev):
    if _call is not None:
        _call.restype = ctypes.c_ssize_t
        _call.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec),
                          ctypes.c_ulong, ctypes.c_ulong]


def _cross(call, pid: int, address: int, local: torch.Tensor) -> int:
    nbytes = local.numel() * local.element_size()
    if nbytes == 0:
        return 0
    mine, theirs = _IOVec(local.data_ptr(), nbytes), _IOVec(address, nbytes)
    done = call(pid, ctypes.byref(mine), 1, ctypes.byref(theirs), 1, 0)
    return done if done >= 0 else -ctypes.get_errno()


def read_peer(pid: int, address: int, into: torch.Tensor) -> int:
    """Copy ``into.nbytes`` bytes at ``address`` in process ``pid`` into the contiguous ``into``; returns
    the bytes read, or ``-errno`` (ESRCH: the process is gone; EPERM/ENOSYS: not allowed here)."""
    if _shmfast is not None:  # one call, the GIL released
        return _shmfast.cross(0, pid, address, into.data_ptr(), into.nbytes)
    return _cross(_readv, pid, address, into)


def write_peer(pid: int, address: int, source: torch.Tensor) -> int:
    """Copy the contiguous ``source`` to ``address`` in process ``pid``; returns bytes written or ``-errno``."""
    if _shmfast is not None:
        return _shmfast.cross(1, pid, address, source.data_ptr(), source.nbytes)
    return _cross(_writev, pid, address, source)


def _futex_wake(address: int) -> None:
    if _FUTEX is not None:
        _syscall(_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)


_NUMPY_DTYPES: dict = {}  # torch dtype -> numpy dtype or None


def _numpy_dtype(dtype: torch.dtype) -> Optional[np.dtype]:
    """numpy's dtype for a torch dtype, or ``None`` where numpy has none (bfloat16, ...); cached."""
    if dtype not in _NUMPY_DTYPES:
        try:
            _NUMPY_DTYPES[dtype] = torch.empty(0, dtype=dtype).numpy().dtype
        except (TypeError, RuntimeError):
            _NUMPY_DTYPES[dtype] = None
    return _NUMPY_DTYPES[dtype]


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino & _MASK
    except OSError:
        return 0


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


# -- segments: create, map, exchange the name, unlink -------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def sweep_stale(directory: str = SHM_DIR) -> list:
    """Remove zerocomm segments left by processes that no longer exist (a ``kill -9`` inside the
    short window between creation and unlink); returns the names removed."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    return removed


def _map(path: str, nbytes: int, create: bool) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def _wait(req, deadline: Optional[float]) -> None:  # a transport request, waited for until the deadline
    req.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))


def map_together(t: Transport, nbytes: int, *, tag: int, deadline: Optional[float]) -> mmap.mmap:
    """One segment of ``nbytes`` (zero-filled) mapped by every rank of ``t``; its name is gone from
    ``/dev/shm`` when this returns.  Every rank calls it together with the call's ``tag``.

    Rank 0 creates the file and sends its name (empty if it could not) to every peer; each peer maps it
    and answers; rank 0 unlinks it and sends every peer the verdict, so that a failure anywhere raises
    ``UnsupportedError`` on every rank, at once.
    """
    name, verdict, failure = torch.zeros(_NAME_BYTES, dtype=torch.uint8), torch.ones(1, dtype=torch.uint8), None
    mm = None
    if t.rank == 0:
        sweep_stale()
        path = os.path.join(SHM_DIR, f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}")
        try:
            try:
                mm = _map(path, nbytes, create=True)
                name[:len(path.encode())] = torch.frombuffer(bytearray(path.encode()), dtype=torch.uint8)
            except OSError as error:
                failure = f"rank 0 cannot create {path} ({error})"
            acks = {peer: torch.zeros(1, dtype=torch.uint8) for peer in range(1, t.size)}
            for req in [t.isend(name, p, tag) for p in acks] + [t.irecv(ack, p, tag) for p, ack in acks.items()]:
                _wait(req, deadline)
        finally:
            if os.path.exists(path):  # created, even where mapping it failed
                os.unlink(path)
        failed = [peer for peer, ack in acks.items() if int(ack) != 1]
        failure = failure or (f"ranks {failed} could not map {path}" if failed else None)
        verdict.fill_(failure is None)
        for req in [t.isend(verdict, peer, tag) for peer in acks]:
            _wait(req, deadline)
    else:
        _wait(t.irecv(name, 0, tag), deadline)
        path = bytes(name.tolist()).rstrip(b"\0").decode()
        try:
            mm = _map(path, nbytes, create=False) if path else None
        except OSError as error:
            failure = f"rank {t.rank} cannot map rank 0's segment {path} ({error})"
        _wait(t.isend(torch.tensor([mm is not None], dtype=torch.uint8), 0, tag), deadline)
        _wait(t.irecv(verdict, 0, tag), deadline)
        failure = failure or (None if int(verdict) else "rank 0 or a peer could not make or map the segment")
    if failure is not None:
        if mm is not None:
            mm.close()
        raise UnsupportedError(f"rank {t.rank}: shm: {failure} although every rank reports the same host; set "
                               f"{topology.HOST_ENV} per shared /dev/shm, or use algorithm='ring'")
    return mm


# -- the arena --------------------------------------------------------------------------------------

class CallMismatch(Exception):
    """A shared-memory call's digest differed from a peer's (raised on every rank, at the same sync);
    ``fingerprint`` is this rank's, for naming the ranks that differ."""

    def __init__(self, fingerprint: tuple):
        super().__init__(fingerprint)
        self.fingerprint = fingerprint


#: The mismatch check's digest of one call in C (``check.digest``, whose Python twin is ``check.digest_twin``), or
#: ``None`` where ``_shmfast`` is not built: it sits beside the segment round that hashes and compares it.
digest_in_c = _shmfast.digest if _shmfast is not None else None


class _Rounds:
    """The round counters where ``_shmfast`` (whose ``Rounds`` holds them) is not built."""

    __slots__ = ("step", "round", "checks")

    def __init__(self):
        self.step = self.round = self.checks = 0


class Arena:
    """The shared segment of one communicator; see the module notes.  Not thread-safe: the group runs
    one collective at a time.

    Attributes:
        n, rank: the communicator's size and this rank.
        slot_bytes: bytes of one slot (the most one rank puts in one round, but where it alone writes the round).
        rounds: the round counters; ``rounds.round`` is the next round's number (its buffer is ``round % 3``),
            which schedules advance.
    """

    def __init__(self, mm: mmap.mmap, n: int, rank: int, slot_bytes: int):
        self.n, self.rank, self.slot_bytes = n, rank, slot_bytes
        self._mm = mm
        self.raw = torch.frombuffer(mm, dtype=torch.uint8)
        # memoryview casts: a word read or written costs a fraction of a numpy scalar access
        self._u32 = memoryview(mm)[:n * LINE].cast("I")
        self._i64 = memoryview(mm)[:n * LINE].cast("q")
        self._base = self.raw.data_ptr()
        self._data = aligned(n * LINE)
        self._buffers, self._round_bytes = self._base + self._data, n * slot_bytes  # for the C round
        #: Bytes of one round's buffer: its ``n`` slots, which a MOVE round (:meth:`move_round`) addresses as one.
        self.buffer_bytes = n * slot_bytes
        #: The round counters: ``step`` (the last step stored), ``round`` (the next round's number) and ``checks``
        #: (mismatch checks run: picks the digest word, they alternate) -- in C where built, so that a check's
        #: round is one call (``rounds.check``).
        self.rounds = (_shmfast.Rounds(self._base, LINE, n, rank, self._buffers, slot_bytes, _DIGEST)
                       if _shmfast is not None else _Rounds())
        self.calls = 0
        self.armed: Optional[tuple] = None  # (digest, fingerprint) of an armed check (``expect``)
        self._nothing = torch.empty(1)[:0]  # a check alone's tensor in the C round (``settle``)
        #: Whether large all_reduce calls read and write peers' tensors with ``process_vm_readv``/``writev``
        #: (``decide_cross_memory`` sets it).
        self.cross_memory = False
        self._views: dict = {}
        self._numpy: dict = {}
        self._pidfds: dict = {}
        self._fence = threading.Lock()
        self._namespace = _pid_namespace()
        self._peers = tuple(p for p in range(n) if p != rank)
        me = rank * _WORDS
        self._u32[me + _PID] = os.getpid()
        self._u32[me + _PIDNS] = self._namespace

    @staticmethod
    def nbytes(n: int, slot_bytes: int) -> int:
        return aligned(n * LINE) + 3 * n * slot_bytes

    # -- slots ------------------------------------------------------------------------------------
    def slot(self, k: int, p: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """Rank ``p``'s slot in the buffer of round ``k``, as a flat tensor of ``dtype`` (cached views)."""
        key = (k % 3, p, dtype)
        view = self._views.get(key)
        if view is None:
            start = self._data + ((k % 3) * self.n + p) * self.slot_bytes
            view = self.raw[start:start + self.slot_bytes].view(dtype)
            self._views[key] = view
        return view

    def slots(self, k: int, dtype: torch.dtype, numel: int) -> list:
        """Every rank's first ``numel`` elements of its slot in round ``k``'s buffer (cached: small calls repeat)."""
        key = (k % 3, dtype, numel)
        views = self._views.get(key)
        if views is None:
            if len(self._views) > 512:  # many distinct sizes: start over rather than grow without bound
                self._views.clear()
            views = self._views[key] = [self.slot(k, p, dtype)[:numel] for p in range(self.n)]
        return views

    def slots_numpy(self, k: int, dtype: np.dtype, numel: int) -> list:
        """``slots`` as numpy arrays (for the small path's ufuncs)."""
        key = (k % 3, dtype, numel, "numpy")
        views = self._views.get(key)
        if views is None:
            views = self._views[key] = [self.slot(k, p).numpy()[:numel * dtype.itemsize].view(dtype)
                                        for p in range(self.n)]
        return views

    def numpy_view(self, tensor: torch.Tensor) -> Optional[np.ndarray]:
        """A flat numpy array over the contiguous ``tensor``'s memory, or ``None`` for a dtype numpy lacks.

        Cached by (address, bytes, dtype), which alone fix the memory the array covers: a cached array is
        used only while some tensor with that key is at hand, so it always covers that tensor's memory.
        Made from the address, not with ``Tensor.numpy()``, which would keep the tensor alive and forbid
        resizing its storage.  Making an array costs more than the reduction of a few bytes.
        """
        dtype = tensor.dtype
        key = (tensor.data_ptr(), tensor.nbytes, dtype)
        made = self._numpy.get(key, _MISSING)
        if made is _MISSING:
            if len(self._numpy) >= _NUMPY_VIEWS:
                self._numpy.clear()
            kind = _numpy_dtype(dtype)
            made = None if kind is None else np.frombuffer((ctypes.c_byte * key[1]).from_address(key[0]), kind)
            self._numpy[key] = made
        return made

    def scratch(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """This rank's private ``numel`` elements of ``dtype`` (cached: made once per dtype and size)."""
        key = ("scratch", dtype, numel)
        made = self._views.get(key)
        if made is None:
            made = self._views[key] = torch.empty(numel, dtype=dtype)
        return made

    # -- per-call words ---------------------------------------------------------------------------
    def begin(self) -> int:
        """Start a call: returns its parity (which set of per-call words it uses)."""
        self.calls += 1
        return self.calls & 1

    def publish(self, parity: int, index: int, value: int) -> None:
        """Set this rank's per-call word ``index`` (before the call's first sync)."""
        self._i64[self.rank * (LINE // 8) + _PER_CALL + parity * PER_CALL_WORDS + index] = value

    def publish_words(self, parity: int, values: tuple) -> None:
        """Set this rank's per-call words ``0 .. len(values) - 1`` at once (before the call's first sync)."""
        start = self.rank * (LINE // 8) + _PER_CALL + parity * PER_CALL_WORDS
        i64 = self._i64
        for k, value in enumerate(values):
            i64[start + k] = value

    def peer_words(self, parity: int, p: int, count: int) -> memoryview:
        """Rank ``p``'s per-call words ``0 .. count - 1`` (after the call's first sync, before its second)."""
        start = p * (LINE // 8) + _PER_CALL + parity * PER_CALL_WORDS
        return self._i64[start:start + count]

    def peer_word(self, parity: int, p: int, index: int) -> int:
        """Rank ``p``'s per-call word ``index`` (after the call's first sync, before its second)."""
        return self._i64[p * (LINE // 8) + _PER_CALL + parity * PER_CALL_WORDS + index]

    def expect(self, digest: int, fingerprint: tuple) -> None:
        """Arm the mismatch check of the call about to run (every rank, before its schedule): the call's
        first sync also compares ``digest`` (``group.digest`` of its call) with every peer's, and raises
        :class:`CallMismatch` carrying ``fingerprint`` on every rank if any differs.  Every schedule syncs
        before it reads a peer's byte, so the check costs no sync of its own; a call that never synced
        (nothing to move) runs it in :meth:`settle`."""
        self.armed = (digest, fingerprint)

    def settle(self, deadline: Optional[float]) -> None:
        """After the call: run the armed check if the call's schedule did not (gloo's, before every call)."""
        if self.armed is not None and _shmfast is not None:  # sync's words, as a C round with nothing to reduce
            self.reduce_small_c(self._nothing, 0, 0, deadline, "the mismatch check")
        elif self.armed is not None:
            self.sync(deadline, "the mismatch check")

    # -- steps ------------------------------------------------------------------------------------
    def sync(self, deadline: Optional[float], what: str) -> None:
        """Barrier of all ranks through the step words: store the next step, wait for every peer's.
        With a check armed (``expect``) it also compares the ranks' digests: the digest word alternates
        by check, and a peer is at most one check ahead, so the word read here is stable."""
        expected = self.armed
        if _shmfast is not None:  # the same words and steps, in C: arrive, spin briefly, then sleep a slice at a time
            word, code = -1, 0
            if expected is not None:
                self.armed = None
                self.rounds.checks += 1
                word, code = _DIGEST + (self.rounds.checks & 1), expected[0]
            step = self.rounds.step = (self.rounds.step + 1) & _MASK
            args = (self._base, LINE, self.n, self.rank, self._buffers, self.slot_bytes, step, self._buffers, 0, 0, 0,
                    word, code)
            answer = _shmfast.post(*args)
            if answer:
                self._settle_round(answer, args, step, deadline, what, expected)
            return
        if expected is not None:
            self.armed = None
            self.rounds.checks += 1
            word = _DIGEST + (self.rounds.checks & 1)
            self._i64[self.rank * (LINE // 8) + word] = expected[0]
        step = self.rounds.step = (self.rounds.step + 1) & _MASK
        u32 = self._u32
        me = self.rank * _WORDS
        u32[me] = step  # _ARRIVE: the one store that tells every peer this rank got here
        with self._fence:  # a locked instruction: the store above is visible before `sleeping` is read
            pass
        if u32[me + _SLEEPING]:
            u32[me + _SLEEPING] = 0
            _futex_wake(self._base + 4 * me)
        for p in self._peers:
            if (u32[p * _WORDS] - step) & _MASK >= 0x80000000:  # not reached yet
                self._wait_for(p, step, deadline, what)
        if expected is not None and any(self._i64[p * (LINE // 8) + word] != expected[0] for p in self._peers):
            # Every rank stops here, at the same step: start the next call's rounds and parity in step.
            self.calls = self.rounds.round = 0
            raise CallMismatch(expected[1])

    def reduce_small_c(self, tensor: torch.Tensor, kind: int, op: int, deadline: Optional[float], what: str) -> None:
        """One round of the small all_reduce through ``_shmfast`` (``kind``, ``op``: its codes): copy in,
        arrive, spin briefly (C); the slow wait (deadline, sleep, liveness) here; then compare the armed
        check's digests and reduce every slot into the contiguous ``tensor`` (C).  The same steps, words
        and bits as ``Arena.sync`` plus the numpy reduction of ``algorithms/shm.py``."""
        self._slot_round(tensor.data_ptr(), tensor.numel(), kind, op, deadline, what)

    def gather_round(self, output: torch.Tensor, nbytes: int, deadline: Optional[float], what: str) -> bool:
        """One C round of an all_gather: this rank's ``nbytes`` at chunk ``rank`` of the contiguous byte tensor
        ``output`` go through its slot, every peer's into its chunk; an armed check (``expect``) rides in it.
        False, with nothing done, where the C round is not built."""
        if _shmfast is None:
            return False
        self._slot_round(output.data_ptr(), nbytes, 4, 8, deadline, what)  # kind 4 (bytes), op 8 (gather)
        return True

    def move_round(self, ins: Sequence[tuple], outs: Sequence[tuple], deadline: Optional[float], what: str) -> None:
        """One round of copies through the next buffer (its ``n`` slots, :attr:`buffer_bytes` in all): each
        ``(address, offset, nbytes)`` of ``ins`` (this process's memory) into the buffer at byte ``offset``; the round's
        sync (an armed check, ``expect``, rides in it and is compared before any peer's byte is read); then each
        ``(address, offset, nbytes)`` of ``outs`` out of the buffer at ``offset`` into this process's memory.  A rank
        writes only bytes no peer writes in the same round: its own slot (``rank * slot_bytes`` on), or any slot of a
        round where it alone writes (broadcast's and scatter's root).  The round of broadcast, scatter, gather,
        all_to_all and the non-root side of a small reduce.  One C call (``_shmfast`` op MOVE) where built; else the
        same copies (``ctypes.memmove``) around :meth:`sync`.  ``ValueError`` before any byte moves if a copy does not
        lie within the buffer."""
        for entries in (ins, outs):  # before the round's counters move (C checks them again)
            for _, offset, nbytes in entries:
                if offset < 0 or nbytes < 0 or offset + nbytes > self.buffer_bytes:
                    raise ValueError(f"{what}: {nbytes} bytes at offset {offset} do not lie within a round's slots "
                                     f"({self.n} of {self.slot_bytes} bytes)")
        if _shmfast is not None:
            words = self.move_words(ins, outs)
            self._slot_round(words.buffer_info()[0], 0, 4, 9, deadline, what)  # kind 4 (bytes), op 9 (MOVE)
            return
        k = self.rounds.round
        self.rounds.round = k + 1
        buffer = self._buffers + (k % 3) * self._round_bytes
        for address, offset, nbytes in ins:
            if nbytes:
                ctypes.memmove(buffer + offset, address, nbytes)
        self.sync(deadline, what)
        for address, offset, nbytes in outs:
            if nbytes:
                ctypes.memmove(address, buffer + offset, nbytes)

    @staticmethod
    def move_words(ins: Sequence[tuple], outs: Sequence[tuple]) -> array:
        """The copies of a MOVE round (:meth:`move_round`'s ``ins`` and ``outs``) as ``_shmfast``'s int64 words:
        ``len(ins), len(outs)``, then each entry's three numbers.  The C round (``post``, ``Rounds.check``) refuses
        (``ValueError``) a copy that does not lie within the round's buffer before its counters move or a byte does."""
        words = array("q", (len(ins), len(outs)))
        for entry in ins:  # a loop of extends: faster than one chained extend for the few entries a round has
            words.extend(entry)
        for entry in outs:
            words.extend(entry)
        return words

    def _slot_round(self, address: int, nelem: int, kind: int, op: int, deadline: Optional[float], what: str) -> None:
        """One C round through the slots of the next buffer: ``nelem`` elements of C ``kind`` at ``address``, combined
        by C ``op`` (``_shmfast.c`` says which); the armed check (``expect``), if any, compared in it."""
        expected = self.armed
        word, code = -1, 0
        if expected is not None:
            self.armed = None
            self.rounds.checks += 1
            word, code = _DIGEST + (self.rounds.checks & 1), expected[0]
        k = self.rounds.round
        self.rounds.round = k + 1
        step = self.rounds.step = (self.rounds.step + 1) & _MASK
        args = (self._base, LINE, self.n, self.rank, self._buffers + (k % 3) * self._round_bytes, self.slot_bytes,
                step, address, nelem, kind, op, word, code)
        answer = _shmfast.post(*args)
        if answer:
            self._settle_round(answer, args, step, deadline, what, expected)

    def checked_round(self, call: tuple, code: int, fingerprint: tuple, address: int, numel: int, kind: int, op: int,
                      deadline: Optional[float]) -> None:
        """The mismatch check as one round of its own: compare the digest ``code`` of ``call`` (``(tag, numel, cell
        code)``, ``check.digest``; in C, hashed here from ``call``) with every peer's (raising :class:`CallMismatch` carrying ``fingerprint`` on every
        rank if any differs), and reduce, in the same round, the ``numel`` elements of C ``kind`` at ``address``
        by C ``op`` (``numel`` 0: nothing rides; a payload needs ``FAST_ROUNDS``).  ``reduce_small_c``'s steps
        with the check armed, in one call."""
        if _shmfast is None:
            self.armed = (code, fingerprint)
            self.sync(deadline, "the mismatch check")
            return
        answer = self.rounds.check(*call, address, numel, kind, op)
        if answer:
            self.settle_check(answer, deadline, fingerprint)

    def settle_check(self, answer: int, deadline: Optional[float], fingerprint: Optional[tuple] = None) -> None:
        """The rest of a check round (``rounds.check``) that answered ``answer`` (not 0): as ``_settle_round``."""
        self._settle_round(answer, self.rounds.last(), self.rounds.step, deadline, "the mismatch check",
                           (0, fingerprint))

    def _settle_round(self, answer: int, args: tuple, step: int, deadline: Optional[float], what: str,
                      armed: Optional[tuple]) -> None:
        """The rest of a C round whose ``post`` answered ``answer`` (not 0): while a peer is late (2), sleep in C a
        slice at a time, checking the deadline and the late peers' liveness here; on a digest mismatch (1) every
        rank stops here, at the same step, and raises :class:`CallMismatch` with the ``armed`` check's fingerprint
        (``(digest, fingerprint)``).  A round that ends at once never calls this: the common case."""
        while answer == 2:
            answer = _shmfast.settle(*args, SLEEP_SLICE_S)
            if answer == 2:
                self._still_late(step, deadline, what)
        for p in self._peers:  # a peer that arrived, then abandoned while this rank waited for another
            self._left(p, what, step)
        if answer:
            self.calls = self.rounds.round = 0  # every rank stops here, at the same step: the next call starts in step
            raise CallMismatch(armed[1])

    def _still_late(self, step: int, deadline: Optional[float], what: str) -> None:
        """Between sleeps of a C round: raise ``TimeoutError`` past ``deadline``, ``PeerFailure`` for a late peer
        whose process has exited."""
        for p in self._peers:
            if not self._reached(p, step):
                self._left(p, what, step)
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"{what}: shared-memory step {step} from rank {p}")
                if not self._peer_alive(p) and not self._reached(p, step):
                    raise PeerFailure(f"{what}: rank {p} (pid {self.pid(p)}) exited while this rank waited for its "
                                      f"shared-memory step {step}", peer=p)

    def _reached(self, p: int, step: int) -> bool:
        return ((self._u32[p * _WORDS + _ARRIVE] - step) & _MASK) < 0x80000000

    def _wait_for(self, p: int, step: int, deadline: Optional[float], what: str) -> None:
        until = time.perf_counter() + SPIN_S
        while True:
            if self._reached(p, step):
                return
            if time.perf_counter() > until:
                break
            os.sched_yield()
        word = p * _WORDS + _ARRIVE
        address = self._base + 4 * word
        while True:
            self._u32[p * _WORDS + _SLEEPING] = 1
            seen = self._u32[word]
            if ((seen - step) & _MASK) < 0x80000000:
                return
            self._left(p, what, step)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError(f"{what}: shared-memory step {step} from rank {p}")
            _futex_wait(address, seen, SLEEP_SLICE_S if deadline is None else min(SLEEP_SLICE_S, deadline - now))
            if not self._reached(p, step) and not self._peer_alive(p):
                raise PeerFailure(f"{what}: rank {p} (pid {self.pid(p)}) exited while this "
                                  f"rank waited for its shared-memory step {step}", peer=p)

    def pid(self, p: int) -> int:
        """Rank ``p``'s process id (written by that rank when it mapped the arena)."""
        return self._u32[p * _WORDS + _PID]

    def abandon(self, code: int) -> None:
        """Mark the call this rank is leaving (a timeout, a failed peer) as abandoned, for good: ``code`` (a
        positive int63, the group's: which call and why) in this rank's ``abandoned`` word, then its ``arrive``
        word set far behind its last step, and sleepers on it woken.  Every peer that waits for this rank from
        now on raises ``PeerFailure`` carrying ``code`` (see [Note: an abandoned call]).  This rank makes no
        further round on the arena (its group is unusable after the failure)."""
        me = self.rank * _WORDS
        self._i64[self.rank * (LINE // 8) + _ABANDONED] = code
        with self._fence:  # the code is visible before the step that sends a peer to read it
            pass
        self._u32[me + _ARRIVE] = (self.rounds.step - _BEHIND) & _MASK
        with self._fence:
            pass
        if self._u32[me + _SLEEPING]:
            self._u32[me + _SLEEPING] = 0
            _futex_wake(self._base + 4 * me)

    def abandoned_by(self, p: int) -> int:
        """Rank ``p``'s abandoned call's code (:meth:`abandon`), or 0."""
        return self._i64[p * (LINE // 8) + _ABANDONED]

    def _left(self, p: int, what: str, step: int) -> None:
        """Raise ``PeerFailure`` if rank ``p`` abandoned the call (:meth:`abandon`) and no other peer is missing, naming
        the peer with the smallest code of all that did (the group's codes make that the one that left first:
        ``abandon.encode``).  While a peer that did not abandon it is still missing, the wait goes on: that
        rank is the cause, and the deadline names it (``TimeoutError``), as for any missing rank."""
        if not self._i64[p * (LINE // 8) + _ABANDONED]:
            return
        if any(not self._reached(q, step) and not self.abandoned_by(q) for q in self._peers):
            return
        code, p = min((self.abandoned_by(q), q) for q in self._peers if self.abandoned_by(q))
        raise PeerFailure(f"{what}: rank {p} (pid {self.pid(p)}) abandoned the call before this rank's "
                          f"shared-memory step {step}", peer=p, abandoned=code)

    def decide_cross_memory(self, deadline: Optional[float]) -> None:
        """Decide, the same on every rank, whether large calls may read and write peers' private memory:
        each rank reads a word of every peer's process with ``process_vm_readv`` and writes the same value
        back with ``process_vm_writev``; all of it on all ranks must succeed.  Every rank calls it once,
        right after making the arena (two syncs)."""
        probe = torch.tensor([0x5A3C0FFEE], dtype=torch.int64)
        line = self.rank * (LINE // 8)
        self._i64[line + _PROBE] = probe.data_ptr()
        self.sync(deadline, "shm arena")
        got = torch.zeros(1, dtype=torch.int64)

        def readable(p: int) -> bool:
            got.zero_()
            address = self._i64[p * (LINE // 8) + _PROBE]
            return (self._u32[p * _WORDS + _PIDNS] == self._namespace
                    and read_peer(self.pid(p), address, got) == 8 and int(got) == int(probe)
                    and write_peer(self.pid(p), address, got) == 8)  # the value it holds: nothing changes

        ok = CROSS_MEMORY and _readv is not None and _writev is not None and all(readable(p) for p in self._peers)
        self._i64[line + _READABLE] = int(ok)
        self.sync(deadline, "shm arena")  # after it no peer reads `probe` any more, and every answer is in
        self.cross_memory = all(self._i64[p * (LINE // 8) + _READABLE] == 1 for p in range(self.n))

    def _peer_alive(self, p: int) -> bool:
        """False once rank ``p``'s process has exited (only checkable within one pid namespace)."""
        pid = self.pid(p)
        if pid == 0 or self._u32[p * _WORDS + _PIDNS] != self._namespace or pid == os.getpid():
            return True
        fd = self._pidfds.get(pid)
        if fd is None:
            try:
                fd = self._pidfds[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                return False
            except (OSError, AttributeError):
                return _alive(pid)
        readable, _, _ = select.select([fd], [], [], 0)
        return not readable

    def close(self) -> None:
        """Close the liveness handles and drop the views; the mapping ends with its last tensor."""
        for fd in self._pidfds.values():
            os.close(fd)
        self._pidfds.clear()
        self._views.clear()
        self._numpy.clear()


def probe_shared_memory(t: Transport, *, tag: int, deadline: Optional[float]) -> bool:
    """Whether the ranks of ``t`` (all on one host, by their names) can share a segment: they map one page
    together; every rank calls it, with ``tag``.  Processes can report one host without sharing ``/dev/shm``
    (containers on the host's network each have their own), and selection must know it before "auto" offers
    "shm".  Where they cannot, ``t`` remembers it, the same on every rank (:func:`shares_memory`)."""
    try:
        map_together(t, 4096, tag=tag, deadline=deadline).close()
        return True
    except UnsupportedError:
        t.local.no_segment = True
        return False


def arena(t: Transport, *, tag: int, deadline: Optional[float]) -> Arena:
    """The arena of communicator ``t``, made by its first caller (every rank, same ``tag``) and cached on ``t``.

    Raises ``UnsupportedError`` (the same on every rank) when the ranks are not all on one host, or cannot
    share a segment (then at once on every later call, with no exchange: every rank knows it alike).
    """
    local = t.local
    if local.arena is not None:
        return local.arena
    if local.no_segment:
        raise UnsupportedError(f"rank {t.rank}: shm: the ranks report one host but could not share a segment; set "
                               f"{topology.HOST_ENV} per shared /dev/shm, or use algorithm='ring'")
    topology.require_one_host(t, tag=tag, deadline=deadline)
    try:
        mm = map_together(t, Arena.nbytes(t.size, SLOT_BYTES), tag=tag, deadline=deadline)
    except UnsupportedError:
        # Every rank alike (map_together's verdict): selection stops offering "shm" (topology.shares_memory).
        local.no_segment = True
        raise
    made = Arena(mm, t.size, t.rank, SLOT_BYTES)
    made.decide_cross_memory(deadline)
    local.arena = made
    return made


def expect(t: Transport, digest: int, fingerprint: tuple, *, tag: int, deadline: Optional[float]) -> None:
    """Arm the mismatch check of a shared-memory call (:meth:`Arena.expect`); every rank of ``t`` calls it
    before the call, and :func:`settle` after it."""
    arena(t, tag=tag, deadline=deadline).expect(digest, fingerprint)


def settle(t: Transport, deadline: Optional[float]) -> None:
    """:meth:`Arena.settle` of ``t``'s arena (every rank, after a call armed with :func:`expect`)."""
    made = t.local.arena
    if made is not None:
        made.settle(deadline)


@Transport.on_close
def release(t: Transport, abandon: bool = False) -> None:
    """Forget ``t``'s arena and heaps (a close hook: the backend's ``close()`` runs it, see
    ``Transport.on_close``; ``abandon`` changes nothing here, no peer is waited for).  Tensors the user still
    holds from :func:`shared_empty` stay valid: a mapping ends with the last tensor viewing it."""
    local = t.local
    made, local.arena = local.arena, None
    if made is not None:
        made.close()
    local.heaps.clear()
