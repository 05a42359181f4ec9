"""ZeRO++ on every backend: quantized weight gathers (qwZ), a secondary partition inside each host (hpZ) and
quantized hierarchical gradient reduction (qgZ).

Three small parts, each plugged into stage 3 (or 2) at one point:

* ``UnitGathers`` is how ``ShardedParameters`` (sharded.py) gathers a unit.  Plain: one all_gather of the
  compute dtype.  qwZ: each rank sends int8 codes of its chunk in blocks of ``quantization_block`` elements
  plus one float32 scale per block, one uint8 buffer per rank; each rank decodes the others' chunks into the
  unit and copies its own chunk exactly.  hpZ: the end of forward's gather also keeps a *secondary shard*
  (this rank's 1/P of the gathered unit, P = ``zero_hpz_partition_size``), and backward gathers the unit
  from the secondary shards of the P ranks of its partition, which share a host: no byte of backward's
  gathers crosses a host's link.  With qwZ the secondary shard is the codes forward received for its 1/P of
  the chunks (a quarter of the float32 bytes to keep and to move), decoded as forward decoded them, and the
  rank's own chunk is again copied exactly: backward computes with bit for bit the weights forward used.
  Gathers outside the step (``gathered_parameters``, the persistent unit after the step) stay exact and plain.
* ``QuantizedReduceScatter`` replaces ``reduce_scatter_tensor`` of a gradient bucket (gradients.py) with two
  all_to_alls of int4 (or int8) codes, hierarchically (see the note below).
* ``HostLayout`` says which ranks share a host (``zerocomm.comm.get_host_names``) and builds the groups the
  two parts talk over.

[Note: qgZ's hierarchy]
H hosts of L ranks each, N = H·L; the bucket is N chunks and rank r owns chunk r (the ZeRO layout).  Name a
rank (h, l): host h, local index l.  Step 1, inside each host: rank (h, l) cuts its bucket into L pieces, piece
l' = the H chunks owned by the ranks of local index l' ((0, l'), (1, l'), ...), quantizes each piece (chunk by chunk, each
chunk its own blocks, read in place from the bucket) and all_to_alls them in its host.  It then holds, decoded and summed, its host's share of the H chunks owned by
the ranks of local index l.  Step 2, across hosts, among the H ranks of local index l: it quantizes each of
those H chunks and all_to_alls them, so that chunk (h', l) goes to host h'; it decodes and sums the H
host-sums of its own chunk and divides by N.  Bytes over a host's link: each rank sends (H-1)/H of 1/L of the
bucket, at ``bits`` per element plus a scale per block: with L = 2 and int4, 1/16 of a flat fp32 ring
reduce-scatter's (which crosses a link with (N-1)/N of the bucket per rank).  A rank's own piece is never
quantized (it does not travel); the others' codes are decoded straight into its sum (``add=True``: one pass,
no temporary), which for a float32 bucket is the bucket's own rows (the bucket belongs to its reduction until
that completes, and nothing reads it afterwards).  Error feedback (``ops.quantize.BlockFeedback``) is not applied: it would keep
a full bucket of error per rank, the memory stage 3 saves; the tests bound the loss against plain ZeRO-3.

[Note: the order of the steps]
A rank blocks in a collective's launch until its peers reach the same call (the mismatch check), so within
each group every rank must launch the same all_to_alls in one order.  Step 1 of a bucket is launched by the
caller when the bucket's reduction is (a point of backward that is the same on every rank).  The rest (wait
for step 1, decode, quantize, launch step 2, wait for it, decode into ``out``) runs on the reducer's one
helper thread, bucket after bucket: step 2's launches come in bucket order on every rank, and the caller's
backward never waits for the other host, whose ranks reach the same bucket at their own pace.  No cycle can
form: a helper waits only for its peers' step 1 of the same bucket, which their callers launch before they
wait for any bucket that follows it.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional, Sequence

import torch

from .. import comm as dist
from ..ops.quantize import dequantize_blocks, quantize_blocks, quantized_nbytes, split_payload
from .errors import ZeroConfigError

WEIGHT_BITS = 8


class HostLayout:
    """Which ranks of a group share a host: ``hosts[h]`` the group ranks of host h (hosts ordered by their
    lowest rank), ``host_of[r]`` and ``local_of[r]`` the host and local index of group rank r."""

    def __init__(self, names: Sequence[str]):
        order: dict = {}
        for r, name in enumerate(names):
            order.setdefault(name, []).append(r)
        self.names = tuple(names)
        self.hosts = tuple(tuple(ranks) for ranks in order.values())
        self.host_of = {r: h for h, ranks in enumerate(self.hosts) for r in ranks}
        self.local_of = {r: ranks.index(r) for ranks in self.hosts for r in ranks}

    @classmethod
    def learn(cls, group) -> "HostLayout":
        """Every rank of ``group`` calls it (one all_gather of the host names)."""
        return cls(dist.get_host_names(group))

    def uniform(self, what: str, rank: int) -> int:
        """L, the ranks per host, when every host has as many; else ``ZeroConfigError`` naming the hosts."""
        sizes = {len(ranks) for ranks in self.hosts}
        if len(sizes) != 1:
            raise ZeroConfigError(f"rank {rank}: {what} needs as many ranks on every host, got hosts "
                                  f"{self.describe()}")
        return sizes.pop()

    def describe(self) -> str:
        return ", ".join(f"{self.names[ranks[0]]!r}: ranks {list(ranks)}" for ranks in self.hosts)


def _new_groups(group, rank_lists: Sequence[Sequence[int]], rank: int) -> dict:
    """``new_group`` over each list of ``group``'s ranks (every process calls it for every list, in order);
    the groups this rank belongs to, by their rank tuple."""
    mine = {}
    for ranks in rank_lists:
        handle = dist.new_group([dist.get_global_rank(group, r) if group is not None else r for r in ranks])
        if rank in ranks:
            mine[tuple(ranks)] = handle
    return mine


class _Then:
    """A ``Work`` whose ``wait`` also runs ``then`` once (decoding what a collective brought)."""

    def __init__(self, work, then: Callable[[], None]):
        self._work, self._then = work, then

    def is_completed(self) -> bool:
        return self._then is None or self._work.is_completed()

    def wait(self) -> bool:
        if self._then is not None:
            self._work.wait()
            then, self._then = self._then, None
            then()
        return True


# -- parameters: qwZ and hpZ ----------------------------------------------------------------------------

class UnitGathers:
    """How stage 3 gathers unit ``u`` into its full buffer, by phase (see the module docstring)."""

    def __init__(self, layouts: Sequence, *, rank: int, world_size: int, group, algorithm: Optional[str],
                 quantize: bool = False, block: int = 256, hpz_group=None, hpz_size: int = 1,
                 hpz_rank: int = 0, dtype: torch.dtype = torch.float32, device=None,
                 quantized_algorithm: Optional[str] = None):
        self.layouts, self.rank, self.world_size = list(layouts), rank, world_size
        self.group, self.algorithm = group, algorithm
        self.quantized_algorithm = quantized_algorithm or algorithm
        """The algorithm of qwZ's gathers over the whole group (see ``build_unit_gathers``)."""
        self.quantize, self.block = quantize, block
        self.hpz_group, self.hpz_size, self.hpz_rank = hpz_group, hpz_size, hpz_rank
        self.dtype, self.device = dtype, device
        self.secondary: dict = {}
        """Unit -> this rank's secondary shard (hpZ): 1 / ``hpz_size`` of the unit as forward gathered it (with
        qwZ: the codes of those chunks, as forward received them)."""
        self._fresh: set = set()  # units whose secondary shard holds this step's values
        self._codes: dict = {}  # unit -> the codes forward's quantized gather brought (hpZ keeps a slice)
        self.gathered_bytes = {"plain": 0, "quantized": 0, "secondary": 0}
        """Bytes this rank received per kind of gather since construction (what each kind costs)."""

    def start(self, u: int, target: torch.Tensor, source: torch.Tensor, phase: str):
        """Launch unit ``u``'s gather into ``target``; returns a ``Work`` whose ``wait`` leaves it complete."""
        if self.quantize and phase in ("forward", "backward") and self.world_size > 1:
            return self._start_quantized(u, target, source, phase)
        if phase == "backward" and u in self._fresh:
            self.gathered_bytes["secondary"] += target.numel() * target.element_size()
            return dist.all_gather_into_tensor(target, self.secondary[u], group=self.hpz_group, async_op=True,
                                               algorithm=self.algorithm)
        self.gathered_bytes["plain"] += target.numel() * target.element_size()
        return dist.all_gather_into_tensor(target, source, group=self.group, async_op=True, algorithm=self.algorithm)

    def _start_quantized(self, u: int, target: torch.Tensor, source: torch.Tensor, phase: str):
        chunk, block, n = self.layouts[u].chunk_numel, self.block, self.world_size
        record = quantized_nbytes(chunk, WEIGHT_BITS, block)
        everyone = torch.empty(n * record, dtype=torch.uint8, device=source.device)
        if phase == "backward" and u in self._fresh:  # hpZ: the partition's codes, inside the host
            work = dist.all_gather_into_tensor(everyone, self.secondary[u], group=self.hpz_group, async_op=True,
                                               algorithm=self.algorithm)
            self.gathered_bytes["secondary"] += everyone.numel()
        else:
            mine = everyone[self.rank * record:(self.rank + 1) * record]
            quantize_blocks(source.reshape(-1), bits=WEIGHT_BITS, block=block, out=mine)
            work = dist.all_gather_into_tensor(everyone, mine, group=self.group, async_op=True,
                                               algorithm=self.quantized_algorithm)
            self.gathered_bytes["quantized"] += everyone.numel()
            if phase == "forward" and self.hpz_group is not None:
                self._codes[u] = everyone  # finished() keeps the partition's slice

        def decode():
            for r in range(n):
                out = target[r * chunk:(r + 1) * chunk]
                if r == self.rank:
                    out.copy_(source.reshape(-1))  # this rank's chunk never travelled: exact
                    continue
                codes, scales = split_payload(everyone[r * record:(r + 1) * record], chunk, bits=WEIGHT_BITS,
                                              block=block)
                dequantize_blocks(codes, scales, bits=WEIGHT_BITS, block=block, numel=chunk, out=out)

        return _Then(work, decode)

    def finished(self, u: int, full: torch.Tensor, phase: str, persistent: bool) -> None:
        """Unit ``u``'s gather completed into ``full``: forward's leaves the secondary shard (hpZ)."""
        codes = self._codes.pop(u, None)
        if self.hpz_group is None or phase != "forward" or persistent:
            return
        if codes is not None:
            full = codes  # the records of every rank's chunk, in rank order: the partition's slice of them
        size = full.numel() // self.hpz_size
        piece = full[self.hpz_rank * size:(self.hpz_rank + 1) * size]
        kept = self.secondary.get(u)
        if kept is None:
            self.secondary[u] = kept = torch.empty(size, dtype=full.dtype, device=full.device)
        with torch.no_grad():
            kept.copy_(piece)
        self._fresh.add(u)

    def invalidate(self) -> None:
        """The step changed the parameters: secondary shards are stale until the next forward's gather."""
        self._fresh.clear()
        self._codes.clear()

    def secondary_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.secondary.values())


