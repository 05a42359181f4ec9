"""``zerocomm-bench collectives`` (the default subcommand): the collective microbenchmark.

It checks every option and the environment in this process, starts the ranks (see ``launch``),
has each run the sweep of ``collectives``, and rank 0 alone prints the table and writes
``--json``/``--csv``/``--plot``.  nccl-tests' flags work as there (``-b 8 -e 64M -f 2 -n 20 -w 5
-c 1``), and the output ends with its ``# Out of bounds values`` and ``# Avg bus bandwidth`` lines.
With ``--compare gloo,mpi`` or several ``--nprocs`` it runs one world per (backend, world size)
(see ``compare``).  Exit status: 0; 1 when a rank failed or the check found a wrong element;
2 for a bad argument or environment value, before any rank started.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Optional

from . import compare, launch, report
from .compare import child_argv
from .collectives import TORCH_DTYPES, SweepConfig, run_sweep, sweep_plan
from .options import (BACKENDS, UsageError, choice, list_of, non_negative_int, positive_float, positive_int,
                      require, step_factor)
from .reference import REDUCE_OPS
from .target import (STANDIN_ENV, check_algorithms, check_comm_environment, check_cuda, comm_module,
                     default_algorithms, is_standin, target_name)
from .units import COLLECTIVES, canonical_collective, parse_size, size_sweep

HELP = "collective microbenchmark with nccl-tests' conventions and flags (the default)"

DESCRIPTION = """\
Times every collective at every size with each algorithm, on local ranks it starts itself (or on
the ranks of torchrun / mpiexec), and prints one row per (collective, size, algorithm):

  size          S, the whole buffer as nccl-tests counts it (all_gather: the gathered output)
  time (µs)     one call, averaged over -n back-to-back calls after -w warm-up calls; the slowest rank
  algbw, busbw  S / time, and busbw = algbw x the collective's factor (GB/s), comparable with a link
  #wrong        elements that differ from a numpy reference (-c 1, the default)

It ends with nccl-tests' lines "# Out of bounds values : 0 OK" and "# Avg bus bandwidth : X".

Examples:
  zerocomm-bench --nprocs 4 --peers --ops all_reduce,all_gather,reduce_scatter
  zerocomm-bench --nprocs 2 --ops all_reduce -b 8 -e 64M -f 2 -n 20 -w 5 -c 1
  zerocomm-bench --compare gloo,mpi --nprocs 2,4 --algorithms native,ring
  mpiexec -n 4 zerocomm-bench --backend mpi

Lists are comma-separated (--nprocs 2,4).  Exit status: 0; 1 when a rank failed or a result was
wrong; 2 for a bad argument or ZEROCOMM_* value, refused before any rank starts.
"""

DEFAULT_NPROCS = 4
# A short sweep (8 B to 16 MiB in 8 steps): the README's command, 4 ranks and three algorithms,
# finishes in well under a minute on 2 cores.
DEFAULT_SIZES = "8B:16MiB"
DEFAULT_FACTOR = 8

#: nccl-tests' names (-d, -o) for what torch calls otherwise.
NCCL_DTYPE_NAMES = {"float": "float32", "double": "float64", "half": "float16", "bf16": "bfloat16"}
NCCL_OP_NAMES = {"prod": "product"}


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _collective(text: str) -> str:
    try:
        return canonical_collective(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_world_arguments(parser: argparse.ArgumentParser) -> None:
    """Which ranks run: the options ``collectives`` and ``compare`` share besides the measurement's."""
    parser.add_argument("--backend", default="gloo", type=choice(BACKENDS, "backend"), metavar="BACKEND",
                        help=f"communication backend: {', '.join(BACKENDS)} (default: gloo)")
    parser.add_argument("--nprocs", type=list_of(positive_int, "world size"), default=None, metavar="N[,N...]",
                        help=f"ranks to start locally (default: {DEFAULT_NPROCS}); several (2,4) run one world "
                             "each, side by side")


