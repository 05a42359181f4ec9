"""The auto-table builder: the margin rule, smoothing, merging, and the table select reads."""
import json
import pathlib

from zerocomm.benchmarks import tune


def _rows(times):
    return [{"collective": "all_reduce", "size": size, "algorithm": alg, "time_us": t}
            for size, per_alg in times.items() for alg, t in per_alg.items()]


def test_native_kept_unless_another_is_clearly_faster():
    rows = _rows({8: {"native": 10.0, "ring": 9.5}, 64: {"native": 10.0, "ring": 5.0},
                  512: {"native": 10.0, "ring": 5.0, "tree": None}})
    assert tune.winners(rows)["all_reduce"] == [(8, "native"), (64, "ring"), (512, "ring")]


def test_lone_winner_between_agreeing_neighbours_is_noise():
    rows = _rows({8: {"native": 1.0, "ring": 5.0}, 64: {"native": 10.0, "ring": 1.0},
                  512: {"native": 1.0, "ring": 5.0}})
    assert tune.winners(rows)["all_reduce"] == [(8, "native"), (64, "native"), (512, "native")]


def test_rows_merge_and_the_largest_world_covers_larger_ones():
    per_world = {2: {"all_reduce": [(8, "tree"), (64, "tree"), (512, "ring")]},
                 4: {"all_reduce": [(8, "native"), (64, "ring")]}}
    table = tune.table_rows(per_world)["all_reduce"]
    assert table == [[2, 64, "tree"], [2, tune.UNBOUNDED, "ring"], [tune.UNBOUNDED, 8, "native"],
                     [tune.UNBOUNDED, tune.UNBOUNDED, "ring"]]


def test_tune_writes_outside_the_package_by_default():
    assert not pathlib.Path(tune.DEFAULT_OUT).is_absolute()
    assert pathlib.Path(tune.PACKAGE_TABLE).parent.name == "comm"


def test_committed_table_is_well_formed():
    path = pathlib.Path(tune.PACKAGE_TABLE)
    table = json.loads(path.read_text())
    assert {"gloo", "mpi"} <= set(table)
    for backend in ("gloo", "mpi"):
        for collective, rows in table[backend].items():
            assert rows and all(len(row) == 3 for row in rows), collective
            assert rows[-1][0] == tune.UNBOUNDED and rows[-1][1] == tune.UNBOUNDED, (backend, collective)
            assert all(row[2] in tune.ALGORITHMS for row in rows)


def test_barrier_is_measured_once_and_becomes_one_row_per_world():
    """tune's sweep asks for barrier too (S = 0 whatever the sizes): its winner covers every size."""
    from zerocomm.benchmarks.collectives import SweepConfig, sweep_plan
    from zerocomm.benchmarks.units import op_layout
    assert op_layout("barrier", 4096, 3, 4).nbytes == 0
    plan = sweep_plan(SweepConfig(collectives=("all_reduce", "barrier"), sizes=(8, 64, 512)), 2)
    assert [c for c, _ in plan].count("barrier") == 1
    rows = [{"collective": "barrier", "size": 0, "algorithm": alg, "time_us": t}
            for alg, t in {"native": 100.0, "tree": 300.0, "shm": 5.0}.items()]
    assert tune.winners(rows)["barrier"] == [(0, "shm")]
    assert tune.table_rows({4: tune.winners(rows)})["barrier"] == [[tune.UNBOUNDED, tune.UNBOUNDED, "shm"]]
    kept = tune.winners(rows, lambda collective, size: "native", ("shm",))  # --add shm beside the table's pick
    assert kept["barrier"] == [(0, "shm")]
