"""``zerocomm-bench``'s command line: nccl-tests' flags, one list convention, every bad argument or
environment value refused before any rank starts (naming it), and end to end runs on 2 local ranks.

gloo forks its ranks; MPI re-runs the command under mpiexec.  The MPI cases need zerocomm.comm
(torch's CPU wheel has no MPI backend), so they are skipped under ``ZEROCOMM_BENCH_STANDIN=torch``.
"""
import ast
import csv
import json
import os
import pathlib
import subprocess
import sys
import tomllib

import pytest

from zerocomm.benchmarks import cli, collectives_cli, launch, overhead, units, zero_cli
from zerocomm.benchmarks.target import STANDIN_ENV, target_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
STANDIN = target_name() == "torch"
NO_MPI_REASON = f"{STANDIN_ENV}=torch: torch has no MPI backend"


@pytest.fixture
def no_ranks(monkeypatch):
    """Fails the test if anything tries to start a rank (fork, mpiexec or a subprocess world)."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a rank was started: {args!r}")

    monkeypatch.setattr(launch, "run_forked", refuse)
    monkeypatch.setattr(launch, "relaunch_under_mpiexec", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)
    for name in ("ZEROCOMM_ALGORITHM", STANDIN_ENV, "RANK", "WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                 "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMIX_SIZE"):
        monkeypatch.delenv(name, raising=False)


def refusal(argv, capsys) -> str:
    """The error ``zerocomm-bench argv`` stops with (exit status 2)."""
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert stopped.value.code == 2
    return capsys.readouterr().err


def parsed(argv):
    args = cli.build_parser().parse_args(argv)
    return args, collectives_cli.plan(args, args.compare)


def test_nccl_tests_flags_set_the_sweep(no_ranks):
    args, plan = parsed(["collectives", "-b", "8", "-e", "64M", "-f", "2", "-n", "20", "-w", "5", "-c", "1",
                         "-d", "float", "-o", "prod", "-r", "1"])
    cfg = plan.cfg
    assert cfg.sizes[0] == 8 and cfg.sizes[-1] == 64 << 20 and len(cfg.sizes) == 24  # 8 B x 2^k up to 64 MiB
    assert (cfg.iters, cfg.warmup, cfg.check, cfg.dtype, cfg.op, cfg.root) == (20, 5, True, "float32", "product", 1)


def test_checking_is_on_by_default_and_can_be_turned_off(no_ranks):
    assert parsed(["collectives"])[1].cfg.check is True
    assert parsed(["collectives", "-c", "0"])[1].cfg.check is False
    assert parsed(["collectives", "--no-check"])[1].cfg.check is False
    assert parsed(["collectives", "--check"])[1].cfg.check is True


def test_lists_are_comma_separated_in_both_spellings(no_ranks):
    spaced, _ = parsed(["collectives", "--compare", "gloo,mpi", "--nprocs", "2,4", "--ops", "all_reduce,all_gather"])
    joined, _ = parsed(["collectives", "--compare=gloo,mpi", "--nprocs=2,4", "--ops=all_reduce,all_gather"])
    assert spaced.compare == joined.compare == ["gloo", "mpi"]
    assert spaced.nprocs == joined.nprocs == [2, 4]
    assert spaced.ops == joined.ops == ["all_reduce", "all_gather"]
    compare, plan = parsed(["compare", "--backends=gloo,mpi", "--nprocs", "2"])
    assert plan.backends == ("gloo", "mpi") and plan.world_sizes == (2,) and plan.side_by_side


def test_the_default_subcommand_takes_nccl_tests_flags_directly(no_ranks, monkeypatch):
    seen = {}
    monkeypatch.setattr(collectives_cli, "run", lambda args: seen.setdefault("args", args) and 0)
    assert cli.main(["-b", "1K", "-e", "1K", "--nprocs", "2"]) == 0
    assert seen["args"].command == "collectives" and seen["args"].minbytes == 1024


@pytest.mark.parametrize("argv, named", [
    (["--algorithms", "foo"], "--algorithms: unknown algorithm(s) 'foo'"),
    (["--algorithms", "native,native"], "--algorithms"),
    (["--compare", "gloo,foo"], "argument --compare: unknown backend 'foo'"),
    (["--compare=gloo,,mpi"], "argument --compare"),
    (["--backend", "infiniband"], "argument --backend: unknown backend 'infiniband'"),
    (["--nprocs", "0"], "argument --nprocs: 0 must be >= 1"),
    (["-b", "1M", "-e", "8"], "-b 1048576 is larger than -e 8"),
    (["-b", "8", "--sizes", "64B"], "--sizes '64B' and -b/-e"),
    (["--sizes", "8B:1XB"], "--sizes '8B:1XB': cannot read size '1XB'"),
    (["-f", "1"], "argument -f/--stepfactor/--factor: 1 must be >= 2"),
    (["-n", "0"], "argument -n/--iters: 0 must be >= 1"),
    (["-d", "complex64"], "argument -d/--datatype/--dtype: unknown dtype 'complex64'"),
    (["-o", "xor"], "argument -o/--op: unknown reduce op 'xor'"),
    (["--root", "4", "--nprocs", "4"], "--root 4 is not a rank of 4 ranks"),
    (["--ops", "allreduce"], "argument --ops: unknown collective 'allreduce'"),
    (["--json", "/no/such/folder/rows.json"], "--json '/no/such/folder/rows.json': the folder"),
    (["--timeout", "0"], "argument --timeout: 0 must be > 0"),
])
def test_bad_arguments_are_refused_before_any_rank_starts_naming_the_flag(argv, named, no_ranks, capsys):
    assert named in refusal(argv, capsys)


@pytest.mark.parametrize("variable, value, named", [
    ("ZEROCOMM_ALGORITHM", "foo", "ZEROCOMM_ALGORITHM='foo'"),
    ("ZEROCOMM_SEGMENT_BYTES", "lots", "ZEROCOMM_SEGMENT_BYTES='lots'"),
    (STANDIN_ENV, "tensorflow", f"{STANDIN_ENV}='tensorflow'"),
    ("RANK", "zero", "RANK='zero'"),
])
def test_bad_environment_values_are_refused_naming_the_variable(variable, value, named, no_ranks, monkeypatch, capsys):
    monkeypatch.setenv(variable, value)
    if variable == "RANK":
        monkeypatch.setenv("WORLD_SIZE", "2")
    assert named in refusal(["--nprocs", "2"], capsys)


def test_nccl_without_a_gpu_says_so(no_ranks, capsys):
    import torch

    if torch.version.cuda is not None and torch.cuda.device_count() > 0:
        pytest.skip(reason="this machine has a CUDA device: the refusal is for machines without one")
    error = refusal(["--backend", "nccl", "--nprocs", "2"], capsys)
    assert "--backend nccl needs CUDA" in error and "ZeroDivisionError" not in error
    assert "--device cuda needs CUDA" in refusal(["--device", "cuda", "--nprocs", "2"], capsys)


def test_a_missing_optional_package_names_its_extra(no_ranks, monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert "pip install 'zerocomm[bench]'" in refusal(["--plot", str(tmp_path / "p.png")], capsys)
    assert "pip install 'zerocomm[bench]'" in refusal(["zero", "--plot", str(tmp_path / "p.png"), "--small"], capsys)


def test_the_cli_imports_only_base_dependencies_at_module_level():
    """Third-party imports of the benchmarks package are base dependencies, except those imported
    inside a function behind a check that names their extra (matplotlib: --plot; mpi4py: MPI; cupy: the GPU)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {req.split(">")[0].split("=")[0].split("[")[0].strip() for req in project["dependencies"]}
    lazily_with_extra = {"matplotlib": "bench", "mpi4py": "mpi", "cupy": "cuda"}
    stdlib = set(sys.stdlib_module_names)
    for path in (ROOT / "benchmarks").glob("*.py"):
        tree = ast.parse(path.read_text())
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                if root in stdlib or root in base or root == "zerocomm":
                    continue
                assert root in lazily_with_extra, f"{path.name} imports {root}, which no base dependency installs"
                assert id(node) not in top_level, f"{path.name} imports {root} at module level"
                for extra in set(lazily_with_extra.values()):
                    assert extra in project["optional-dependencies"]


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main([command, "--help"])
    assert stopped.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_zero_takes_lists_comma_separated_and_still_reads_the_old_world_sizes_flag(no_ranks, monkeypatch):
    seen = []
    monkeypatch.setattr("zerocomm.benchmarks.zero_interleaved.main", lambda args, shape: seen.append(args) or 0)
    for argv in (["--nprocs", "2,4", "--only=ring,stage 3"], ["--nprocs=2,4", "--only", "ring,stage 3"],
                 ["--world-sizes", "2", "4", "--only", "ring,stage 3"], ["--world-sizes=2,4", "--only=ring,stage 3"]):
        assert zero_cli.main(["--small", "--interleave", "1", *argv]) == 0
        assert seen[-1].world_sizes == [2, 4] and seen[-1].only == ["ring", "stage 3"], argv
    assert "--world-sizes" not in cli.build_parser().format_help()


