"""Ending gloo point-to-point waits on a peer whose process has exited (peers on this machine).

[Note: waits on the dead]  When a pair's connection closes, gloo ends the sends and receives queued on it
(``Pair::signalException`` walks the pair's pending queues) but not the transfer it had begun: a receive
whose message had partly arrived (the pair's ``rx_``), or a send partly written into the socket and the
sends queued behind it (``tx_``, where the walk looks at bound buffers only, and a write that fails with
EPIPE or ECONNRESET signals nothing).  Such a wait on a killed peer lasts until its deadline.  The kill
sweep showed it: a 4 MiB recursive-doubling exchange in 64 KiB segments left about one survivor in ten
under load waiting 30 s in a send to the victim or a receive from it; so does a 64 MiB send into a
stopped peer that is then killed, every time (tests/comm/test_fault_injection.py).

What cannot end it: slicing the wait (a gloo wait that times out closes every pair of its communicator),
polling ``is_completed`` (gloo's send and receive works complete only inside ``wait``), and
``ProcessGroupGloo.abort()`` (torch's default, which does nothing).  What does: c10d's ``Work::abort``,
which gloo's send and receive works implement (their unbound buffer's ``abortWaitSend``/``abortWaitRecv``;
the wait then returns False), and which torch does not bind in Python.  :func:`abort` calls it through
ctypes on a work whose C++ type it checks first: the object's vtable pointer must be the exported vtable
of ``ProcessGroupGloo::SendWork`` or ``RecvWork``.  Where the check fails (another torch build, another
layout), nothing is aborted and such a wait ends at its deadline, as before.

Who aborts: one thread per process, blocked in ``poll`` on a pidfd per peer process (a pidfd becomes
readable when its process exits), so nothing spins.  A wait puts its work in the peer's
:attr:`PeerExit.waiting`, then looks at :attr:`PeerExit.exited`; the thread sets ``exited``, then aborts
every work in ``waiting``.  Under the GIL one of the two sees the other, and an abort that lands before
the wait begins still ends it (gloo's abort flag stays set until a wait takes it).  An aborted wait answers
False even where its transfer had completed, so the waiting thread then waits once more, briefly (gloo.py's
``_after_exit``): a complete transfer returns at once, with its data; one cut off raises ``PeerFailure``.
A healthy wait pays a dict store and delete (a send no longer polls its peer's pidfd before waiting).
"""
from __future__ import annotations

import ctypes
import os
import select
import threading
from typing import Dict, List, Optional

import torch

_Work = torch._C._distributed_c10d.Work


class PeerExit:
    """One peer process on this machine: ``exited`` once it has, ``waiting`` the gloo works waited on it now
    (``{id(work): work}``, filled and emptied by the waiting threads, read by the watch's thread)."""

    __slots__ = ("pid", "fd", "exited", "waiting", "users")

    def __init__(self, pid: int, fd: int):
        self.pid = pid
        self.fd = fd  # its pidfd, -1 once closed (by the watch's thread only)
        self.exited = fd < 0
        self.waiting: Dict[int, object] = {}
        self.users = 0  # communicators holding it (see watch, release)


