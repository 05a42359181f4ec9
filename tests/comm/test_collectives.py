"""Reducing collectives against numpy: all_reduce, reduce, reduce_scatter, reduce_scatter_tensor.

Every (dtype, op) the dtype admits, every root, in place and out of place, on the default group
and on a subgroup, with no ``algorithm=`` and with each explicit one, at world sizes 1-4 on gloo
and MPI.  Each test is one ``pool.run``: the ranks loop over the cases and compare with numpy
themselves (see support/cases.py); inputs are integer-valued so results are exact (floats allow
one rounding, for avg's division).  The data-moving collectives are in test_data_movement.py.
"""
import pytest

from support.cases import REFUSED, SHAPES, Cases, Guarded, algorithms, assert_reports, dtype_name, groups, numel, red_op
from support.reference import DTYPES, admitted_ops, rank_input, reduce
from support.dist import dist
from support.worlds import worlds

RUN_TIMEOUT_S = 240.0
REDUCE_SHAPES = [(0,), (1,), (3, 5)]  # fewer than SHAPES: every root multiplies the cases
CHUNK_SHAPES = [(0,), (1,), (3,), (2, 3)]  # a rank's chunk of a reduce_scatter


def _cells():
    for dtype in DTYPES:
        for op in admitted_ops(dtype):
            yield dtype, op


# --- what the ranks run ----------------------------------------------------------------------------

def all_reduce_cases(backend):
    cases = Cases(backend)
    for grp in groups():
        for dtype, op in _cells():
            for shape in SHAPES:
                inputs = [rank_input(g, numel(shape), dtype, op) for g in grp.members]
                expected = reduce(inputs, op)
                for alg in algorithms("recursive_doubling", "hierarchical"):
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
    for grp in groups():
        for dtype, op in _cells():
            for shape in REDUCE_SHAPES:
                inputs = [rank_input(g, numel(shape), dtype, op) for g in grp.members]
                expected = reduce(inputs, op)
                for root in range(grp.size):
                    for alg in algorithms():
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
    for grp in groups():
        n = grp.size
        for dtype, op in _cells():
            for chunk in CHUNK_SHAPES:
                full = (n * chunk[0],) + chunk[1:]
                inputs = [rank_input(g, numel(full), dtype, op) for g in grp.members]
                size = numel(chunk)
                expected = reduce(inputs, op)[grp.rank * size:(grp.rank + 1) * size]
                for in_place in (False, True):
                    for alg in algorithms():
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
    for grp in groups():
        n = grp.size
        for dtype, op in _cells():
            for chunk in CHUNK_SHAPES:
                size = numel(chunk)
                # Rank g's j-th input differs by g and by j, so a swapped chunk shows.
                inputs = {g: [rank_input(g, size, dtype, op, salt=5 * j) for j in range(n)] for g in grp.members}
                expected = reduce([inputs[g][grp.rank] for g in grp.members], op)
                for in_place in (False, True):
                    for alg in algorithms():
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