def _bench(*argv, timeout=150):
    done = subprocess.run([sys.executable, "-m", "zerocomm.benchmarks", *argv], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["gloo", pytest.param("mpi", marks=pytest.mark.skipif(STANDIN, reason=NO_MPI_REASON))])
def test_cli_prints_a_checked_row_for_every_op_and_nccl_tests_closing_lines(backend, tmp_path):
    json_path = tmp_path / "rows.json"
    stdout = _bench("--backend", backend, "--nprocs", "2", "-b", "64", "-e", "64", "-w", "1", "-n", "2",
                    "--json", str(json_path))
    lines = stdout.splitlines()
    assert any("nccl-tests" in line for line in lines if line.startswith("#")), stdout
    table = {line.split()[0] for line in lines if line and not line.startswith(("#", "-", "collective"))}
    assert table == set(units.COLLECTIVES), stdout
    closing = [line for line in lines if line.startswith(("# Out of bounds", "# Avg bus bandwidth"))]
    assert closing[0] == "# Out of bounds values : 0 OK", stdout  # checking is on by default
    assert closing[1].startswith("# Avg bus bandwidth    : ") and float(closing[1].split(":")[1]) > 0
    assert lines[-1].startswith("#   by algorithm") and lines[-2] == closing[1]

    data = json.loads(json_path.read_text())
    assert data["meta"]["world_size"] == 2 and data["meta"]["backend"] == backend and data["meta"]["check"]
    native = {row["collective"]: row for row in data["rows"] if row["algorithm"] == "native"}
    assert set(native) == set(units.COLLECTIVES)
    assert all(row["wrong"] == 0 and row["time_us"] > 0 for row in native.values())
    # every algorithm that ran got its result right
    assert all(row["wrong"] == 0 for row in data["rows"] if row["time_us"] is not None)


