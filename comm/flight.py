"""The flight recorder: each rank's last calls, always kept, published for its peers, written on failure.

[Note: flight recorder]  Every group keeps rings of its last :data:`RING` calls, written by ``Group.run`` --
the one place every collective passes (plan.py's "one path") -- under the group's lock and without a lock of
their own: per call, its cell (``Group.flight``: ``Call.check``, ``(collective, op, dtype, root, algorithm)`` as
the mismatch check's small integers, made once per plan row) and its size in bytes (``Group.flight_sizes``), at
slot ``seq & MASK``.  Two stores into preallocated lists, about 1% of the smallest call (an 8-byte all_reduce
on shared memory, ~3 us): the call number is the slot's, the state is not written per call either -- the group
notes the tag of the call it started and of the last one it completed (``Group.flight_started`` and
``flight_done``; its calls run in order), and :func:`state` derives queued / started / completed / failed from
them.

Where the rank is, the caller's ``file:line``, is not taken per call: a frame per call would cost about as much
as the rest of the call's Python (tests/support/flight_cost.py measures both; docs/failures.md).  It is taken
when it is asked: where a rank stands still -- its heads unchanged for one publishing period, a hang or a rank
stuck in Python -- the publisher reads the stack of the thread that made the world (:func:`position`); an error
reads its own; either names the first frame outside the library, and fills in the ``file:line`` of the call
in progress where that frame is inside one.  ``ZEROCOMM_FLIGHT_CALLERS=1`` records every call's caller too
(``Group.flight_callers``), for a divergence that needs the line of each past call, at the cost of a frame walk
per call.

A daemon thread per world (:class:`Publisher`) writes this rank's head -- the last call of each group, and
where the rank stands when it stands still -- to the world's store, under ``zerocomm/flight/<global rank>``,
about every :data:`PUBLISH_S` seconds and only when it changed.  A rank stuck in Python (or waiting in a
collective) still answers through it.  When a call times out or loses a peer, :func:`note` reads the peers'
heads from the store (within a short bound) and the error names the ranks that did not arrive, what each last
called and where it stands.  ``ZEROCOMM_FLIGHT_DUMP=dir`` makes :func:`dump` write ``dir/flight-rank<R>.json``
on such a failure and at ``destroy_process_group``; ``zerocomm-trace flight dir`` (``benchmarks/flight_report.py``)
merges them.
"""
from __future__ import annotations

import collections
import json
import os
import socket
import sys
import threading
import time
from typing import Dict, List, Optional

from . import best_effort, environment
from .algorithms import ALGORITHM_NAMES, COLLECTIVES
from .reduce_op import SUPPORTED_DTYPES
from .transport import USER_TAG_LIMIT

#: Calls each group keeps (a power of two: a call's slot is ``seq & MASK``).
RING = 256
MASK = RING - 1
#: Seconds between two looks of the publisher thread at this rank's head.
PUBLISH_S = 0.5
#: Seconds an error may spend reading its peers' heads from the store.
READ_S = 2.0
#: How many destroyed groups' heads a rank keeps publishing.
CLOSED_KEPT = 16
#: The store key of a rank's head (under the world's store).
KEY = "zerocomm/flight/{rank}"
#: The file a rank's record is written to under ``ZEROCOMM_FLIGHT_DUMP``.
DUMP_NAME = "flight-rank{rank}.json"

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The communication layer's folder: frames in it are not a caller's.  Its users are callers: the user's code,
#: ``tests`` and ``benchmarks``, and ``zero/`` and ``integrations/``, whose line says which part of a ZeRO step
#: was communicating (a bucket's reduce-scatter, a unit's gather).  torch.distributed's own frames are passed
#: over too: a call made through torch's API (DDP's reducer, ``torch.distributed.all_reduce`` on a zerocomm
#: world) is the user's line above them.
_LIBRARY_DIRS = tuple(os.path.join(_PACKAGE, name) + os.sep for name in ("comm", "ops"))
_LIBRARY_FILES = (os.path.join(_PACKAGE, "__init__.py"),)
try:
    import torch.distributed as _td
    _LIBRARY_DIRS += (os.path.dirname(os.path.abspath(_td.__file__)) + os.sep,)
