"""Ring and chain algorithms, written once over the Transport.

Terms.  The flat buffer is cut into ``n`` *chunks* (balanced: the first ``numel % n`` are one
element longer, some are empty when ``numel < n``); chunk ``c`` is the slice rank ``c`` ends up
owning.  Each chunk is cut into ``S`` *segments* of at most ``segment_bytes`` (the same ``S`` for
every chunk, so ranks agree on every message's size); segments are what travel.  Empty segments
are never sent: every rank derives the bounds from arguments all ranks share.

Ring schedule (all_reduce = reduce-scatter then all-gather, the 2(n-1)/n schedule).  Rank ``r``
only sends to ``r+1`` and only receives from ``r-1``.  At step ``j`` it sends chunk
``(r-j-1) mod n`` and receives chunk ``(r-j-2) mod n``; so what it sends at step ``j+1`` is
exactly what it received at step ``j``::

    step j:      send chunk r-j-1 --> right        left --> recv chunk r-j-2
    reduce-scatter (j = 0 .. n-2):  combine the received partial into our chunk
    all-gather (j = n-1 .. 2n-3):   the received chunk is final; store it

After step ``n-2`` rank ``r`` holds the fully reduced chunk ``r``; after ``n-1`` more steps
every rank holds every chunk.

[Note: bounded scratch]  A pass walks its *items* ``(segment k, step j)`` segment by segment:
all steps of segment 0, then all steps of segment 1, ... (what NCCL calls a chunked ring); both
sides post their messages in that order, since two ranks' messages match in posting order.  Only
one item's receive is posted ahead of the one being consumed, so a pass holds at most two
segments of scratch whatever the buffer's size (64 MiB at 4 MiB segments: 8 MiB, not two whole
chunks), while the next segment's transfer still overlaps this one's reduction.  A region is
written only after the last send that read it has completed (``_RingPass.wait_send``).

Algorithms trust their arguments: ``comm.validate`` checked them, once, before any byte moved.

Chains (broadcast_ring, reduce_ring) run along virtual ranks ``v = (r - root) mod n``:
broadcast flows ``v=0 -> 1 -> ... -> n-1``, reduce flows ``n-1 -> ... -> 1 -> 0``; each
segment is forwarded as soon as it has arrived (and been combined), with up to
``RECV_DEPTH`` receives posted ahead.  all_to_all_ring runs ``n-1`` shifted exchanges:
at step ``s`` rank ``r`` sends its block for ``r+s`` and receives the block from ``r-s``.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

import torch

from ...ops.chunk import partition_bounds
from ...ops.reduce import KERNELS, finalize_
from ..transport import Request, Transport

#: Receives a chain posts ahead of the segment it is consuming.
RECV_DEPTH = 4

Region = Optional[torch.Tensor]


def _segment_count(longest_chunk: int, elem_size: int, segment_bytes: int) -> int:
    """``S``: segments per chunk so the longest chunk's segments fit ``segment_bytes`` (1: unsegmented)."""
    if segment_bytes <= 0 or longest_chunk == 0:
        return 1
    seg = max(1, segment_bytes // elem_size)
    return -(-longest_chunk // seg)


def _left(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class _RingPass:
    """Drives ``steps`` ring steps over ``nsegs`` segments, segment-major, one receive ahead.

    ``send_at(j, k)`` is the region sent right at step ``j`` of segment ``k``; ``recv_into(j, k, slot)``
    the region the left neighbour's ``(j, k)`` lands in (``slot`` alternates 0/1 between consecutive
    receives, for double-buffered scratch; it may call :meth:`wait_send` to reuse a buffer);
    ``arrived(j, k, region)`` combines or stores it.  ``None`` regions are empty segments, skipped on
    both sides.  Sends and receives are posted in item order (see the module note).
    """

    def __init__(self, t: Transport, tag: int, deadline: Optional[float], steps: int, nsegs: int,
                 send_at: Callable[[int, int], Region], recv_into: Callable[[int, int, int], Region],
                 arrived: Callable[[int, int, torch.Tensor], None]):
        self.t, self.tag, self.deadline = t, tag, deadline
        self.steps, self.nsegs = steps, nsegs
        self.send_at, self.recv_into, self.arrived = send_at, recv_into, arrived
        self.right = (t.rank + 1) % t.size
        self.left = (t.rank - 1) % t.size
        self._sends: dict[tuple[int, int], Request] = {}
        self._slot = 0

    def wait_send(self, j: int, k: int) -> None:
        """Block until the send of ``(j, k)`` (if there was one) has completed."""
        req = self._sends.pop((j, k), None)
        if req is not None:
            req.wait(_left(self.deadline))

    def _post_send(self, j: int, k: int) -> None:
        region = self.send_at(j, k)
        if region is not None:
            self._sends[(j, k)] = self.t.isend(region, self.right, self.tag)
        # Messages between two ranks match in posting order, so sends go out in item order too: the next
        # segment's first send (which reads only what this rank started with) right after this one's last.
        if j == self.steps - 1 and k + 1 < self.nsegs:
            self._post_send(0, k + 1)

    def _post_recv(self, j: int, k: int):
        region = self.recv_into(j, k, self._slot)
        if region is None:
            return None
        self._slot ^= 1
        return self.t.irecv(region, self.left, self.tag), region

    def run(self) -> None:
        try:
            self._run()
        finally:
            # The callbacks close over the caller's buffers: drop them now rather than at the next GC.
            self.send_at = self.recv_into = self.arrived = None
            self._sends.clear()

    def _run(self) -> None:
        items = [(j, k) for k in range(self.nsegs) for j in range(self.steps)]
        self._post_send(0, 0)
        posted = self._post_recv(*items[0])
        for index, (j, k) in enumerate(items):
            ahead = self._post_recv(*items[index + 1]) if index + 1 < len(items) else None
            if posted is not None:
                req, region = posted
                req.wait(_left(self.deadline))
                self.arrived(j, k, region)
            if j + 1 < self.steps:
                self._post_send(j + 1, k)
            posted = ahead
        for req in self._sends.values():
            req.wait(_left(self.deadline))
        self._sends.clear()


def all_reduce_ring(t: Transport, tensor: torch.Tensor, op: str, *, tag: int, deadline: Optional[float],
                    segment_bytes: int) -> None:
    """Reduce the flat ``tensor`` across all ranks, in place on every rank (ring reduce-scatter + all-gather).

    Every rank calls it with a tensor of the same numel and dtype.  Each rank sends and receives
    ``2 (n-1)/n`` of the buffer; scratch is two segments.  Every rank ends with the bitwise-same
    result (each chunk is reduced once, by its owner, then copied around).
    """
    buf = tensor
    n, r = t.size, t.rank
    if n == 1 or buf.numel() == 0:
        if op == "avg":  # the other ops are done once combined
            finalize_(buf, op, n)
        return
    combine = KERNELS[op]
    chunks = partition_bounds(buf.numel(), n)
    nsegs = _segment_count(chunks[0][1] - chunks[0][0], buf.element_size(), segment_bytes)
    # pieces[c][k]: chunk c's segment k as absolute offsets.
    pieces = [[(lo + a, lo + b) for a, b in partition_bounds(hi - lo, nsegs)] for lo, hi in chunks]
    longest = pieces[0][0][1] - pieces[0][0][0]
    scratch = [torch.empty(longest, dtype=buf.dtype, device=buf.device) for _ in range(2)]
    ring: _RingPass

    def send_at(j: int, k: int) -> Region:
        lo, hi = pieces[(r - j - 1) % n][k]
        return buf[lo:hi] if hi > lo else None

    def recv_into(j: int, k: int, slot: int) -> Region:
        lo, hi = pieces[(r - j - 2) % n][k]
        if hi == lo:
            return None
        if j <= n - 2:  # reduce-scatter: a partial to combine, lands in scratch
            return scratch[slot][:hi - lo]
        ring.wait_send(j + 1 - n, k)  # all-gather lands in place; this region was last sent at step j+1-n
        return buf[lo:hi]

    def arrived(j: int, k: int, region: torch.Tensor) -> None:
        if j <= n - 2:
            lo, hi = pieces[(r - j - 2) % n][k]
            combine(buf[lo:hi], region)

    ring = _RingPass(t, tag, deadline, 2 * (n - 1), nsegs, send_at, recv_into, arrived)
    ring.run()
    if op == "avg":
        finalize_(buf, op, n)


def reduce_scatter_ring(t: Transport, output: torch.Tensor, input: torch.Tensor, op: str, *, tag: int,
                        deadline: Optional[float], segment_bytes: int) -> None:
    """Reduce the flat ``input`` (``n * m`` elements) across ranks; rank ``r`` gets chunk ``r`` in ``output`` (``m``).

    ``input`` is not modified, except where ``output`` is ``input``'s own chunk ``r`` (in place).
    Each rank sends ``(n-1)/n`` of ``input``; scratch is two segments.
    """
    out, inp = output, input
    n, r, m = t.size, t.rank, output.numel()
    if n == 1:
        if out.data_ptr() != inp.data_ptr():
            out.copy_(inp)
        if op == "avg":
            finalize_(out, op, n)
        return
    if m == 0:
        return
    combine = KERNELS[op]
    segs = partition_bounds(m, _segment_count(m, inp.element_size(), segment_bytes))
    longest = segs[0][1] - segs[0][0]
    in_place = out.data_ptr() == inp[r * m:].data_ptr()
    scratch = [torch.empty(longest, dtype=inp.dtype, device=inp.device) for _ in range(2)]
    received: dict[tuple[int, int], torch.Tensor] = {}  # (j, k) -> the scratch region holding its partial
    slot_of: dict[tuple[int, int], int] = {}
    reader: list[Optional[tuple[int, int]]] = [None, None]  # slot -> the send that still reads it
    ring: _RingPass

    def send_at(j: int, k: int) -> Region:
        a, b = segs[k]
        if b == a:
            return None
        # Step 0 sends our own input; later steps forward the partial reduced at step j-1.
        c = (r - 1) % n
        return inp[c * m + a:c * m + b] if j == 0 else received.pop((j - 1, k))

    def recv_into(j: int, k: int, slot: int) -> Region:
        a, b = segs[k]
        if b == a:
            return None
        if j == n - 2 and not in_place:
            return out[a:b]
        if reader[slot] is not None:  # the partial this slot held last is still being forwarded
            ring.wait_send(*reader[slot])
            reader[slot] = None
        received[(j, k)] = region = scratch[slot][:b - a]
        slot_of[(j, k)] = slot
        return region

    def arrived(j: int, k: int, region: torch.Tensor) -> None:
        a, b = segs[k]
        if j < n - 2:
            c = (r - j - 2) % n
            combine(region, inp[c * m + a:c * m + b])
            reader[slot_of.pop((j, k))] = (j + 1, k)  # forwarded next, as item (j+1, k)
        elif in_place:
            combine(out[a:b], received.pop((j, k)))
            slot_of.pop((j, k))
        else:
            combine(region, inp[r * m + a:r * m + b])

    ring = _RingPass(t, tag, deadline, n - 1, len(segs), send_at, recv_into, arrived)
    ring.run()
    if op == "avg":
        finalize_(out, op, n)


def all_gather_ring(t: Transport, output: torch.Tensor, input: torch.Tensor, *, tag: int,
                    deadline: Optional[float], segment_bytes: int) -> None:
    """Gather every rank's flat ``input`` (``m`` elements) into every rank's ``output`` (``n * m``), chunk ``r`` from rank ``r``.

    ``input`` may be ``output``'s own chunk (in place).  Each rank sends ``(n-1)/n`` of ``output``;
    no scratch: segments land in place.
    """
    out, inp = output, input
    n, r, m = t.size, t.rank, input.numel()
    if m and out[r * m:].data_ptr() != inp.data_ptr():
        out[r * m:(r + 1) * m].copy_(inp)
    if n == 1 or m == 0:
        return
    segs = partition_bounds(m, _segment_count(m, inp.element_size(), segment_bytes))

    def region(c: int, k: int) -> Region:
        a, b = segs[k]
        return out[c * m + a:c * m + b] if b > a else None

    # Step j sends chunk r-j (our own at step 0) and receives chunk r-j-1 straight into output.
    _RingPass(t, tag, deadline, n - 1, len(segs), send_at=lambda j, k: region((r - j) % n, k),
              recv_into=lambda j, k, slot: region((r - j - 1) % n, k), arrived=lambda j, k, reg: None).run()


def _chain_segments(numel: int, elem_size: int, segment_bytes: int) -> list[tuple[int, int]]:
    if numel == 0:
        return []
    seg = numel if segment_bytes <= 0 else max(1, segment_bytes // elem_size)
    return [(lo, min(lo + seg, numel)) for lo in range(0, numel, seg)]


def broadcast_ring(t: Transport, tensor: torch.Tensor, root: int, *, tag: int, deadline: Optional[float],
                   segment_bytes: int) -> None:
    """Copy ``root``'s flat ``tensor`` into every rank's along the pipelined chain root -> root+1 -> ..."""
    buf = tensor
    n, r = t.size, t.rank
    if n == 1 or buf.numel() == 0:
        return
    v = (r - root) % n
    nxt = (r + 1) % n if v < n - 1 else None
    segs = _chain_segments(buf.numel(), buf.element_size(), segment_bytes)
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
            recvs.pop(k).wait(_left(deadline))
            if nxt is not None:
                sends.append(t.isend(buf[lo:hi], nxt, tag))
    for req in sends:
        req.wait(_left(deadline))


def reduce_ring(t: Transport, tensor: torch.Tensor, op: str, root: int, *, tag: int, deadline: Optional[float],
                segment_bytes: int) -> None:
    """Reduce every rank's flat ``tensor`` into ``root``'s, along the chain root+n-1 -> ... -> root+1 -> root.

    Non-root tensors are left unchanged (partials live in ``RECV_DEPTH`` segments of scratch).
    """
    buf = tensor
    n, r = t.size, t.rank
    if n == 1 or buf.numel() == 0:
        if r == root:
            if op == "avg":
                finalize_(buf, op, n)
        return
    combine = KERNELS[op]
    v = (r - root) % n
    prev, nxt = (r - 1) % n, (r + 1) % n  # data flows from nxt to us to prev
    segs = _chain_segments(buf.numel(), buf.element_size(), segment_bytes)
    if v == n - 1:  # the chain's far end sends its own tensor untouched
        for req in [t.isend(buf[lo:hi], prev, tag) for lo, hi in segs]:
            req.wait(_left(deadline))
        return
    longest = segs[0][1] - segs[0][0]
    slots = [torch.empty(longest, dtype=buf.dtype, device=buf.device) for _ in range(min(RECV_DEPTH, len(segs)))]
    recvs: dict[int, Request] = {}
    sends: dict[int, Request] = {}

    def post_recv(k: int) -> None:
        lo, hi = segs[k]
        recvs[k] = t.irecv(slots[k % len(slots)][:hi - lo], nxt, tag)

    for k in range(len(slots) - 1):
        post_recv(k)
    for k, (lo, hi) in enumerate(segs):
        ahead = k + len(slots) - 1
        if ahead < len(segs):
            # That slot last carried segment ahead - len(slots) == k-1; its send must be done.
            prior = sends.pop(k - 1, None)
            if prior is not None:
                prior.wait(_left(deadline))
            post_recv(ahead)
        recvs.pop(k).wait(_left(deadline))
        slot = slots[k % len(slots)][:hi - lo]
        if v == 0:
            combine(buf[lo:hi], slot)
        else:
            combine(slot, buf[lo:hi])
            sends[k] = t.isend(slot, prev, tag)
    for req in sends.values():
        req.wait(_left(deadline))
    if v == 0:
        if op == "avg":
            finalize_(buf, op, n)


def _offsets(counts: Sequence[int]) -> list[int]:
    offsets, total = [], 0
    for c in counts:
        offsets.append(total)
        total += c
    return offsets


def all_to_all_ring(t: Transport, output: torch.Tensor, input: torch.Tensor, out_counts: Sequence[int],
                    in_counts: Sequence[int], *, tag: int, deadline: Optional[float], segment_bytes: int) -> None:
    """Personalized exchange: ``in_counts[j]`` consecutive elements of ``input`` go to rank ``j``;
    the ``out_counts[j]`` elements from rank ``j`` land consecutively in ``output``.

    ``in_counts[j]`` on rank ``i`` must equal ``out_counts[i]`` on rank ``j``; ``output`` must not
    overlap ``input``.  Runs ``n-1`` shifted exchanges, one step's receives posted ahead.
    """
    out, inp = output, input
    n, r = t.size, t.rank
    out_at, in_at = _offsets(out_counts), _offsets(in_counts)
    out[out_at[r]:out_at[r] + out_counts[r]].copy_(inp[in_at[r]:in_at[r] + in_counts[r]])
    if n == 1:
        return
    size = inp.element_size()

    def post_recvs(s: int) -> list[Request]:
        src = (r - s) % n
        lo = out_at[src]
        return [t.irecv(out[lo + a:lo + b], src, tag) for a, b in _chain_segments(out_counts[src], size, segment_bytes)]

    recvs = post_recvs(1)
    for s in range(1, n):
        dst = (r + s) % n
        lo = in_at[dst]
        sends = [t.isend(inp[lo + a:lo + b], dst, tag) for a, b in _chain_segments(in_counts[dst], size, segment_bytes)]
        ahead = post_recvs(s + 1) if s + 1 < n else []
        for req in recvs + sends:
            req.wait(_left(deadline))
        recvs = ahead
