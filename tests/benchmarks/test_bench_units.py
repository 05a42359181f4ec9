"""The benchmark's pure definitions: sizes, layouts, bandwidths, references, reports, launch detection.

Fast and process-free: nothing here starts a rank or communicates.
"""
import csv
import json
import types

import numpy as np
import pytest

from zerocomm.benchmarks import launch, reference, report, target, units
from zerocomm.benchmarks.collectives import Row, SweepConfig, sweep_plan


# --- sizes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("8", 8), ("8B", 8), ("8 b", 8), ("64KiB", 65536), ("64K", 65536), ("1KB", 1000),
    ("64MiB", 64 << 20), ("4M", 4 << 20), ("1MB", 10**6), ("1GiB", 1 << 30), ("1.5KiB", 1536),
])
def test_parse_size_reads_units(text, expected):
    assert units.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "8Q", "-8", "0", "0.5", "1.3B"])
def test_parse_size_rejects_and_quotes_the_text(text):
    with pytest.raises(ValueError, match=repr(text).replace(".", r"\.").replace("-", r"\-")):
        units.parse_size(text)


def test_size_sweep_steps_like_nccl_tests():
    assert units.size_sweep("8B:64MiB", 2)[:4] == [8, 16, 32, 64]
    assert units.size_sweep("8B:64MiB", 2)[-1] == 64 << 20
    # hi appears only when the steps land on it
    assert units.size_sweep("8B:4MiB", 8) == [8, 64, 512, 4096, 32768, 262144, 2097152]
    assert units.size_sweep("8B:16MiB", 8)[-1] == 16 << 20


def test_size_sweep_mixes_ranges_and_single_sizes_sorted_and_distinct():
    assert units.size_sweep("1MiB,8:64,64", 2) == [8, 16, 32, 64, 1 << 20]


@pytest.mark.parametrize("spec, factor, message", [
    ("64:8", 2, "runs backwards"), ("8:64", 1, "factor"), ("8:64", 2.5, "factor"), ("8,,16", 2, "empty"),
])
def test_size_sweep_rejects_bad_specs(spec, factor, message):
    with pytest.raises(ValueError, match=message):
        units.size_sweep(spec, factor)


def test_format_size():
    assert [units.format_size(b) for b in (8, 1024, 1536, 64 << 20)] == ["8 B", "1 KiB", "1.5 KiB", "64 MiB"]


def test_canonical_collective_accepts_torch_names_and_rejects_others():
    assert units.canonical_collective("all_gather_into_tensor") == "all_gather"
    assert units.canonical_collective("Reduce_Scatter_Tensor") == "reduce_scatter"
    assert units.canonical_collective("all_to_all_single") == "all_to_all"
    with pytest.raises(ValueError, match="'allreduce'"):
        units.canonical_collective("allreduce")


# --- S and the bus factor (nccl-tests' definitions) --------------------------------------

@pytest.mark.parametrize("collective", ["all_reduce", "broadcast", "reduce"])
def test_whole_buffer_collectives_use_the_buffer_as_s(collective):
    layout = units.op_layout(collective, 1 << 20, 4, 4)
    assert layout == units.Layout(chunk=1 << 18, elements=1 << 18, nbytes=1 << 20)


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"])
def test_partitioned_collectives_split_s_into_n_chunks(collective):
    layout = units.op_layout(collective, 1 << 20, 4, 4)
    assert layout == units.Layout(chunk=1 << 16, elements=1 << 18, nbytes=1 << 20)


def test_layout_rounds_down_to_whole_chunks_but_never_below_one_element_per_rank():
    assert units.op_layout("all_gather", 100, 3, 4) == units.Layout(chunk=8, elements=24, nbytes=96)
    assert units.op_layout("all_gather", 8, 4, 4) == units.Layout(chunk=1, elements=4, nbytes=16)
    assert units.op_layout("all_reduce", 3, 4, 4) == units.Layout(chunk=1, elements=1, nbytes=4)


