"""Single-host schedules over shared memory: the "shm" algorithm of every collective and barrier.

Terms (as in ring.py): a *piece* is what one round moves (at most one slot of the arena,
``min(segment_bytes, SLOT_BYTES)``); for the reductions a piece is cut into ``n`` balanced
*slices*, slice ``q`` being reduced by rank ``q``.  Rounds, buffers and syncs are the arena's
(comm/shm.py, "steps and buffers"): round ``k`` writes this rank's slot of buffer ``k % 3``
before a sync and peers read it after; a sync is a barrier through step words in shared memory,
not a message.  Every function takes any :class:`~zerocomm.comm.transport.Transport` whose ranks
share a host (gloo, MPI, an intra-host sub-communicator); the transport itself moves bytes only
once, when the arena is made (the segment's name).

all_reduce (the schedule of DeepSpeed's CPU shm all_reduce, pipelined):
  * small (at most ``SMALL_BYTES``): every rank copies its input into its slot; one sync; every
    rank reduces all slots, in rank order, straight into its tensor (identical bits everywhere;
    two ranks add the peer's slot in place, commutative ops give the same bits).  numpy ufuncs on
    cached views where numpy has the dtype: a torch kernel's dispatch costs more than a few bytes.
  * large, where every rank may read and write its peers' memory (``process_vm_readv``/``writev``,
    or a heap; the arena agrees on it once): *direct* — each rank publishes its tensor's address;
    sync; rank ``r`` combines slice ``r`` of every peer's tensor into its own, block by block, and
    pushes each reduced block, still in cache, into every peer's tensor; sync.  No slot, no copy-in,
    no copy-out: per rank, the traffic of one copy of the tensor.
  * large otherwise, round ``k`` over piece ``k``: *copy-in* the slices peers will reduce (this rank's own
    slice is read from its input where it lies); sync; *reduce*: rank ``r`` combines slice ``r``
    of every rank's piece into its slot (one pass: ``out = mine (op) first peer``, then in place);
    sync; *copy-out*: every rank copies the ``n`` reduced slices into its tensor.  Software-
    pipelined, phase ``j`` runs copy-out ``j-2``, reduce ``j-1`` and copy-in ``j``: one sync a round.
  * zero-copy: a rank whose tensor lives in a heap (``comm.shm_heap.shared_empty``) publishes where, and
    peers read it in place (no copy-in; the reduced slice is written into the tensor itself); a
    final sync keeps every tensor unchanged until no peer reads it any more.
reduce: large all_reduce's schedule without the heap, only the root copies out.
reduce_scatter: round ``k`` copies piece ``k`` of every other rank's chunk in; sync; rank ``r``
  combines piece ``k`` of chunk ``r`` from every slot straight into its output.
broadcast / scatter / all_gather / gather / all_to_all: writers copy piece ``k`` into the round's buffer; sync;
  readers copy it out.  One sync a round, and each round one call (``Arena.move_round``: the C op MOVE where
  ``_shmfast`` is built, else the same copies around ``Arena.sync``), so a call that fits one piece is one round.
  Where one rank alone writes (broadcast's and scatter's root) every slot of the round is its room (up to
  ``LONE_PIECE_BYTES`` per destination); else each rank writes its own slot (all_to_all: in ``n - 1`` parts, one
  per peer, all ranks' together at most ``ROUND_BYTES``: pieces that stay in cache between copy-in and copy-out).
  Each byte is copied once in and once out; the root's own chunk, and a rank's block to itself, is one local copy.
  A small reduce is a small all_reduce's round whose non-root ranks only copy in (a MOVE round too).
barrier: one sync.
"""
from __future__ import annotations

import ctypes
import errno
import os
import warnings
from typing import Optional, Sequence

import numpy as np
import torch

from ...ops.chunk import partition_bounds
from ...ops.reduce import KERNELS, KERNELS_OUT
from .. import shm
from ..transport import PeerFailure, Transport

