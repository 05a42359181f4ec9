"""Point-to-point calls of the user: send, recv, isend, irecv, batch_isend_irecv.

They go straight to the transport with the user's tag (below ``USER_TAG_LIMIT``),
not through the group's executor: tags keep them apart from collectives' messages,
and torch lets them overlap collectives too.  A tensor that is not contiguous travels as a
contiguous copy; a receive into one lands in a contiguous buffer that is copied into it when
its ``Work`` completes (``wait``, or ``is_completed`` returning True).  ``src``/``dst`` are global ranks,
``group_src``/``group_dst`` ranks within ``group``, as in torch.
"""
from __future__ import annotations

import concurrent.futures
import threading
from typing import Callable, List, Optional

import torch

from . import validate
from .errors import CommTimeoutError, InvalidArgumentError, PeerError, UnsupportedError
from .group import Group
from .transport import USER_TAG_LIMIT, PeerFailure, Request
from .validate import resolve_group
from .work import Work, timeout_seconds


def _peer(g: Group, global_rank, group_rank, role: str, op: str) -> int:
    peer = validate.group_rank_of(g, global_rank, group_rank, role, op)
    if peer == g.rank:
        raise InvalidArgumentError(f"rank {g.my_global_rank}: {op}: {role} {g.ranks[peer]} is this process itself")
    return peer


def _check(tensor, tag: int, op: str, g: Group, receive: bool) -> tuple:
    """``(buffer, destination)``: the buffer ``tensor`` (of any dtype: its bytes travel) travels as after the checks
    (a complex tensor as its real view; one that is not contiguous as a contiguous copy, or for a receive an empty
    contiguous buffer), and where a receive's buffer is copied once it completes (``None``: the caller's tensor)."""
    moved = validate.as_real(tensor, op, g)
    buffer, destination = moved, None
    if isinstance(moved, torch.Tensor) and moved.layout is torch.strided and not moved.is_contiguous():
        validate.check_writable(moved, "tensor", op, g)
        if receive:
            buffer = torch.empty(moved.shape, dtype=moved.dtype, device=moved.device)
            destination = moved
        else:
            buffer = moved.contiguous()
    validate.check_tensor(buffer, "tensor", op, g, any_dtype=True)  # the transport moves its bytes, whatever dtype
    if not 0 <= int(tag) < USER_TAG_LIMIT:
        raise InvalidArgumentError(f"rank {g.my_global_rank}: {op}: tag {tag} must be in [0, {USER_TAG_LIMIT}); "
                                   "larger tags are reserved for collectives")
    return buffer, destination


def _peer_error(g: Group, description: str, failure: PeerFailure) -> PeerError:
    return PeerError(f"rank {g.my_global_rank}: {description} on {g.describe()} failed: "
                     f"{g.peer_name(failure.peer)} failed or went away ({failure})")


def _posted(g: Group, description: str, post, *args) -> Request:
    """``post(*args)``: a transport's ``user_isend``/``user_irecv``/``irecv_any``, which may fail at once where
    the peer went away before this call (gloo raises while posting on a failed pair): ``PeerError`` then."""
    try:
        return post(*args)
    except PeerFailure as failure:
        raise _peer_error(g, description, failure) from None


class _RequestWork(Work):
    """A ``Work`` over a transport request; completion is observed by a waiter thread only if asked for."""

    def __init__(self, description: str, request: Request, g: Group, outputs, source: Optional[Callable] = None,
                 copy_back: Optional[tuple] = None):
        self._request = request
        self._group = g
        self._source = source
        self._copy_back = copy_back  # (buffer, caller's tensor) of a receive into a tensor that is not contiguous
        self._lock = threading.Lock()
        super().__init__(description, concurrent.futures.Future(), outputs, g)

    def wait(self, timeout=None) -> bool:
        seconds = timeout_seconds(timeout, "Work.wait: timeout")
        if seconds is None:
            seconds = self._group.timeout.total_seconds()
        g = self._group
        try:
            self._request.wait(seconds)
        except TimeoutError:
            raise CommTimeoutError(f"rank {g.my_global_rank}: {self._description} on {g.describe()}: timed out "
                                   f"after {seconds * 1000:.0f} ms") from None
        except PeerFailure as failure:
            raise _peer_error(g, self._description, failure) from None
        self._settle(None)
        return True

    def _settle(self, error) -> None:
        with self._lock:
            if not self._future.done():
                if error is None and self._copy_back is not None:
                    buffer, destination = self._copy_back
                    destination.copy_(buffer)
                if error is None:
                    self._future.set_result(None)
                else:
                    self._future.set_exception(error)

    def is_completed(self) -> bool:
        if self._request.test():
            self._settle(None)
            return True
        return False

    def source_rank(self) -> int:
        """The sender's global rank (``recv``'s return value)."""
        return self._source() if self._source is not None else -1

    _source_rank = source_rank  # torch's Work spells it this way

    def get_future(self):
        if not self._future.done():
            def waiter():
                try:
                    self.wait()
                except Exception as error:  # handed to the future's consumer
                    self._settle(error)
            threading.Thread(target=waiter, daemon=True).start()
        return super().get_future()


