"""Data-moving collectives against numpy: broadcast, scatter, gather, all_gather,
all_gather_into_tensor, all_to_all, all_to_all_single (even and uneven splits).

Every dtype, every root, in place and out of place, empty, one-element, uneven (7), 2-D and
several-hundred-element tensors, on the default group and a subgroup, with no ``algorithm=`` and
each explicit one, at world sizes 1-4 on gloo and MPI (5-8: test_large_worlds.py); one
``pool.run`` per test and world (see support/cases.py).  The value global rank ``s`` sends to
``d`` differs by sender and by receiver, so a misplaced block shows.

[Note: rotation]
An option is a (shape, root, in_place) triple of broadcast, scatter or gather, or a (shape,
in_place) pair of the all_gathers.  The turn is (group index + dtype index + algorithm index), so
it counts up along the 9 dtypes.

* On the default group, the default path (no ``algorithm=``) and "native" run every dtype with
  every shape and in_place form, each shape at one root (``sweep_root``: the root moves on with the turn and the shape), so
  with each dtype every root runs (there are at least as many shapes as roots), and over the
  dtypes every shape at every root.
* The explicit algorithms (ring, tree, shm), and on the subgroup every algorithm (the subgroup is
  there for group handles, group roots and non-contiguous members), run ceil(options / ``TURNS``)
  options a turn (``takes_turn``), so every option within ``TURNS`` = 8 dtypes: each still runs
  every shape, root and in_place form, and every dtype, only not every dtype with every option.  Every (algorithm,
  collective, dtype) cell is also proven by test_capability_matrix.py and, at 1-8 ranks, by
  tests/algorithms/test_matrix.py.

``test_rotation_runs_every_option`` checks that arithmetic without starting ranks.  all_to_all and
all_to_all_single run every case with every algorithm (there are few).
"""
import numpy as np
import pytest

from support.cases import (ALGORITHMS, REFUSED, SHAPES, Cases, Guarded, algorithms, assert_reports, block,
                           dtype_name, full_sweep, groups, numel, sweep_root, takes_turn)
from support.reference import DTYPES, to_torch
from support.dist import dist
from support.worlds import worlds

RUN_TIMEOUT_S = 240.0
ROOTED_SHAPES = [(0,), (1,), (7,), (2, 3)]  # every root multiplies the cases
COLUMNS = 2  # all_to_all_single splits rows of this many columns
TURNS = 8  # an explicit algorithm runs every option within this many dtypes (there are 9)


