"""An in-process fake :class:`~zerocomm.comm.transport.Transport`: ``n`` ranks as ``n`` threads.

A :class:`LocalFabric` holds, for every key ``(src, dst, tag)``, the sends and receives posted
but not yet matched, each in posting order (so messages with the same key are FIFO, as the
Transport contract promises).  Matching is *rendezvous*: a send completes only when its
receive has been posted and the bytes copied, so an algorithm that waits on a send before
posting the receive its peer needs deadlocks here exactly as it would over MPI or gloo with
large messages -- and then a bounded wait raises ``TimeoutError`` instead of hanging.  A send
also snapshots its bytes when posted and fails with :class:`SendBufferModifiedError` if the
buffer changed before it was matched.

Typical use::

    results = run_ranks(4, my_rank_fn, arg)      # my_rank_fn(transport, arg) on 4 threads

A rank's exception is re-raised in the caller with "raised on rank R" added as a note; when
several ranks fail, the first one that is not a timeout is chosen (timeouts are usually the
other ranks waiting on the one that failed).
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Optional

import torch

from zerocomm.comm.transport import Request, Transport


class MessageSizeError(RuntimeError):
    """A send and the receive it matched have different byte sizes."""


class SendBufferModifiedError(RuntimeError):
    """A send's tensor changed between posting and completion (the Transport contract forbids it)."""


class _LocalRequest(Request):
    """One posted send or receive; completed (or failed) by whichever side matches second."""

    def __init__(self, what: str):
        self._what = what
        self._done = threading.Event()
        self._error: Optional[BaseException] = None

    def _finish(self, error: Optional[BaseException] = None) -> None:
        self._error = error
        self._done.set()

    def test(self) -> bool:
        if self._done.is_set() and self._error is not None:
            raise self._error
        return self._done.is_set()

    def wait(self, timeout_s: Optional[float] = None) -> None:
        if not self._done.wait(timeout_s):
            raise TimeoutError(self._what)
        if self._error is not None:
            raise self._error