@pytest.mark.parametrize("collective, n, factor", [
    ("all_reduce", 4, 1.5), ("all_reduce", 2, 1.0), ("all_reduce", 1, 0.0),
    ("reduce_scatter", 4, 0.75), ("all_gather", 8, 0.875), ("all_to_all", 2, 0.5),
    ("gather", 4, 0.75), ("scatter", 4, 0.75), ("broadcast", 4, 1.0), ("reduce", 7, 1.0),
])
def test_bus_factor(collective, n, factor):
    assert units.bus_factor(collective, n) == pytest.approx(factor)


def test_bandwidths_are_decimal_gigabytes_per_second():
    assert units.algbw_gbps(10**9, 1.0) == pytest.approx(1.0)
    assert units.busbw_gbps("all_reduce", 64 << 20, 0.05, 4) == pytest.approx((64 << 20) / 0.05 / 1e9 * 1.5)
    with pytest.raises(ValueError, match="time"):
        units.algbw_gbps(8, 0.0)


# --- the numpy reference -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", sorted(reference.NUMPY_DTYPES))
def test_patterns_are_small_and_differ_between_ranks(dtype):
    a, b = reference.rank_pattern(0, 64, dtype), reference.rank_pattern(1, 64, dtype)
    assert a.shape == (64,) and not np.array_equal(a, b)
    if dtype != "bool":
        assert 1 <= a.min() and a.max() <= 61


def test_expected_outputs_of_data_movement():
    n, chunk, root = 3, 2, 1
    inputs = [reference.rank_pattern(r, n * chunk, "int32") for r in range(n)]
    small = [reference.rank_pattern(r, chunk, "int32") for r in range(n)]

    def expect(collective, rank):
        return reference.expected_output(collective, rank, n, root, chunk, "int32", "sum")

    assert np.array_equal(expect("broadcast", 0), small[root])
    assert np.array_equal(expect("scatter", 2), inputs[root][4:6])
    assert np.array_equal(expect("all_gather", 0), np.concatenate(small))
    assert np.array_equal(expect("gather", root), np.concatenate(small))
    assert expect("gather", 0) is None and expect("reduce", 2) is None
    assert np.array_equal(expect("all_to_all", 1), np.concatenate([x[2:4] for x in inputs]))


@pytest.mark.parametrize("op, combine", [
    ("sum", np.sum), ("product", np.prod), ("min", np.min), ("max", np.max),
    ("band", np.bitwise_and.reduce), ("bor", np.bitwise_or.reduce), ("bxor", np.bitwise_xor.reduce),
])
def test_expected_reductions_match_numpy(op, combine):
    n, chunk = 4, 5
    stack = np.stack([reference.rank_pattern(r, n * chunk, "int64", op) for r in range(n)])
    got = reference.expected_output("reduce_scatter", 2, n, 0, chunk, "int64", op)
    assert np.array_equal(got, combine(stack[:, 10:15], axis=0))


def test_integer_overflow_wraps_like_the_dtype():
    n, chunk = 64, 8  # 64 ranks of values up to 5: sums above 127 wrap in int8
    wide = sum(reference.rank_pattern(r, chunk, "int64", "sum") for r in range(n))
    got = reference.expected_output("all_reduce", 0, n, 0, chunk, "int8", "sum")
    assert np.array_equal(got, wide.astype(np.int8))


def test_avg_and_bool_ops():
    got = reference.expected_output("all_reduce", 0, 3, 0, 4, "float32", "avg")
    stack = np.stack([reference.rank_pattern(r, 4, "float32", "avg") for r in range(3)])
    assert np.allclose(got, stack.mean(axis=0))
    got = reference.expected_output("all_reduce", 0, 3, 0, 4, "bool", "bor")
    assert np.array_equal(got, np.logical_or.reduce([reference.rank_pattern(r, 4, "bool") for r in range(3)]))
    with pytest.raises(ValueError, match="'sum' is not defined on bool"):
        reference.expected_output("all_reduce", 0, 3, 0, 4, "bool", "sum")
    with pytest.raises(ValueError, match="'avg' is not defined on integer"):
        reference.expected_output("all_reduce", 0, 3, 0, 4, "int32", "avg")


def test_products_stay_exact_in_bfloat16_precision():
    got = reference.expected_output("all_reduce", 0, 8, 0, 16, "bfloat16", "product")
    assert got.max() <= 256 and np.array_equal(got, np.round(got))


