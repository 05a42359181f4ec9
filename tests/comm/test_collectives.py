"""Reducing collectives against numpy: all_reduce, reduce, reduce_scatter, reduce_scatter_tensor.

Every (dtype, op) the dtype admits, every root, in place and out of place, empty, one-element,
uneven (7: no world size of 2-4 divides it), 2-D and several-hundred-element tensors, on the
default group and on a subgroup, with no ``algorithm=`` and with each explicit one, at world sizes
1-4 on gloo and MPI (5-8: test_large_worlds.py).  Each test is one ``pool.run``: the ranks loop
over the cases and compare with numpy themselves (see support/cases.py); inputs are
integer-valued so results are exact (floats allow one rounding, for avg's division).  The
data-moving collectives are in test_data_movement.py.

[Note: rotation]
On the default group, the default path (no ``algorithm=``) and "native" run every (dtype, op)
with every shape and in_place form; in reduce, each shape at one root (``sweep_root``).  The
explicit algorithms (ring, tree, shm, recursive_doubling, hierarchical), and on the subgroup every
algorithm (it is there for group handles, group roots and non-contiguous members, the same for
every op), take turns over the options instead; every (algorithm, dtype, op) cell is also proven
by test_capability_matrix.py and, at 1-8 ranks, tests/algorithms/test_matrix.py:

* all_reduce: 2 of the 5 shapes a turn;
* reduce: every shape of ``REDUCE_SHAPES`` at one root a turn;
* reduce_scatter, reduce_scatter_tensor: 2 of the 8 (chunk, in_place) pairs a turn.

The turn is (group index + index of the op among the dtype's ops + index of the algorithm), so it
counts up along the ops of a dtype, and every dtype admits at least 5 ops.  ``takes_turn`` runs
every option within ceil(options / take) consecutive turns: 3 for the shapes, the group's size (at
most 4) for the roots, 4 for the chunks; ``sweep_root`` runs every root within the group's size.
Hence, on each group, every algorithm (the default included) still runs every shape, root and
in_place form with every dtype, only not always with every op; ``test_rotation_runs_every_option``
checks that arithmetic without starting ranks.
"""
import pytest

from support.cases import (ALGORITHMS, REFUSED, SHAPES, Cases, Guarded, algorithms, assert_reports,
                           dtype_name, full_sweep, groups, numel, red_op, sweep_root,
                           takes_turn)
from support.reference import DTYPES, admitted_ops, rank_input, reduce
from support.dist import dist
from support.worlds import worlds

RUN_TIMEOUT_S = 240.0
REDUCE_SHAPES = [(0,), (1,), (3, 5)]  # fewer than SHAPES: every root multiplies the cases
CHUNK_SHAPES = [(0,), (1,), (3,), (2, 3)]  # a rank's chunk of a reduce_scatter
SHAPES_TAKE = 2  # shapes a turn runs in all_reduce (of 5), where it is not a full sweep
CHUNKS_TAKE = 2  # (chunk, in_place) pairs a turn runs in the reduce_scatters (of 8)
# reduce: a turn runs every shape of REDUCE_SHAPES at one root


def _cells():
    """(dtype, op, index of op among the dtype's ops) for every cell."""
    for dtype in DTYPES:
        for index, op in enumerate(admitted_ops(dtype)):
            yield dtype, op, index


def _turn(group_index: int, op_index: int, alg_index: int) -> int:
    """Counts up along the dtype's ops: see the module docstring."""
    return group_index + op_index + alg_index


def _shape_turn(alg, g_index: int, turn: int, shape_index: int) -> bool:
    """Whether an all_reduce case runs: options are the shapes."""
    return takes_turn(full_sweep(alg, g_index), turn, shape_index, len(SHAPES), SHAPES_TAKE)