class LocalFabric:
    """The shared mailbox of ``size`` in-process ranks; also counts bytes and messages sent per rank."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"LocalFabric: size must be at least 1, got {size}")
        self.size = size
        self._lock = threading.Lock()
        # (src, dst, tag) -> deque of (tensor, request) posted by the side that came first.
        self._sends: dict[tuple[int, int, int], collections.deque] = collections.defaultdict(collections.deque)
        self._recvs: dict[tuple[int, int, int], collections.deque] = collections.defaultdict(collections.deque)
        self.bytes_sent = [0] * size
        self.messages_sent = [0] * size
        self._subs: dict[str, "LocalFabric"] = {}

    def transports(self) -> list["LocalTransport"]:
        """One transport per rank, all over this fabric."""
        return [LocalTransport(self, rank) for rank in range(self.size)]

    def sub_fabric(self, key: str, size: int) -> "LocalFabric":
        """The fabric of the sub-communicator ``key`` (made by its first member to ask)."""
        with self._lock:
            sub = self._subs.get(key)
            if sub is None:
                sub = self._subs[key] = LocalFabric(size)
            return sub

    def pending(self) -> int:
        """How many posted operations are still unmatched (0 after a clean collective)."""
        with self._lock:
            return sum(len(q) for q in self._sends.values()) + sum(len(q) for q in self._recvs.values())

    def _post(self, kind: str, tensor: torch.Tensor, key: tuple[int, int, int]) -> _LocalRequest:
        src, dst, tag = key
        what = f"send to rank {dst} (tag {tag})" if kind == "send" else f"recv from rank {src} (tag {tag})"
        req = _LocalRequest(what)
        mine, theirs = (self._sends, self._recvs) if kind == "send" else (self._recvs, self._sends)
        # A send keeps a snapshot of its bytes, so a buffer changed before the send completed is caught.
        entry = (tensor, req, tensor.clone() if kind == "send" else None)
        with self._lock:
            if kind == "send":
                self.bytes_sent[src] += tensor.numel() * tensor.element_size()
                self.messages_sent[src] += 1
            if theirs[key]:
                other = theirs[key].popleft()
            else:
                mine[key].append(entry)
                return req
        # Matched: copy outside the lock (the pair is ours alone now), then release both sides.
        (send_t, send_req, snapshot), (recv_t, recv_req, _) = (entry, other) if kind == "send" else (other, entry)
        error = _copy_bytes(send_t, recv_t, key)
        if error is None and not torch.equal(snapshot.view(-1).view(torch.uint8), send_t.view(-1).view(torch.uint8)):
            error = SendBufferModifiedError(
                f"rank {src} changed the buffer of its send to rank {dst} (tag {tag}) before the send completed"
            )
        send_req._finish(error)
        recv_req._finish(error)
        return req


def _copy_bytes(src_t: torch.Tensor, dst_t: torch.Tensor, key: tuple[int, int, int]) -> Optional[BaseException]:
    src, dst, tag = key
    sent = src_t.numel() * src_t.element_size()
    expected = dst_t.numel() * dst_t.element_size()
    if sent != expected:
        return MessageSizeError(
            f"rank {src} sent {sent} bytes to rank {dst} (tag {tag}), "
            f"but rank {dst} posted a receive of {expected} bytes"
        )
    if sent:
        dst_t.reshape(-1).view(torch.uint8).copy_(src_t.reshape(-1).view(torch.uint8))
    return None


class LocalTransport(Transport):
    """Rank ``rank`` of a :class:`LocalFabric`.  Thread-safe: several collectives may run at once."""

    name = "local"
    device_type = "cpu"

    def __init__(self, fabric: LocalFabric, rank: int):
        self.fabric = fabric
        self.rank = rank
        self.size = fabric.size

    def _check(self, what: str, tensor: torch.Tensor, peer: int, tag: int) -> None:
        if not 0 <= peer < self.size:
            raise ValueError(f"rank {self.rank}: {what} peer must be in [0, {self.size}), got {peer}")
        if not tensor.is_contiguous():
            raise ValueError(f"rank {self.rank}: {what} needs a contiguous tensor (peer {peer}, tag {tag})")
        if not isinstance(tag, int) or tag < 0:
            raise ValueError(f"rank {self.rank}: {what} tag must be a non-negative int, got {tag!r}")

    def isend(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        self._check("isend", tensor, peer, tag)
        return self.fabric._post("send", tensor, (self.rank, peer, tag))

    def irecv(self, tensor: torch.Tensor, peer: int, tag: int) -> Request:
        self._check("irecv", tensor, peer, tag)
        return self.fabric._post("recv", tensor, (peer, self.rank, tag))

    def split(self, ranks, key: str) -> Optional["LocalTransport"]:
        """A sub-communicator over ``ranks`` (``Backend.split``'s contract); ``None`` on non-members."""
        ranks = list(ranks)
        if self.rank not in ranks:
            return None
        return LocalTransport(self.fabric.sub_fabric(key, len(ranks)), ranks.index(self.rank))

    def close(self, abandon: bool = False) -> None:
        pass


def run_ranks(
    n: int,
    fn: Callable[..., Any],
    *args: Any,
    fabric: Optional[LocalFabric] = None,
    timeout_s: float = 60.0,
) -> list[Any]:
    """Run ``fn(transport, *args)`` for ranks ``0..n-1`` on ``n`` threads; return the results by rank.

    Pass ``fabric`` to inspect its counters afterwards.  A rank that raises makes this raise the
    same exception with the rank named; ranks still running after ``timeout_s`` seconds make it
    raise ``TimeoutError`` naming them (their threads are daemons and are abandoned).
    """
    fabric = fabric if fabric is not None else LocalFabric(n)
    if fabric.size != n:
        raise ValueError(f"run_ranks: fabric has {fabric.size} ranks, asked for {n}")
    results: list[Any] = [None] * n
    errors: dict[int, BaseException] = {}

    def body(transport: LocalTransport) -> None:
        try:
            results[transport.rank] = fn(transport, *args)
        except BaseException as exc:  # noqa: BLE001 -- handed to the caller below
            errors[transport.rank] = exc

    threads = [
        threading.Thread(target=body, args=(t,), name=f"rank-{t.rank}", daemon=True) for t in fabric.transports()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    hung = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
    if errors:
        rank = min(errors, key=lambda r: (isinstance(errors[r], TimeoutError), r))
        exc = errors[rank]
        exc.add_note(f"raised on rank {rank} of {n}")
        others = sorted(set(errors) - {rank})
        if others:
            exc.add_note("also failed: " + "; ".join(f"rank {r}: {errors[r]!r}" for r in others))
        if hung:
            exc.add_note(f"still running after {timeout_s} s: ranks {hung}")
        raise exc
    if hung:
        raise TimeoutError(f"ranks {hung} of {n} still running after {timeout_s} s")
    return results