def test_count_wrong():
    expected = np.arange(1, 11, dtype=np.float32)
    assert reference.count_wrong(expected.copy(), expected, "float32", 4) == 0
    off = expected.copy()
    off[3] += 0.5
    assert reference.count_wrong(off, expected, "float32", 4) == 1
    assert reference.count_wrong(expected[:5], expected, "float32", 4) == 10  # wrong shape: all wrong
    assert reference.count_wrong(np.array([1, 2], np.int8), np.array([1, 3], np.int8), "int8", 2) == 1
    # one rounding of avg in float16 is within tolerance
    third = np.array([1 / 3], dtype=np.float16)
    assert reference.count_wrong(third, np.array([1 / 3]), "float16", 3) == 0


# --- the sweep's configuration and plan -----------------------------------------------------

def test_sweep_config_validates_with_the_offending_values():
    with pytest.raises(ValueError, match="'float8'"):
        SweepConfig(dtype="float8")
    with pytest.raises(ValueError, match=r"iters \(0\)"):
        SweepConfig(iters=0)
    with pytest.raises(ValueError, match="'allreduce'"):
        SweepConfig(collectives=("allreduce",))
    with pytest.raises(ValueError, match="distinct"):
        SweepConfig(algorithms=("ring", "ring"))


def test_sweep_plan_measures_each_rounded_size_once():
    cfg = SweepConfig(collectives=("all_reduce", "all_gather"), sizes=(4, 8, 16, 64))
    plan = sweep_plan(cfg, 4)
    assert [(c, layout.nbytes) for c, layout in plan] == [
        ("all_reduce", 4), ("all_reduce", 8), ("all_reduce", 16), ("all_reduce", 64),
        ("all_gather", 16), ("all_gather", 64),
    ]


# --- the module under measurement ------------------------------------------------------------

def test_target_reads_the_standin_variable():
    assert target.target_name({}) == "zerocomm"
    assert target.target_name({target.STANDIN_ENV: "torch"}) == "torch"
    with pytest.raises(ValueError, match="'nccl'"):
        target.target_name({target.STANDIN_ENV: "nccl"})


def test_algorithm_keyword_is_explicit_except_for_torchs_native():
    import torch.distributed

    zerocomm_like = types.SimpleNamespace(__name__="zerocomm.comm")
    assert target.algorithm_kwargs(zerocomm_like, "native") == {"algorithm": "native"}
    assert target.algorithm_kwargs(zerocomm_like, "ring") == {"algorithm": "ring"}
    assert target.algorithm_kwargs(torch.distributed, "native") == {}


# --- launch detection -------------------------------------------------------------------------

@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, launch.Launched("torchrun", 1, 4, 1)),
    ({"PMI_RANK": "2", "PMI_SIZE": "3"}, launch.Launched("mpiexec", 2, 3, 2)),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"},
     launch.Launched("mpiexec", 0, 2, 0)),
])
def test_detect_launcher(environ, expected):
    assert launch.detect_launcher(environ) == expected


def test_detect_launcher_names_malformed_variables():
    with pytest.raises(ValueError, match="PMI_RANK=5"):
        launch.detect_launcher({"PMI_RANK": "5", "PMI_SIZE": "2"})
    with pytest.raises(ValueError, match="'x'"):
        launch.detect_launcher({"RANK": "x", "WORLD_SIZE": "2"})


def test_init_specs():
    torchrun = launch.launched_spec(launch.Launched("torchrun", 1, 2, 1), "gloo")
    assert torchrun.kwargs() == {"backend": "gloo", "init_method": "env://", "rank": 1, "world_size": 2}
    mpi = launch.launched_spec(launch.Launched("mpiexec", 1, 2, 1), "mpi")
    assert mpi.kwargs() == {"backend": "mpi"}
    with pytest.raises(ValueError, match="mpiexec"):
        launch.launched_spec(launch.Launched("torchrun", 0, 2, 0), "mpi")


# --- reports ------------------------------------------------------------------------------------