@pytest.mark.timeout(240)
@pytest.mark.skipif(STANDIN, reason=NO_MPI_REASON)
def test_compare_keeps_every_backends_rows(tmp_path):
    csv_path, json_path = tmp_path / "rows.csv", tmp_path / "rows.json"
    stdout = _bench("--compare=gloo,mpi", "--nprocs", "2", "--ops", "all_reduce", "--algorithms", "native,ring",
                    "-b", "64", "-e", "64", "-w", "1", "-n", "2", "--csv", str(csv_path), "--json", str(json_path),
                    timeout=200)
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((r["backend"], r["world_size"], r["algorithm"]) for r in rows) == [
        ("gloo", "2", "native"), ("gloo", "2", "ring"), ("mpi", "2", "native"), ("mpi", "2", "ring")]
    assert all(r["dtype"] == "float32" and r["op"] == "sum" and r["size"] == "64" and float(r["time_us"]) > 0
               for r in rows)
    assert {r["backend"] for r in json.loads(json_path.read_text())["rows"]} == {"gloo", "mpi"}
    assert "# Avg bus bandwidth    : " in stdout and "(mpi, 2 ranks)" in stdout and "(gloo, 2 ranks)" in stdout


def test_the_algorithm_check_accepts_exactly_what_comm_accepts():
    from zerocomm.benchmarks.target import check_algorithms, comm_module
    from zerocomm.comm.algorithms import ALGORITHM_CHOICES, COMPRESSED
    ALGORITHMS = [a for a in ALGORITHM_CHOICES if a not in COMPRESSED]  # 1-bit is all_reduce's compression=

    dist = comm_module()
    if STANDIN:
        pytest.skip(reason=f"{STANDIN_ENV}=torch: torch accepts only native")
    check_algorithms(dist, ALGORITHMS)
    with pytest.raises(ValueError, match="'foo'"):
        check_algorithms(dist, ["native", "foo"])