def isend(tensor: torch.Tensor, dst: Optional[int] = None, group=None, tag: int = 0,
          group_dst: Optional[int] = None) -> Optional[Work]:
    """Start sending ``tensor`` to ``dst``; the returned ``Work`` completes when the buffer may be reused."""
    g = resolve_group(group, "isend")
    peer = _peer(g, dst, group_dst, "dst", "isend")
    description = f"isend to rank {g.ranks[peer]} (tag {tag})"
    buffer, _ = _check(tensor, tag, "isend", g, receive=False)
    request = _posted(g, description, g.communicator.user_isend, buffer, peer, int(tag))
    return _RequestWork(description, request, g, [tensor])


def irecv(tensor: torch.Tensor, src: Optional[int] = None, group=None, tag: int = 0,
          group_src: Optional[int] = None) -> Optional[Work]:
    """Start receiving into ``tensor`` from ``src`` (any rank if both ``src`` and ``group_src`` are None)."""
    g = resolve_group(group, "irecv")
    moved, destination = _check(tensor, tag, "irecv", g, receive=True)
    copy_back = None if destination is None else (moved, destination)
    if src is None and group_src is None:
        if not g.communicator.ANY_SOURCE:
            raise UnsupportedError(f"rank {g.my_global_rank}: irecv: backend {g.backend!r} cannot receive from any "
                                   "source; pass src")
        description = f"irecv from any rank (tag {tag})"
        request = _posted(g, description, g.communicator.irecv_any, moved, int(tag))
        return _RequestWork(description, request, g, [tensor], source=lambda: g.ranks[request.source()],
                            copy_back=copy_back)
    peer = _peer(g, src, group_src, "src", "irecv")
    description = f"irecv from rank {g.ranks[peer]} (tag {tag})"
    request = _posted(g, description, g.communicator.user_irecv, moved, peer, int(tag))
    return _RequestWork(description, request, g, [tensor], source=lambda: g.ranks[peer], copy_back=copy_back)


def send(tensor: torch.Tensor, dst: Optional[int] = None, group=None, tag: int = 0,
         group_dst: Optional[int] = None) -> None:
    """Send ``tensor`` to ``dst`` and wait until its buffer may be reused."""
    isend(tensor, dst, group, tag, group_dst).wait()


def recv(tensor: torch.Tensor, src: Optional[int] = None, group=None, tag: int = 0,
         group_src: Optional[int] = None) -> int:
    """Receive into ``tensor``; returns the sender's global rank."""
    work = irecv(tensor, src, group, tag, group_src)
    work.wait()
    return work.source_rank()


class P2POp:
    """One send or receive for ``batch_isend_irecv``: ``op`` is ``isend`` or ``irecv`` (zerocomm's or torch's)."""

    def __init__(self, op: Callable, tensor: torch.Tensor, peer: Optional[int] = None, group=None, tag: int = 0,
                 group_peer: Optional[int] = None):
        name = getattr(op, "__name__", "")
        if name not in ("isend", "irecv"):
            raise InvalidArgumentError(f"P2POp: op must be isend or irecv, got {op!r}")
        self.op = isend if name == "isend" else irecv
        self.tensor = tensor
        self.peer = peer
        self.group = group
        self.tag = tag
        self.group_peer = group_peer

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: List[P2POp]) -> List[Work]:
    """Post every operation of the list (receives first, so no pair can block) and return their ``Work``\\ s."""
    if not p2p_op_list or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise InvalidArgumentError("batch_isend_irecv: expects a non-empty list of P2POp")
    order = sorted(range(len(p2p_op_list)), key=lambda i: p2p_op_list[i].op is isend)
    works: List[Optional[Work]] = [None] * len(p2p_op_list)
    for index in order:
        p = p2p_op_list[index]
        if p.op is isend:
            works[index] = isend(p.tensor, p.peer, p.group, p.tag, p.group_peer)
        else:
            works[index] = irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer)
    return works  # type: ignore[return-value]
