"""Hierarchical algorithms for groups that span hosts: bytes cross a host's link once.

Terms.  A *host* is the set of ranks with the same host name (``comm.topology``); ``m_h`` is the
number of ranks on host ``h`` and a rank's *local index* its position among them.  The *intra*
communicator of a host holds its ranks; an *inter* communicator holds one rank per host.  Both
are made with ``Backend.split`` the first time a call needs them and cached on the backend (see
:func:`release`).  Intra-host phases use the ``"shm"`` algorithm (one
host, shared memory), else the ring (large) or tree (small) one; inter-host phases use the ring
for large pieces (between two hosts, one pipelined exchange) and recursive doubling / a binomial tree
for small ones.

all_reduce of ``N`` elements, large (above ``SMALL_BYTES``):
  1. intra reduce-scatter: host ``h`` cuts ``[0, m_h s_h)`` (``s_h = N // m_h``) into ``m_h``
     chunks, local index ``i`` ends with the host's partial sum of chunk ``i``; the *tail*
     ``[m_h s_h, N)`` (fewer than ``m_h`` elements) is reduced into the last local index.
  2. inter all_reduce: the *owner* of element ``x`` on host ``h`` is the local index whose chunk
     holds it (the last one for the tail).  Cutting ``[0, N)`` at every host's chunk bounds gives
     *pieces*; a piece's owners (one rank per host) all_reduce it over their inter communicator.
     Owners are monotone in ``x``, so equal owner sets are contiguous and merge into one piece.
     With the same ``m`` on every host these are the ``m`` classic "same local index" rings.
     Every rank runs its pieces in order of position, which is one order for every rank: no
     deadlock, whatever the hosts' sizes (3 ranks on one host, 1 on another: the single rank is
     an owner of every piece).
  3. intra all_gather of the chunks, and a broadcast of the tail from the last local index.
  Each host's link carries ``2 (H-1)/H`` of the buffer once, against ``2 (n-1)/n`` per rank for a
  flat ring whose neighbours sit on other hosts.
all_reduce, small: intra reduce to local index 0, inter all_reduce among those, intra broadcast.
reduce_scatter / all_gather (``n`` chunks of ``m``): chunk ``c`` has one *responsible* rank per
  host: its own rank on its host, local index ``(local index of c) mod m_h`` elsewhere.  A rank's
  responsible chunks (``K`` slots, padded to the host's maximum) are laid out side by side in a
  scratch buffer.  reduce_scatter: intra reduce-scatter of that buffer, then per inter communicator
  one reduce-scatter (when its chunks are exactly its members' own, the even case) or one reduce
  per chunk to the chunk's rank.  all_gather runs the mirror image: inter all_gather (or a
  broadcast per chunk), then an intra all_gather, then chunks are copied to their places.
broadcast: the root and the first rank of every other host broadcast over their inter
  communicator (a pipelined chain when large, a tree when small), then each host broadcasts.
AVG is reduced as SUM and divided by ``n`` once at the end.  One host only: the intra algorithm
over the whole group; one rank per host: the inter algorithm over the whole group.
The other collectives are not registered: the selection layer refuses them, naming alternatives.
"""
from __future__ import annotations

import collections
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Sequence

import torch

from ...ops.reduce import KERNELS, finalize_
from .. import topology
from ..transport import Transport
from .ring import all_gather_ring, all_reduce_ring, broadcast_ring, reduce_ring, reduce_scatter_ring
from .shm import all_gather_shm, all_reduce_shm, broadcast_shm, reduce_scatter_shm, reduce_shm
from .tree import all_reduce_recursive_doubling, broadcast_tree, reduce_tree, remaining

#: all_reduce of at most this many bytes takes the small path (reduce, leaders' all_reduce, broadcast).
SMALL_BYTES = 64 << 10
#: Large all_reduce runs in rounds of at most this many bytes (see [Note: rounds]).
PIPELINE_BYTES = 2 << 20
#: ... the first and the last round of this many, doubling up to PIPELINE_BYTES from both ends.
PIPELINE_FIRST_BYTES = 128 << 10
#: Between two hosts: rounds whose exchange is posted while an earlier round's is being finished.
EXCHANGES_AHEAD = 2
#: Inter-host pieces of at most this many bytes use recursive doubling / a tree, larger ones the ring.
INTER_TREE_BYTES = 64 << 10