except ImportError:  # pragma: no cover - torch is a dependency
    pass

#: Code objects met by :func:`outside`, by ``id`` (a code object's own hash reads its whole bytecode and
#: constants: far too slow for every call): ``id -> (code, is the library's)``; the code is kept so that its
#: id is never reused while it is in here.
KNOWN: Dict[int, tuple] = {}
KNOWN_LIMIT = 1 << 14  # code made at run time (exec) could be endless: forget and learn again past this
class _Nowhere:
    """A frame stand-in for a call with no caller outside the library (a hook on a thread of torch's)."""
    f_code = None
    f_lasti = -1


NOWHERE = _Nowhere()


def _is_library(code) -> bool:
    name = code.co_filename
    if not name.startswith("<"):
        name = os.path.abspath(name)
    return name.startswith(_LIBRARY_DIRS) or name in _LIBRARY_FILES


def _learn(code) -> tuple:
    if len(KNOWN) >= KNOWN_LIMIT:
        KNOWN.clear()
    known = KNOWN[id(code)] = (code, _is_library(code))
    return known


def _library(code) -> bool:
    known = KNOWN.get(id(code))
    return (_learn(code) if known is None or known[0] is not code else known)[1]


def outside(frame):
    """The first frame from ``frame`` up that is not the library's (or :data:`NOWHERE`)."""
    while frame is not None:
        code = frame.f_code
        known = KNOWN.get(id(code))  # inline: under ZEROCOMM_FLIGHT_CALLERS this runs once per call
        if known is None or known[0] is not code:
            known = _learn(code)
        if not known[1]:
            return frame
        frame = frame.f_back
    return NOWHERE


#: The functions of ``zerocomm.comm`` a thread is in while a call of its runs or is awaited: ``Group.execute``
#: (every call runs there) and ``Work.wait`` (a queued or issued call's caller).
_CALL_FUNCTIONS = frozenset(("execute", "wait"))
_COMM_DIR = os.path.join(_PACKAGE, "comm") + os.sep


def callers_wanted() -> bool:
    """``ZEROCOMM_FLIGHT_CALLERS=1``: every call's caller is recorded (read when a group is made)."""
    return environment.get("ZEROCOMM_FLIGHT_CALLERS") == "1"


def position(frame) -> Optional[dict]:
    """Where a thread whose innermost Python frame is ``frame`` stands: ``{"at": "file:line", "in_call": bool}``
    -- its first frame outside the library, and whether it is inside one of the library's calls there (a frame
    of ``zerocomm.comm`` below it) -- or ``None`` (no frame, or none outside the library)."""
    in_call = False
    while frame is not None:
        code = frame.f_code
        if not _library(code):
            return {"at": where(code, frame.f_lasti), "in_call": in_call}
        in_call = in_call or (code.co_name in _CALL_FUNCTIONS and code.co_filename.startswith(_COMM_DIR))
        frame = frame.f_back
    return None


def position_of(thread_ident: Optional[int]) -> Optional[dict]:
    """:func:`position` of the thread ``thread_ident`` (``None``: none, or it has ended)."""
    if thread_ident is None:
        return None
    return position(sys._current_frames().get(thread_ident))


def where(code, lasti: int) -> str:
    """``file:line`` of a recorded caller (``?`` where none was outside the library)."""
    if code is None:
        return "?"
    line = code.co_firstlineno
    for start, end, number in code.co_lines():
        if start <= lasti < end:
            line = number if number is not None else line
            break
    return f"{code.co_filename}:{line}"


# -- reading a group's ring ---------------------------------------------------------------------------

QUEUED, STARTED, COMPLETED, FAILED, ISSUED = "queued", "started", "completed", "failed", "issued"