def build_unit_gathers(config, layouts, *, rank: int, world_size: int, group, dtype, device) -> UnitGathers:
    """The gathers ``config`` asks for (plain unless ``zero_quantized_weights`` or ``zero_hpz_partition_size``);
    with either, every rank of ``group`` must call it together (host names are exchanged, groups created)."""
    kwargs = dict(rank=rank, world_size=world_size, group=group, algorithm=config.algorithm,
                  quantize=config.zero_quantized_weights, block=config.quantization_block, dtype=dtype, device=device)
    size = config.zero_hpz_partition_size
    if world_size == 1 or (size <= 1 and not config.zero_quantized_weights):
        return UnitGathers(layouts, **kwargs)
    hosts = HostLayout.learn(group)
    if (config.zero_quantized_weights and config.algorithm in (None, "auto") and len(hosts.hosts) > 1
            and any(len(ranks) > 1 for ranks in hosts.hosts) and torch.device(device or "cpu").type == "cpu"):
        # [Note: qwZ's gather across hosts]  The codes are small, so a gather's time is its sequential steps
        # more than its bytes: the ring's n - 1 steps each wait for a rank of the other host, and its link
        # carries (n - 1) / n of the unit.  The hierarchical gather has two steps (between hosts, then inside
        # each) and every chunk crosses a link once: measured on the simulated 2 x 2 cluster, a quarter fewer
        # link bytes per step and no slower on 2 shared cores.
        kwargs["quantized_algorithm"] = "hierarchical"
    if size <= 1:
        return UnitGathers(layouts, **kwargs)
    uneven = [list(ranks) for ranks in hosts.hosts if len(ranks) % size]
    if uneven:
        raise ZeroConfigError(f"rank {rank}: zero_hpz_partition_size ({size}) must divide the ranks of every host; "
                              f"hosts: {hosts.describe()}")
    partitions = [ranks[i:i + size] for ranks in hosts.hosts for i in range(0, len(ranks), size)]
    mine = _new_groups(group, partitions, rank)
    (members, handle), = mine.items()
    return UnitGathers(layouts, hpz_group=handle, hpz_size=size, hpz_rank=members.index(rank), **kwargs)


