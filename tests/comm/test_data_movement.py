"""Data-moving collectives against numpy: broadcast, scatter, gather, all_gather,
all_gather_into_tensor, all_to_all, all_to_all_single (even and uneven splits).

Every dtype, every root, in place and out of place, on the default group and a subgroup, with
no ``algorithm=`` and each explicit one, at world sizes 1-4 on gloo and MPI; one ``pool.run``
per test and world (see support/cases.py).  The value global rank ``s`` sends to ``d`` differs
by sender and by receiver, so a misplaced block shows.
"""
import numpy as np
import pytest

from support.cases import REFUSED, SHAPES, Cases, Guarded, algorithms, assert_reports, block, dtype_name, groups, numel
from support.reference import DTYPES, to_torch
from support.dist import dist
from support.worlds import worlds

RUN_TIMEOUT_S = 240.0
ROOTED_SHAPES = [(0,), (1,), (7,), (2, 3)]  # every root multiplies the cases
COLUMNS = 2  # all_to_all_single splits rows of this many columns


def uneven(src: int, dst: int) -> int:
    """Rows global rank ``src`` sends to ``dst`` in the uneven all_to_all cases (0 to 3)."""
    return (src + 2 * dst + 1) % 4


# --- what the ranks run ----------------------------------------------------------------------------

def broadcast_cases(backend):
    cases = Cases(backend)
    for grp in groups():
        me = grp.members[grp.rank]
        for dtype in DTYPES:
            for shape in SHAPES:
                for root in range(grp.size):
                    src = grp.members[root]
                    for alg in algorithms():
                        root_kw = grp.root("src", root)
                        what = f"broadcast {grp} {dtype_name(dtype)} shape={shape} {root_kw}"
                        buf = Guarded(block(src, src, numel(shape), dtype) if me == src else None, dtype, shape)
                        if cases.call(what, grp.members, alg, dist.broadcast, buf.tensor, group=grp.handle,
                                      dtype=dtype, **root_kw) is REFUSED:
                            continue
                        cases.expect(what, buf, block(src, src, numel(shape), dtype))
    return cases.report()


def scatter_cases(backend):
    cases = Cases(backend)
    for grp in groups():
        me = grp.members[grp.rank]
        for dtype in DTYPES:
            for shape in ROOTED_SHAPES:
                count = numel(shape)
                for root in range(grp.size):
                    src = grp.members[root]
                    for in_place in (False, True):
                        for alg in algorithms():
                            root_kw = grp.root("src", root)
                            what = f"scatter {grp} {dtype_name(dtype)} shape={shape} {root_kw} in_place={in_place}"
                            chunks = None
                            if me == src:
                                chunks = [Guarded(block(src, d, count, dtype), dtype, shape) for d in grp.members]
                            # in place: the root's output is its own entry of the scatter list
                            out = chunks[root] if in_place and chunks else Guarded(None, dtype, shape)
                            if cases.call(what, grp.members, alg, dist.scatter, out.tensor,
                                          [c.tensor for c in chunks] if chunks else None, group=grp.handle,
                                          dtype=dtype, **root_kw) is REFUSED:
                                continue
                            cases.expect(what, out, block(src, me, count, dtype))
                            for d, chunk in zip(grp.members, chunks or []):
                                cases.expect(f"{what} (scatter_list[{d}] unchanged)", chunk, block(src, d, count, dtype))
    return cases.report()


def gather_cases(backend):
    cases = Cases(backend)
    for grp in groups():
        me = grp.members[grp.rank]
        for dtype in DTYPES:
            for shape in ROOTED_SHAPES:
                count = numel(shape)
                for root in range(grp.size):
                    dst = grp.members[root]
                    for in_place in (False, True):
                        for alg in algorithms():
                            root_kw = grp.root("dst", root)
                            what = f"gather {grp} {dtype_name(dtype)} shape={shape} {root_kw} in_place={in_place}"
                            mine = Guarded(block(me, dst, count, dtype), dtype, shape)
                            slots = None
                            if me == dst:
                                slots = [Guarded(None, dtype, shape) for _ in grp.members]
                                if in_place:  # the root's own entry of the gather list is its input
                                    slots[root] = mine
                            if cases.call(what, grp.members, alg, dist.gather, mine.tensor,
                                          [s.tensor for s in slots] if slots else None, group=grp.handle,
                                          dtype=dtype, **root_kw) is REFUSED:
                                continue
                            for s, slot in zip(grp.members, slots or []):
                                cases.expect(f"{what} (from rank {s})", slot, block(s, dst, count, dtype))
                            cases.expect(f"{what} (input unchanged)", mine, block(me, dst, count, dtype))
    return cases.report()