class _Watch:
    """The process's pidfds and the thread that polls them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_pid: Dict[int, PeerExit] = {}
        self.opened: List[PeerExit] = []  # to be polled (the thread registers them)
        self.dropped: List[PeerExit] = []  # no longer used by any communicator (the thread closes them)
        self.wake_r, self.wake_w = -1, -1
        self.thread: Optional[threading.Thread] = None

    def watch(self, pid: int) -> Optional[PeerExit]:
        with self.lock:
            peer = self.by_pid.get(pid)
            if peer is None:
                try:
                    fd = os.pidfd_open(pid)
                except ProcessLookupError:
                    fd = -1  # gone already
                except (OSError, AttributeError):
                    return None  # no pidfds here (an old kernel, a sandbox): such waits end at their deadline
                peer = self.by_pid[pid] = PeerExit(pid, fd)
                if fd >= 0:
                    self.opened.append(peer)
                    self._wake()
            peer.users += 1
            return peer

    def release(self, peer: PeerExit) -> None:
        with self.lock:
            peer.users -= 1
            if peer.users == 0 and self.by_pid.get(peer.pid) is peer:
                del self.by_pid[peer.pid]
                self.dropped.append(peer)
                self._wake()

    def _wake(self) -> None:  # the lock is held
        if self.thread is None:
            self.wake_r, self.wake_w = os.pipe()
            self.thread = threading.Thread(target=self._run, name="zerocomm-peer-exits", daemon=True)
            self.thread.start()
        os.write(self.wake_w, b"\0")

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.wake_r, select.POLLIN)
        polled: Dict[int, PeerExit] = {}
        while True:
            for fd, _ in poller.poll():  # blocks until a peer exits or the lists change
                if fd == self.wake_r:
                    os.read(self.wake_r, 4096)
                    with self.lock:
                        opened, self.opened = self.opened, []
                        dropped, self.dropped = self.dropped, []
                    for peer in opened:
                        if peer.fd >= 0 and peer.fd not in polled:
                            poller.register(peer.fd, select.POLLIN)
                            polled[peer.fd] = peer
                    for peer in dropped:
                        self._close(poller, polled, peer)
                    continue
                peer = polled.get(fd)
                if peer is None:
                    continue
                peer.exited = True
                for work in list(peer.waiting.values()):  # a copy taken under the GIL
                    try:
                        abort(work)
                    except Exception:  # noqa: BLE001 - that wait then ends at its deadline; the watch goes on
                        pass
                self._close(poller, polled, peer)

    def _close(self, poller, polled: Dict[int, PeerExit], peer: PeerExit) -> None:
        with self.lock:
            fd, peer.fd = peer.fd, -1
        if fd >= 0:
            if polled.pop(fd, None) is not None:
                poller.unregister(fd)
            os.close(fd)


_WATCH = _Watch()


def watch(pid: int) -> Optional[PeerExit]:
    """The :class:`PeerExit` of process ``pid`` (on this machine), watched until every :func:`release`; ``None``
    where pidfds are not available."""
    return _WATCH.watch(pid)


def release(peer: PeerExit) -> None:
    """A communicator no longer uses ``peer`` (its ``close``)."""
    _WATCH.release(peer)


def _forget_in_child() -> None:
    """A forked child starts with no watch: the parent's thread is not in it, its pidfds and pipe are closed."""
    global _WATCH
    old, _WATCH = _WATCH, _Watch()
    for fd in [peer.fd for peer in old.by_pid.values()] + [old.wake_r, old.wake_w]:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


os.register_at_fork(after_in_child=_forget_in_child)


# -- c10d's Work::abort, which torch does not bind in Python -------------------------------------------

#: The torch releases whose build this reading was checked against (``tests/test_layers.py`` aborts a real gloo
#: receive with :func:`abort` and fails on a torch not listed here): pybind11's instance layout, the Itanium
#: vtable layout and the mangled names below are torch's build, not its API, so every torch upgrade re-runs
#: that test and adds its version here.  This module is the only one in zerocomm that reads them, and only
#: ``backends/gloo.py`` imports it.
VERIFIED_TORCH = ("2.13.0",)

#: Where pybind11 keeps a bound object's C++ pointer, and then its holder (an intrusive_ptr: the same pointer).
_HEAD = object.__basicsize__
_ABORTS: Optional[dict] = None


def _aborts() -> dict:
    """``{vtable address point: abort}`` of gloo's send and receive works, or ``{}`` where not found."""
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    table = {}
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)  # loaded already by ``import torch``
        for name in ("SendWork", "RecvWork"):
            vtable = ctypes.addressof(ctypes.c_char.in_dll(lib, f"_ZTVN4c10d16ProcessGroupGloo{len(name)}{name}E"))
            function = getattr(lib, f"_ZN4c10d16ProcessGroupGloo{len(name)}{name}5abortEv")
            function.argtypes, function.restype = [ctypes.c_void_p], None
            # The Itanium ABI's address point: past the offset-to-top and the type_info pointer.
            table[vtable + 2 * ctypes.sizeof(ctypes.c_void_p)] = function
    except (OSError, ValueError, AttributeError):
        return {}
    return table


def abort(work) -> bool:
    """End a wait on ``work`` (a gloo send or receive ``Work``) now or the next one, as c10d's
    ``Work::abort`` does; the wait returns False.  False where this torch's works cannot be recognized."""
    global _ABORTS
    if _ABORTS is None:
        _ABORTS = _aborts()
    if not _ABORTS or type(work) is not _Work:
        return False
    this, held = (ctypes.c_void_p * 2).from_address(id(work) + _HEAD)
    if not this or this != held:  # not pybind11's simple layout with an intrusive_ptr holder
        return False
    function = _ABORTS.get(ctypes.c_void_p.from_address(this).value)
    if function is None:
        return False
    function(this)
    return True