# -- gradients: qgZ --------------------------------------------------------------------------------------

class _Pending:
    """The ``Work`` of one quantized reduce-scatter: its remaining steps run on the reducer's helper thread."""

    def __init__(self, future: Future):
        self._future = future

    def is_completed(self) -> bool:
        return self._future.done()

    def wait(self) -> bool:
        self._future.result()  # raises what a step raised (a CommError)
        return True


class QuantizedReduceScatter:
    """``reduce_scatter_tensor(out, bucket, op=AVG)`` as two quantized all_to_alls (see [Note: qgZ's
    hierarchy]); same signature, so the gradients part calls it in place of the collective."""

    def __init__(self, hosts: HostLayout, *, rank: int, world_size: int, intra_group, cross_group, bits: int,
                 block: int, algorithm: Optional[str] = None):
        self.hosts, self.rank, self.world_size = hosts, rank, world_size
        self.intra_group, self.cross_group = intra_group, cross_group
        self.bits, self.block, self.algorithm = bits, block, algorithm
        self.h, self.l = hosts.host_of[rank], hosts.local_of[rank]
        self.n_hosts, self.n_local = len(hosts.hosts), len(hosts.hosts[0])
        # slot of host h' in this rank's cross-host group (its members in rank order, one per host)
        members = sorted(ranks[self.l] for ranks in hosts.hosts)
        self._cross_slot = [members.index(ranks[self.l]) for ranks in hosts.hosts]
        self._helper: Optional[ThreadPoolExecutor] = None  # runs every bucket's steps after the first, in order
        self.sent_bytes = {"intra": 0, "cross": 0}
        """Bytes this rank sent to other ranks inside its host and across hosts, since construction."""

    def __call__(self, out: torch.Tensor, bucket: torch.Tensor, op=None, group=None, async_op: bool = True,
                 algorithm: Optional[str] = None):
        if op is not None and op != dist.ReduceOp.AVG:
            raise ZeroConfigError(f"rank {self.rank}: the quantized reduce-scatter averages; got op {op}")
        n, c = self.world_size, out.numel()
        if bucket.numel() != n * c:
            raise ZeroConfigError(f"rank {self.rank}: quantized reduce-scatter of {bucket.numel()} elements into "
                                  f"{c} x {n} ranks")
        chunks = bucket.view(n, c)
        bits, block, H, L = self.bits, self.block, self.n_hosts, self.n_local
        hosts, me_h, me_l = self.hosts.hosts, self.h, self.l
        crec = quantized_nbytes(c, bits, block)  # one chunk's codes and scales
        state: dict = {}

        def quantize_into(send: torch.Tensor, slot: int, row: torch.Tensor) -> None:
            quantize_blocks(row, bits=bits, block=block, out=send[slot * crec:(slot + 1) * crec])

        def add_decoded(recv: torch.Tensor, slot: int, into: torch.Tensor) -> None:
            codes, scales = split_payload(recv[slot * crec:(slot + 1) * crec], c, bits=bits, block=block)
            dequantize_blocks(codes, scales, bits=bits, block=block, numel=c, out=into, add=True)

        def intra_launch():
            # this rank's piece: the chunks owned by local index l on every host, summed where they lie
            rows = [chunks[ranks[me_l]] for ranks in hosts]
            state["rows"] = rows if bucket.dtype == torch.float32 else [row.to(torch.float32) for row in rows]
            if L == 1:
                return None
            send = torch.empty(L * H * crec, dtype=torch.uint8, device=bucket.device)
            for lp in range(L):
                if lp != me_l:
                    for hp in range(H):
                        quantize_into(send, lp * H + hp, chunks[hosts[hp][lp]])
            state["recv"] = torch.empty_like(send)
            self.sent_bytes["intra"] += (L - 1) * H * crec
            return dist.all_to_all_single(state["recv"], send, group=self.intra_group, async_op=True,
                                          algorithm=algorithm or self.algorithm)

        def cross_launch():
            rows = state["rows"]
            if L > 1:
                recv = state.pop("recv")
                for j in range(L):
                    if j != me_l:
                        for hp in range(H):
                            add_decoded(recv, j * H + hp, rows[hp])
            if H == 1:
                return None
            send = torch.empty(H * crec, dtype=torch.uint8, device=bucket.device)
            for hp in range(H):
                if hp != me_h:
                    quantize_into(send, self._cross_slot[hp], rows[hp])
            state["recv2"] = torch.empty_like(send)
            self.sent_bytes["cross"] += (H - 1) * crec
            return dist.all_to_all_single(state["recv2"], send, group=self.cross_group, async_op=True,
                                          algorithm=algorithm or self.algorithm)

        def finish():
            total = state.pop("rows")[me_h]
            if H > 1:
                recv = state.pop("recv2")
                for hp in range(H):
                    if hp != me_h:
                        add_decoded(recv, self._cross_slot[hp], total)
            if out.dtype == torch.float32:
                torch.div(total, n, out=out)
            else:
                out.copy_(total.div_(n))

        def rest(first) -> None:
            if first is not None:
                first.wait()
            second = cross_launch()
            if second is not None:
                second.wait()
            finish()

        first = intra_launch()
        if self._helper is None:
            self._helper = ThreadPoolExecutor(1, thread_name_prefix=f"zerocomm-qgz-rank{self.rank}")
        work = _Pending(self._helper.submit(rest, first))
        if not async_op:
            work.wait()
            return None
        return work

    def close(self) -> None:
        """Stop the helper thread (after the last reduction was waited for)."""
        if self._helper is not None:
            self._helper.shutdown(wait=True)
            self._helper = None


def build_quantized_reduce_scatter(config, *, rank: int, world_size: int, group) -> Optional[QuantizedReduceScatter]:
    """qgZ's reduce-scatter for ``group`` (None when ``zero_quantized_gradients`` is off or there is one rank);
    every rank of ``group`` calls it together (host names are exchanged, groups created)."""
    if not config.zero_quantized_gradients or world_size == 1:
        return None
    hosts = HostLayout.learn(group)
    per_host = hosts.uniform("zero_quantized_gradients", rank)
    intra = _new_groups(group, hosts.hosts, rank) if per_host > 1 else {}
    cross_lists = [[ranks[l] for ranks in hosts.hosts] for l in range(per_host)]
    cross = _new_groups(group, cross_lists, rank) if len(hosts.hosts) > 1 else {}
    return QuantizedReduceScatter(hosts, rank=rank, world_size=world_size,
                                  intra_group=next(iter(intra.values()), None),
                                  cross_group=next(iter(cross.values()), None),
                                  bits=config.quantized_gradient_bits, block=config.quantization_block,
                                  algorithm=config.algorithm)