class _Layout:
    """Who runs where, learnt once per backend, and the sub-communicators made so far.

    ``hosts``: the ranks of each host, hosts ordered by their lowest rank; ``host_of[r]``: the host
    index of rank ``r``; ``mine``: this rank's host's ranks; ``index``: this rank's local index;
    ``comms``: ranks (sorted tuple) -> this rank's sub-communicator (``None`` if not a member).
    """

    def __init__(self, names: Sequence[str], rank: int, nonce: str):
        order: dict[str, list[int]] = {}
        for r, name in enumerate(names):
            order.setdefault(name, []).append(r)
        self.hosts = tuple(tuple(ranks) for ranks in order.values())
        self.host_of = [0] * len(names)
        for h, ranks in enumerate(self.hosts):
            for r in ranks:
                self.host_of[r] = h
        self.mine = self.hosts[self.host_of[rank]]
        self.index = self.mine.index(rank)
        self.local_index = {r: ranks.index(r) for ranks in self.hosts for r in ranks}
        self.nonce = nonce
        self.comms: dict[tuple[int, ...], Optional[Transport]] = {}
        self._helper: Optional[ThreadPoolExecutor] = None

    def comm_of(self, ranks: Sequence[int], rank: int) -> Optional[Transport]:
        """``rank``'s communicator over ``ranks`` (made by :func:`_comms`), ``None`` if it is not a member."""
        key = tuple(sorted(ranks))
        return self.comms[key] if rank in key else None

    def helper(self) -> ThreadPoolExecutor:
        """The thread that runs inter-host phases beside this one (see [Note: rounds])."""
        if self._helper is None:
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="zerocomm-hierarchical")
        return self._helper

    def close(self, t: Transport, abandon: bool = False) -> None:
        if self._helper is not None:
            self._helper.shutdown(wait=False, cancel_futures=True)
            self._helper = None
        for comm in self.comms.values():
            if comm is not None and comm is not t:
                comm.close(abandon)
        self.comms.clear()

    def one_host(self) -> bool:
        return len(self.hosts) == 1

    def one_rank_per_host(self) -> bool:
        return all(len(ranks) == 1 for ranks in self.hosts)


def _layout(t: Transport, tag: int, deadline: Optional[float]) -> _Layout:
    """The backend's layout; the first call on a backend is a collective of all its ranks."""
    known = t.local.hierarchy
    if known is not None:
        return known
    names = topology.hosts(t, tag=tag, deadline=deadline, all_gather=all_gather_ring)
    # Split keys must be new in the backend's store even when a store outlives a communicator (a
    # world torn down and made again over the same file): rank 0 draws a nonce for this backend.
    nonce = torch.frombuffer(bytearray(os.urandom(8)), dtype=torch.uint8).clone()
    broadcast_tree(t, nonce, 0, tag=tag, deadline=deadline, segment_bytes=0)
    layout = _Layout(names, t.rank, bytes(nonce.tolist()).hex())
    t.local.hierarchy = layout
    return layout


def _comms(t: Transport, lay: _Layout, wanted: Sequence[Sequence[int]]) -> list[Optional[Transport]]:
    """This rank's communicator over each set of ranks in ``wanted`` (``None`` where it is not a member).

    Every rank of ``t`` calls it with the same ``wanted`` (derived from arguments all ranks share),
    so each new set is split by every rank in the same order.  The whole group reuses ``t``.
    """
    out = []
    for ranks in wanted:
        key = tuple(sorted(ranks))
        if key not in lay.comms:
            if len(key) == t.size:
                lay.comms[key] = t
            elif len(key) == 1:
                lay.comms[key] = None  # one rank: every phase over it is a no-op, no communicator needed
            else:
                lay.comms[key] = t.split(list(key), f"zerocomm-hier-{lay.nonce}-{len(lay.comms)}")
        out.append(lay.comms[key] if t.rank in key else None)
    return out