def _reduce_turn(alg, g_index: int, turn: int, root: int, shape_index: int, size: int) -> bool:
    """Whether a reduce case runs: on a full sweep each shape at one root (``sweep_root``), else every
    shape at one root a turn (options are (root, shape) pairs, shape fastest)."""
    if full_sweep(alg, g_index):
        return root == sweep_root(turn, shape_index, size)
    return takes_turn(False, turn, root * len(REDUCE_SHAPES) + shape_index, size * len(REDUCE_SHAPES),
                      len(REDUCE_SHAPES))


def _chunk_turn(alg, g_index: int, turn: int, chunk_index: int, in_place: bool) -> bool:
    """Whether a reduce_scatter case runs: options are (in_place, chunk) pairs, chunk fastest."""
    option = in_place * len(CHUNK_SHAPES) + chunk_index
    return takes_turn(full_sweep(alg, g_index), turn, option, 2 * len(CHUNK_SHAPES), CHUNKS_TAKE)


# --- what the ranks run ----------------------------------------------------------------------------

def all_reduce_cases(backend):
    cases = Cases(backend)
    for g_index, grp in enumerate(groups()):
        for dtype, op, o_index in _cells():
            for s_index, shape in enumerate(SHAPES):
                inputs = [rank_input(g, numel(shape), dtype, op) for g in grp.members]
                expected = reduce(inputs, op)
                for a_index, alg in enumerate(algorithms("recursive_doubling", "hierarchical")):
                    if not _shape_turn(alg, g_index, _turn(g_index, o_index, a_index), s_index):
                        continue
                    what = f"all_reduce {grp} {dtype_name(dtype)} {op} shape={shape}"
                    buf = Guarded(inputs[grp.rank], dtype, shape)
                    if cases.call(what, grp.members, alg, dist.all_reduce, buf.tensor, red_op(op),
                                  group=grp.handle, dtype=dtype) is REFUSED:
                        continue
                    cases.expect(what, buf, expected)
                    cases.same_everywhere(f"{what} algorithm={alg}", grp.members, buf.tensor)
    return cases.report()


def reduce_cases(backend):
    cases = Cases(backend)
    for g_index, grp in enumerate(groups()):
        for dtype, op, o_index in _cells():
            for s_index, shape in enumerate(REDUCE_SHAPES):
                inputs = [rank_input(g, numel(shape), dtype, op) for g in grp.members]
                expected = reduce(inputs, op)
                for root in range(grp.size):
                    for a_index, alg in enumerate(algorithms()):
                        if not _reduce_turn(alg, g_index, _turn(g_index, o_index, a_index), root, s_index, grp.size):
                            continue
                        root_kw = grp.root("dst", root)
                        what = f"reduce {grp} {dtype_name(dtype)} {op} shape={shape} {root_kw}"
                        buf = Guarded(inputs[grp.rank], dtype, shape)
                        if cases.call(what, grp.members, alg, dist.reduce, buf.tensor, op=red_op(op),
                                      group=grp.handle, dtype=dtype, **root_kw) is REFUSED:
                            continue
                        if grp.rank == root:
                            cases.expect(what, buf, expected)
                        else:  # only the root's result is defined; the rest must stay in bounds
                            cases.check(what, buf.intact(), "wrote outside its tensor")
    return cases.report()


def reduce_scatter_tensor_cases(backend):
    cases = Cases(backend)
    for g_index, grp in enumerate(groups()):
        n = grp.size
        for dtype, op, o_index in _cells():
            for c_index, chunk in enumerate(CHUNK_SHAPES):
                full = (n * chunk[0],) + chunk[1:]
                inputs = [rank_input(g, numel(full), dtype, op) for g in grp.members]
                size = numel(chunk)
                expected = reduce(inputs, op)[grp.rank * size:(grp.rank + 1) * size]
                for in_place in (False, True):
                    for a_index, alg in enumerate(algorithms()):
                        if not _chunk_turn(alg, g_index, _turn(g_index, o_index, a_index), c_index, in_place):
                            continue
                        what = (f"reduce_scatter_tensor {grp} {dtype_name(dtype)} {op} chunk={chunk} "
                                f"in_place={in_place}")
                        source = Guarded(inputs[grp.rank], dtype, full)
                        if in_place:  # the NCCL convention: the output is this rank's chunk of the input
                            output = source.tensor[grp.rank * chunk[0]:(grp.rank + 1) * chunk[0]]
                        else:
                            target = Guarded(None, dtype, chunk)
                            output = target.tensor
                        if cases.call(what, grp.members, alg, dist.reduce_scatter_tensor, output, source.tensor,
                                      red_op(op), group=grp.handle, dtype=dtype) is REFUSED:
                            continue
                        cases.expect(what, output, expected)
                        if in_place:
                            cases.check(what, source.intact(), "wrote outside the input")
                        else:
                            cases.check(what, target.intact(), "wrote outside the output")
                            cases.expect(f"{what} (input unchanged)", source, inputs[grp.rank])
    return cases.report()