def _reached(mark: Optional[int], tag: int, span: int) -> bool:
    """Whether the call of tag ``mark`` is ``tag``'s or after it (tags cycle through a span far wider than
    the calls a ring holds)."""
    return mark is not None and (mark - tag) % span < span // 2


def state(group, record: tuple) -> str:
    """A record's state, from the group's marks: the calls of a group run in order."""
    span = group.TAG_SPAN
    tag = USER_TAG_LIMIT + record[0] % span  # the call's tag, as Group.run gave it
    if _reached(group.flight_done, tag, span):
        return COMPLETED
    started = group.flight_started
    if started == tag:
        return FAILED if group.failure is not None else STARTED
    if _reached(started, tag, span):  # a later call started: this one was issued to the backend
        return FAILED if group.failure is not None else ISSUED
    return QUEUED


def record(group, seq: int) -> tuple:
    """The record of the group's call ``seq`` (one of its last :data:`RING`): ``(seq, check, nbytes, caller)``,
    ``caller`` a ``(code, instruction offset)`` where callers are recorded, else ``None``."""
    slot = seq & MASK
    callers = group.flight_callers
    return seq, group.flight[slot], group.flight_sizes[slot], None if callers is None else callers[slot]


def records(group) -> List[tuple]:
    """The group's recorded calls, oldest first (:func:`record`).  The oldest slot is left out: the next call
    writes it, perhaps while this reads."""
    if group.flight is None:
        return []
    last = group.seq
    return [record(group, seq) for seq in range(max(last - RING + 2, group.flight_origin + 1), last + 1)]


def cell(check: tuple) -> tuple:
    """``(collective, dtype, itemsize, algorithm)`` of a recorded ``Call.check`` (``check.fingerprint_cell``'s
    integers; an internal call without one reads "internal")."""
    if not check or not check[1]:
        return "internal", "uint8", 1, "?"
    collective, _, dtype_id, _, algorithm = check[1]
    dtype = SUPPORTED_DTYPES[dtype_id] if 0 <= dtype_id < len(SUPPORTED_DTYPES) else None
    return (COLLECTIVES[collective], "?" if dtype is None else str(dtype).replace("torch.", ""),
            1 if dtype is None else dtype.itemsize, ALGORITHM_NAMES[algorithm])


#: A record's ``file:line`` where nothing says where its caller was.
UNKNOWN = "?"
#: The ``file:line`` of calls seen in progress (:func:`as_row`), by ``(group name, seq)``: a record keeps it
#: after its thread moved on (a failed call's, in the record written at ``destroy_process_group``).
PLACES: Dict[tuple, str] = {}
PLACES_KEPT = 64