def host_communicator(t: Transport, *, tag: int, deadline: Optional[float]) -> Optional[Transport]:
    """This rank's communicator over the ranks of ``t`` on its host (``t`` itself on one host; ``None`` where the
    rank is alone on its host).  Every rank of ``t`` calls it, with the same ``tag``: the first call learns the
    hosts and splits every host's communicator."""
    lay = _layout(t, tag, deadline)
    return _comms(t, lay, lay.hosts)[lay.host_of[t.rank]]


@Transport.on_close
def release(t: Transport, abandon: bool = False) -> None:
    """Close the sub-communicators hierarchical made over ``t`` (a close hook: its backend's ``close`` runs
    it, see ``Transport.on_close``)."""
    local = t.local
    lay, local.hierarchy = local.hierarchy, None
    if lay is not None:
        lay.close(t, abandon)


#: The shared-memory algorithm of each collective an intra-host phase runs.
_SHM = {"all_reduce": all_reduce_shm, "reduce": reduce_shm, "broadcast": broadcast_shm, "all_gather": all_gather_shm,
        "reduce_scatter": reduce_scatter_shm}


def _intra(collective: str, fallback: Callable[..., None]) -> Callable[..., None]:
    """The shared-memory algorithm of ``collective`` where there is one, else ``fallback``."""
    return _SHM.get(collective, fallback)


def _inter_all_reduce(nbytes: int, size: int) -> Callable[..., None]:
    """Small pieces: recursive doubling.  Large ones: the ring, except between two hosts, where recursive
    doubling is one segmented exchange that carries the piece once each way, as the ring's two steps do, but
    with nothing to wait for between them: the link stays busy (the ring idles while each half is reduced)."""
    return all_reduce_recursive_doubling if nbytes <= INTER_TREE_BYTES or size == 2 else all_reduce_ring


def _rank_in(comm_ranks: Sequence[int], rank: int) -> int:
    return sorted(comm_ranks).index(rank)


# -- all_reduce ------------------------------------------------------------------------------------------

def all_reduce_hierarchical(t: Transport, tensor: torch.Tensor, op: str, *, tag: int, deadline: Optional[float],
                            segment_bytes: int) -> None:
    """Reduce the flat ``tensor`` across all ranks of ``t``, in place on every rank (every rank calls it).

    Intra-host reduce-scatter, inter-host all_reduce of each slice among the ranks holding it,
    intra-host all_gather (small buffers: reduce, all_reduce among one rank per host, broadcast).
    Every rank ends with the bitwise-same result.
    """
    n, numel = t.size, tensor.numel()
    if n == 1 or numel == 0:
        if op == "avg":  # the other ops are done once combined
            finalize_(tensor, op, n)
        return
    nbytes = numel * tensor.element_size()
    kw = dict(tag=tag, deadline=deadline, segment_bytes=segment_bytes)
    lay = _layout(t, tag, deadline)
    if lay.one_host():
        small = nbytes <= SMALL_BYTES
        _intra("all_reduce", all_reduce_recursive_doubling if small else all_reduce_ring)(t, tensor, op, **kw)
        return
    if lay.one_rank_per_host():
        _inter_all_reduce(nbytes, t.size)(t, tensor, op, **kw)
        return
    base = "sum" if op == "avg" else op
    if nbytes <= SMALL_BYTES or numel < max(len(ranks) for ranks in lay.hosts):
        _all_reduce_small(t, lay, tensor, base, kw)
    else:
        _all_reduce_large(t, lay, tensor, base, kw)
    if op == "avg":
        finalize_(tensor, op, n)


def _all_reduce_small(t: Transport, lay: _Layout, tensor: torch.Tensor, op: str, kw: dict) -> None:
    leaders = [ranks[0] for ranks in lay.hosts]
    *intras, inter = _comms(t, lay, list(lay.hosts) + [leaders])
    intra = intras[lay.host_of[t.rank]]
    if intra is not None:
        _intra("reduce", reduce_tree)(intra, tensor, op, 0, **kw)
    if inter is not None:
        all_reduce_recursive_doubling(inter, tensor, op, **kw)
    if intra is not None:
        _intra("broadcast", broadcast_tree)(intra, tensor, 0, **kw)