#: all_reduce / reduce of at most this many bytes: one round, one sync, every rank reduces everything.
SMALL_BYTES = 16 << 10
#: reduce_scatter / all_gather / gather of at least this many bytes in all read peers' tensors where they lie
#: (where the arena agreed every rank can): two syncs and no slot copies, against one sync per slot round.
DIRECT_BYTES = 256 << 10
#: Scratch through which the direct schedule reads a peer's private memory (``process_vm_readv``) before
#: combining it: small enough to stay in cache between the read and the combine, large enough that the
#: calls' overhead stays small (1 MiB measured best of 256 KiB-2 MiB at 16 MiB, 2 ranks on 2 cores).
BLOCK_BYTES = 1 << 20
#: Most ranks for which reduce_scatter, all_gather and gather read peers' inputs in place (``process_vm_readv``, where
#: the arena agreed every rank can); ``None``: the host's cores (``os.cpu_count()``, the same on every rank).  With more
#: ranks than cores, copies through the slots were faster.  Measured on 2 cores at 16 MiB float32 (load 1.3-1.7): at 2
#: ranks in place wins (all_gather 2.8-3.1 ms against 3.3-3.6 through the slots); at 4 ranks the slots win (all_gather
#: 5.4-5.7 against 7.6-8.5, reduce_scatter 7.0-7.9 against 7.3-8.1).  A cross-memory read moves about 3.6 GB/s here, a
#: copy through the mapped segment several times that.  (all_reduce reads in place wherever it can: its direct schedule
#: also serves tensors from heaps, which need no cross-memory read; through slots or in place it measured alike at 4
#: ranks, 10.3-12.6 ms against 10.2-12.1.)
READ_IN_PLACE_RANKS: Optional[int] = None
#: Most bytes a lone writer (broadcast's, scatter's root) puts into one round for each destination.  A round's copy-out
#: by the peers overlaps the root's copy-in of the next, so a large call wants several rounds; each costs a sync.
#: Measured on 2 cores at 16 MiB (load 2-3): 1 MiB per destination ran a 2-rank scatter in 0.85-1.4 ms against
#: 1.4-1.9 ms at 4 MiB; broadcast alike within the noise at 2 and 4 ranks.
LONE_PIECE_BYTES = 1 << 20
#: Most bytes all ranks together put into one round's buffer where each writes its own slot (all_to_all): the three
#: buffers in use then stay in the last-level cache beside the tensors' own streams, so the copy out of a slot reads
#: cache, not memory.  Measured: a 16 MiB all_to_all at 4 ranks on 2 cores took 5.2-6.3 ms with 256-341 KiB per
#: block and round against 7.3-8.3 ms with a slot's third (682 KiB); at 2 ranks this is a whole slot.
ROUND_BYTES = 4 << 20


def _piece_bytes(a: shm.Arena, segment_bytes: int) -> int:
    """Bytes a round moves: ``segment_bytes`` within a slot; 0 (no segmenting, as every algorithm reads it): a slot."""
    return a.slot_bytes if segment_bytes <= 0 else min(segment_bytes, a.slot_bytes)


def _read_in_place(a: shm.Arena, nbytes: int) -> bool:
    """Whether a reduce_scatter, all_gather or gather of ``nbytes`` (in all) reads peers' inputs where they lie: the
    arena agreed every rank can, the call is large (``DIRECT_BYTES``), and the ranks do not outnumber
    ``READ_IN_PLACE_RANKS`` (the same answer on every rank)."""
    most = READ_IN_PLACE_RANKS if READ_IN_PLACE_RANKS is not None else (os.cpu_count() or 1)
    return a.cross_memory and nbytes >= DIRECT_BYTES and a.n <= most


def _share(a: shm.Arena, segment_bytes: int, room: int, ways: int, most: int) -> int:
    """Bytes a round moves to each of ``ways`` destinations that share ``room`` bytes of the round's buffer (a MOVE
    round's: a slot, or all ``n`` slots where one rank alone writes): an equal part of the room, at most ``most``
    and ``segment_bytes`` (0: no limit), rounded down to a cache line where it is larger (no two parts share one)."""
    share = min(room // max(1, ways), most)
    if segment_bytes > 0:
        share = min(share, segment_bytes)
    return max(1, share - share % shm.ALIGN if share >= shm.ALIGN else share)


def _average(buf: torch.Tensor, n: int) -> None:
    """avg's last step, as ``ops.reduce.finalize_`` does it (the same bits as ``buf / n``, a multiply where n is
    a power of two); kept here so that the step of a ZeRO model, which averages through shm, enters no
    further file."""
    if n > 1 and n & (n - 1) == 0:
        buf.mul_(1.0 / n)
    elif n > 1:
        buf.div_(n)


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The flat contiguous ``tensor``'s bytes (an empty tensor may carry any stride: a fresh empty view; so may a
    tensor of one element, ``torch.zeros(1, 2)[:, ::2]``, which ``view`` refuses as bytes: a unit-stride view)."""
    numel = tensor.numel()
    if numel <= 1:
        return torch.empty(0, dtype=torch.uint8) if numel == 0 else tensor.as_strided((1,), (1,)).view(torch.uint8)
    return tensor.view(-1).view(torch.uint8)


# -- heaps: where a tensor from shm_heap.shared_empty lies -------------------------------------------

def heap_slot(t: Transport, tensor: torch.Tensor) -> tuple[int, int]:
    """``(heap index, byte offset)`` of ``tensor``'s data in this rank's region of a heap of ``t``, or ``(-1, 0)``."""
    heaps = t.local.heaps
    if not heaps:
        return -1, 0
    ptr = tensor.data_ptr()
    end = ptr + tensor.numel() * tensor.element_size()
    for index, heap in enumerate(heaps):
        lo = heap.raw.data_ptr() + t.rank * heap.stride
        if lo <= ptr and end <= lo + heap.stride:
            return index, ptr - lo
    return -1, 0


def heap_view(t: Transport, index: int, p: int, offset: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``p``'s ``numel`` elements of ``dtype`` at byte ``offset`` of its region of heap ``index``."""
    heap = t.local.heaps[index]
    start = p * heap.stride + offset
    return heap.raw[start:start + numel * torch.empty((), dtype=dtype).element_size()].view(dtype)