def as_row(group, record_: tuple, standing: Optional[dict] = None) -> list:
    """A record as JSON: ``[seq, collective, nbytes, numel, dtype, algorithm, state, "file:line"]`` (``numel``:
    ``nbytes`` over the dtype's size).  ``standing`` (:func:`position`) gives the ``file:line`` of a call in
    progress whose caller was not recorded: the rank's thread is inside that call."""
    seq, check, nbytes, caller = record_
    collective, dtype, itemsize, algorithm = cell(check)
    state_ = state(group, record_)
    if caller is not None:
        place = where(*caller)
    else:
        key = (group.name, seq)
        place = PLACES.get(key, UNKNOWN)
        if place == UNKNOWN and standing is not None and standing["in_call"] \
                and state_ in (STARTED, FAILED, ISSUED):
            place = PLACES[key] = standing["at"]
            while len(PLACES) > PLACES_KEPT:
                PLACES.pop(next(iter(PLACES), None), None)
    return [seq - group.flight_origin, collective, nbytes, nbytes // itemsize, dtype, algorithm, state_, place]


def head(groups, standing: Optional[dict] = None) -> Dict[str, list]:
    """Each group's last call (:func:`as_row`), by group name."""
    heads = {}
    for group in groups:
        if group.flight is None:
            continue
        seq = group.seq  # its record is written before ``seq`` moves (Group.run)
        if seq == group.flight_origin:  # no call yet
            continue
        heads[group.name] = as_row(group, record(group, seq), standing)
    return heads


def describe_row(row: list, group_name: Optional[str] = None) -> str:
    """``all_reduce #5 (started, 8 B float32, shm) at train.py:12`` (no ``at`` where the caller is unknown)."""
    seq, collective, nbytes, _, dtype, algorithm, state_, place = row
    on = "" if group_name is None else f" on group {group_name}"
    at = "" if place == UNKNOWN else f" at {place}"
    return f"{collective} #{seq}{on} ({state_}, {nbytes} B {dtype}, {algorithm}){at}"


def describe_standing(standing: Optional[dict]) -> str:
    """``; it is now at train.py:40, outside any collective`` (empty where unknown or inside a call, which its
    row says)."""
    if not standing or standing.get("in_call"):
        return ""
    return f"; it is now at {standing['at']}, outside any collective"


# -- publishing ---------------------------------------------------------------------------------------

class Publisher:
    """This rank's head in the world's store, rewritten when it changed, from a daemon thread of its own.

    ``store`` is the world's (the one its ranks met through, or MPI's shared store), or ``None``: then
    nothing is published and peers say so.  :meth:`stop` (``destroy_process_group``) writes the last head
    and ends the thread."""

    def __init__(self, store, rank: int, world_size: int, groups, backend: str = "",
                 thread: Optional[int] = None) -> None:
        self.store = store
        #: The thread that made the world (``threading.get_ident``): where a rank that stands still stands.
        self.thread = thread
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self._groups = groups  # World.groups: read, never written, by the thread
        self._last: Optional[str] = None
        self._marks: Optional[tuple] = None  # the groups' call numbers and marks at the last look
        self._lock = threading.Lock()  # one writer at a time: the thread, or an error path publishing now
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        #: The last heads of groups destroyed while the world lives (the newest :data:`CLOSED_KEPT`): a rank
        #: that left a group still says what it last called there.
        self._closed: Dict[str, list] = {}
        #: The first failure's text, kept for the dump.
        self.failure: Optional[str] = None
        if store is not None:
            self._thread = threading.Thread(target=self._serve, name="zerocomm.flight", daemon=True)
            self._thread.start()

    def snapshot(self, standing: Optional[dict] = None) -> str:
        calls = dict(self._closed)
        calls.update(head(list(self._groups.values()), standing))
        return json.dumps({"rank": self.rank, "t": round(time.time(), 3), "calls": calls, "now": standing},
                          separators=(",", ":"))

    def closing(self, group) -> None:
        """``group`` is being destroyed: keep its head, and publish it now."""
        row = head([group]).get(group.name)
        if row is not None:
            self._closed.pop(group.name, None)
            self._closed[group.name] = row
            while len(self._closed) > CLOSED_KEPT:
                self._closed.pop(next(iter(self._closed)))
        self.publish_now()

    def publish(self, standing: Optional[dict] = None) -> None:
        """Write the head (and ``standing``, :func:`position`) now if it changed (its time aside); errors of the
        store are the reader's to report.  Waits at most :data:`READ_S` for a write under way (a store that
        stopped answering holds it)."""
        if self.store is None or not self._lock.acquire(timeout=READ_S):
            return
        try:
            text = self.snapshot(standing)
            body = text[text.index(",\"calls\""):]
            if body == self._last:
                return
            self.store.set(KEY.format(rank=self.rank), text)
            self._last = body
        finally:
            self._lock.release()

    def publish_now(self, standing: Optional[dict] = None) -> None:
        """:meth:`publish` from an error path or ``destroy_process_group``: within :data:`READ_S`, never raising
        (a store whose host is gone or stuck must not hold back the error or the destroy)."""
        if self.store is not None:
            best_effort.within(lambda: self.publish(standing), READ_S)

    def _serve(self) -> None:
        while not self._stop.wait(PUBLISH_S):
            try:
                # A rank whose calls stood still since the last look (a hang, or a rank stuck in Python) says
                # where it stands; one that moves on says what it called.
                groups = list(self._groups.values())
                marks = tuple((group.seq, group.flight_started, group.flight_done) for group in groups)
                standing = position_of(self.thread) if marks == self._marks else None
                self._marks = marks
                self.publish(standing)
            except Exception:  # the store went away (its host rank left): nobody is left to read it
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=0.0 if best_effort.gave_up() else READ_S)
        self.publish_now()

    def read(self, ranks: List[int], timeout_s: float = READ_S) -> Dict[int, object]:
        """The heads of global ``ranks`` (a dict each) or the reason one is unavailable (a string), within
        ``timeout_s``: a thread reads, so that a store that does not answer cannot hold the error back."""
        if self.store is None:
            return {rank: "unavailable (this world has no store)" for rank in ranks}
        found: Dict[int, object] = {rank: "unavailable (the store did not answer in time)" for rank in ranks}

        def fetch():
            for rank in ranks:
                key = KEY.format(rank=rank)
                try:
                    if self.store.check([key]):
                        found[rank] = json.loads(self.store.get(key))
                    else:
                        found[rank] = "unavailable (it published no record)"
                except Exception as error:  # the store's host went away
                    found[rank] = f"unavailable (store: {type(error).__name__}: {str(error).splitlines()[0][:80]})"

        best_effort.within(fetch, timeout_s)
        return dict(found)


