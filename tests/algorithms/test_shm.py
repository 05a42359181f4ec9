"""The "shm" algorithm and its arena, on the in-process fabric (ranks as threads of one process).

Threads of one process share a host, so the arena is real: a /dev/shm segment mapped once per
rank, step words waited on with futexes.  Covered here: every collective at world sizes 1-8
(non-powers of two, uneven chunks, empty tensors, multi-piece messages through tiny segments), the
small all_reduce's C round (``_shmfast``) and its Python fallback, each against numpy and bit for bit,
zero-copy inputs from heaps (every rank, and some ranks only), ranks on several hosts refused
with the alternatives named, a missing peer timing out, stale segments swept, selection rules.
The real multi-process suites (gloo, MPI) run "shm" in tests/comm/test_collectives.py and
test_data_movement.py; a rank killed with SIGKILL is in tests/comm/test_shm_faults.py.
"""
import os
import time

import pytest
import torch

from support import collective_checks as checks
from support.local_transport import run_ranks
from support.references import assert_matches, rank_values, reference, to_torch
from zerocomm.comm import UnsupportedError, shm, shm_heap, topology
from zerocomm.comm.check import digest
from zerocomm.comm.algorithms import ALGORITHMS
from zerocomm.comm.algorithms import shm as shm_schedules
from zerocomm.comm.backends.gloo import GlooBackend
from zerocomm.comm.select import rule

SIZES = range(1, 9)
SMALL_SEGMENT = 24  # bytes: many pieces (and pieces smaller than n slices) on small tensors
CELLS = [(torch.float32, "sum"), (torch.float64, "avg"), (torch.int32, "bxor"), (torch.int64, "min"),
         (torch.bfloat16, "max"), (torch.uint8, "product"), (torch.bool, "bor")]


def fn(collective):
    return ALGORITHMS[(collective, "shm")]