def _runs(alg, g_index: int, d_index: int, a_index: int, option: int, options: int) -> bool:
    """Whether option ``option`` of ``options`` runs with ``alg`` for the dtype ``d_index``: see [Note: rotation]."""
    return takes_turn(full_sweep(alg, g_index), g_index + d_index + a_index, option, options, -(-options // TURNS))


def _rooted_runs(alg, g_index: int, d_index: int, a_index: int, root: int, s_index: int, shapes: int, size: int,
                 in_place: bool = False) -> bool:
    """``_runs`` for a (shape, root[, in_place]) option of broadcast, scatter or gather: a full sweep runs
    each shape at one root (``sweep_root``), in place and not."""
    if full_sweep(alg, g_index):
        return root == sweep_root(g_index + d_index + a_index, s_index, size)
    return _runs(alg, g_index, d_index, a_index, (in_place * size + root) * shapes + s_index, 2 * size * shapes)


def uneven(src: int, dst: int) -> int:
    """Rows global rank ``src`` sends to ``dst`` in the uneven all_to_all cases (0 to 3)."""
    return (src + 2 * dst + 1) % 4


# --- what the ranks run ----------------------------------------------------------------------------

def broadcast_cases(backend):
    cases = Cases(backend)
    for g_index, grp in enumerate(groups()):
        me = grp.members[grp.rank]
        for d_index, dtype in enumerate(DTYPES):
            for s_index, shape in enumerate(SHAPES):
                for root in range(grp.size):
                    src = grp.members[root]
                    for a_index, alg in enumerate(algorithms()):
                        if not _rooted_runs(alg, g_index, d_index, a_index, root, s_index, len(SHAPES), grp.size):
                            continue
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
    for g_index, grp in enumerate(groups()):
        me = grp.members[grp.rank]
        for d_index, dtype in enumerate(DTYPES):
            for s_index, shape in enumerate(ROOTED_SHAPES):
                count = numel(shape)
                for root in range(grp.size):
                    src = grp.members[root]
                    for in_place in (False, True):
                        for a_index, alg in enumerate(algorithms()):
                            if not _rooted_runs(alg, g_index, d_index, a_index, root, s_index, len(ROOTED_SHAPES),
                                                grp.size, in_place):
                                continue
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
    for g_index, grp in enumerate(groups()):
        me = grp.members[grp.rank]
        for d_index, dtype in enumerate(DTYPES):
            for s_index, shape in enumerate(ROOTED_SHAPES):
                count = numel(shape)
                for root in range(grp.size):
                    dst = grp.members[root]
                    for in_place in (False, True):
                        for a_index, alg in enumerate(algorithms()):
                            if not _rooted_runs(alg, g_index, d_index, a_index, root, s_index, len(ROOTED_SHAPES),
                                                grp.size, in_place):
                                continue
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
    for g_index, grp in enumerate(groups()):
        me = grp.members[grp.rank]
        for d_index, dtype in enumerate(DTYPES):
            for s_index, shape in enumerate(SHAPES):
                count = numel(shape)
                for in_place in (False, True):
                    for a_index, alg in enumerate(algorithms()):
                        if not _runs(alg, g_index, d_index, a_index, in_place * len(SHAPES) + s_index, 2 * len(SHAPES)):
                            continue
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
    for g_index, grp in enumerate(groups()):
        n = grp.size
        for d_index, dtype in enumerate(DTYPES):
            for s_index, shape in enumerate(SHAPES):
                count = numel(shape)
                full = (n * shape[0],) + shape[1:]
                expected = [block(s, 0, count, dtype) for s in grp.members]
                for in_place in (False, True):
                    for a_index, alg in enumerate(algorithms()):
                        if not _runs(alg, g_index, d_index, a_index, in_place * len(SHAPES) + s_index, 2 * len(SHAPES)):
                            continue
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


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_rotation_runs_every_option(size):
    """On each group, every algorithm runs every option over the dtypes, and the default path and "native"
    run every shape and every root with each dtype (see [Note: rotation])."""
    dtypes = range(len(DTYPES))
    for g_index in (0, 1):
        for a_index, alg in enumerate((None,) + ALGORITHMS):
            # broadcast: (shape, root); scatter and gather: (shape, root, in_place)
            for shapes, in_places in ((len(SHAPES), (False,)), (len(ROOTED_SHAPES), (False, True))):
                every = {(s_index, root, in_place) for s_index in range(shapes) for root in range(size)
                         for in_place in in_places}
                ran = {d_index: {(s_index, root, in_place) for s_index, root, in_place in every
                                 if _rooted_runs(alg, g_index, d_index, a_index, root, s_index, shapes, size, in_place)}
                       for d_index in dtypes}
                assert set().union(*ran.values()) == every, (alg, shapes, size)
                if full_sweep(alg, g_index):
                    for d_index, options in ran.items():
                        assert {root for _, root, _ in options} == set(range(size)), (alg, d_index, options)
                        assert {(s, i) for s, _, i in options} == {(s, i) for s, _, i in every}, (alg, d_index)
            # the all_gathers: (shape, in_place)
            options = 2 * len(SHAPES)
            ran = {option for option in range(options) for d_index in dtypes
                   if _runs(alg, g_index, d_index, a_index, option, options)}
            assert ran == set(range(options)), (alg, sorted(ran))