def add_measure_arguments(parser: argparse.ArgumentParser) -> None:
    """What each world measures and writes (nccl-tests' short flags where it has one)."""
    parser.add_argument("--ops", type=list_of(_collective, "collective"), default=list(COLLECTIVES),
                        metavar="OP[,OP...]",
                        help="collectives (default: all eight); torch's tensor-form names such as "
                             "all_gather_into_tensor are accepted")
    parser.add_argument("--algorithms", type=list_of(str, "algorithm"), default=None, metavar="ALG[,ALG...]",
                        help="algorithms compared side by side: auto, native, ring, tree, recursive_doubling, shm, "
                             "hierarchical (default: native,ring,tree; auto with --peers)")
    sizes = parser.add_argument_group("sizes (S, nccl-tests' definition; K/M/G are binary, KB/MB/GB decimal)")
    sizes.add_argument("--sizes", default=None, metavar="SPEC",
                       help=f"ranges lo:hi and single sizes, comma-separated (default: {DEFAULT_SIZES}); "
                            "not with -b/-e")
    sizes.add_argument("-b", "--minbytes", type=_size, default=None, metavar="SIZE",
                       help="smallest S, as nccl-tests' -b (default: -e's value)")
    sizes.add_argument("-e", "--maxbytes", type=_size, default=None, metavar="SIZE",
                       help="largest S, as nccl-tests' -e (default: -b's value)")
    sizes.add_argument("-f", "--stepfactor", "--factor", dest="factor", type=step_factor, default=DEFAULT_FACTOR,
                       metavar="F", help=f"multiply S by F between steps (default: {DEFAULT_FACTOR})")
    timing = parser.add_argument_group("timing and checking")
    timing.add_argument("-w", "--warmup_iters", "--warmup", dest="warmup", type=non_negative_int, default=5,
                        metavar="N", help="untimed calls per cell (default: 5)")
    timing.add_argument("-n", "--iters", type=positive_int, default=20, metavar="N",
                        help="timed back-to-back calls per cell (default: 20)")
    timing.add_argument("-c", "--check", type=non_negative_int, nargs="?", const=1, default=1, metavar="0|1",
                        help="check each cell's first result against a numpy reference: 1 (default) or 0")
    timing.add_argument("--no-check", dest="check", action="store_const", const=0, help="same as -c 0")
    parser.add_argument("-d", "--datatype", "--dtype", dest="dtype", default="float32",
                        type=choice(TORCH_DTYPES, "dtype", NCCL_DTYPE_NAMES), metavar="DTYPE",
                        help=f"element type: {', '.join(TORCH_DTYPES)} (nccl-tests' float, half, double too; "
                             "default: float32)")
    parser.add_argument("-o", "--op", default="sum", type=choice(REDUCE_OPS, "reduce op", NCCL_OP_NAMES),
                        metavar="OP", help=f"reduction op: {', '.join(REDUCE_OPS)} (default: sum)")
    parser.add_argument("-r", "--root", type=non_negative_int, default=0, metavar="RANK",
                        help="root rank of rooted collectives (default: 0)")
    parser.add_argument("--in-place", action="store_true",
                        help="all_gather into / reduce_scatter out of this rank's chunk of the big buffer")
    parser.add_argument("--device", default=None, type=choice(("cpu", "cuda"), "device"), metavar="{cpu,cuda}",
                        help="buffer device (default: cuda for nccl, else cpu)")
    parser.add_argument("--threads", type=positive_int, default=1, metavar="N",
                        help="torch intra-op threads per rank (default: 1, as ranks share the cores)")
    parser.add_argument("--timeout", type=positive_float, default=300.0, metavar="SECONDS",
                        help="process group timeout in seconds (default: 300)")
    out = parser.add_argument_group("output (rank 0)")
    out.add_argument("--json", metavar="PATH", help="write metadata and rows as JSON")
    out.add_argument("--csv", metavar="PATH", help="write rows as CSV")
    out.add_argument("--plot", metavar="PNG", help="draw busbw against size (needs zerocomm[bench])")
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("Under torchrun or mpiexec the launcher's ranks are used and --nprocs is ignored. "
                     f"{STANDIN_ENV}=torch measures torch.distributed instead of zerocomm.comm "
                     f"({STANDIN_ENV}=mpi4py: MPICH, with --backend mpi).")
    add_world_arguments(parser)
    parser.add_argument("--compare", type=list_of(choice(BACKENDS, "backend"), "backend"), default=None,
                        metavar="B[,B...]",
                        help=f"run these backends ({', '.join(BACKENDS)}) side by side and print ratios to each "
                             "backend's native and to the first backend's native; replaces --backend")
    parser.add_argument("--peers", action="store_true",
                        help="run the same sweep on torch.distributed's own gloo and on MPICH (mpi4py), each "
                             "in a world of its own, and print their times beside zerocomm's (its default "
                             "algorithm, auto, unless --algorithms) with the speed-up; needs zerocomm[mpi]")
    add_measure_arguments(parser)


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything a run needs, checked before any rank starts."""

    cfg: SweepConfig
    dist: ModuleType
    backends: tuple[str, ...]
    world_sizes: tuple[int, ...]
    launched: Optional[launch.Launched]
    peers: bool = False

    @property
    def side_by_side(self) -> bool:
        return len(self.backends) > 1 or len(self.world_sizes) > 1


def _sizes(args: argparse.Namespace) -> list[int]:
    if args.sizes is not None and (args.minbytes is not None or args.maxbytes is not None):
        raise UsageError(f"--sizes {args.sizes!r} and -b/-e both name the sizes; pass one or the other")
    if args.minbytes is not None or args.maxbytes is not None:
        low = args.minbytes if args.minbytes is not None else args.maxbytes
        high = args.maxbytes if args.maxbytes is not None else args.minbytes
        if low > high:
            raise UsageError(f"-b {low} is larger than -e {high}")
        return size_sweep(f"{low}:{high}", args.factor)
    try:
        return size_sweep(args.sizes or DEFAULT_SIZES, args.factor)
    except ValueError as exc:
        raise UsageError(f"--sizes {args.sizes!r}: {exc}") from None


def _check_output(flag: str, path: Optional[str]) -> None:
    folder = os.path.dirname(os.path.abspath(path)) if path else None
    if folder and not os.path.isdir(folder):
        raise UsageError(f"{flag} {path!r}: the folder {folder!r} does not exist")


def plan(args: argparse.Namespace, backends: Optional[list[str]] = None) -> Plan:
    """Check the options and the environment, in this process; raise ``UsageError`` naming the bad one."""
    try:
        dist = comm_module()
        launched = launch.detect_launcher(os.environ)
        if not is_standin(dist):
            check_comm_environment(dist)
    except (ValueError, RuntimeError) as exc:
        raise UsageError(str(exc)) from None
    backends = tuple(backends or [args.backend])
    world_sizes = tuple(args.nprocs or [DEFAULT_NPROCS])
    peers = getattr(args, "peers", False)
    if peers:
        _check_peers(args, launched)
    algorithms = tuple(args.algorithms) if args.algorithms else ("auto",) if peers else default_algorithms(dist)
    try:
        check_algorithms(dist, algorithms)
    except ValueError as exc:
        raise UsageError(f"--algorithms: {exc}") from None
    if len(set(algorithms)) != len(algorithms):
        raise UsageError(f"--algorithms {','.join(algorithms)} repeats an algorithm")
    device = args.device or ("cuda" if backends == ("nccl",) else "cpu")
    if len({b == "nccl" for b in backends}) > 1 and args.device is None:
        raise UsageError(f"--compare {','.join(backends)} mixes nccl (cuda buffers) with CPU backends; "
                         f"pass --device cuda to run every backend on the GPU")
    try:
        cfg = SweepConfig(collectives=tuple(args.ops), algorithms=algorithms, sizes=tuple(_sizes(args)),
                          dtype=args.dtype, op=args.op, root=args.root, warmup=args.warmup, iters=args.iters,
                          check=bool(args.check), in_place=args.in_place, device=device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if launched is not None:
        if len(backends) > 1 or len(world_sizes) > 1:
            raise UsageError(f"under {launched.launcher} one world runs: pass one --backend and no --compare "
                             f"or list of --nprocs")
        world_sizes = (launched.world_size,)
    if cfg.root >= min(world_sizes):
        raise UsageError(f"--root {cfg.root} is not a rank of {min(world_sizes)} ranks")
    if target_name() == "mpi4py":
        _check_mpi4py_standin(cfg, backends)
    for backend in backends:
        if backend == "mpi" and is_standin(dist) and not dist.is_mpi_available():
            raise UsageError("this torch build has no MPI backend; benchmark zerocomm.comm (unset "
                             f"{STANDIN_ENV}, now {target_name()!r}) or use --backend gloo")
        if backend == "mpi":
            require("mpi4py", "--backend mpi", "mpi")
            if launched is None:
                try:
                    launch.find_mpiexec()
                except FileNotFoundError as exc:
                    raise UsageError(f"--backend mpi: {exc}") from None
        if backend == "nccl" or device == "cuda":
            local = 1 if launched is not None else max(world_sizes)
            try:
                check_cuda(backend, device, local)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    if args.plot:
        require("matplotlib", "--plot", "bench")
    for flag in ("json", "csv", "plot"):
        _check_output(f"--{flag}", getattr(args, flag))
    return Plan(cfg, dist, backends, world_sizes, launched, peers)


def _check_peers(args: argparse.Namespace, launched: Optional[launch.Launched]) -> None:
    """``--peers`` starts torch's gloo and MPICH worlds of its own, on CPU, beside zerocomm's."""
    if args.compare:
        raise UsageError("--peers and --compare both choose what runs beside zerocomm; pass one of them")
    if launched is not None:
        raise UsageError(f"--peers starts its own worlds; run it without {launched.launcher}")
    if target_name() != "zerocomm":
        raise UsageError(f"--peers measures zerocomm.comm beside its peers; unset {STANDIN_ENV} "
                         f"(now {target_name()!r})")
    if args.backend == "nccl" or args.device == "cuda":
        raise UsageError("--peers runs torch's gloo and MPICH on CPU tensors; pass --backend gloo or mpi "
                         "and no --device cuda")
    from .mpi4py_standin import DTYPES

    if args.dtype not in DTYPES:
        raise UsageError(f"--dtype {args.dtype}: with --peers, MPICH measures {', '.join(DTYPES)}")
    require("mpi4py", "--peers", "mpi")
    try:
        launch.find_mpiexec()
    except FileNotFoundError as exc:
        raise UsageError(f"--peers: {exc}") from None


def _check_mpi4py_standin(cfg: SweepConfig, backends: tuple[str, ...]) -> None:
    from .mpi4py_standin import DTYPES

    if backends != ("mpi",):
        raise UsageError(f"{STANDIN_ENV}=mpi4py runs only --backend mpi, not {','.join(backends)}")
    if cfg.dtype not in DTYPES:
        raise UsageError(f"--dtype {cfg.dtype}: the mpi4py stand-in measures {', '.join(DTYPES)}")


def _metadata(args: argparse.Namespace, cfg: SweepConfig, dist: ModuleType, world_size: int) -> dict:
    import torch

    return {
        "target": dist.__name__ if is_standin(dist) else "zerocomm.comm",
        "backend": str(dist.get_backend()),
        "world_size": world_size,
        "collectives": list(cfg.collectives),
        "algorithms": list(cfg.algorithms),
        "dtype": cfg.dtype,
        "op": cfg.op,
        "root": cfg.root,
        "warmup": cfg.warmup,
        "iters": cfg.iters,
        "check": cfg.check,
        "in_place": cfg.in_place,
        "device": cfg.device,
        "threads": args.threads,
        "timing": report.TIMING_CONVENTION,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _progress(enabled: bool, total: int) -> tuple[Callable, Callable[[], None]]:
    """(on_row, close) of a tqdm bar on stderr; tqdm itself stays quiet when stderr is no terminal."""
    from tqdm import tqdm

    bar = tqdm(total=total, file=sys.stderr, desc="collectives", unit="cell", leave=False,
               disable=None if enabled else True)

    def on_row(row) -> None:
        bar.set_postfix_str(f"{row.collective} {row.algorithm} {row.size} B", refresh=False)
        bar.update(1)

    return on_row, bar.close


def run_rank(args: argparse.Namespace, cfg: SweepConfig, dist: ModuleType, spec: launch.InitSpec) -> int:
    """One rank's whole run: join the group, sweep, and (rank 0) report.  Same status on every rank."""
    import torch

    # torch 2.13 deprecates the tensor-form names in favour of *_single ones; they are the
    # drop-in API zerocomm keeps, so the warning is noise on every call of the stand-in.
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    torch.set_num_threads(args.threads)
    if cfg.device == "cuda":
        torch.cuda.set_device(spec.local_rank % torch.cuda.device_count())
    dist.init_process_group(**spec.kwargs(), timeout=datetime.timedelta(seconds=args.timeout))
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if not 0 <= cfg.root < world_size:
            raise ValueError(f"--root {cfg.root} is not a rank of this group of {world_size} ranks")
        lead = rank == 0
        on_row, close = _progress(lead and not args.no_progress,
                                  len(sweep_plan(cfg, world_size)) * len(cfg.algorithms))
        try:
            rows = list(run_sweep(dist, cfg, on_row))
        finally:
            close()
        if lead:
            write_report(args, cfg, rows, _metadata(args, cfg, dist, world_size))
        wrong = sum(row.wrong or 0 for row in rows)
        return 1 if wrong else 0
    finally:
        dist.destroy_process_group()