@pytest.mark.parametrize("n", SIZES)
def test_reductions_every_world_size(n):
    for dtype, op in CELLS:
        for numel, segment in ((0, SMALL_SEGMENT), (1, SMALL_SEGMENT), (37, SMALL_SEGMENT), (9000, 4 << 20),
                               (20000, 4096)):
            checks.check_all_reduce(fn("all_reduce"), n, numel, dtype, op, segment)
            checks.check_reduce(fn("reduce"), n, numel, dtype, op, (n + 1) // 2 % n, segment)
        for chunk in (0, 1, 7):
            checks.check_reduce_scatter(fn("reduce_scatter"), n, chunk, dtype, op, SMALL_SEGMENT)


NO_SHMFAST = ("the C extension zerocomm.comm._shmfast is not built here (no C compiler when the package was "
              "installed): only the Python path of the small all_reduce runs")


@pytest.mark.parametrize("path", ["c", "python"])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_small_all_reduce_every_fast_cell_both_ways(n, path, monkeypatch):
    """The small all_reduce of every (dtype, op) the C round reduces, with ``_shmfast`` and with it forced
    off: each against numpy, and (below) the two paths' bits against each other on random floats."""
    if path == "c" and shm._shmfast is None:
        pytest.skip(NO_SHMFAST)
    if path == "python":
        monkeypatch.setattr(shm, "_shmfast", None)
    for dtype in shm_schedules.FAST_KINDS:
        ops = ["sum", "avg", "product", "min", "max"] if dtype.is_floating_point else \
            ["sum", "product", "min", "max", "band", "bor", "bxor"]
        for op in ops:
            for numel in (0, 1, 37):
                checks.check_all_reduce(fn("all_reduce"), n, numel, dtype, op, SMALL_SEGMENT)


@pytest.mark.parametrize("op", ["sum", "avg", "product", "min", "max"])
def test_small_all_reduce_c_and_python_give_the_same_bits(op, monkeypatch):
    if shm._shmfast is None:
        pytest.skip(NO_SHMFAST)
    n = 3
    generator = torch.Generator().manual_seed(5)
    inputs = [torch.randn(300, dtype=torch.float64, generator=generator) for _ in range(n)]
    inputs[1][::7] = float("nan")  # NaN wins min and max on either side, as numpy's does
    inputs[2][::5] = -0.0

    def run(dtype):
        def body(t):
            x = inputs[t.rank].to(dtype)
            fn("all_reduce")(t, x, op, tag=7, deadline=checks.deadline(), segment_bytes=SMALL_SEGMENT)
            return x
        return run_ranks(n, body, timeout_s=30)

    for dtype in (torch.float32, torch.float64):
        with_c = run(dtype)
        monkeypatch.setattr(shm, "_shmfast", None)
        without = run(dtype)
        monkeypatch.undo()
        for rank in range(n):
            assert torch.equal(with_c[rank].view(torch.uint8), without[rank].view(torch.uint8)), (dtype, op, rank)


@pytest.mark.parametrize("n", SIZES)
def test_data_movement_every_world_size(n):
    for dtype in (torch.float32, torch.bfloat16, torch.bool):
        for numel in (0, 1, 13):
            for root in {0, n - 1}:
                checks.check_broadcast(fn("broadcast"), n, numel, dtype, root, SMALL_SEGMENT)
                checks.check_gather(fn("gather"), n, numel, dtype, root, SMALL_SEGMENT)
                checks.check_scatter(fn("scatter"), n, numel, dtype, root, SMALL_SEGMENT)
            checks.check_all_gather(fn("all_gather"), n, numel, dtype, SMALL_SEGMENT)
            checks.check_all_gather(fn("all_gather"), n, numel, dtype, SMALL_SEGMENT, in_place=True)
        uneven = [[(i * 3 + j) % 4 + (i == j) for j in range(n)] for i in range(n)]
        checks.check_all_to_all(fn("all_to_all"), uneven, dtype, SMALL_SEGMENT)
        nothing = [[0] * n for _ in range(n)]
        checks.check_all_to_all(fn("all_to_all"), nothing, dtype, SMALL_SEGMENT)
    checks.check_barrier(fn("barrier"), n)


@pytest.mark.parametrize("lone", ["default", "whole buffer"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_large_movement_in_many_rounds(n, lone, monkeypatch):
    """Messages larger than a round's buffer, in many rounds whose last piece is short: broadcast and scatter (a lone
    writer's pieces, also as large as the whole buffer, so that a part spans slots), all_to_all (a peer's part of a
    slot); every root, scatter from a flat tensor and from the list form's chunks, segments of 0 (no limit), the
    default and an odd size; bit for bit against the inputs."""
    buffer = n * shm.SLOT_BYTES
    if lone == "whole buffer":
        monkeypatch.setattr(shm_schedules, "LONE_PIECE_BYTES", buffer)
    m = buffer // 4 + 1000 + n  # float32 elements a rank receives: more than a buffer's bytes, not a round multiple
    for segment in (0, 4 << 20, 1 << 20 | 24):
        for root in {0, n - 1}:
            def body(t):
                r, kw = t.rank, dict(tag=7, deadline=checks.deadline(), segment_bytes=segment)
                x = _random_bytes(root, 1, m, torch.float32) if r == root else torch.zeros(m)
                fn("broadcast")(t, x, root, **kw)
                whole = _random_bytes(root, 2, n * m, torch.float32) if r == root else None
                flat_part, list_part = torch.zeros(m), torch.zeros(m)
                fn("scatter")(t, flat_part, whole, root, **kw)
                fn("scatter")(t, list_part, tuple(whole.chunk(n)) if r == root else None, root, **kw)
                return x, flat_part, list_part

            whole = _random_bytes(root, 2, n * m, torch.float32)
            for r, (x, flat_part, list_part) in enumerate(run_ranks(n, body, timeout_s=60)):
                what = f"n={n} m={m} root={root} segment={segment}: rank {r}"
                _same_bits(x, _random_bytes(root, 1, m, torch.float32), f"broadcast {what}")
                _same_bits(flat_part, whole[r * m:(r + 1) * m], f"scatter {what}")
                _same_bits(list_part, whole[r * m:(r + 1) * m], f"scatter from chunks {what}")
        if lone != "default":  # all_to_all's pieces are a slot's parts: LONE_PIECE_BYTES is not theirs
            continue
        block = shm.SLOT_BYTES // 4 + 333  # elements: a block is more than a slot, in several pieces
        even = [[block] * n for _ in range(n)]
        uneven = [[(block * (1 + (i + j) % 3)) // 2 + i for j in range(n)] for i in range(n)]
        for counts in (even, uneven):
            checks.check_all_to_all(fn("all_to_all"), counts, torch.float32, segment)


def _random_bytes(rank: int, salt: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """``numel`` elements of ``dtype`` made of random bytes (NaN payloads, subnormals, -0.0: every bit pattern a copy
    must keep); bool gets 0/1 bytes, the only ones it holds."""
    generator = torch.Generator().manual_seed(1000 * rank + salt)
    raw = torch.randint(0, 2 if dtype == torch.bool else 256, (numel * dtype.itemsize,), dtype=torch.uint8,
                        generator=generator)
    return raw.view(dtype)


def _same_bits(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape, (what, got.shape, expected.shape)
    assert torch.equal(got.reshape(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8)), what


@pytest.mark.parametrize("path", ["c", "python"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_small_movement_rounds_every_dtype_both_ways_bit_for_bit(n, path, monkeypatch):
    """broadcast, scatter, gather, all_gather and all_to_all (even, uneven, empty blocks) of every dtype, each small call
    one round through the segment (``Arena.move_round``: ``_shmfast``'s MOVE op, or its Python twin with ``_shmfast``
    forced off); tiny segments make several rounds of the same.  Every result is compared, bit for bit, with the
    inputs' bytes put where numpy's concatenation and slicing put them (random bytes: NaN payloads must survive)."""
    if path == "c" and shm._shmfast is None:
        pytest.skip(NO_SHMFAST)
    if path == "python":
        monkeypatch.setattr(shm, "_shmfast", None)
    from support.reference import DTYPES
    uneven = [[(i * 3 + j) % 4 + (i == j) for j in range(n)] for i in range(n)]
    layouts = {"even": [[2] * n for _ in range(n)], "uneven": uneven, "empty": [[0] * n for _ in range(n)]}
    cases = [(dtype, m, segment) for dtype in DTYPES for m, segment in ((0, 0), (1, 0), (5, 0), (5, 16))]
    root = n - 1

    def body(t):
        r, out = t.rank, []
        for dtype, m, segment in cases:
            kw = dict(tag=7, deadline=checks.deadline(), segment_bytes=segment)
            mine = _random_bytes(r, m, m, dtype)
            x = mine.clone() if r == root else torch.zeros(m, dtype=dtype)
            fn("broadcast")(t, x, root, **kw)
            whole = _random_bytes(root, 50 + m, n * m, dtype) if r == root else None
            part = torch.zeros(m, dtype=dtype)
            fn("scatter")(t, part, whole, root, **kw)
            gathered = torch.zeros(n * m, dtype=dtype) if r == root else None
            fn("gather")(t, gathered, mine, root, **kw)
            every = torch.zeros(n * m, dtype=dtype)
            fn("all_gather")(t, every, mine, **kw)
            in_place = torch.zeros(n * m, dtype=dtype)
            in_place[r * m:(r + 1) * m] = mine
            fn("all_gather")(t, in_place, in_place[r * m:(r + 1) * m], **kw)
            exchanged = {}
            for name, counts in layouts.items():
                sent = _random_bytes(r, 90 + m, sum(counts[r]), dtype)
                got = torch.zeros(sum(counts[j][r] for j in range(n)), dtype=dtype)
                fn("all_to_all")(t, got, sent, [counts[j][r] for j in range(n)], list(counts[r]), **kw)
                exchanged[name] = got
            out.append((x, part, gathered, every, in_place, exchanged))
        return out

    results = run_ranks(n, body, timeout_s=60)
    for index, (dtype, m, segment) in enumerate(cases):
        inputs = [_random_bytes(p, m, m, dtype) for p in range(n)]
        whole = _random_bytes(root, 50 + m, n * m, dtype)
        for r in range(n):
            what = f"n={n} {path} {dtype} m={m} segment={segment}: rank {r}"
            x, part, gathered, every, in_place, exchanged = results[r][index]
            _same_bits(x, inputs[root], f"broadcast {what}")
            _same_bits(part, whole[r * m:(r + 1) * m], f"scatter {what}")
            if r == root:
                _same_bits(gathered, torch.cat(inputs), f"gather {what}")
            _same_bits(every, torch.cat(inputs), f"all_gather {what}")
            _same_bits(in_place, torch.cat(inputs), f"all_gather in place {what}")
            for name, counts in layouts.items():
                sent = [_random_bytes(p, 90 + m, sum(counts[p]), dtype) for p in range(n)]
                blocks = [sent[p][sum(counts[p][:r]):sum(counts[p][:r + 1])] for p in range(n)]
                _same_bits(exchanged[name], torch.cat(blocks), f"all_to_all ({name}) {what}")


@pytest.mark.parametrize("path", ["c", "python"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_small_reduce_and_barrier_both_ways(n, path, monkeypatch):
    """The small reduce (the non-root ranks' side is a MOVE round, the root's the reduction) of every dtype and an
    admitted op, against numpy; and the barrier, with ``_shmfast`` and with it forced off."""
    if path == "c" and shm._shmfast is None:
        pytest.skip(NO_SHMFAST)
    if path == "python":
        monkeypatch.setattr(shm, "_shmfast", None)
    from support.reference import DTYPES, admitted_ops
    for dtype in DTYPES:
        for op in admitted_ops(dtype)[:2]:
            for numel in (0, 1, 7):
                checks.check_reduce(fn("reduce"), n, numel, dtype, op, n // 2, 0)
    checks.check_barrier(fn("barrier"), n)


def test_move_rounds_refuse_copies_outside_a_slot():
    """A MOVE round whose copy would leave the round's slots raises ``ValueError`` before any byte moves: in Python
    (``Arena.move_round``) and in C (``_shmfast``'s own check, for callers of ``combine``)."""
    def body(t):
        a = shm.arena(t, tag=1, deadline=checks.deadline())
        step, round_ = a.rounds.step, a.rounds.round
        x = torch.zeros(4, dtype=torch.uint8)
        refusals = []
        end = a.buffer_bytes
        for ins, outs in ((((x.data_ptr(), end - 2, 4),), ()), ((), ((x.data_ptr(), end, 1),)),
                          ((), ((x.data_ptr(), -1, 4),))):
            with pytest.raises(ValueError, match="slots"):
                a.move_round(ins, outs, checks.deadline(), "test")
            refusals.append((a.rounds.step, a.rounds.round) == (step, round_))  # nothing arrived, no round used
        if shm._shmfast is not None:
            from array import array
            words = array("q", (0, 1, x.data_ptr(), end - 2, 4))
            with pytest.raises(ValueError, match="slots"):
                shm._shmfast.combine(a._base, shm.LINE, a.n, a.rank, a._buffers, a.slot_bytes, 0,
                                     words.buffer_info()[0], 0, 4, 9, -1, 0)
        return refusals

    for refusals in run_ranks(2, body, timeout_s=30):
        assert refusals == [True] * 3


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("who", ["every rank", "rank 0 only"])
def test_zero_copy_inputs(n, who):
    """Inputs in a heap are read in place by peers and reduced in place; a later call reuses them."""
    numel, dtype, op = 50_001, torch.float32, "sum"
    inputs = [rank_values(r, numel, dtype, op) for r in range(n)]
    expected = reference(inputs, op)

    def body(t):
        deadline = time.monotonic() + 20
        region = shm_heap.allocate_heap(t, numel * 4, tag=3, deadline=deadline)
        x = region.view(dtype) if who == "every rank" or t.rank == 0 else torch.empty(numel, dtype=dtype)
        results = []
        for _ in range(2):
            x.copy_(to_torch(inputs[t.rank], dtype))
            fn("all_reduce")(t, x, op, tag=5, deadline=deadline, segment_bytes=40_000)
            results.append(x.clone())
        return results, shm_schedules.heap_slot(t, x)[0]

    for r, (results, heap) in enumerate(run_ranks(n, body, timeout_s=60)):
        assert heap == (0 if who == "every rank" or r == 0 else -1)
        for out in results:
            assert_matches(out, expected, f"zero-copy all_reduce n={n} ({who}): rank {r}")


def _cross_memory_works() -> bool:
    """Whether this process may read and write its own memory with process_vm_readv/writev (threads-as-ranks
    share it)."""
    probe, into = torch.tensor([12345], dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    readable = shm.read_peer(os.getpid(), probe.data_ptr(), into) == 8 and int(into) == 12345
    return readable and shm.write_peer(os.getpid(), probe.data_ptr(), into) == 8


@pytest.mark.parametrize("allowed", [True, False], ids=["cross-memory", "slots-only"])
def test_arena_agrees_on_reading_peers_memory(monkeypatch, allowed):
    monkeypatch.setattr(shm, "CROSS_MEMORY", allowed)

    def body(t):
        fn("barrier")(t, tag=1, deadline=time.monotonic() + 10, segment_bytes=64)
        return t.local.arena.cross_memory

    assert run_ranks(3, body, timeout_s=30) == [allowed and _cross_memory_works()] * 3


@pytest.mark.parametrize("allowed", [True, False], ids=["direct", "slots"])
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_large_all_reduce_both_schedules(monkeypatch, n, allowed):
    """The direct schedule (peers' tensors read and written in place, in blocks far smaller than a slice
    here) and the slot schedule (several pieces), on uneven sizes."""
    monkeypatch.setattr(shm, "CROSS_MEMORY", allowed)
    monkeypatch.setattr(shm_schedules, "BLOCK_BYTES", 1000)
    for dtype, op in CELLS:
        for numel, segment in ((5003, 4096), (20_011, 1 << 20)):
            checks.check_all_reduce(fn("all_reduce"), n, numel, dtype, op, segment)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_reduce_scatter_and_gathers_read_peers_inputs_where_they_lie(monkeypatch, n):
    """The direct schedules of reduce_scatter, all_gather and gather (every size counts as large here,
    in blocks far smaller than a chunk): every (dtype, op) cell, uneven chunk sizes, in place and not."""
    monkeypatch.setattr(shm_schedules, "DIRECT_BYTES", 1)
    monkeypatch.setattr(shm_schedules, "READ_IN_PLACE_RANKS", 64)  # at every world size, not only up to the cores
    monkeypatch.setattr(shm_schedules, "BLOCK_BYTES", 1000)
    if not _cross_memory_works():
        pytest.skip("this kernel refuses process_vm_readv between the test's ranks: only the slot schedules run")
    for dtype, op in CELLS:
        for chunk in (1, 7, 1001):
            checks.check_reduce_scatter(fn("reduce_scatter"), n, chunk, dtype, op, SMALL_SEGMENT)
            checks.check_reduce_scatter(fn("reduce_scatter"), n, chunk, dtype, op, SMALL_SEGMENT, in_place=True)
    for dtype in (torch.float32, torch.bool):
        for numel in (1, 1001):
            checks.check_all_gather(fn("all_gather"), n, numel, dtype, SMALL_SEGMENT)
            checks.check_all_gather(fn("all_gather"), n, numel, dtype, SMALL_SEGMENT, in_place=True)
            checks.check_gather(fn("gather"), n, numel, dtype, n - 1, SMALL_SEGMENT)


@pytest.mark.parametrize("n", [2, 3])
def test_gathers_read_in_place_by_default_only_where_ranks_have_cores(monkeypatch, n):
    """``READ_IN_PLACE_RANKS = None`` (the default): a large all_gather reads peers' inputs in place only where the
    ranks do not outnumber the host's cores, else it goes through the slots; the result is the same either way."""
    if not _cross_memory_works():
        pytest.skip("this kernel refuses process_vm_readv between the test's ranks: only the slot schedules run")
    monkeypatch.setattr(shm_schedules, "READ_IN_PLACE_RANKS", None)
    monkeypatch.setattr(shm_schedules.os, "cpu_count", lambda: 2)
    real, reads = shm_schedules._peer_read, []

    def counted(*args):  # the ranks are threads of this process: one count for all
        reads.append(args[2])
        return real(*args)

    monkeypatch.setattr(shm_schedules, "_peer_read", counted)
    checks.check_all_gather(fn("all_gather"), n, shm_schedules.DIRECT_BYTES // 2, torch.float32, 0)
    assert bool(reads) == (n <= 2), (n, len(reads))


def test_small_all_reduce_views_follow_the_memory():
    """The small path's cached numpy views are keyed by address, size and dtype: the same memory read as
    another dtype, a tensor resized in place (its storage stays resizable), and a fresh tensor each call
    all reduce correctly."""
    def body(t):
        deadline = time.monotonic() + 20
        out = []
        x = torch.full((6,), float(t.rank + 1))
        for _ in range(2):
            fn("all_reduce")(t, x, "sum", tag=1, deadline=deadline, segment_bytes=1 << 20)
            out.append(x.tolist())
        y = x.view(torch.int32)  # same address and bytes, another dtype
        y.fill_(t.rank + 1)
        fn("all_reduce")(t, y, "bxor", tag=2, deadline=deadline, segment_bytes=1 << 20)
        out.append(y.tolist())
        x.resize_(1000)  # new storage (and address) under the same tensor
        x.fill_(2.0)
        fn("all_reduce")(t, x, "max", tag=3, deadline=deadline, segment_bytes=1 << 20)
        out.append(sorted(set(x.tolist())))
        for step in range(20):  # more distinct tensors than the cache keeps
            z = torch.full((3,), float(step + t.rank))
            fn("all_reduce")(t, z, "sum", tag=4, deadline=deadline, segment_bytes=1 << 20)
            out.append(z.tolist())
        return out

    for results in run_ranks(3, body, timeout_s=60):
        assert results[0] == [6.0] * 6 and results[1] == [18.0] * 6
        assert results[2] == [1 ^ 2 ^ 3] * 6 and results[3] == [2.0]
        assert results[4:] == [[3.0 * step + 3.0] * 3 for step in range(20)]


def test_check_rounds_in_c_count_compare_and_reduce():
    """``Arena.rounds`` (``_shmfast.Rounds``): each check round advances step, round and checks by one and reduces
    its payload as the small all_reduce does; a digest that differs on one rank raises ``CallMismatch`` on every
    rank at the same round, which starts the rounds again from 0 in step."""
    if shm._shmfast is None:
        pytest.skip(NO_SHMFAST)

    def body(t):
        deadline = time.monotonic() + 20
        arena = shm.arena(t, tag=1, deadline=deadline)
        start = (arena.rounds.step, arena.rounds.round, arena.rounds.checks)
        x = torch.full((5,), float(t.rank + 1))
        for k in range(4):
            arena.checked_round((1000 + k, 5, 3), digest(1000 + k, 5, 3), ("call", k), x.data_ptr(), 5, 0, 0,
                                deadline)  # float32 SUM
        counted = (arena.rounds.step - start[0], arena.rounds.round - start[1], arena.rounds.checks - start[2])
        try:
            cell_code = 1 if t.rank == 1 else 2
            arena.checked_round((7, 0, cell_code), digest(7, 0, cell_code), ("odd", t.rank), 0, 0, 0, 0, deadline)
            raised = None
        except shm.CallMismatch as mismatch:
            raised = mismatch.fingerprint
        return counted, x.tolist(), raised, arena.rounds.round

    for rank, (counted, values, raised, round_after) in enumerate(run_ranks(3, body, timeout_s=60)):
        assert counted == (4, 4, 4), counted
        assert values == [6.0 * 3 ** 3] * 5, values  # 1 + 2 + 3, then tripled by each later round
        assert raised == ("odd", rank) and round_after == 0, (raised, round_after)


def test_segment_bytes_zero_means_whole_slots():
    """``segment_bytes=0`` is "no segmenting" for every algorithm: shm moves a slot a round (a 1 KiB broadcast,
    reduce or gather is one round), not a byte a round."""
    def body(t):
        deadline = time.monotonic() + 20
        arena = shm.arena(t, tag=1, deadline=deadline)
        rounds, out = [], []
        for collective, args in (("broadcast", (0,)), ("reduce", ("sum", 0)), ("all_gather", ())):
            x = torch.full((256,), float(t.rank + 1))
            before = arena.rounds.round
            if collective == "all_gather":
                gathered = torch.empty(256 * t.size)
                fn(collective)(t, gathered, x, tag=2, deadline=deadline, segment_bytes=0)
                out.append(sorted(set(gathered.tolist())))
            else:
                fn(collective)(t, x, *args, tag=2, deadline=deadline, segment_bytes=0)
                out.append(sorted(set(x.tolist())))
            rounds.append(arena.rounds.round - before)
        return rounds, out

    for rank, (rounds, out) in enumerate(run_ranks(3, body, timeout_s=60)):
        assert all(k <= 1 for k in rounds), rounds  # the C gather round counts no round of the Python path
        assert out[0] == [1.0] and out[2] == [1.0, 2.0, 3.0], out
        assert out[1] == ([6.0] if rank == 0 else [float(rank + 1)]), out


def test_ranks_on_several_hosts_are_refused_naming_the_alternatives():
    def body(t):
        topology.hosts(t, tag=1, deadline=time.monotonic() + 10, name=f"node{t.rank % 2}")
        with pytest.raises(UnsupportedError) as error:
            fn("all_reduce")(t, torch.ones(4), "sum", tag=2, deadline=time.monotonic() + 10, segment_bytes=64)
        return str(error.value)

    for text in run_ranks(3, body, timeout_s=30):
        assert "hierarchical" in text and "ring" in text and "node0 (ranks [0, 2])" in text, text


def test_a_missing_peer_times_out():
    def body(t):
        fn("barrier")(t, tag=1, deadline=time.monotonic() + 10, segment_bytes=64)  # the arena exists
        if t.rank == 1:
            return None
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="from rank 1"):
            fn("all_reduce")(t, torch.ones(3), "sum", tag=2, deadline=start + 0.3, segment_bytes=64)
        return time.monotonic() - start

    waited = run_ranks(2, body, timeout_s=30)[0]
    assert 0.3 <= waited < 2.0


def test_stale_segments_are_swept(tmp_path):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # a pid that no longer exists
    dead = tmp_path / f"{shm.PREFIX}{pid}-abc"
    live = tmp_path / f"{shm.PREFIX}{os.getpid()}-abc"
    other = tmp_path / "someone-else"
    for path in (dead, live, other):
        path.write_bytes(b"x")
    assert shm.sweep_stale(str(tmp_path)) == [dead.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


def test_selection_offers_shm_only_on_one_host():
    table = rule.__wrapped__
    assert table(GlooBackend, 2, "all_reduce", torch.float32, "sum", "shm", True).refusal is None
    refused = table(GlooBackend, 2, "all_reduce", torch.float32, "sum", "shm", False).refusal
    assert "several hosts" in refused
    for one_host in (None, False):  # unknown or spread: "auto" never picks shm
        rows = table(GlooBackend, 2, "all_reduce", torch.float32, "sum", "auto", one_host).rows
        assert all(algorithm != "shm" for _, algorithm in rows)


@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_auto_picks_shm_on_one_host_where_the_table_says_it_wins(backend):
    """Every shm row of the committed table's "+one_host" section is what "auto" picks on one host for a
    call at that row's upper size; across hosts, or while the hosts are unknown, "auto" reads rows
    that never name shm (the plain section has none)."""
    from zerocomm.comm.backends import backend_class
    from zerocomm.comm.select import UNBOUNDED, auto_table

    cls = backend_class(backend)
    local = auto_table()[f"{backend}+one_host"]
    assert all(algorithm != "shm" for rows in auto_table()[backend].values() for _, _, algorithm in rows)
    largest = max(world for rows in local.values() for world, _, _ in rows if world < UNBOUNDED)
    shm_rows = [(collective, world, max_bytes) for collective, rows in local.items()
                for world, max_bytes, algorithm in rows if algorithm == "shm"]
    assert any(collective == "all_reduce" for collective, _, _ in shm_rows), f"no shm all_reduce row for {backend}"

    def auto(collective, n, nbytes, one_host):
        op = "sum" if collective in ("all_reduce", "reduce", "reduce_scatter") else None
        rows = rule.__wrapped__(cls, n, collective, torch.float32, op, "auto", one_host).rows
        return next(algorithm for bound, algorithm in rows if nbytes <= bound)

    for collective, world, max_bytes in shm_rows:
        n = world if world < UNBOUNDED else largest + 1
        nbytes = max_bytes if max_bytes < UNBOUNDED else 1 << 30
        assert auto(collective, n, nbytes, True) == "shm", (collective, n, nbytes)
        for one_host in (False, None):
            assert auto(collective, n, nbytes, one_host) != "shm", (collective, n, nbytes, one_host)