#: Groups destroyed while the world lives (the newest :data:`CLOSED_KEPT`): dumps still write their records.
_CLOSED: collections.deque = collections.deque(maxlen=CLOSED_KEPT)
#: The world's publisher (``init_process_group`` starts it, ``destroy_process_group`` stops it).
PUBLISHER: Optional[Publisher] = None


def start(store, rank: int, world_size: int, groups, backend: str = "") -> None:
    """A world was made, by the calling thread: publish its rank's head through ``store`` (or nothing, where
    ``None``); ``groups``: the world's groups by name (``World.groups``), read, never written."""
    global PUBLISHER
    stop()
    best_effort.reset()
    PUBLISHER = Publisher(store, rank, world_size, groups, backend, threading.get_ident())


def closing(group) -> None:
    """``destroy_process_group(group)``: the record of ``group`` (``ZEROCOMM_FLIGHT_DUMP``), and its last head
    kept in what this rank publishes."""
    try:
        dump()
    except Exception:
        pass
    if group not in _CLOSED:
        _CLOSED.append(group)
    if PUBLISHER is not None:
        PUBLISHER.closing(group)


def stop() -> None:
    global PUBLISHER
    _CLOSED.clear()
    PLACES.clear()
    publisher, PUBLISHER = PUBLISHER, None
    if publisher is not None:
        publisher.stop()


# -- on a failure ---------------------------------------------------------------------------------------

def note(group, collective: str, failed_peer: Optional[int] = None, wait_s: float = 0.0) -> str:
    """What the failing call's peers last did, for its error: the ranks of ``group`` that did not reach this
    call (their head in this group is behind it), ``failed_peer`` (a global rank) and any whose call differs,
    each with its last call.  ``wait_s``: how long to wait for peers to publish a later head (a mismatch,
    where every rank is in this call's error path and publishes at once).  Never raises."""
    try:
        return _note(group, collective, failed_peer, wait_s)
    except Exception as error:  # the recorder must never hide the failure it explains
        return f" Flight recorder: unavailable ({type(error).__name__}: {error})."