# -- reductions ----------------------------------------------------------------------------------------

#: numpy's ufunc of each op: on a few bytes a ufunc costs a fraction of a torch kernel's dispatch.
#: torch's kernels overflow to inf (or give nan) silently; numpy would warn, and `np.errstate` around
#: each call costs more than the call.  So these warnings are ignored where this module causes them.
warnings.filterwarnings("ignore", r"(overflow|invalid value|divide by zero) encountered", RuntimeWarning, __name__)
_UFUNCS = {"sum": np.add, "avg": np.add, "product": np.multiply, "min": np.minimum, "max": np.maximum,
           "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


#: The dtypes and ops the C small path (``_shmfast``, when built: ``shm.small_round_in_c``) reduces: their codes there.
FAST_KINDS = {torch.float32: 0, torch.float64: 1, torch.int32: 2, torch.int64: 3}
FAST_OPS = {"sum": 0, "avg": 1, "product": 2, "min": 3, "max": 4, "band": 5, "bor": 6, "bxor": 7}


def _reduce_small(a: shm.Arena, tensor: torch.Tensor, op: str, out_ranks: bool, deadline, what: str) -> None:
    """One round: copy in, sync, reduce every slot in rank order into ``tensor`` where ``out_ranks``.

    Two ranks combine the peer's slot into ``tensor`` in place: one kernel, and the same bits on both
    ranks because every op is commutative (``a + b == b + a`` exactly, also for min/max/bitwise).
    An all_reduce of the dtypes in ``FAST_KINDS`` runs the round in C where ``_shmfast`` is built
    (``Arena.reduce_small_c``: the same bits); other dtypes numpy has run as numpy ufuncs on cached
    views (``Arena.numpy_view``), the rest as torch kernels.
    """
    if out_ranks and shm.small_round_in_c():
        kind = FAST_KINDS.get(tensor.dtype)
        if kind is not None:
            a.reduce_small_c(tensor, kind, FAST_OPS[op], deadline, what)
            return
    if not out_ranks:  # a reduce's non-root: copy in, sync, nothing out (one C call where built)
        a.move_round(((tensor.data_ptr(), a.rank * a.slot_bytes, tensor.nbytes),), (), deadline, what)
        return
    k = a.rounds.round
    a.rounds.round += 1
    mine = a.numpy_view(tensor)
    if mine is not None:
        slots = a.slots_numpy(k, mine.dtype, mine.size)
        slots[a.rank][:] = mine  # slice assignment: no Python frame (np.copyto has one)
        a.sync(deadline, what)
        if not out_ranks:
            return
        ufunc = _UFUNCS[op]
        if a.n == 2:
            ufunc(mine, slots[1 - a.rank], out=mine)
        else:
            ufunc(slots[0], slots[1], out=mine)
            for p in range(2, a.n):
                ufunc(mine, slots[p], out=mine)
        if op == "avg":
            np.divide(mine, a.n, out=mine)
        return
    slots = a.slots(k, tensor.dtype, tensor.numel())
    slots[a.rank].copy_(tensor)
    a.sync(deadline, what)
    if not out_ranks:
        return
    if a.n == 2:
        KERNELS[op](tensor, slots[1 - a.rank])
    else:
        KERNELS_OUT[op](slots[0], slots[1], out=tensor)
        combine = KERNELS[op]
        for p in range(2, a.n):
            combine(tensor, slots[p])
    if op == "avg":
        tensor.div_(a.n)


def _reduce_pipelined(t: Transport, a: shm.Arena, tensor: torch.Tensor, op: str, copy_out: bool, zero_copy: bool,
                      deadline, segment_bytes: int, what: str) -> None:
    """The large schedule (module docstring); ``copy_out``: this rank wants the result in ``tensor``."""
    n, r, dtype, es = a.n, a.rank, tensor.dtype, tensor.element_size()
    numel = tensor.numel()
    piece = max(1, _piece_bytes(a, segment_bytes) // es)
    rounds = -(-numel // piece)
    first = a.rounds.round
    a.rounds.round += rounds
    parity = a.begin()
    heap, offset = heap_slot(t, tensor) if zero_copy else (-1, 0)
    a.publish(parity, 0, heap)
    a.publish(parity, 1, offset)
    peers_heap: list = [None] * n  # rank p's whole tensor, where it lies in a heap (known after the first sync)
    slices = {}

    def cut(k: int) -> tuple[int, int, list]:
        lo = k * piece
        hi = min(numel, lo + piece)
        parts = slices.get(hi - lo)
        if parts is None:
            parts = slices[hi - lo] = partition_bounds(hi - lo, n)
        return lo, hi, parts

    def source(k: int, p: int) -> torch.Tensor:
        """Piece ``k`` of rank ``p``'s input as this rank can read it (a heap in place, else p's slot)."""
        lo, hi, _ = cut(k)
        whole = peers_heap[p]
        return whole[lo:hi] if whole is not None else a.slot(first + k, p, dtype)[:hi - lo]

    def copy_in(k: int) -> None:
        if heap >= 0:
            return
        lo, hi, parts = cut(k)
        slot = a.slot(first + k, r, dtype)
        for q, (s, e) in enumerate(parts):
            if q != r and e > s:
                slot[s:e].copy_(tensor[lo + s:lo + e])

    def reduce(k: int) -> None:
        lo, hi, parts = cut(k)
        s, e = parts[r]
        if e == s:
            return
        peers = [p for p in range(n) if p != r]
        mine = tensor[lo + s:lo + e]
        dst = mine if heap >= 0 else a.slot(first + k, r, dtype)[s:e]
        KERNELS_OUT[op](mine, source(k, peers[0])[s:e], out=dst)
        combine = KERNELS[op]
        for p in peers[1:]:
            combine(dst, source(k, p)[s:e])
        if op == "avg":  # the other ops are done once combined
            _average(dst, n)

    def copy_back(k: int) -> None:
        lo, hi, parts = cut(k)
        for q, (s, e) in enumerate(parts):
            if e > s and not (q == r and heap >= 0):
                tensor[lo + s:lo + e].copy_(source(k, q)[s:e])

    for phase in range(rounds + 2):
        if copy_out and 0 <= phase - 2:
            copy_back(phase - 2)
        if 0 <= phase - 1 < rounds:
            reduce(phase - 1)
        if phase < rounds:
            copy_in(phase)
        if phase <= rounds:
            a.sync(deadline, what)
        if phase == 0:
            for p in range(n):
                index = a.peer_word(parity, p, 0)
                if index >= 0:
                    peers_heap[p] = heap_view(t, index, p, a.peer_word(parity, p, 1), numel, dtype)
    if any(whole is not None for whole in peers_heap):
        a.sync(deadline, what)  # no rank returns (and lets its tensor change) while a peer still reads it


def _peer_io(a: shm.Arena, p: int, done: int, nbytes: int, what: str, verb: str) -> None:
    """Raise ``PeerFailure`` unless a ``read_peer``/``write_peer`` of rank ``p``'s tensor moved ``nbytes``."""
    if done != nbytes:
        reason = "exited" if done == -errno.ESRCH else f"could not be {verb} ({os.strerror(-done) if done < 0 else done})"
        raise PeerFailure(f"{what}: rank {p} (pid {a.pid(p)}) {reason} while this rank {verb} its tensor", peer=p)


def _reduce_direct(t: Transport, a: shm.Arena, tensor: torch.Tensor, op: str, deadline, what: str) -> None:
    """all_reduce over every rank's own tensor, no slot: in place where it lies in a heap, else with
    ``process_vm_readv``/``writev`` (the arena agreed that every rank can).

    Each rank publishes its tensor's address; sync; rank ``r`` then owns slice ``r`` alone, in blocks
    of ``BLOCK_BYTES``: it combines the block of every peer into its own tensor (a peer's private block
    is read through scratch that stays in cache) and writes the reduced block, still in cache, into
    every peer's tensor ("push").  No rank reads or writes another's slice, so nothing races; a final
    sync keeps every rank in the call until all pushes into its tensor are done.  Per rank this moves
    what one copy of the tensor moves (read it once, write it once), where reducing then copying the
    other slices out reads ``(n-1)/n`` of it again.
    """
    n, r, dtype, es = a.n, a.rank, tensor.dtype, tensor.itemsize
    numel = tensor.nbytes // es
    parity = a.begin()
    heap, offset = heap_slot(t, tensor)
    a.publish_words(parity, (heap, offset, tensor.data_ptr()))
    a.sync(deadline, what)
    peers = [p for p in range(n) if p != r]
    views, addresses, pids = {}, {}, {}
    for p in peers:
        index, at, address = a.peer_words(parity, p, 3)
        if index >= 0:
            views[p] = heap_view(t, index, p, at, numel, dtype)
        else:
            addresses[p], pids[p] = address, a.pid(p)
    block = max(1, BLOCK_BYTES // es)
    scratch = a.scratch(dtype, block) if addresses else None
    combine = KERNELS[op]
    base, extra = numel // n, numel % n  # this rank's slice of partition_bounds(numel, n), without the list
    s = r * base + (r if r < extra else extra)
    e = s + base + (r < extra)
    for b0 in range(s, e, block):
        b1 = e if e - b0 <= block else b0 + block
        mine = tensor[b0:b1]
        for p in peers:
            if p in views:
                combine(mine, views[p][b0:b1])
            else:
                part = scratch[:b1 - b0]
                done = shm.read_peer(pids[p], addresses[p] + b0 * es, part)
                if done != part.nbytes:
                    _peer_io(a, p, done, part.nbytes, what, "read")
                combine(mine, part)
        if op == "avg":
            _average(mine, n)
        for p in peers:
            if p in views:
                views[p][b0:b1].copy_(mine)
            else:
                done = shm.write_peer(pids[p], addresses[p] + b0 * es, mine)
                if done != mine.nbytes:
                    _peer_io(a, p, done, mine.nbytes, what, "written")
    a.sync(deadline, what)  # every push into this rank's tensor is done; no peer touches it after


def all_reduce_shm(t: Transport, tensor: torch.Tensor, op: str, *, tag: int, deadline: Optional[float],
                   segment_bytes: int) -> None:
    """Reduce the flat ``tensor`` across all ranks in place, through shared memory (every rank calls it).

    Up to ``SMALL_BYTES``: one sync.  Larger: where the arena agreed that peers' memory can be read and
    written, every peer's tensor is read and written where it lies (``_reduce_direct``, two syncs);
    else pipelined through the slots in pieces of ``min(segment_bytes, SLOT_BYTES)``, one sync a round,
    tensors from ``shared_empty`` on every rank read in place (zero-copy).  Every rank ends with the same bits.
    ``UnsupportedError`` if the ranks are not on one host.
    """
    a = t.local.arena  # the arena, once made
    nbytes = tensor.nbytes
    if a is None:
        if t.size == 1 or nbytes == 0:
            if op == "avg":
                _average(tensor, t.size)
            return
        a = shm.arena(t, tag=tag, deadline=deadline)
    elif nbytes == 0:
        return
    if nbytes <= SMALL_BYTES and nbytes <= a.slot_bytes:
        _reduce_small(a, tensor, op, True, deadline, f"all_reduce (tag {tag})")
    elif a.cross_memory:
        _reduce_direct(t, a, tensor, op, deadline, f"all_reduce (tag {tag})")
    else:
        _reduce_pipelined(t, a, tensor, op, True, True, deadline, segment_bytes, f"all_reduce (tag {tag})")


def reduce_shm(t: Transport, tensor: torch.Tensor, op: str, root: int, *, tag: int, deadline: Optional[float],
               segment_bytes: int) -> None:
    """Reduce the flat ``tensor`` into ``root``'s; other ranks' tensors are left unchanged."""
    n = t.size
    if n == 1 or tensor.numel() == 0:
        if op == "avg":
            _average(tensor, n)
        return
    a = shm.arena(t, tag=tag, deadline=deadline)
    what = f"reduce (tag {tag})"
    if tensor.numel() * tensor.element_size() <= min(SMALL_BYTES, a.slot_bytes):
        _reduce_small(a, tensor, op, t.rank == root, deadline, what)
    else:
        _reduce_pipelined(t, a, tensor, op, t.rank == root, False, deadline, segment_bytes, what)


def reduce_scatter_shm(t: Transport, output: torch.Tensor, input: torch.Tensor, op: str, *, tag: int,
                       deadline: Optional[float], segment_bytes: int) -> None:
    """Rank ``r``'s ``output`` (``m`` elements) ← chunk ``r`` of the reduction of every rank's ``input`` (``n*m``).

    ``output`` may be ``input``'s own chunk ``r`` (in place); ``input`` is not modified otherwise.
    """
    n, r, m = t.size, t.rank, output.numel()
    if n == 1:
        if output.data_ptr() != input.data_ptr():
            output.copy_(input)
        if op == "avg":
            _average(output, n)
        return
    if m == 0:
        return
    a = shm.arena(t, tag=tag, deadline=deadline)
    what = f"reduce_scatter (tag {tag})"
    kind = FAST_KINDS.get(input.dtype)
    if kind is not None and input.nbytes <= min(SMALL_BYTES, a.slot_bytes) and shm.small_round_in_c():
        # Small: the whole input reduced in one C round (the small all_reduce's), then this rank's chunk kept.
        # Reducing n chunks where one is kept costs less, at these sizes, than a round of Python per chunk.
        whole = a.scratch(input.dtype, input.numel())
        _copy(whole.data_ptr(), input.data_ptr(), input.nbytes)
        a.reduce_small_c(whole, kind, FAST_OPS[op], deadline, what)
        _copy(output.data_ptr(), whole.data_ptr() + r * output.nbytes, output.nbytes)
        return
    if _read_in_place(a, input.nbytes):
        _reduce_scatter_direct(a, output, input, op, deadline, what)
        return
    dtype = input.dtype
    piece = max(1, _piece_bytes(a, segment_bytes) // input.element_size() // n)
    rounds = -(-m // piece)
    first = a.rounds.round
    a.rounds.round += rounds
    combine = KERNELS[op]
    peers = [p for p in range(n) if p != r]
    for k in range(rounds):
        lo, hi = k * piece, min(m, (k + 1) * piece)
        mine = a.slot(first + k, r, dtype)
        for q in peers:
            mine[q * piece:q * piece + hi - lo].copy_(input[q * m + lo:q * m + hi])
        a.sync(deadline, what)
        region = slice(r * piece, r * piece + hi - lo)
        out = output[lo:hi]
        KERNELS_OUT[op](input[r * m + lo:r * m + hi], a.slot(first + k, peers[0], dtype)[region], out=out)
        for p in peers[1:]:
            combine(out, a.slot(first + k, p, dtype)[region])
        if op == "avg":
            _average(out, n)  # while the piece is in cache


def _publish_address(a: shm.Arena, tensor: torch.Tensor, deadline, what: str) -> tuple:
    """Publish ``tensor``'s address, sync (the call's first: its mismatch check rides in it); returns
    ``(parity, peers)`` for :func:`_peer_read`."""
    parity = a.begin()
    a.publish(parity, 2, tensor.data_ptr())
    a.sync(deadline, what)
    return parity, [p for p in range(a.n) if p != a.rank]


def _peer_read(a: shm.Arena, parity: int, p: int, element: int, into: torch.Tensor, what: str) -> None:
    """``into`` <- rank ``p``'s published tensor from element ``element`` on (``process_vm_readv``)."""
    address = a.peer_word(parity, p, 2) + element * into.element_size()
    _peer_io(a, p, shm.read_peer(a.pid(p), address, into), into.nbytes, what, "read")


def _reduce_scatter_direct(a: shm.Arena, output: torch.Tensor, input: torch.Tensor, op: str, deadline,
                           what: str) -> None:
    """reduce_scatter reading every peer's ``input`` where it lies (the arena agreed that every rank can):
    rank ``r`` combines chunk ``r`` of every input into its ``output``, block by block through scratch that
    stays in cache; no slot, no copy-in.  Two syncs: no peer changes its input before every rank read it."""
    n, r, m = a.n, a.rank, output.numel()
    parity, peers = _publish_address(a, input, deadline, what)
    block = max(1, BLOCK_BYTES // input.element_size())
    scratch = a.scratch(input.dtype, block)
    for b0 in range(0, m, block):
        b1 = min(m, b0 + block)
        out = output[b0:b1]
        for i, p in enumerate(peers):
            part = scratch[:b1 - b0]
            _peer_read(a, parity, p, r * m + b0, part, what)
            if i == 0:
                KERNELS_OUT[op](input[r * m + b0:r * m + b1], part, out=out)
            else:
                KERNELS[op](out, part)
        if op == "avg":
            _average(out, n)  # while the block is in cache: a pass over the output less
    a.sync(deadline, what)


# -- data movement -----------------------------------------------------------------------------------

def _copy(into: int, source: int, nbytes: int) -> None:
    """``nbytes`` from address ``source`` to ``into`` in this process (this rank's own chunk of a data movement): a
    ``memmove``, a fraction of a torch slice's and copy's cost on a few bytes; none where they are the same memory
    (in place)."""
    if nbytes and into != source:
        ctypes.memmove(into, source, nbytes)


def broadcast_shm(t: Transport, tensor: torch.Tensor, root: int, *, tag: int, deadline: Optional[float],
                  segment_bytes: int) -> None:
    """Copy ``root``'s flat ``tensor`` into every rank's: the root writes a piece, a sync, the rest read it."""
    if t.size == 1 or tensor.numel() == 0:
        return
    a = shm.arena(t, tag=tag, deadline=deadline)
    r, what = t.rank, f"broadcast (tag {tag})"
    nbytes, address = tensor.nbytes, tensor.data_ptr()  # flat and contiguous: its bytes from its first element's
    piece = _share(a, segment_bytes, a.buffer_bytes, 1, LONE_PIECE_BYTES)  # the root alone writes: any slot is its room
    for lo in range(0, nbytes, piece):
        a.move_round(*_broadcast_copies(r == root, address + lo, min(nbytes - lo, piece)), deadline, what)


def _broadcast_copies(writes: bool, address: int, nbytes: int) -> tuple:
    """A broadcast round's copies: the root's ``nbytes`` at ``address`` into the buffer's start, the others' out."""
    return (((address, 0, nbytes),), ()) if writes else ((), ((address, 0, nbytes),))


def _gather(t: Transport, output: Optional[torch.Tensor], input: torch.Tensor, readers: Sequence[int], tag: int,
            deadline, segment_bytes: int, what: str) -> None:
    """Every rank's ``input`` (``m`` bytes) into chunk ``rank`` of ``output`` on the ``readers``.

    A rank that both writes and reads (all_gather) in rounds of pieces copies its own chunk out of its slot in each
    round, where the piece it just copied in is still in cache, not from its input again."""
    n, r = t.size, t.rank
    m, source = input.nbytes, input.data_ptr()
    reads = r in readers
    into = output.data_ptr() if reads else 0
    if n == 1 or m == 0:
        if reads:
            _copy(into + r * m, source, m)
        return
    a = shm.arena(t, tag=tag, deadline=deadline)
    writes = not reads or len(readers) > 1  # a lone reader (gather's root) needs no slot of its own
    direct = _read_in_place(a, m * n)
    one_c_round = reads and len(readers) == n and m <= a.slot_bytes and shm.small_round_in_c()  # gather_round's
    rounds = not direct and not one_c_round
    own = reads and into + r * m != source  # this rank's chunk still to copy (not in place)
    if own and not (rounds and writes):  # else each round copies it out of this rank's slot
        _copy(into + r * m, source, m)
    if direct:  # readers copy each peer's input where it lies: no slot
        out = _bytes(output) if reads else None
        parity, peers = _publish_address(a, _bytes(input), deadline, what)
        if out is not None:
            for p in peers:
                _peer_read(a, parity, p, 0, out[p * m:(p + 1) * m], what)
        a.sync(deadline, what)  # no rank changes its input before every reader has it
        return
    if one_c_round and a.gather_round(output, m, deadline, what):
        return  # one C round: copy in (from the output's own chunk), sync, copy every peer's slot out
    piece, slot = _piece_bytes(a, segment_bytes), a.slot_bytes
    peers = [p for p in range(n) if p != r] if reads else []
    if own and writes:
        peers.append(r)
    for lo in range(0, m, piece):  # one round a piece: every writer copies in, sync, the readers copy out
        span = min(m - lo, piece)
        a.move_round(((source + lo, r * slot, span),) if writes else (),
                     [(into + p * m + lo, p * slot, span) for p in peers], deadline, what)


def all_gather_shm(t: Transport, output: torch.Tensor, input: torch.Tensor, *, tag: int, deadline: Optional[float],
                   segment_bytes: int) -> None:
    """``output`` (``n*m``) ← every rank's ``input`` (``m``) in rank order; ``input`` may be chunk ``rank``."""
    _gather(t, output, input, range(t.size), tag, deadline, segment_bytes, f"all_gather (tag {tag})")


def gather_shm(t: Transport, output: Optional[torch.Tensor], input: torch.Tensor, root: int, *, tag: int,
               deadline: Optional[float], segment_bytes: int) -> None:
    """``root``'s ``output`` (``n*m``) ← every rank's ``input`` (``m``); ``output`` is ``None`` elsewhere."""
    _gather(t, output, input, (root,), tag, deadline, segment_bytes, f"gather (tag {tag})")


def scatter_shm(t: Transport, output: torch.Tensor, input, root: int, *, tag: int, deadline: Optional[float],
                segment_bytes: int) -> None:
    """Rank ``r``'s ``output`` (``m``) ← chunk ``r`` of ``root``'s ``input`` (``None`` elsewhere): one flat tensor of
    ``n*m`` elements, or the ``n`` chunks themselves (contiguous tensors of ``m``; the list form's items, not joined).

    The root alone writes, so a round's whole buffer is its room: piece ``k`` of chunk ``p`` (at most
    ``LONE_PIECE_BYTES``) goes into part ``p`` of the buffer's ``n - 1`` parts (``_share``); sync; rank ``p`` copies its
    part out.  The root copies its own chunk
    last, while its peers copy the last round out.
    """
    n, r = t.size, t.rank
    m, into = output.nbytes, output.data_ptr()
    sources = _chunk_addresses(input, n, m) if r == root else ()
    if n == 1 or m == 0:
        if r == root:
            _copy(into, sources[r], m)
        return
    a = shm.arena(t, tag=tag, deadline=deadline)
    piece = _share(a, segment_bytes, a.buffer_bytes, n - 1, LONE_PIECE_BYTES)
    what = f"scatter (tag {tag})"

    def part(p: int) -> int:  # where the root's chunk for rank p goes in the buffer: the parts skip the root
        return (p if p < root else p - 1) * piece

    mine = part(r)
    for lo in range(0, m, piece):  # one round a piece: the root copies every chunk's piece into its part, sync, read
        span = min(m - lo, piece)
        if r == root:
            a.move_round([(sources[p] + lo, part(p), span) for p in range(n) if p != root], (), deadline, what)
        else:
            a.move_round((), ((into + lo, mine, span),), deadline, what)
    if r == root:
        _copy(into, sources[r], m)


def _chunk_addresses(input, n: int, m: int) -> list:
    """The address of each of the ``n`` chunks (``m`` bytes) of a scatter's ``input``: a flat tensor, or the chunks."""
    if isinstance(input, torch.Tensor):
        base = input.data_ptr()
        return [base + p * m for p in range(n)]
    return [chunk.data_ptr() for chunk in input]


def all_to_all_shm(t: Transport, output: torch.Tensor, input: torch.Tensor, out_counts: Sequence[int],
                   in_counts: Sequence[int], *, tag: int, deadline: Optional[float], segment_bytes: int) -> None:
    """``in_counts[j]`` elements of ``input`` go to rank ``j``; rank ``j``'s ``out_counts[j]`` land in ``output``.

    Each round every rank writes piece ``k`` of each block for a peer into that peer's part of its own slot (the
    slot in ``n - 1`` parts, all ranks' together at most ``ROUND_BYTES``: ``_share``); sync; every rank copies its
    part of each peer's slot out.  The number of
    rounds is agreed at the first sync (the largest block of any rank); the block to itself is one local copy.
    """
    n, r, es = t.size, t.rank, input.element_size()
    if out_counts[r] != in_counts[r]:
        raise ValueError(f"rank {r}: all_to_all: this rank sends itself {in_counts[r]} elements but expects "
                         f"{out_counts[r]} from itself")
    source, into = input.data_ptr(), output.data_ptr()
    sends, receives, most = [], [], 0  # (rank, byte offset, bytes) of every block to and from a peer
    at_in = at_out = 0
    for j in range(n):
        size_in, size_out = in_counts[j] * es, out_counts[j] * es
        if j == r:
            _copy(into + at_out, source + at_in, size_in)
        else:
            if size_in:
                sends.append((j, at_in, size_in))
                most = size_in if size_in > most else most
            if size_out:
                receives.append((j, at_out, size_out))
        at_in += size_in
        at_out += size_out
    if n == 1:
        return
    a = shm.arena(t, tag=tag, deadline=deadline)
    what = f"all_to_all (tag {tag})"
    slot = a.slot_bytes
    piece = _share(a, segment_bytes, slot, n - 1, ROUND_BYTES // (n * (n - 1)))
    # Rank i's block for rank j lies in part (j if j < i else j - 1) of i's slot: n - 1 parts, none for itself.
    sends = [(at, r * slot + (j if j < r else j - 1) * piece, size) for j, at, size in sends]
    receives = [(at, j * slot + (r if r < j else r - 1) * piece, size) for j, at, size in receives]
    parity = a.begin()
    a.publish(parity, 0, most)
    rounds, k = 1, 0
    while k < rounds:  # one round a piece of every block: copy in, sync, copy out (small calls: one round)
        lo = k * piece
        a.move_round([(source + at + lo, part, min(piece, size - lo)) for at, part, size in sends if size > lo],
                     [(into + at + lo, part, min(piece, size - lo)) for at, part, size in receives if size > lo],
                     deadline, what)
        if k == 0:
            rounds = max(1, -(-max(a.peer_word(parity, p, 0) for p in range(n)) // piece))
        k += 1


def barrier_shm(t: Transport, *, tag: int, deadline: Optional[float], segment_bytes: int) -> None:
    """Return once every rank has entered: one sync through the step words."""
    if t.size > 1:
        shm.arena(t, tag=tag, deadline=deadline).sync(deadline, f"barrier (tag {tag})")


# -- a small call in its check's round ----------------------------------------------------------------------------
# A small call of these collectives (at most the check's ``RIDE_BYTES``) is one round of copies (a MOVE round), and on
# a group checked in the segment that round is the check's own: ``MismatchCheck.in_segment`` hands the round's copies,
# made here, to the C round that compares the digests (``Rounds.check``), so the call is one C call after its plan,
# as a small all_reduce is.  Each function gives ``(ins, outs)`` of ``Arena.move_round`` for the call's arguments
# (``Call.args``, as the collective's schedule above gets them) on arena ``a``, or ``None`` where the round
# reduces instead (a reduce's root: the small all_reduce's round, into its tensor).  Every copy fits the round's
# buffer at these sizes; a rank reads only what it or a peer wrote in the same round.

def _broadcast_round(a: shm.Arena, args: tuple):
    tensor, root = args
    return _broadcast_copies(a.rank == root, tensor.data_ptr(), tensor.nbytes)


def _scatter_round(a: shm.Arena, args: tuple):
    """The root writes chunk ``p`` at ``p * m`` (its own too: no copy before the round's check); each rank reads
    its own."""
    output, input, root = args
    r, m, n = a.rank, output.nbytes, a.n
    outs = ((output.data_ptr(), r * m, m),)
    if r != root:
        return (), outs
    return [(address, p * m, m) for p, address in enumerate(_chunk_addresses(input, n, m))], outs


def _gather_round(a: shm.Arena, args: tuple, everyone: bool):
    """Every rank writes its input into its slot (a gather's root too); the readers copy every slot out."""
    output, input = args[0], args[1]
    r, m, slot = a.rank, input.nbytes, a.slot_bytes
    ins = ((input.data_ptr(), r * slot, m),)
    if not everyone and r != args[2]:
        return ins, ()
    into = output.data_ptr()
    return ins, [(into + p * m, p * slot, m) for p in range(a.n)]


def _all_to_all_round(a: shm.Arena, args: tuple):
    """Even splits (every block ``m`` bytes): rank ``i``'s block for ``j`` at part ``j`` of ``i``'s slot (``n``
    parts), its own block too; every rank copies its part of every slot out."""
    output, input = args[0], args[1]
    r, n, slot = a.rank, a.n, a.slot_bytes
    m, part = input.nbytes // n, slot // n
    source, into = input.data_ptr(), output.data_ptr()
    return ([(source + j * m, r * slot + j * part, m) for j in range(n)],
            [(into + j * m, j * slot + r * part, m) for j in range(n)])


def _reduce_round(a: shm.Arena, args: tuple):
    """The root reduces (the small all_reduce's round); the others copy in, as ``_reduce_small`` has them."""
    tensor, _, root = args
    if a.rank == root:
        return None
    return ((tensor.data_ptr(), a.rank * a.slot_bytes, tensor.nbytes),), ()


def _barrier_round(a: shm.Arena, args: tuple):
    return (), ()


#: The collectives whose small calls ride in the check's round, and the copies of that round.
ROUND_COPIES = {
    "broadcast": _broadcast_round,
    "scatter": _scatter_round,
    "gather": lambda a, args: _gather_round(a, args, False),
    "all_gather": lambda a, args: _gather_round(a, args, True),
    "all_to_all": _all_to_all_round,
    "reduce": _reduce_round,
    "barrier": _barrier_round,
}