def test_zero_interleaved_measures_every_variant_in_the_same_ranks(tmp_path, capsys):
    """``zero --interleave``: one world runs DDP and ZeRO variants block by block (one of them keeping its
    optimizer state in files); the rows carry per-rotation ratios to DDP, and the variants trained alike
    (the same seeded model on the same batches)."""
    out = tmp_path / "rows.json"
    assert zero_cli.main(["--small", "--interleave", "2", "--repeat", "3", "--nprocs", "2", "--only",
                          "torch DDP,stage 2 native,stage 2 offload nvme", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "3 rotations of 2 steps" in printed and "allocator left at its defaults" in printed
    ddp, *zero = json.loads(out.read_text())
    assert [(row["variant"], row["algorithm"]) for row in [ddp, *zero]] == [
        ("torch DDP", "-"), ("zerocomm stage 2", "native"), ("zerocomm stage 2 offload nvme", "native")]
    assert ddp["× DDP"] == ddp["smallest × DDP"] == ddp["largest × DDP"] == "1.00"
    for row in zero:
        assert float(row["smallest × DDP"]) <= float(row["× DDP"]) <= float(row["largest × DDP"])
        assert float(row["step ms"]) > 0
        assert float(row["last loss (rank 0)"]) == pytest.approx(float(ddp["last loss (rank 0)"]), rel=1e-4)


@pytest.mark.parametrize("argv, words", [
    (["--interleave", "2", "--trace", "traces"], "--plot and --trace need the default mode"),
    (["--interleave", "-1"], "must be at least 1"),
    (["--interleave", "2", "--repeat", "0"], "argument --repeat: 0 must be >= 1"),
    (["--pin-mmap-threshold"], "--pin-mmap-threshold is for --interleave"),
])
def test_zero_interleaved_refuses_what_it_cannot_measure_before_any_rank_starts(no_ranks, capsys, argv, words):
    with pytest.raises(SystemExit) as stopped:
        zero_cli.main(["--small", *argv])
    assert stopped.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.timeout(180)
@pytest.mark.skipif(STANDIN, reason=NO_MPI_REASON)
def test_overhead_prints_every_variant_beside_its_peer_with_the_check_on_and_off(tmp_path):
    """``overhead`` end to end: per backend, every variant's per-call time beside the peer's, then the peer and the
    checked algorithms again with the mismatch check off; the ring's memory; the MPI waiting rank's CPU."""
    json_path = tmp_path / "overhead.json"
    stdout = _bench("overhead", "--iters", "100", "--json", str(json_path), timeout=170)
    results = json.loads(json_path.read_text())["results"]
    for backend, peer in (("mpi", "raw mpi4py Allreduce"), ("gloo", "torch.distributed gloo")):
        latency, rss, unchecked = results[backend]
        assert set(latency) == {peer, overhead.HANDLE_VARIANT, *(f"zerocomm {a}" for a in overhead.ALGORITHMS)}
        assert set(unchecked) == {peer, *(f"zerocomm {a}" for a in overhead.UNCHECKED)}
        assert all(us > 0 for us in [*latency.values(), *unchecked.values()]), results[backend]
        assert 0 <= rss["ring"] < 64, rss  # MiB: a 64 MiB all_reduce's ring keeps segments, not the tensor
        for title in ("blocking (median", "blocking, mismatch check off (median"):
            assert f"{backend}, 2 ranks, 8 B float32 all_reduce, {title}" in stdout, stdout
    assert "% of a core" in stdout and "load average at the end" in stdout


# --- help written for users ---------------------------------------------------------------------

def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stopped:
        cli.main([*argv, "--help"])
    assert stopped.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_each_subcommands_help_shows_its_own_usage_and_no_internals(command, capsys):
    """``zerocomm-bench COMMAND --help`` names the command in its usage line, describes it for users (not the
    module's docstring, with its double backquotes and pointers to other modules), and shows each flag once."""
    text = _help([command], capsys)
    assert text.startswith(f"usage: zerocomm-bench {command} "), text[:200]
    module = cli.command_module(command)
    for internal in ("``", "see ``", module.__doc__.strip().splitlines()[0]):
        assert internal not in text, (command, internal)
    assert "--world-sizes" not in text  # the old spelling of --nprocs is accepted but not shown


def test_the_top_level_help_lists_every_subcommand(capsys):
    text = _help([], capsys)
    assert text.startswith("usage: zerocomm-bench ") and "--peers" in text
    for command in cli.COMMANDS:
        assert f"\n    {command}" in text, command


def test_the_collectives_help_lists_the_choices_of_each_flag(capsys):
    from zerocomm.benchmarks.collectives import TORCH_DTYPES
    from zerocomm.benchmarks.options import BACKENDS
    from zerocomm.benchmarks.reference import REDUCE_OPS
    from zerocomm.comm.algorithms import ALGORITHM_CHOICES, COMPRESSED

    text = " ".join(_help(["collectives"], capsys).split())  # unwrapped
    assert f"communication backend: {', '.join(BACKENDS)}" in text
    assert f"element type: {', '.join(TORCH_DTYPES)}" in text and f"reduction op: {', '.join(REDUCE_OPS)}" in text
    algorithms = text.split("algorithms compared side by side: ")[1].split(" (default")[0]
    assert algorithms.split(", ") == sorted((a for a in ALGORITHM_CHOICES if a not in COMPRESSED),
                                           key=algorithms.split(", ").index)
    assert set(algorithms.split(", ")) == {a for a in ALGORITHM_CHOICES if a not in COMPRESSED}


@pytest.mark.parametrize("command", ["collectives", "compare", "tune", "compression", "zero", "soak", "check-cost",
                                     "shm"])  # the commands that take world sizes
def test_world_sizes_are_nprocs_everywhere(command, capsys):
    assert "--nprocs N" in _help([command], capsys)


def test_tune_still_reads_the_old_world_sizes_flag():
    parser = cli.build_parser()
    assert parser.parse_args(["tune", "--world-sizes", "2,4"]).world_sizes == [2, 4]
    assert parser.parse_args(["tune", "--nprocs", "2,4"]).world_sizes == [2, 4]


# --- --peers: zerocomm's default algorithm beside torch's gloo and MPICH ----------------------------------

@pytest.mark.parametrize("argv, named", [
    (["--peers", "--compare", "gloo,mpi"], "--peers and --compare"),
    (["--peers", "-d", "bfloat16"], "--dtype bfloat16: with --peers, MPICH measures"),
    (["--peers", "--device", "cuda"], "--peers runs torch's gloo and MPICH on CPU"),
])
def test_peers_refuses_what_its_peers_cannot_run(argv, named, no_ranks, capsys):
    assert named in refusal(argv, capsys)


def test_peers_runs_zerocomms_default_algorithm(no_ranks):
    assert parsed(["collectives", "--peers"])[1].cfg.algorithms == ("auto",)
    assert parsed(["collectives", "--peers", "--algorithms", "auto,ring"])[1].cfg.algorithms == ("auto", "ring")


@pytest.mark.timeout(240)
@pytest.mark.skipif(STANDIN, reason=NO_MPI_REASON)
def test_peers_puts_zerocomm_torch_gloo_and_mpich_side_by_side_every_result_checked(tmp_path):
    """Three worlds of 2 ranks (zerocomm's default algorithm on gloo, torch's own gloo, MPICH through mpi4py) run
    every collective at 64 B with the numpy check on; one table shows each one's time and the speed-ups."""
    csv_path = tmp_path / "rows.csv"
    stdout = _bench("--peers", "--nprocs", "2", "-b", "64", "-e", "64", "-w", "1", "-n", "2", "--csv", str(csv_path),
                    timeout=230)
    with open(csv_path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted({(r["target"], r["algorithm"]) for r in rows}) == [
        ("MPICH", "native"), ("torch gloo", "native"), ("zerocomm gloo", "auto")]
    for target in ("MPICH", "torch gloo", "zerocomm gloo"):
        mine = [r for r in rows if r["target"] == target]
        assert {r["collective"] for r in mine} == set(units.COLLECTIVES), target
        assert all(r["wrong"] == "0" and float(r["time_us"]) > 0 for r in mine), mine
    header = next(line for line in stdout.splitlines() if line.startswith("collective"))
    assert header.split() == ["collective", "n", "size", "zerocomm", "gloo", "auto", "(µs)", "torch", "gloo", "(µs)",
                              "MPICH", "(µs)", "x", "vs", "torch", "gloo", "x", "vs", "MPICH"]
    for target in ("zerocomm gloo", "torch gloo", "MPICH"):
        assert f"# Out of bounds values : 0 OK ({target}, 2 ranks)" in stdout, stdout