def reduce_scatter_cases(backend):
    cases = Cases(backend)
    for g_index, grp in enumerate(groups()):
        n = grp.size
        for dtype, op, o_index in _cells():
            for c_index, chunk in enumerate(CHUNK_SHAPES):
                size = numel(chunk)
                # Rank g's j-th input differs by g and by j, so a swapped chunk shows.
                inputs = {g: [rank_input(g, size, dtype, op, salt=5 * j) for j in range(n)] for g in grp.members}
                expected = reduce([inputs[g][grp.rank] for g in grp.members], op)
                for in_place in (False, True):
                    for a_index, alg in enumerate(algorithms()):
                        if not _chunk_turn(alg, g_index, _turn(g_index, o_index, a_index), c_index, in_place):
                            continue
                        what = f"reduce_scatter {grp} {dtype_name(dtype)} {op} chunk={chunk} in_place={in_place}"
                        sources = [Guarded(values, dtype, chunk) for values in inputs[grp.members[grp.rank]]]
                        target = sources[grp.rank] if in_place else Guarded(None, dtype, chunk)
                        if cases.call(what, grp.members, alg, dist.reduce_scatter, target.tensor,
                                      [s.tensor for s in sources], red_op(op), group=grp.handle,
                                      dtype=dtype) is REFUSED:
                            continue
                        cases.expect(what, target, expected)
                        for j, source in enumerate(sources):
                            if not (in_place and j == grp.rank):
                                cases.expect(f"{what} (input {j} unchanged)", source, inputs[grp.members[grp.rank]][j])
    return cases.report()


# --- tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("world", worlds(), indirect=True)
@pytest.mark.parametrize("cases_fn", [all_reduce_cases, reduce_cases, reduce_scatter_tensor_cases,
                                      reduce_scatter_cases], ids=lambda fn: fn.__name__.removesuffix("_cases"))
def test_reducing_collective(world, cases_fn):
    assert_reports(world.run(cases_fn, world.backend, timeout=RUN_TIMEOUT_S))


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_rotation_runs_every_option(size):
    """Every algorithm, on each group, runs every option with every dtype (see [Note: rotation])."""
    suites = {"all_reduce": (len(SHAPES), SHAPES_TAKE), "reduce": (size * len(REDUCE_SHAPES), len(REDUCE_SHAPES)),
              "reduce_scatter": (2 * len(CHUNK_SHAPES), CHUNKS_TAKE)}
    for suite, (options, take) in suites.items():
        for g_index in (0, 1):
            for a_index, alg in enumerate((None,) + ALGORITHMS + ("recursive_doubling", "hierarchical")):
                for dtype in DTYPES:
                    turns = [_turn(g_index, o_index, a_index) for o_index in range(len(admitted_ops(dtype)))]
                    if suite == "reduce":
                        ran = {root * len(REDUCE_SHAPES) + s_index for root in range(size)
                               for s_index in range(len(REDUCE_SHAPES)) for turn in turns
                               if _reduce_turn(alg, g_index, turn, root, s_index, size)}
                    else:
                        ran = {option for option in range(options) for turn in turns
                               if takes_turn(full_sweep(alg, g_index), turn, option, options, take)}
                    assert ran == set(range(options)), (suite, size, g_index, alg, dtype, sorted(ran))
