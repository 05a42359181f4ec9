"""Ring and chain algorithms, written once over the Transport.

Terms.  The flat buffer is cut into ``n`` *chunks* (``ops.partition_bounds``: balanced, the
first ``numel % n`` one element longer, possibly empty when ``numel < n``); chunk ``c`` is the
slice rank ``c`` ends up owning.  Each chunk is cut into ``S`` *segments* of at most
``segment_bytes`` (the same ``S`` for every chunk, so ranks agree on every message's size);
segments are what travel, so sending one overlaps reducing or forwarding the previous one.
Empty segments are never sent: every rank derives the bounds from arguments all ranks share.

Ring schedule (all_reduce = reduce-scatter then all-gather, the 2(n-1)/n schedule).  Rank ``r``
only sends to ``r+1`` and only receives from ``r-1``.  At step ``j`` it sends chunk
``(r-j-1) mod n`` and receives chunk ``(r-j-2) mod n``; so what it sends at step ``j+1`` is
exactly what it received at step ``j``::

    step j:      send chunk r-j-1 --> right        left --> recv chunk r-j-2
    reduce-scatter (j = 0 .. n-2):  combine the received partial into our chunk
    all-gather (j = n-1 .. 2n-3):   the received chunk is final; store it

After step ``n-2`` rank ``r`` holds the fully reduced chunk ``r``; after ``n-1`` more steps
every rank holds every chunk.  Per segment ``k`` the loop is: post the receive for
``(j+1, k)``, wait for ``(j, k)``, combine it, post the send ``(j+1, k)`` -- so the receive
side is always one step ahead and a segment is forwarded as soon as it is reduced.  A buffer
is only written after the last send that read it has completed (``_RingPass.wait_send``).

Chains (broadcast_ring, reduce_ring) run along virtual ranks ``v = (r - root) mod n``:
broadcast flows ``v=0 -> 1 -> ... -> n-1``, reduce flows ``n-1 -> ... -> 1 -> 0``; each
segment is forwarded as soon as it has arrived (and been combined), with up to
``RECV_DEPTH`` receives posted ahead.  all_to_all_ring runs ``n-1`` shifted exchanges:
at step ``s`` rank ``r`` sends its block for ``r+s`` and receives the block from ``r-s``.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from ...ops.chunk import partition_bounds
from ...ops.reduce import finalize_, reduce_
from ..errors import InvalidArgumentError
from ..transport import Request, Transport, remaining, wait_all
from .common import (
    RECV_DEPTH,
    check_numel,
    check_op,
    check_root,
    check_same_dtype,
    flat,
    same_memory,
    scratch,
    segment_elems,
    segments,
)

Region = Optional[torch.Tensor]


def _segment_count(longest_chunk: int, seg: Optional[int]) -> int:
    """``S``: segments per chunk so that the longest chunk's segments fit ``seg`` elements."""
    if seg is None or longest_chunk == 0:
        return 1
    return -(-longest_chunk // seg)


class _RingPass:
    """Drives ``steps`` ring steps of ``nsegs`` segments each, one step of receives ahead.

    ``send_at(j, k)`` is the region sent right at step ``j``, segment ``k``; ``recv_into(j, k)``
    the region the left neighbour's ``(j, k)`` lands in (it may first call :meth:`wait_send`
    to reuse a buffer); ``arrived(j, k, region)`` combines or stores it.  ``None`` regions
    are empty segments and are skipped on both sides.
    """

    def __init__(
        self,
        t: Transport,
        tag: int,
        deadline: Optional[float],
        steps: int,
        nsegs: int,
        send_at: Callable[[int, int], Region],
        recv_into: Callable[[int, int], Region],
        arrived: Callable[[int, int, torch.Tensor], None],
    ):
        self.t, self.tag, self.deadline = t, tag, deadline
        self.steps, self.nsegs = steps, nsegs
        self.send_at, self.recv_into, self.arrived = send_at, recv_into, arrived
        self.right = (t.rank + 1) % t.size
        self.left = (t.rank - 1) % t.size
        self._sends: dict[tuple[int, int], Request] = {}
        self._recvs: dict[tuple[int, int], tuple[Request, torch.Tensor]] = {}

    def wait_send(self, j: int, k: int) -> None:
        """Block until the send of ``(j, k)`` (if there was one) has completed."""
        req = self._sends.pop((j, k), None)
        if req is not None:
            req.wait(remaining(self.deadline))

    def _post_send(self, j: int, k: int) -> None:
        region = self.send_at(j, k)
        if region is not None:
            self._sends[(j, k)] = self.t.isend(region, self.right, self.tag)

    def _post_recv(self, j: int, k: int) -> None:
        region = self.recv_into(j, k)
        if region is not None:
            self._recvs[(j, k)] = (self.t.irecv(region, self.left, self.tag), region)

    def run(self) -> None:
        try:
            self._run()
        finally:
            # The callbacks close over the caller's buffers and (recv_into) over this object: drop them,
            # so the cycle does not keep inputs and scratch alive until the garbage collector runs.
            self.send_at = self.recv_into = self.arrived = None
            self._sends.clear()
            self._recvs.clear()

    def _run(self) -> None:
        for k in range(self.nsegs):
            self._post_send(0, k)
        for k in range(self.nsegs):
            self._post_recv(0, k)
        for j in range(self.steps):
            for k in range(self.nsegs):
                if j + 1 < self.steps:
                    self._post_recv(j + 1, k)
                posted = self._recvs.pop((j, k), None)
                if posted is not None:
                    req, region = posted
                    req.wait(remaining(self.deadline))
                    self.arrived(j, k, region)
                if j + 1 < self.steps:
                    self._post_send(j + 1, k)
        wait_all(list(self._sends.values()), self.deadline)
        self._sends.clear()


def all_reduce_ring(
    t: Transport, tensor: torch.Tensor, op: str, *, tag: int, deadline: Optional[float], segment_bytes: int
) -> None:
    """Reduce ``tensor`` across all ranks, in place on every rank (ring reduce-scatter + all-gather).

    Every rank calls it with a tensor of the same numel and dtype.  Each rank sends and
    receives ``2 (n-1)/n`` of the buffer; scratch is two chunks.  Every rank ends with the
    bitwise-same result (each chunk is reduced once, by its owner, then copied around).
    """
    buf = flat(t, tensor, "tensor", "all_reduce")
    check_op(t, op, buf.dtype, "all_reduce")
    n, r = t.size, t.rank
    if n == 1 or buf.numel() == 0:
        finalize_(buf, op, n)
        return
    chunks = partition_bounds(buf.numel(), n)
    nsegs = _segment_count(chunks[0][1] - chunks[0][0], segment_elems(buf, segment_bytes))
    # seg_bounds[c][k]: chunk c's segment k as offsets relative to the chunk's start.
    seg_bounds = [partition_bounds(hi - lo, nsegs) for lo, hi in chunks]
    recv_scratch = [scratch(buf, chunks[0][1] - chunks[0][0]) for _ in range(min(2, n - 1))]
    ring: _RingPass

    def piece(c: int, k: int) -> tuple[int, int]:
        a, b = seg_bounds[c][k]
        return chunks[c][0] + a, chunks[c][0] + b

    def send_at(j: int, k: int) -> Region:
        lo, hi = piece((r - j - 1) % n, k)
        return buf[lo:hi] if hi > lo else None

    def recv_into(j: int, k: int) -> Region:
        c = (r - j - 2) % n
        a, b = seg_bounds[c][k]
        if b == a:
            return None
        if j <= n - 2:  # reduce-scatter: a partial to combine, lands in scratch
            return recv_scratch[j % 2][a:b]
        # all-gather: lands in place; chunk c was last sent at step j+1-n.
        ring.wait_send(j + 1 - n, k)
        lo, hi = piece(c, k)
        return buf[lo:hi]

    def arrived(j: int, k: int, region: torch.Tensor) -> None:
        if j <= n - 2:
            lo, hi = piece((r - j - 2) % n, k)
            reduce_(buf[lo:hi], region, op)

    ring = _RingPass(t, tag, deadline, 2 * (n - 1), nsegs, send_at, recv_into, arrived)
    ring.run()
    finalize_(buf, op, n)


def reduce_scatter_ring(
    t: Transport,
    output: torch.Tensor,
    input: torch.Tensor,
    op: str,
    *,
    tag: int,
    deadline: Optional[float],
    segment_bytes: int,
) -> None:
    """Reduce ``input`` (``n * m`` elements) across ranks; rank ``r`` gets chunk ``r`` in ``output`` (``m``).

    ``input`` is not modified, except where ``output`` is ``input``'s own chunk ``r`` (in place).
    Each rank sends ``(n-1)/n`` of ``input``; scratch is two chunks.
    """
    out = flat(t, output, "output", "reduce_scatter")
    inp = flat(t, input, "input", "reduce_scatter")
    check_same_dtype(t, out, inp, "reduce_scatter")
    check_op(t, op, inp.dtype, "reduce_scatter")
    n, r, m = t.size, t.rank, out.numel()
    check_numel(t, inp, n * m, "input (world size x output numel)", "reduce_scatter")
    if n == 1:
        if not same_memory(out, inp):
            out.copy_(inp)
        finalize_(out, op, n)
        return
    if m == 0:
        return
    nsegs = _segment_count(m, segment_elems(inp, segment_bytes))
    segs = partition_bounds(m, nsegs)
    in_place = same_memory(out, inp[r * m : (r + 1) * m])
    partials: list[Optional[torch.Tensor]] = [None, None]  # reduced partials, double-buffered by step
    ring: _RingPass

    def partial(j: int) -> torch.Tensor:
        if partials[j % 2] is None:
            partials[j % 2] = scratch(inp, m)
        return partials[j % 2]

    def in_chunk(c: int, k: int) -> torch.Tensor:
        return inp[c * m + segs[k][0] : c * m + segs[k][1]]

    def send_at(j: int, k: int) -> Region:
        a, b = segs[k]
        if b == a:
            return None
        # Step 0 sends our own input; later steps forward the partial reduced at step j-1.
        return in_chunk((r - 1) % n, k) if j == 0 else partial(j - 1)[a:b]

    def recv_into(j: int, k: int) -> Region:
        a, b = segs[k]
        if b == a:
            return None
        if j == n - 2 and not in_place:
            return out[a:b]
        if j >= 2:
            ring.wait_send(j - 1, k)  # partial(j) last held step j-2's data, sent at step j-1
        return partial(j)[a:b]

    def arrived(j: int, k: int, region: torch.Tensor) -> None:
        a, b = segs[k]
        if j < n - 2:
            reduce_(region, in_chunk((r - j - 2) % n, k), op)
        elif in_place:
            reduce_(out[a:b], region, op)
        else:
            reduce_(region, in_chunk(r, k), op)

    ring = _RingPass(t, tag, deadline, n - 1, nsegs, send_at, recv_into, arrived)
    ring.run()
    finalize_(out, op, n)


def all_gather_ring(
    t: Transport, output: torch.Tensor, input: torch.Tensor, *, tag: int, deadline: Optional[float], segment_bytes: int
) -> None:
    """Gather every rank's ``input`` (``m`` elements) into every rank's ``output`` (``n * m``), chunk ``r`` from rank ``r``.

    ``input`` may be ``output``'s own chunk (in place).  Each rank sends ``(n-1)/n`` of ``output``.
    """
    out = flat(t, output, "output", "all_gather")
    inp = flat(t, input, "input", "all_gather")
    check_same_dtype(t, out, inp, "all_gather")
    n, r, m = t.size, t.rank, inp.numel()
    check_numel(t, out, n * m, "output (world size x input numel)", "all_gather")
    own = out[r * m : (r + 1) * m]
    if not same_memory(own, inp):
        own.copy_(inp)
    if n == 1 or m == 0:
        return
    nsegs = _segment_count(m, segment_elems(inp, segment_bytes))
    segs = partition_bounds(m, nsegs)

    def region(c: int, k: int) -> Region:
        a, b = segs[k]
        return out[c * m + a : c * m + b] if b > a else None

    # Step j sends chunk r-j (our own at step 0) and receives chunk r-j-1 straight into output.
    _RingPass(
        t,
        tag,
        deadline,
        n - 1,
        nsegs,
        send_at=lambda j, k: region((r - j) % n, k),
        recv_into=lambda j, k: region((r - j - 1) % n, k),
        arrived=lambda j, k, reg: None,
    ).run()


def broadcast_ring(
    t: Transport, tensor: torch.Tensor, root: int, *, tag: int, deadline: Optional[float], segment_bytes: int
) -> None:
    """Copy ``root``'s ``tensor`` into every rank's ``tensor`` along the pipelined chain root -> root+1 -> ..."""
    buf = flat(t, tensor, "tensor", "broadcast")
    check_root(t, root, "broadcast")
    n, r = t.size, t.rank
    if n == 1 or buf.numel() == 0:
        return
    v = (r - root) % n
    nxt = (r + 1) % n if v < n - 1 else None
    segs = segments(0, buf.numel(), segment_elems(buf, segment_bytes))
    sends: list[Request] = []
    if v == 0:
        sends = [t.isend(buf[lo:hi], nxt, tag) for lo, hi in segs]
    else:
        prev = (r - 1) % n
        recvs = {k: t.irecv(buf[lo:hi], prev, tag) for k, (lo, hi) in enumerate(segs[:RECV_DEPTH])}
        for k, (lo, hi) in enumerate(segs):
            if k + RECV_DEPTH < len(segs):
                a, b = segs[k + RECV_DEPTH]
                recvs[k + RECV_DEPTH] = t.irecv(buf[a:b], prev, tag)
            recvs.pop(k).wait(remaining(deadline))
            if nxt is not None:
                sends.append(t.isend(buf[lo:hi], nxt, tag))
    wait_all(sends, deadline)


def reduce_ring(
    t: Transport,
    tensor: torch.Tensor,
    op: str,
    root: int,
    *,
    tag: int,
    deadline: Optional[float],
    segment_bytes: int,
) -> None:
    """Reduce every rank's ``tensor`` into ``root``'s, along the chain root+n-1 -> ... -> root+1 -> root.

    Non-root tensors are left unchanged (partials live in ``RECV_DEPTH`` segments of scratch).
    """
    buf = flat(t, tensor, "tensor", "reduce")
    check_root(t, root, "reduce")
    check_op(t, op, buf.dtype, "reduce")
    n, r = t.size, t.rank
    if n == 1 or buf.numel() == 0:
        if r == root:
            finalize_(buf, op, n)
        return
    v = (r - root) % n
    prev, nxt = (r - 1) % n, (r + 1) % n  # data flows from nxt to us to prev
    segs = segments(0, buf.numel(), segment_elems(buf, segment_bytes))
    if v == n - 1:  # the chain's far end sends its own tensor untouched
        wait_all([t.isend(buf[lo:hi], prev, tag) for lo, hi in segs], deadline)
        return
    longest = segs[0][1] - segs[0][0]
    slots = [scratch(buf, longest) for _ in range(min(RECV_DEPTH, len(segs)))]
    recvs: dict[int, Request] = {}
    sends: dict[int, Request] = {}

    def post_recv(k: int) -> None:
        lo, hi = segs[k]
        recvs[k] = t.irecv(slots[k % len(slots)][: hi - lo], nxt, tag)

    for k in range(len(slots) - 1):
        post_recv(k)
    for k, (lo, hi) in enumerate(segs):
        ahead = k + len(slots) - 1
        if ahead < len(segs):
            # That slot last carried segment ahead - len(slots) == k-1; its send must be done.
            prior = sends.pop(k - 1, None)
            if prior is not None:
                prior.wait(remaining(deadline))
            post_recv(ahead)
        recvs.pop(k).wait(remaining(deadline))
        slot = slots[k % len(slots)][: hi - lo]
        if v == 0:
            reduce_(buf[lo:hi], slot, op)
        else:
            reduce_(slot, buf[lo:hi], op)
            sends[k] = t.isend(slot, prev, tag)
    wait_all(list(sends.values()), deadline)
    if v == 0:
        finalize_(buf, op, n)


def _offsets(counts: Sequence[int]) -> list[int]:
    offsets, total = [], 0
    for c in counts:
        offsets.append(total)
        total += c
    return offsets


def _check_counts(t: Transport, counts: Sequence[int], tensor: torch.Tensor, what: str) -> None:
    if len(counts) != t.size:
        raise InvalidArgumentError(
            f"all_to_all: rank {t.rank}: {what} must have one count per rank ({t.size}), got {len(counts)}"
        )
    if any((not isinstance(c, int)) or c < 0 for c in counts):
        raise InvalidArgumentError(f"all_to_all: rank {t.rank}: {what} must be non-negative ints, got {list(counts)}")
    if sum(counts) != tensor.numel():
        raise InvalidArgumentError(
            f"all_to_all: rank {t.rank}: {what} sum to {sum(counts)}, but the tensor has {tensor.numel()} elements"
        )


def all_to_all_ring(
    t: Transport,
    output: torch.Tensor,
    input: torch.Tensor,
    out_counts: Sequence[int],
    in_counts: Sequence[int],
    *,
    tag: int,
    deadline: Optional[float],
    segment_bytes: int,
) -> None:
    """Personalized exchange: ``in_counts[j]`` consecutive elements of ``input`` go to rank ``j``;
    the ``out_counts[j]`` elements from rank ``j`` land consecutively in ``output``.

    ``in_counts[j]`` on rank ``i`` must equal ``out_counts[i]`` on rank ``j``; ``output`` must not
    overlap ``input``.  Runs ``n-1`` shifted exchanges, one step's receives posted ahead.
    """
    out = flat(t, output, "output", "all_to_all")
    inp = flat(t, input, "input", "all_to_all")
    check_same_dtype(t, out, inp, "all_to_all")
    _check_counts(t, out_counts, out, "out_counts")
    _check_counts(t, in_counts, inp, "in_counts")
    n, r = t.size, t.rank
    out_at, in_at = _offsets(out_counts), _offsets(in_counts)
    out[out_at[r] : out_at[r] + out_counts[r]].copy_(inp[in_at[r] : in_at[r] + in_counts[r]])
    if n == 1:
        return
    seg = segment_elems(inp, segment_bytes)

    def post_recvs(s: int) -> list[Request]:
        src = (r - s) % n
        lo = out_at[src]
        return [t.irecv(out[lo + a : lo + b], src, tag) for a, b in segments(0, out_counts[src], seg)]

    recvs = post_recvs(1)
    for s in range(1, n):
        dst = (r + s) % n
        lo = in_at[dst]
        sends = [t.isend(inp[lo + a : lo + b], dst, tag) for a, b in segments(0, in_counts[dst], seg)]
        ahead = post_recvs(s + 1) if s + 1 < n else []
        wait_all(recvs, deadline)
        wait_all(sends, deadline)
        recvs = ahead