def write_report(args: argparse.Namespace, cfg: SweepConfig, rows: list, meta: dict) -> None:
    show_ratio = "native" in cfg.algorithms and len(cfg.algorithms) > 1
    text = [*report.header_lines(meta), report.format_table(rows, check=cfg.check, show_ratio=show_ratio),
            *report.summary_lines(rows, check=cfg.check)]
    print("\n".join(text), flush=True)
    if args.json:
        report.write_json(args.json, meta, rows)
    if args.csv:
        report.write_csv(args.csv, rows, meta)
    if args.plot:
        compare.plot(report.rows_as_dicts(rows, meta), args.plot)


def run(args: argparse.Namespace) -> int:
    """The ``collectives`` subcommand."""
    checked = plan(args, args.compare)
    if checked.peers:
        return compare.run_peers(args, checked)
    if checked.side_by_side or args.compare:
        return compare.run_worlds(args, checked)
    cfg, dist, backend = checked.cfg, checked.dist, checked.backends[0]

    def body(spec: launch.InitSpec) -> int:
        return run_rank(args, cfg, dist, spec)

    launched = checked.launched
    if launched is not None:
        if args.nprocs is not None and args.nprocs != [launched.world_size] and launched.rank == 0:
            print(f"# --nprocs {','.join(map(str, args.nprocs))} ignored: {launched.launcher} started "
                  f"{launched.world_size} ranks", file=sys.stderr)
        return body(launch.launched_spec(launched, backend))
    nprocs = checked.world_sizes[0]
    if backend == "mpi":
        outputs = {"json": args.json, "csv": args.csv, "plot": args.plot}
        return launch.relaunch_under_mpiexec(
            nprocs, child_argv(args, cfg, backend, nprocs, outputs=outputs, progress=not args.no_progress))
    return launch.run_forked(nprocs, backend, body)