def _owner(x: int, m: int, numel: int) -> int:
    """Local index owning element ``x`` on a host of ``m`` ranks (chunks of ``numel // m``, tail to the last)."""
    s = numel // m
    return m - 1 if s == 0 else min(x // s, m - 1)


def _pieces(lay: _Layout, numel: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """``[(lo, hi, owners)]``: ``[0, numel)`` cut at every host's chunk bounds, equal owner sets merged."""
    cuts = {0, numel}
    for ranks in lay.hosts:
        s = numel // len(ranks)
        cuts.update(i * s for i in range(1, len(ranks)) if s)
    bounds = sorted(cuts)
    pieces: list[tuple[int, int, tuple[int, ...]]] = []
    for lo, hi in zip(bounds, bounds[1:]):
        owners = tuple(ranks[_owner(lo, len(ranks), numel)] for ranks in lay.hosts)
        if pieces and pieces[-1][2] == owners:
            pieces[-1] = (pieces[-1][0], hi, owners)
        else:
            pieces.append((lo, hi, owners))
    return pieces


def _round_sizes(numel: int, first: int, most: int) -> list[int]:
    """Elements of each round: ``first``, doubling up to ``most`` from the front and, mirrored, from the back,
    ``most`` in between (every round at least ``first`` unless the buffer is smaller)."""
    head: list[int] = []
    tail: list[int] = []
    left, size = numel, first
    while left > 0 and size < most:
        for side in (head, tail):
            take = min(size, left)
            if take:
                side.append(take)
                left -= take
        size *= 2
    middle = [most] * (left // most) + ([left % most] if left % most else [])
    return head + middle + tail[::-1]


def _all_reduce_large(t: Transport, lay: _Layout, tensor: torch.Tensor, op: str, kw: dict) -> None:
    # [Note: rounds]  The buffer runs in rounds, each a whole hierarchical all_reduce of its region; a
    # helper thread runs the inter-host phase of round k while this thread runs the intra-host
    # reduce-scatter of round k+1 and the all_gather of round k-1, so the link is busy while the host's
    # memory work happens (round k+1's inter phase is queued behind round k's).  Only the first round's
    # reduce-scatter comes before the link has anything to carry and only the last round's all_gather
    # after it is done, so those rounds are small (PIPELINE_FIRST_BYTES), and rounds double from both ends
    # up to PIPELINE_BYTES (fewer, larger rounds in the middle: less per-round cost).  Per communicator,
    # every rank issues the same calls in the same order: intra RS 0, RS 1, AG 0, RS 2, AG 1, ...; inter
    # round 0, 1, ... (pieces in order).
    numel, esize = tensor.numel(), tensor.element_size()
    least = max(len(ranks) for ranks in lay.hosts)
    rounds, lo = [], 0
    for size in _round_sizes(numel, max(PIPELINE_FIRST_BYTES // esize, least), max(PIPELINE_BYTES // esize, least)):
        rounds.append((lo, lo + size, _pieces(lay, size)))
        lo += size
    _comms(t, lay, list(lay.hosts) + [owners for _, _, pieces in rounds for _, _, owners in pieces])
    intra = lay.comm_of(lay.mine, t.rank)
    if len(lay.hosts) == 2:
        _all_reduce_two_hosts(t, lay, tensor, op, rounds, intra, kw)
        return
    queued: collections.deque = collections.deque()  # (inter-host phase's future, region), oldest first
    for lo, hi, pieces in rounds:
        region = tensor[lo:hi]
        if intra is not None:
            _intra_reduce(intra, lay, region, op, kw)
        # Queued behind the previous round's inter phase: the link never waits for this thread's all_gather.
        queued.append((lay.helper().submit(_inter_pieces, t, lay, region, pieces, op, kw), region))
        if len(queued) > 1:
            _finish_round(intra, lay, *queued.popleft(), kw)
    while queued:
        _finish_round(intra, lay, *queued.popleft(), kw)


def _all_reduce_two_hosts(t: Transport, lay: _Layout, tensor: torch.Tensor, op: str, rounds: list,
                          intra: Optional[Transport], kw: dict) -> None:
    # [Note: two hosts]  Every inter-host piece has one owner on each host, so its inter phase is one
    # exchange: send the host's partial, receive the other host's, combine (a + b on one rank, b + a on the
    # other: the same bits).  This thread posts a round's exchange as soon as the round is reduced inside
    # the host and finishes it EXCHANGES_AHEAD rounds later, so the sockets always hold the next rounds'
    # bytes and the link never waits for a round to end before the next one starts (a helper thread running
    # one blocking exchange after another leaves the link idle between them).  Messages of one (peer, tag)
    # arrive in the order posted, the same on both owners.
    posted: collections.deque = collections.deque()  # (region, [(piece, incoming, recv, send)]), oldest first
    for lo, hi, pieces in rounds:
        region = tensor[lo:hi]
        if intra is not None:
            _intra_reduce(intra, lay, region, op, kw)
        posted.append((region, _post_exchanges(t, lay, region, pieces, kw["tag"])))
        if len(posted) > EXCHANGES_AHEAD:
            _finish_exchanges(intra, lay, *posted.popleft(), op, kw)
    while posted:
        _finish_exchanges(intra, lay, *posted.popleft(), op, kw)


def _post_exchanges(t: Transport, lay: _Layout, region: torch.Tensor, pieces, tag: int) -> list:
    out = []
    for lo, hi, owners in pieces:
        inter = lay.comm_of(owners, t.rank)
        if inter is None:
            continue
        piece = region[lo:hi]
        incoming = torch.empty_like(piece)
        peer = 1 - inter.rank
        out.append((piece, incoming, inter.irecv(incoming, peer, tag), inter.isend(piece, peer, tag)))
    return out


def _finish_exchanges(intra: Optional[Transport], lay: _Layout, region: torch.Tensor, exchanges: list, op: str,
                      kw: dict) -> None:
    for piece, incoming, recv, send in exchanges:
        # The receive first (see Transport.exchange); both are done before the piece changes.
        recv.wait(remaining(kw["deadline"]))
        send.wait(remaining(kw["deadline"]))
        KERNELS[op](piece, incoming)
    if intra is not None:
        _intra_gather(intra, lay, region, kw)


def _finish_round(intra: Optional[Transport], lay: _Layout, inter_done, region: torch.Tensor, kw: dict) -> None:
    inter_done.result(timeout=remaining(kw["deadline"]))
    if intra is not None:
        _intra_gather(intra, lay, region, kw)


def _intra_reduce(intra: Transport, lay: _Layout, region: torch.Tensor, op: str, kw: dict) -> None:
    """Local index ``i`` ends with the host's partial of chunk ``i`` of ``region``; the last, with the tail's."""
    m, i = len(lay.mine), lay.index
    s = region.numel() // m
    if s:
        _intra("reduce_scatter", reduce_scatter_ring)(intra, region[i * s:(i + 1) * s], region[:m * s], op, **kw)
    if m * s < region.numel():
        _intra("reduce", reduce_ring)(intra, region[m * s:], op, m - 1, **kw)


def _inter_pieces(t: Transport, lay: _Layout, region: torch.Tensor, pieces, op: str, kw: dict) -> None:
    for lo, hi, owners in pieces:
        inter = lay.comm_of(owners, t.rank)
        if inter is not None:
            piece = region[lo:hi]
            _inter_all_reduce(piece.numel() * piece.element_size(), inter.size)(inter, piece, op, **kw)


def _intra_gather(intra: Transport, lay: _Layout, region: torch.Tensor, kw: dict) -> None:
    m, i = len(lay.mine), lay.index
    s = region.numel() // m
    if s:
        _intra("all_gather", all_gather_ring)(intra, region[:m * s], region[i * s:(i + 1) * s], **kw)
    if m * s < region.numel():
        _intra("broadcast", broadcast_tree)(intra, region[m * s:], m - 1, **kw)


# -- reduce_scatter and all_gather ------------------------------------------------------------------------

def _responsible(lay: _Layout, h: int, c: int) -> int:
    """The rank of host ``h`` responsible for chunk ``c`` (``c`` itself on its own host)."""
    ranks = lay.hosts[h]
    if lay.host_of[c] == h:
        return c
    return ranks[lay.local_index[c] % len(ranks)]


class _Slots:
    """The chunks each rank of this host is responsible for, and their slots in the scratch buffer.

    ``chunks[j]``: chunk numbers of local index ``j``, ascending; ``k``: slots per local index (the
    host's maximum, shorter lists are padded); ``teams``: ``[(members, chunks)]`` in order of first
    chunk, ``members`` the responsible rank of every host (one inter communicator each).
    """

    def __init__(self, lay: _Layout, n: int):
        h = lay.host_of[lay.mine[0]]
        self.chunks = [[c for c in range(n) if _responsible(lay, h, c) == r] for r in lay.mine]
        self.k = max(len(cs) for cs in self.chunks)
        teams: dict[tuple[int, ...], list[int]] = {}
        for c in range(n):
            teams.setdefault(tuple(_responsible(lay, g, c) for g in range(len(lay.hosts))), []).append(c)
        self.teams = list(teams.items())
        self.slot = {c: (j, k) for j, cs in enumerate(self.chunks) for k, c in enumerate(cs)}

    def view(self, scratch: torch.Tensor, c: int, m: int) -> torch.Tensor:
        j, k = self.slot[c]
        at = (j * self.k + k) * m
        return scratch[at:at + m]


def _one_collective(members: tuple[int, ...], chunks: list[int]) -> bool:
    """True when a team's chunks are exactly its members' own: one reduce-scatter / all_gather serves."""
    return sorted(members) == chunks


def reduce_scatter_hierarchical(t: Transport, output: torch.Tensor, input: torch.Tensor, op: str, *, tag: int,
                                deadline: Optional[float], segment_bytes: int) -> None:
    """Reduce the flat ``input`` (``n * m`` elements) across ranks; rank ``r`` gets chunk ``r`` in ``output`` (``m``).

    ``output`` may be ``input``'s own chunk ``r`` (in place).  Chunks travel to one responsible rank
    per host inside the host, then between hosts once.
    """
    n, m = t.size, output.numel()
    kw = dict(tag=tag, deadline=deadline, segment_bytes=segment_bytes)
    if n == 1 or m == 0:
        reduce_scatter_ring(t, output, input, op, **kw)  # the copy (when not in place) and AVG's division
        return
    lay = _layout(t, tag, deadline)
    if lay.one_host():
        _intra("reduce_scatter", reduce_scatter_ring)(t, output, input, op, **kw)
        return
    if lay.one_rank_per_host():
        reduce_scatter_ring(t, output, input, op, **kw)
        return
    base = "sum" if op == "avg" else op
    slots = _Slots(lay, n)
    comms = _comms(t, lay, list(lay.hosts) + [members for members, _ in slots.teams])
    intra, inters = comms[lay.host_of[t.rank]], comms[len(lay.hosts):]
    width = slots.k * m
    if len(lay.mine) == 1:
        scratch = input  # this rank is responsible for every chunk, in chunk order: the input as it is
    else:
        scratch = torch.empty(len(lay.mine) * width, dtype=input.dtype, device=input.device)
        for j, cs in enumerate(slots.chunks):
            for k, c in enumerate(cs):
                scratch[(j * slots.k + k) * m:(j * slots.k + k + 1) * m].copy_(input[c * m:(c + 1) * m])
            scratch[(j * slots.k + len(cs)) * m:(j + 1) * width].zero_()  # padding: reduced, never read
        i = lay.index
        _intra("reduce_scatter", reduce_scatter_ring)(intra, scratch[i * width:(i + 1) * width], scratch, base, **kw)
    for (members, chunks), inter in zip(slots.teams, inters):
        if inter is None:
            continue
        if _one_collective(members, chunks):
            mine = torch.cat([slots.view(scratch, c, m) for c in chunks])
            reduce_scatter_ring(inter, output, mine, base, **kw)
            continue
        for c in chunks:
            piece = slots.view(scratch, c, m)
            if c == t.rank:
                piece = piece.clone()  # the root reduces in place, and the scratch may be the caller's input
            reduce_ring(inter, piece, base, _rank_in(members, c), **kw)
            if c == t.rank:
                output.copy_(piece)
    if op == "avg":
        finalize_(output, op, n)


def all_gather_hierarchical(t: Transport, output: torch.Tensor, input: torch.Tensor, *, tag: int,
                            deadline: Optional[float], segment_bytes: int) -> None:
    """Gather every rank's flat ``input`` (``m`` elements) into every rank's ``output`` (``n * m``), in rank order.

    ``input`` may be ``output``'s own chunk (in place).  Chunks cross between hosts once (to one
    responsible rank per host), then spread inside each host.
    """
    n, m = t.size, input.numel()
    kw = dict(tag=tag, deadline=deadline, segment_bytes=segment_bytes)
    if n == 1 or m == 0:
        all_gather_ring(t, output, input, **kw)
        return
    lay = _layout(t, tag, deadline)
    if lay.one_host():
        _intra("all_gather", all_gather_ring)(t, output, input, **kw)
        return
    if lay.one_rank_per_host():
        all_gather_ring(t, output, input, **kw)
        return
    slots = _Slots(lay, n)
    comms = _comms(t, lay, list(lay.hosts) + [members for members, _ in slots.teams])
    intra, inters = comms[lay.host_of[t.rank]], comms[len(lay.hosts):]
    width = slots.k * m
    alone = len(lay.mine) == 1
    # A rank alone on its host is responsible for every chunk, in order: its scratch is the output itself.
    scratch = output if alone else torch.empty(len(lay.mine) * width, dtype=input.dtype, device=input.device)
    if not alone:  # padding travels in the intra all_gather: defined bytes (a bool must hold 0 or 1)
        scratch[(lay.index * slots.k + len(slots.chunks[lay.index])) * m:(lay.index + 1) * width].zero_()
    own = input  # read only by the inter phase, before anything is written to output (other than its chunks)
    for (members, chunks), inter in zip(slots.teams, inters):
        if inter is None:
            continue
        if _one_collective(members, chunks):
            gathered = torch.empty(len(chunks) * m, dtype=input.dtype, device=input.device)
            all_gather_ring(inter, gathered, own, **kw)
            for q, c in enumerate(chunks):
                slots.view(scratch, c, m).copy_(gathered[q * m:(q + 1) * m])
            continue
        for c in chunks:
            piece = slots.view(scratch, c, m)
            if c == t.rank:
                piece.copy_(own)
            broadcast_ring(inter, piece, _rank_in(members, c), **kw)
    if alone:
        return
    i = lay.index
    _intra("all_gather", all_gather_ring)(intra, scratch, scratch[i * width:(i + 1) * width], **kw)
    for j, cs in enumerate(slots.chunks):
        for k, c in enumerate(cs):
            output[c * m:(c + 1) * m].copy_(scratch[(j * slots.k + k) * m:(j * slots.k + k + 1) * m])


# -- broadcast ----------------------------------------------------------------------------------------------

def broadcast_hierarchical(t: Transport, tensor: torch.Tensor, root: int, *, tag: int, deadline: Optional[float],
                           segment_bytes: int) -> None:
    """Copy ``root``'s flat ``tensor`` into every rank's: across hosts to one rank each, then within hosts."""
    n, numel = t.size, tensor.numel()
    if n == 1 or numel == 0:
        return
    nbytes = numel * tensor.element_size()
    kw = dict(tag=tag, deadline=deadline, segment_bytes=segment_bytes)
    chain = broadcast_ring if nbytes > INTER_TREE_BYTES else broadcast_tree
    lay = _layout(t, tag, deadline)
    if lay.one_host():
        _intra("broadcast", chain)(t, tensor, root, **kw)
        return
    if lay.one_rank_per_host():
        chain(t, tensor, root, **kw)
        return
    leaders = [root if lay.host_of[root] == h else ranks[0] for h, ranks in enumerate(lay.hosts)]
    *intras, inter = _comms(t, lay, list(lay.hosts) + [leaders])
    if inter is not None:
        chain(inter, tensor, _rank_in(leaders, root), **kw)
    intra = intras[lay.host_of[t.rank]]
    if intra is not None:
        leader = leaders[lay.host_of[t.rank]]
        _intra("broadcast", chain)(intra, tensor, lay.local_index[leader], **kw)


__all__ = ["all_gather_hierarchical", "all_reduce_hierarchical", "broadcast_hierarchical", "release",
           "reduce_scatter_hierarchical"]