def _row(algorithm, time_us, size=64, collective="all_reduce", wrong=0, note=""):
    return Row(collective=collective, algorithm=algorithm, size=size, count=size // 4, time_us=time_us,
               algbw=None if time_us is None else size / time_us / 1e3,
               busbw=None if time_us is None else size / time_us / 1e3, wrong=wrong,
               rank_times_us=() if time_us is None else (time_us, time_us / 2), note=note)


def test_native_ratios_are_busbw_over_native_busbw():
    rows = [_row("native", 100.0), _row("ring", 50.0), _row("tree", None, note="no tree"),
            _row("ring", 10.0, size=128)]
    assert report.native_ratios(rows) == [None, 2.0, None, None]


def test_table_has_aligned_rows_footnotes_and_verdict():
    rows = [_row("native", 100.0), _row("ring", 50.0, wrong=3), _row("tree", None, wrong=None, note="no tree")]
    table = report.format_table(rows, check=True, show_ratio=True)
    lines = table.splitlines()
    assert len(lines) == 2 + len(rows)
    assert "busbw/native" in lines[0] and "2.00" in lines[3] and "unsupported [1]" in lines[4]
    assert len({len(line.rstrip()) for line in lines[2:4]}) == 1  # numeric columns right-aligned
    summary = report.summary_lines(rows, check=True)
    assert summary[:2] == ["# [1] no tree", "# Out of bounds values : 3 FAILED"]
    assert summary[2].startswith("# Avg bus bandwidth    : ")


def test_closing_lines_follow_nccl_tests():
    """The mean busbw over every row with a time (GB/s), as nccl-tests averages over its sizes."""
    cells = [("native", 1.0, 0), ("ring", 3.0, 0), ("native", 2.0, 0), ("tree", None, None)]
    lines = report.closing_lines(cells, check=True)
    assert lines == ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 2",
                     "#   by algorithm (GB/s): native 1.5, ring 3"]
    assert float(lines[1].split(":")[1]) == 2.0  # what `grep 'Avg bus bandwidth' | cut -d: -f2` reads
    unchecked = report.closing_lines([("native", 0.5, None)], check=False, label="gloo, 2 ranks")
    assert unchecked == ["# Out of bounds values : not checked (-c 0) (gloo, 2 ranks)",
                         "# Avg bus bandwidth    : 0.5 (gloo, 2 ranks)"]


def test_header_names_the_timing_convention_and_definitions():
    meta = {"target": "zerocomm.comm", "backend": "gloo", "world_size": 4, "device": "cpu", "threads": 1,
            "dtype": "float32", "op": "sum", "root": 0, "warmup": 5, "iters": 20, "check": False,
            "collectives": list(units.COLLECTIVES), "algorithms": ["native", "ring"]}
    text = "\n".join(report.header_lines(meta))
    assert "nccl-tests" in text and "back-to-back" in text and "maximum over ranks" in text
    assert "2(n-1)/n" in text and "busbw/native" in text


def test_json_and_csv(tmp_path):
    rows = [_row("native", 100.0), _row("ring", 50.0)]
    meta = {"target": "zerocomm.comm", "backend": "gloo", "world_size": 2, "dtype": "float32", "op": "sum",
            "in_place": False, "device": "cpu", "iters": 20}
    report.write_json(tmp_path / "out.json", meta, rows)
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["meta"] == meta
    assert data["rows"][1]["busbw_vs_native"] == 2.0 and data["rows"][1]["rank_times_us"] == [50.0, 25.0]
    assert all(row["backend"] == "gloo" and row["world_size"] == 2 and row["dtype"] == "float32"
               for row in data["rows"])
    report.write_csv(tmp_path / "out.csv", rows, meta)
    with open(tmp_path / "out.csv", newline="") as handle:
        records = list(csv.DictReader(handle))
    assert [r["algorithm"] for r in records] == ["native", "ring"]
    assert tuple(records[0]) == report.CSV_FIELDS and records[0]["busbw_vs_native"] == ""
    assert {"backend", "world_size", "algorithm", "dtype", "op", "size", "time_us", "busbw"} <= set(records[0])
    assert records[1]["backend"] == "gloo" and records[1]["world_size"] == "2"
