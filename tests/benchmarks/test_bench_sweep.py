"""The measurement loop over a recording fake of a one-rank ``dist`` module: no processes.

The fake implements the eight tensor-form collectives for a group of one (where every
collective is a copy or nothing), records each call with its ``algorithm=`` keyword, can
raise ``UnsupportedError`` for one algorithm, and can corrupt results, so the sweep's
bookkeeping (warm-up and timed call counts, skipping, ``#wrong``) is checked exactly.
"""
import types

import pytest
import torch

from zerocomm.benchmarks import collectives, units
from zerocomm.benchmarks.collectives import SweepConfig, run_sweep


class FakeUnsupportedError(Exception):
    pass


def make_fake(unsupported_algorithm=None, corrupt=False):
    calls = []

    def collective(name, body):
        def call(*args, algorithm="auto", **kwargs):  # zerocomm's process default
            if name != "stats" and algorithm == unsupported_algorithm:
                raise FakeUnsupportedError(f"rank 0: {name} has no {algorithm} algorithm")
            calls.append((name, algorithm))
            body(*args, **kwargs)
            if corrupt and name != "stats":
                out = kwargs["gather_list"][0] if name == "gather" else args[0]
                out.view(-1)[0] = 99  # one wrong element on this rank
        return call

    def copy(out, inp, **_):
        out.copy_(inp)

    def scatter(out, scatter_list=None, src=0, **_):
        out.copy_(scatter_list[0])

    def gather(inp, gather_list=None, dst=0, **_):
        gather_list[0].copy_(inp)

    def nothing(*_, **__):
        pass

    fake = types.SimpleNamespace(
        __name__="fake.dist",
        UnsupportedError=FakeUnsupportedError,
        ReduceOp=types.SimpleNamespace(**{op.upper(): op for op in ("sum", "avg", "product", "min", "max",
                                                                      "band", "bor", "bxor")}),
        get_rank=lambda: 0,
        get_world_size=lambda: 1,
        barrier=lambda: calls.append(("barrier", None)),
        broadcast=collective("broadcast", nothing),
        scatter=collective("scatter", scatter),
        reduce=collective("reduce", nothing),
        all_reduce=collective("all_reduce", nothing),
        gather=collective("gather", gather),
        reduce_scatter_tensor=collective("reduce_scatter", copy),
        all_to_all_single=collective("all_to_all", copy),
    )
    gather_into = collective("all_gather", copy)
    stats_gather = collective("stats", copy)

    def all_gather_into_tensor(out, inp, **kwargs):
        # the sweep gathers its 3-value float64 statistics with the same call
        (stats_gather if inp.dtype == torch.float64 and inp.numel() == 6 else gather_into)(out, inp, **kwargs)

    fake.all_gather_into_tensor = all_gather_into_tensor
    return fake, calls


def test_every_collective_runs_warmup_plus_iters_then_one_gather_of_stats():
    fake, calls = make_fake()
    cfg = SweepConfig(sizes=(64,), warmup=2, iters=3, check=True, algorithms=("native",))
    rows = list(run_sweep(fake, cfg))
    assert [row.collective for row in rows] == list(units.COLLECTIVES)
    assert all(row.wrong == 0 and row.time_us > 0 and row.busbw is not None for row in rows)
    # per-call statistics come from the same loop: min <= median <= max, and the mean lies between
    assert all(0 < row.time_min_us <= row.time_median_us <= row.time_max_us for row in rows)
    assert all(row.time_min_us <= row.time_us <= row.time_max_us * (1 + 1e-9) for row in rows)
    for name in units.COLLECTIVES:
        # "native" is passed explicitly (else zerocomm would pick "auto"); the checked call
        # doubles as the first warm-up call
        assert calls.count((name, "native")) == 1 + 2 + 3
    assert calls.count(("barrier", None)) == len(units.COLLECTIVES)
    assert calls.count(("stats", "native")) == len(units.COLLECTIVES)


def test_rows_report_s_and_time_max_over_ranks():
    fake, _ = make_fake()
    (row,) = run_sweep(fake, SweepConfig(collectives=("all_gather",), sizes=(100,), iters=1, warmup=0))
    assert (row.size, row.count) == (100, 25)
    assert row.time_us == max(row.rank_times_us)
    assert row.algbw == pytest.approx(units.algbw_gbps(100, row.time_us / 1e6))
    assert row.busbw == 0.0  # one rank: nothing crosses a link


def test_algorithm_keyword_and_unsupported_cells():
    fake, calls = make_fake(unsupported_algorithm="tree")
    cfg = SweepConfig(collectives=("all_reduce",), sizes=(8, 64), algorithms=("native", "ring", "tree"),
                      warmup=0, iters=1)
    rows = list(run_sweep(fake, cfg))
    assert [(r.size, r.algorithm) for r in rows] == [(s, a) for s in (8, 64) for a in ("native", "ring", "tree")]
    assert ("all_reduce", "ring") in calls
    tree = [r for r in rows if r.algorithm == "tree"]
    assert all(r.time_us is None and "no tree algorithm" in r.note for r in tree)


def test_check_counts_wrong_elements():
    fake, _ = make_fake(corrupt=True)
    rows = list(run_sweep(fake, SweepConfig(sizes=(64,), check=True, warmup=0, iters=1)))
    # reduce and gather are checked on the root, which rank 0 is: every collective has one bad element
    assert [row.wrong for row in rows] == [1] * len(units.COLLECTIVES)


def test_root_must_be_a_rank():
    fake, _ = make_fake()
    with pytest.raises(ValueError, match="root 1"):
        list(run_sweep(fake, SweepConfig(root=1)))


def test_ones_fill_without_check_keeps_in_place_reductions_finite():
    fake, _ = make_fake()
    case = collectives._build_case(fake, "all_reduce", units.op_layout("all_reduce", 16, 1, 4), 0, 1,
                                   SweepConfig(), "native")
    assert torch.equal(case.result, torch.ones(4))


def test_in_place_all_gather_and_reduce_scatter_use_the_big_buffer():
    seen = {}

    class Recorder:
        ReduceOp = torch.distributed.ReduceOp

        @staticmethod
        def all_gather_into_tensor(out, inp, **kw):
            seen["all_gather"] = (out, inp)

        @staticmethod
        def reduce_scatter_tensor(out, inp, **kw):
            seen["reduce_scatter"] = (inp, out)

    rank, n = 1, 3
    for collective in ("all_gather", "reduce_scatter"):
        for in_place in (True, False):
            layout = units.op_layout(collective, 96, n, 4)
            case = collectives._build_case(Recorder, collective, layout, rank, n, SweepConfig(in_place=in_place),
                                           "native")
            case.run()
            big, small = seen[collective]
            inside = big.data_ptr() + rank * small.numel() * 4 == small.data_ptr()
            assert inside == in_place, (collective, in_place)