def all_gather_cases(backend):
    cases = Cases(backend)
    for grp in groups():
        me = grp.members[grp.rank]
        for dtype in DTYPES:
            for shape in SHAPES:
                count = numel(shape)
                for in_place in (False, True):
                    for alg in algorithms():
                        what = f"all_gather {grp} {dtype_name(dtype)} shape={shape} in_place={in_place}"
                        mine = Guarded(block(me, 0, count, dtype), dtype, shape)
                        slots = [Guarded(None, dtype, shape) for _ in grp.members]
                        if in_place:
                            slots[grp.rank] = mine
                        if cases.call(what, grp.members, alg, dist.all_gather, [s.tensor for s in slots], mine.tensor,
                                      group=grp.handle, dtype=dtype) is REFUSED:
                            continue
                        for s, slot in zip(grp.members, slots):
                            cases.expect(f"{what} (from rank {s})", slot, block(s, 0, count, dtype))
    return cases.report()


def all_gather_into_tensor_cases(backend):
    cases = Cases(backend)
    for grp in groups():
        n = grp.size
        for dtype in DTYPES:
            for shape in SHAPES:
                count = numel(shape)
                full = (n * shape[0],) + shape[1:]
                expected = [block(s, 0, count, dtype) for s in grp.members]
                for in_place in (False, True):
                    for alg in algorithms():
                        what = f"all_gather_into_tensor {grp} {dtype_name(dtype)} shape={shape} in_place={in_place}"
                        out = Guarded(None, dtype, full)
                        if in_place:  # torch's documented in-place form: the input is this rank's chunk
                            mine = out.tensor[grp.rank * shape[0]:(grp.rank + 1) * shape[0]]
                            mine.copy_(to_torch(expected[grp.rank], dtype).view(shape))
                        else:
                            mine = Guarded(expected[grp.rank], dtype, shape).tensor
                        if cases.call(what, grp.members, alg, dist.all_gather_into_tensor, out.tensor, mine,
                                      group=grp.handle, dtype=dtype) is REFUSED:
                            continue
                        cases.expect(what, out, np.concatenate(expected))
                        cases.expect(f"{what} (input)", mine, expected[grp.rank])
    return cases.report()


def all_to_all_cases(backend):
    cases = Cases(backend)
    for grp in groups():
        me = grp.members[grp.rank]
        for dtype in DTYPES:
            for split in ("even", "uneven"):
                rows = (lambda s, d: 3) if split == "even" else uneven
                for alg in algorithms():
                    what = f"all_to_all {grp} {dtype_name(dtype)} {split}"
                    sends = [Guarded(block(me, d, rows(me, d), dtype), dtype, (rows(me, d),)) for d in grp.members]
                    recvs = [Guarded(None, dtype, (rows(s, me),)) for s in grp.members]
                    if cases.call(what, grp.members, alg, dist.all_to_all, [r.tensor for r in recvs],
                                  [s.tensor for s in sends], group=grp.handle, dtype=dtype) is REFUSED:
                        continue
                    for s, recv in zip(grp.members, recvs):
                        cases.expect(f"{what} (from rank {s})", recv, block(s, me, rows(s, me), dtype))
                    for d, send in zip(grp.members, sends):
                        cases.expect(f"{what} (input for rank {d} unchanged)", send, block(me, d, rows(me, d), dtype))
    return cases.report()


def all_to_all_single_cases(backend):
    cases = Cases(backend)
    for grp in groups():
        me = grp.members[grp.rank]
        for dtype in DTYPES:
            for split in ("none", "even", "uneven"):
                rows = (lambda s, d: 2) if split != "uneven" else uneven
                send_rows = [rows(me, d) for d in grp.members]
                recv_rows = [rows(s, me) for s in grp.members]
                sent = [block(me, d, r * COLUMNS, dtype) for d, r in zip(grp.members, send_rows)]
                wanted = [block(s, me, r * COLUMNS, dtype) for s, r in zip(grp.members, recv_rows)]
                # "none": no split sizes (equal blocks); "even": explicit equal split sizes
                splits = {} if split == "none" else {"output_split_sizes": recv_rows, "input_split_sizes": send_rows}
                for alg in algorithms():
                    what = f"all_to_all_single {grp} {dtype_name(dtype)} splits={split}"
                    source = Guarded(np.concatenate(sent), dtype, (sum(send_rows), COLUMNS))
                    target = Guarded(None, dtype, (sum(recv_rows), COLUMNS))
                    if cases.call(what, grp.members, alg, dist.all_to_all_single, target.tensor, source.tensor,
                                  group=grp.handle, dtype=dtype, **splits) is REFUSED:
                        continue
                    cases.expect(f"{what} send rows {send_rows}, receive rows {recv_rows}", target, np.concatenate(wanted))
                    cases.expect(f"{what} (input unchanged)", source, np.concatenate(sent))
    return cases.report()


# --- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", worlds(), indirect=True)
@pytest.mark.parametrize("cases_fn", [broadcast_cases, scatter_cases, gather_cases, all_gather_cases,
                                      all_gather_into_tensor_cases, all_to_all_cases, all_to_all_single_cases],
                         ids=lambda fn: fn.__name__.removesuffix("_cases"))
def test_data_movement(world, cases_fn):
    assert_reports(world.run(cases_fn, world.backend, timeout=RUN_TIMEOUT_S))