def _note(group, collective: str, failed_peer: Optional[int], wait_s: float) -> str:
    publisher = PUBLISHER
    if publisher is None or group.flight is None:
        return ""
    standing = position(sys._getframe(1))  # inside the failing call: its caller
    mine = head([group], standing).get(group.name)
    if mine is None:
        return ""
    publisher.publish_now(standing)  # this rank's failing call, for the peers reading now
    peers = [rank for rank in group.ranks if rank != group.my_global_rank]
    deadline = time.monotonic() + wait_s
    while True:
        heads = publisher.read(peers)
        # A rank without a record: no wait.  One behind this call, or in it without saying where (it publishes
        # its call's caller from its error path: a mismatch is raised on every rank at once), may yet publish.
        behind = [rank for rank in peers if isinstance(heads[rank], dict)
                  and _behind(heads[rank]["calls"].get(group.name), mine[0])]
        if not behind or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    parts = []
    for rank in peers:
        seen = heads[rank]
        if not isinstance(seen, dict):
            parts.append(f"rank {rank}: record {seen}")
            continue
        calls = seen["calls"]
        here = calls.get(group.name)
        if here is None:
            parts.append(f"rank {rank} did not arrive: it has made no call on group {group.name}")
        elif here[0] < mine[0]:
            parts.append(f"rank {rank} did not arrive: it last called {describe_row(here)}"
                         f"{describe_standing(seen.get('now'))}")
        elif here[1:4] != mine[1:4] and here[0] == mine[0]:
            parts.append(f"rank {rank} called {describe_row(here)} instead")
        elif rank == failed_peer:
            parts.append(f"rank {rank} was in {describe_row(here)}")
        else:
            continue
        others = [(name, row) for name, row in calls.items() if name != group.name and row[6] != COMPLETED]
        for name, row in others:  # where it may be waiting instead
            parts[-1] += f"; and on group {name}: {describe_row(row)}"
    if not parts:
        return ""
    return (f" Flight recorder (this rank: {describe_row(mine)}; peers as last published, within "
            f"{PUBLISH_S:g} s): " + "; ".join(parts) + ".")


def _behind(row: Optional[list], seq: int) -> bool:
    return row is None or row[0] < seq or (row[0] == seq and row[7] == UNKNOWN)


def failed(group, error_text: str) -> None:
    """A call of ``group`` timed out or lost a peer: keep the text; write the record if ``ZEROCOMM_FLIGHT_DUMP``
    says where.  Never raises."""
    publisher = PUBLISHER
    if publisher is not None and publisher.failure is None:
        publisher.failure = error_text
    try:
        dump()
    except Exception:
        pass


def dump(groups=None) -> Optional[str]:
    """Write this rank's record to ``$ZEROCOMM_FLIGHT_DUMP/flight-rank<R>.json``; the path, or ``None`` where
    the variable is unset or no world is up."""
    folder = environment.get("ZEROCOMM_FLIGHT_DUMP")
    publisher = PUBLISHER
    if not folder or publisher is None:
        return None
    standing = position(sys._getframe(1))  # on a failure, inside the failing call: its caller
    if groups is None:
        live = list(publisher._groups.values())
        groups = [group for group in _CLOSED if group not in live] + live
    content = {
        "rank": publisher.rank, "world_size": publisher.world_size, "host": socket.gethostname(),
        "pid": os.getpid(), "time": time.time(), "backend": publisher.backend, "failure": publisher.failure,
        "fields": ["seq", "collective", "nbytes", "numel", "dtype", "algorithm", "state", "where"],
        "now": standing,
        "groups": {group.name: {"ranks": group.ranks,
                                "records": [as_row(group, r, standing) for r in records(group)]}
                   for group in groups if group.flight is not None},
    }
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, DUMP_NAME.format(rank=publisher.rank))
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as out:
        out.write(_readable(content))
    os.replace(temporary, path)  # a reader never sees half a file
    return path


def _readable(content: dict) -> str:
    """JSON with one record per line."""
    groups = content["groups"]
    head_text = json.dumps({key: value for key, value in content.items() if key != "groups"}, indent=1)
    parts = []
    for name, group in groups.items():
        rows = ",\n".join("   " + json.dumps(row) for row in group["records"])
        parts.append(f'  {json.dumps(name)}: {{"ranks": {json.dumps(group["ranks"])}, "records": [\n{rows}\n  ]}}')
    return head_text[:-2] + ',\n "groups": {\n' + ",\n".join(parts) + "\n }\n}\n"
