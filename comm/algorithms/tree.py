"""Binomial-tree and recursive-doubling algorithms, written once over the Transport.

Terms.  A tree is rooted anywhere: ranks are renumbered to *virtual ranks*
``v = (rank - root) mod n`` so the root is ``v = 0``.  In the binomial tree over ``n`` ranks
(any ``n``, not only powers of two) the parent of ``v > 0`` is ``v`` with its lowest set bit
cleared, and the children of ``v`` are ``v + m`` for ``m = 1, 2, 4, ...`` below ``v``'s lowest
set bit (below ``n`` for the root) while ``v + m < n``.  ``v``'s *subtree* is the virtual ranks
``v .. v + size - 1`` with ``size = min(lowbit(v), n - v)``, so a subtree's blocks are
contiguous in virtual order.  Depth is ``ceil(log2 n)``: latency-optimal for small buffers.

A *segment* is a pipelined piece of at most ``segment_bytes``: broadcast forwards segment
``k`` to the children as soon as it has arrived, reduce sends segment ``k`` up as soon as the
children's segment ``k`` has been combined into it, so the levels of the tree overlap.
gather/scatter move a subtree's blocks as one segmented message per edge.

Recursive doubling (all_reduce): with ``p`` the largest power of two ``<= n`` and
``rem = n - p``, the first ``2 rem`` ranks fold in pairwise (even ``r`` hands its data to
``r + 1`` and sits out), the ``p`` remaining ranks exchange whole buffers with partner
``rank XOR 2^i`` for ``i = 0 .. log2 p - 1``, and the folded ranks get the result back.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import torch

from ...ops.flatten import joined
from ...ops.reduce import KERNELS, finalize_
from ..transport import Request, Transport

# -- helpers of the tree schedules (kept here: one file per schedule keeps a call's path short) --------


def remaining(deadline: Optional[float]) -> Optional[float]:
    """Seconds left until ``deadline`` (``time.monotonic()`` seconds; never negative), or ``None``."""
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def wait_all(requests: Sequence[Request], deadline: Optional[float]) -> None:
    """Wait for every request, each bounded by the absolute ``deadline``."""
    for req in requests:
        req.wait(remaining(deadline))



def segment_elems(tensor: torch.Tensor, segment_bytes: int) -> Optional[int]:
    """Elements per segment for ``tensor``'s dtype (at least 1); ``None`` when ``segment_bytes <= 0`` (no segmenting)."""
    if segment_bytes <= 0:
        return None
    return max(1, segment_bytes // tensor.element_size())


def segments(start: int, end: int, seg: Optional[int]) -> list[tuple[int, int]]:
    """``[start, end)`` split into segments of ``seg`` elements; one piece when ``seg`` is None; none when empty."""
    if end <= start:
        return []
    step = seg if seg is not None else end - start
    return [(lo, min(lo + step, end)) for lo in range(start, end, step)]


def scratch(like: torch.Tensor, numel: int) -> torch.Tensor:
    """An uninitialized flat buffer of ``numel`` elements with ``like``'s dtype and device."""
    return like.new_empty(numel)  # a third cheaper than torch.empty(numel, dtype=..., device=...) for a small call


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` are the same elements (in-place calls skip their self-copy)."""
    return a.numel() == b.numel() and (a.numel() == 0 or a.data_ptr() == b.data_ptr())


def send_segmented(t: Transport, buf: torch.Tensor, peer: int, tag: int, seg: Optional[int]) -> list[Request]:
    """Post sends of ``buf`` to ``peer`` in segments; the matching receive is :func:`recv_segmented`."""
    return [t.isend(buf[lo:hi], peer, tag) for lo, hi in segments(0, buf.numel(), seg)]


def recv_segmented(t: Transport, buf: torch.Tensor, peer: int, tag: int, seg: Optional[int]) -> list[Request]:
    """Post receives into ``buf`` from ``peer``, segmented exactly as the sender's :func:`send_segmented`."""
    return [t.irecv(buf[lo:hi], peer, tag) for lo, hi in segments(0, buf.numel(), seg)]


def _lowbit(v: int) -> int:
    return v & -v


def _subtree_size(v: int, n: int) -> int:
    """Ranks in virtual rank ``v``'s subtree (``v`` itself included)."""
    return n if v == 0 else min(_lowbit(v), n - v)


def _children(v: int, n: int) -> list[int]:
    """Virtual children of ``v``, smallest subtree first."""
    limit = n if v == 0 else _lowbit(v)
    kids, m = [], 1
    while m < limit and v + m < n:
        kids.append(v + m)
        m <<= 1
    return kids


def _parent(v: int) -> int:
    return v - _lowbit(v)


def _place(t: Transport, root: int, block: torch.Tensor, segment_bytes: int) -> tuple:
    """``(n, m, v, seg, size)`` of a gather or scatter of ``block`` (a rank's own block): the ranks, a block's
    elements, this rank's place in the tree rooted at ``root`` (the root's is 0), the elements of a segment, and
    the blocks of this rank's subtree."""
    n, m = t.size, block.numel()
    v = (t.rank - root) % n
    return n, m, v, segment_elems(block, segment_bytes), _subtree_size(v, n)


def _alone(t: Transport, out: Optional[torch.Tensor], inp: Optional[torch.Tensor]) -> bool:
    """One rank: its own block is the whole result, copied from ``inp`` into ``out`` unless they are one memory."""
    if t.size != 1:
        return False
    if not same_memory(out, inp):
        out.copy_(inp)
    return True


def broadcast_tree(
    t: Transport, tensor: torch.Tensor, root: int, *, tag: int, deadline: Optional[float], segment_bytes: int
) -> None:
    """Copy ``root``'s ``tensor`` into every rank's ``tensor`` down a pipelined binomial tree."""
    buf = tensor
    _broadcast(t, buf, root, tag, deadline, segment_bytes)


def _broadcast(t: Transport, buf: torch.Tensor, root: int, tag: int, deadline: Optional[float], segment_bytes: int) -> None:
    n = t.size
    if n == 1 or buf.numel() == 0:
        return
    v = (t.rank - root) % n
    # Largest subtree first: it has the longest way still to go.
    kids = [(c + root) % n for c in reversed(_children(v, n))]
    seg = segment_elems(buf, segment_bytes)
    segs = segments(0, buf.numel(), seg)
    # Every receive lands in its own region of buf, so all can be posted at once.
    recvs = recv_segmented(t, buf, (_parent(v) + root) % n, tag, seg) if v != 0 else []
    sends: list[Request] = []
    for k, (lo, hi) in enumerate(segs):
        if recvs:
            recvs[k].wait(remaining(deadline))
        sends.extend(t.isend(buf[lo:hi], kid, tag) for kid in kids)
    wait_all(sends, deadline)


def reduce_tree(
    t: Transport,
    tensor: torch.Tensor,
    op: str,
    root: int,
    *,
    tag: int,
    deadline: Optional[float],
    segment_bytes: int,
) -> None:
    """Reduce every rank's ``tensor`` into ``root``'s up a pipelined binomial tree; non-root tensors are unchanged."""
    buf = tensor
    _reduce(t, buf, op, root, tag, deadline, segment_bytes, clobber=False)


def _reduce(
    t: Transport,
    buf: torch.Tensor,
    op: str,
    root: int,
    tag: int,
    deadline: Optional[float],
    segment_bytes: int,
    clobber: bool,
) -> None:
    """The binomial reduce; with ``clobber`` inner ranks may accumulate in ``buf`` itself (saves a copy)."""
    n = t.size
    v = (t.rank - root) % n
    if n == 1 or buf.numel() == 0:
        if v == 0:
            if op == "avg":  # the other ops are done once combined
                finalize_(buf, op, n)
        return
    kids = [(c + root) % n for c in _children(v, n)]  # smallest subtree first: it is ready first
    parent = (_parent(v) + root) % n if v != 0 else None
    segs = segments(0, buf.numel(), segment_elems(buf, segment_bytes))
    longest = segs[0][1] - segs[0][0]
    # Two receive slots per child, double-buffered by segment: (k+1)'s receive is posted while k is combined.
    slots = {kid: [scratch(buf, longest) for _ in range(min(2, len(segs)))] for kid in kids}
    own_acc = v == 0 or clobber or not kids
    acc_slots = [] if own_acc else [scratch(buf, longest) for _ in range(min(2, len(segs)))]
    recvs: dict[tuple[int, int], Request] = {}
    sends: dict[int, Request] = {}

    def post_recv(kid: int, k: int) -> None:
        lo, hi = segs[k]
        recvs[(kid, k)] = t.irecv(slots[kid][k % 2][: hi - lo], kid, tag)

    for kid in kids:
        post_recv(kid, 0)
    for k, (lo, hi) in enumerate(segs):
        if k + 1 < len(segs):
            for kid in kids:
                post_recv(kid, k + 1)
        if own_acc:
            acc = buf[lo:hi]
        else:
            prior = sends.pop(k - 2, None)  # the slot last carried segment k-2 up
            if prior is not None:
                prior.wait(remaining(deadline))
            acc = acc_slots[k % 2][: hi - lo]
            acc.copy_(buf[lo:hi])
        for kid in kids:
            recvs.pop((kid, k)).wait(remaining(deadline))
            KERNELS[op](acc, slots[kid][k % 2][: hi - lo])
        if parent is not None:
            sends[k] = t.isend(acc, parent, tag)
    wait_all(list(sends.values()), deadline)
    if v == 0:
        if op == "avg":
            finalize_(buf, op, n)


def all_reduce_tree(
    t: Transport, tensor: torch.Tensor, op: str, *, tag: int, deadline: Optional[float], segment_bytes: int
) -> None:
    """Reduce ``tensor`` in place on every rank: binomial reduce to rank 0, then binomial broadcast."""
    buf = tensor
    numel = buf.numel()
    if t.size > 1 and 0 < numel and (segment_bytes <= 0 or numel * buf.element_size() <= segment_bytes):
        _all_reduce_tree_whole(t, buf, op, tag, deadline)
        return
    _reduce(t, buf, op, 0, tag, deadline, segment_bytes, clobber=True)
    _broadcast(t, buf, 0, tag, deadline, segment_bytes)


def _all_reduce_tree_whole(t: Transport, buf: torch.Tensor, op: str, tag: int, deadline: Optional[float]) -> None:
    """The tree all_reduce of a buffer that is one segment: the same messages as ``_reduce`` then
    ``_broadcast`` (children's buffers up, the result down, rooted at rank 0), with none of the
    segment bookkeeping (the short path of a small call)."""
    n, v = t.size, t.rank
    if n == 2:
        # Two ranks: the reduce-then-broadcast (up, then down) becomes one exchange, half the latency with
        # the same bytes.  Every op is commutative, so both ranks compute the same result bit for bit.
        incoming = scratch(buf, buf.numel())
        t.exchange(buf, incoming, 1 - v, tag, deadline)  # done before buf changes
        KERNELS[op](buf, incoming)
        if op == "avg":
            finalize_(buf, op, n)
        return
    kids = _children(v, n)  # smallest subtree first: it is ready first
    if kids:
        m = buf.numel()
        incoming = scratch(buf, m * len(kids))
        recvs = [t.irecv(incoming if len(kids) == 1 else incoming[i * m:(i + 1) * m], kid, tag)
                 for i, kid in enumerate(kids)]
        combine = KERNELS[op]
        for i, recv in enumerate(recvs):
            recv.wait(remaining(deadline))
            combine(buf, incoming if len(kids) == 1 else incoming[i * m:(i + 1) * m])
    if v != 0:
        parent = _parent(v)
        t.isend(buf, parent, tag).wait(remaining(deadline))  # buf is about to be overwritten by the result
        t.irecv(buf, parent, tag).wait(remaining(deadline))
    else:
        if op == "avg":
            finalize_(buf, op, n)
    if kids:
        wait_all([t.isend(buf, kid, tag) for kid in reversed(kids)], deadline)  # largest subtree first


def all_reduce_recursive_doubling(
    t: Transport, tensor: torch.Tensor, op: str, *, tag: int, deadline: Optional[float], segment_bytes: int
) -> None:
    """Reduce ``tensor`` in place on every rank in ``ceil(log2 n)`` (+2 when ``n`` is not a power of two) exchanges.

    Latency-optimal; each exchange moves the whole buffer, so it suits small tensors.  Scratch is one buffer.
    """
    buf = tensor
    n, r = t.size, t.rank
    if n == 1 or buf.numel() == 0:
        if op == "avg":
            finalize_(buf, op, n)
        return
    seg = segment_elems(buf, segment_bytes)
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    incoming = scratch(buf, buf.numel())
    # Fold in: among the first 2*rem ranks, even r hands its data to r+1 and sits out.
    if r < 2 * rem and r % 2 == 0:
        wait_all(send_segmented(t, buf, r + 1, tag, seg), deadline)
        newrank = -1
    elif r < 2 * rem:
        wait_all(recv_segmented(t, incoming, r - 1, tag, seg), deadline)
        KERNELS[op](buf, incoming)
        newrank = r // 2
    else:
        newrank = r - rem
    if newrank >= 0:
        mask = 1
        combine = KERNELS[op]
        whole = seg is None or buf.numel() <= seg  # one message per exchange: no slicing (small buffers)
        while mask < p:
            partner_new = newrank ^ mask
            peer = partner_new * 2 + 1 if partner_new < rem else partner_new + rem
            if whole:
                t.exchange(buf, incoming, peer, tag, deadline)  # done before buf changes
                combine(buf, incoming)
            else:
                recvs = recv_segmented(t, incoming, peer, tag, seg)
                sends = send_segmented(t, buf, peer, tag, seg)
                for k, (lo, hi) in enumerate(segments(0, buf.numel(), seg)):
                    # The receive first (see Transport.exchange); both are done before buf[lo:hi] changes.
                    recvs[k].wait(remaining(deadline))
                    sends[k].wait(remaining(deadline))
                    combine(buf[lo:hi], incoming[lo:hi])
            mask <<= 1
    # Fold out: the result goes back to the ranks that sat out.
    if r < 2 * rem and r % 2 == 1:
        wait_all(send_segmented(t, buf, r - 1, tag, seg), deadline)
    elif r < 2 * rem:
        wait_all(recv_segmented(t, buf, r + 1, tag, seg), deadline)
    if op == "avg":
        finalize_(buf, op, n)


def gather_tree(
    t: Transport,
    output: Optional[torch.Tensor],
    input: torch.Tensor,
    root: int,
    *,
    tag: int,
    deadline: Optional[float],
    segment_bytes: int,
) -> None:
    """Gather every rank's ``input`` (``m`` elements) into ``root``'s ``output`` (``n * m``; ``None`` elsewhere).

    Each rank sends its whole subtree's blocks to its parent in one segmented message.
    """
    inp = input
    out = output if t.rank == root else None
    _gather(t, out, inp, root, tag, deadline, segment_bytes)


def _gather(t: Transport, out: Optional[torch.Tensor], inp: torch.Tensor, root: int, tag: int,
            deadline: Optional[float], segment_bytes: int) -> None:
    if _alone(t, out, inp) or inp.numel() == 0:
        return
    n, m, v, seg, size = _place(t, root, inp, segment_bytes)
    # buf holds blocks v .. v+size-1 in virtual order; the root's virtual order is real order only when root == 0.
    if v == 0 and root == 0:
        buf = out
    elif size == 1:
        buf = inp
    else:
        buf = scratch(inp, size * m)
    if not same_memory(buf[:m], inp):
        buf[:m].copy_(inp)
    recvs: list[Request] = []
    for c in _children(v, n):
        lo = (c - v) * m
        recvs += recv_segmented(t, buf[lo : lo + _subtree_size(c, n) * m], (c + root) % n, tag, seg)
    wait_all(recvs, deadline)
    if v != 0:
        wait_all(send_segmented(t, buf, (_parent(v) + root) % n, tag, seg), deadline)
    elif root != 0:
        # Virtual block i is rank (i + root) mod n: rotate back into rank order.
        split = (n - root) * m
        out[root * m :].copy_(buf[:split])
        out[: root * m].copy_(buf[split:])


def scatter_tree(
    t: Transport,
    output: torch.Tensor,
    input,
    root: int,
    *,
    tag: int,
    deadline: Optional[float],
    segment_bytes: int,
) -> None:
    """Send chunk ``r`` of ``root``'s ``input`` (``n * m``, or its ``n`` chunks; ``None`` elsewhere) to rank ``r``'s
    ``output`` (``m``).

    Each rank receives its whole subtree's blocks from its parent and passes the children theirs.
    """
    out = output
    inp = joined(input) if t.rank == root else None
    _scatter(t, out, inp, root, tag, deadline, segment_bytes)


def _scatter(t: Transport, out: torch.Tensor, inp: Optional[torch.Tensor], root: int, tag: int,
             deadline: Optional[float], segment_bytes: int) -> None:
    if _alone(t, out, inp) or out.numel() == 0:
        return
    n, m, v, seg, size = _place(t, root, out, segment_bytes)
    if v == 0 and root == 0:
        buf = inp
    elif v == 0:
        # Virtual order starts at the root's own chunk.
        buf = torch.cat([inp[root * m :], inp[: root * m]])
    elif size == 1:
        buf = out
    else:
        buf = scratch(out, size * m)
    if v != 0:
        wait_all(recv_segmented(t, buf, (_parent(v) + root) % n, tag, seg), deadline)
    sends: list[Request] = []
    for c in reversed(_children(v, n)):  # largest subtree first: it has the longest way to go
        lo = (c - v) * m
        sends += send_segmented(t, buf[lo : lo + _subtree_size(c, n) * m], (c + root) % n, tag, seg)
    if not same_memory(out, buf[:m]):
        out.copy_(buf[:m])
    wait_all(sends, deadline)


def all_gather_tree(
    t: Transport, output: torch.Tensor, input: torch.Tensor, *, tag: int, deadline: Optional[float], segment_bytes: int
) -> None:
    """Every rank's ``input`` (``m``) into every rank's ``output`` (``n * m``): binomial gather to rank 0, then broadcast.

    ``input`` may be ``output``'s own chunk (in place).
    """
    out = output
    inp = input
    # Non-roots' output is not written until the broadcast, after their input has been sent.
    _gather(t, out if t.rank == 0 else None, inp, 0, tag, deadline, segment_bytes)
    _broadcast(t, out, 0, tag, deadline, segment_bytes)


def reduce_scatter_tree(
    t: Transport,
    output: torch.Tensor,
    input: torch.Tensor,
    op: str,
    *,
    tag: int,
    deadline: Optional[float],
    segment_bytes: int,
) -> None:
    """Reduce ``input`` (``n * m``) across ranks; rank ``r`` gets chunk ``r`` in ``output`` (``m``).

    Binomial reduce to rank 0 (which reduces into a copy, so no ``input`` is modified), then
    binomial scatter.  ``output`` may be ``input``'s own chunk.
    """
    out = output
    inp = input
    if _alone(t, out, inp):
        if op == "avg":
            finalize_(out, op, 1)
        return
    if out.numel() == 0:
        return
    if t.rank == 0:
        total = inp.clone()
        _reduce(t, total, op, 0, tag, deadline, segment_bytes, clobber=True)
    else:
        total = None
        _reduce(t, inp, op, 0, tag, deadline, segment_bytes, clobber=False)
    _scatter(t, out, total, 0, tag, deadline, segment_bytes)


def barrier_tree(t: Transport, *, tag: int, deadline: Optional[float], segment_bytes: int) -> None:
    """Return once every rank has entered: 1-byte tokens up a binomial tree to rank 0, then back down."""
    n = t.size
    if n == 1:
        return
    v = t.rank
    kids = _children(v, n)
    tokens = torch.zeros(len(kids) + 1, dtype=torch.uint8, device=t.device_type)
    wait_all([t.irecv(tokens[i : i + 1], kid, tag) for i, kid in enumerate(kids)], deadline)
    if v != 0:
        parent = _parent(v)
        wait_all([t.isend(tokens[-1:], parent, tag)], deadline)
        wait_all([t.irecv(tokens[-1:], parent, tag)], deadline)
    wait_all([t.isend(tokens[-1:], kid, tag) for kid in kids], deadline)
