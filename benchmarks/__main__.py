"""``zerocomm-bench`` / ``python -m zerocomm.benchmarks``: the command line.

``zerocomm-bench [collectives] [options]`` runs the collective microbenchmark (the
default subcommand): it starts the ranks (see ``launch``), has each run the sweep of
``collectives``, and rank 0 alone prints the table and writes ``--json``/``--csv``.
Exit status: 0, or 1 when a rank failed or ``--check`` found a wrong element.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import warnings
from types import ModuleType
from typing import Callable, Optional, Sequence

from . import launch, report
from .collectives import TORCH_DTYPES, SweepConfig, run_sweep, sweep_plan
from .reference import REDUCE_OPS
from .target import comm_module, default_algorithms, is_standin, target_name
from .units import COLLECTIVES, canonical_collective, size_sweep

DEFAULT_NPROCS = 4
# A short sweep (8 B to 16 MiB in 8 steps): the README's command, 4 ranks and three algorithms,
# finishes in well under a minute on 2 cores.
DEFAULT_SIZES = "8B:16MiB"
DEFAULT_FACTOR = 8


def _csv_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def collectives_parser(prog: str = "zerocomm-bench") -> argparse.ArgumentParser:
    """The options of the collectives microbenchmark."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Collective microbenchmark of zerocomm.comm (nccl-tests conventions: "
                    "S, algbw, busbw; averaged back-to-back calls; max over ranks).",
        epilog="Under torchrun or mpiexec the launcher's ranks are used and --nprocs is ignored. "
               "ZEROCOMM_BENCH_STANDIN=torch measures torch.distributed instead of zerocomm.comm.",
    )
    parser.add_argument("--backend", default="gloo", choices=("gloo", "mpi", "nccl"),
                        help="communication backend (default: gloo)")
    parser.add_argument("--nprocs", type=int, default=None,
                        help=f"ranks to start locally (default: {DEFAULT_NPROCS})")
    parser.add_argument("--ops", default=",".join(COLLECTIVES),
                        help="comma-separated collectives (default: all eight); torch's tensor-form "
                             "names such as all_gather_into_tensor are accepted")
    parser.add_argument("--algorithms", default=None,
                        help="comma-separated algorithms compared side by side, e.g. native,ring,tree "
                             "(default: native,ring,tree on zerocomm, native on the torch stand-in)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES,
                        help=f"S values: ranges lo:hi and single sizes, comma-separated (default: {DEFAULT_SIZES})")
    parser.add_argument("--factor", type=int, default=DEFAULT_FACTOR,
                        help=f"step factor of size ranges (default: {DEFAULT_FACTOR})")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per cell (default: 5)")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per cell (default: 20)")
    parser.add_argument("--dtype", default="float32", choices=tuple(TORCH_DTYPES), help="element type (default: float32)")
    parser.add_argument("--op", default="sum", choices=REDUCE_OPS, help="reduction op (default: sum)")
    parser.add_argument("--root", type=int, default=0, help="root rank of rooted collectives (default: 0)")
    parser.add_argument("--check", action="store_true", help="validate each result against a numpy reference")
    parser.add_argument("--in-place", action="store_true",
                        help="all_gather into / reduce_scatter out of this rank's chunk of the big buffer")
    parser.add_argument("--device", default=None, choices=("cpu", "cuda"),
                        help="buffer device (default: cuda for nccl, else cpu)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per rank (default: 1, as ranks share the cores)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="process group timeout in seconds (default: 300)")
    parser.add_argument("--json", metavar="PATH", help="write metadata and rows as JSON (rank 0)")
    parser.add_argument("--csv", metavar="PATH", help="write rows as CSV (rank 0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--plot", metavar="PNG", help="write busbw against size, one line per algorithm (rank 0)")
    parser.add_argument("--compare", metavar="BACKENDS",
                        help="run these backends side by side (e.g. gloo,mpi; --nprocs may list sizes, e.g. 2,4) "
                             "and print ratios to each backend's native and to the first backend's native")
    return parser


def _sweep_config(args: argparse.Namespace, parser: argparse.ArgumentParser, dist: ModuleType) -> SweepConfig:
    """The sweep the options ask for; a malformed option ends the program with its message."""
    try:
        collectives = tuple(dict.fromkeys(canonical_collective(name) for name in _csv_list(args.ops)))
        algorithms = tuple(_csv_list(args.algorithms)) if args.algorithms else default_algorithms(dist)
        if is_standin(dist) and set(algorithms) != {"native"}:
            raise ValueError(f"the torch stand-in has only the 'native' algorithm, not {list(algorithms)}")
        return SweepConfig(
            collectives=collectives, algorithms=algorithms,
            sizes=tuple(size_sweep(args.sizes, args.factor)), dtype=args.dtype, op=args.op,
            root=args.root, warmup=args.warmup, iters=args.iters, check=args.check, in_place=args.in_place,
            device=args.device or ("cuda" if args.backend == "nccl" else "cpu"),
        )
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def _metadata(args: argparse.Namespace, cfg: SweepConfig, dist: ModuleType, world_size: int) -> dict:
    import torch

    return {
        "target": "torch.distributed" if is_standin(dist) else "zerocomm.comm",
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
            _write_report(args, cfg, rows, _metadata(args, cfg, dist, world_size))
        wrong = sum(row.wrong or 0 for row in rows)
        return 1 if wrong else 0
    finally:
        dist.destroy_process_group()


def _write_report(args: argparse.Namespace, cfg: SweepConfig, rows: list, meta: dict) -> None:
    show_ratio = "native" in cfg.algorithms and len(cfg.algorithms) > 1
    text = [*report.header_lines(meta), report.format_table(rows, check=cfg.check, show_ratio=show_ratio),
            *report.summary_lines(rows, check=cfg.check)]
    print("\n".join(text), flush=True)
    if args.json:
        report.write_json(args.json, meta, rows)
    if args.csv:
        report.write_csv(args.csv, rows)
    if args.plot:
        from .compare import plot
        plot([{**record, "backend": meta["backend"], "world_size": meta["world_size"]}
              for record in report.rows_as_dicts(rows)], args.plot)


def collectives_main(argv: Sequence[str]) -> int:
    """The ``collectives`` subcommand; ``argv`` are its options."""
    argv = list(argv)
    if "--compare" in argv:  # several worlds side by side: the compare subcommand runs them
        at = argv.index("--compare")
        if at + 1 >= len(argv):
            collectives_parser().error("--compare needs a comma-separated list of backends")
        backends = argv[at + 1]
        rest = argv[:at] + argv[at + 2:]
        rest = [item for item in rest if not item.startswith("--backend=")]
        if "--backend" in rest:
            index = rest.index("--backend")
            del rest[index:index + 2]
        return compare_main(["--backends", backends, *rest])
    parser = collectives_parser()
    args = parser.parse_args(list(argv))
    if args.nprocs is not None and args.nprocs < 1:
        parser.error(f"--nprocs must be >= 1, got {args.nprocs}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    try:
        dist = comm_module()
        launched = launch.detect_launcher(os.environ)
    except (ValueError, RuntimeError) as exc:
        parser.error(str(exc))
    cfg = _sweep_config(args, parser, dist)
    if args.backend == "mpi" and is_standin(dist) and not dist.is_mpi_available():
        parser.error("this torch build has no MPI backend; benchmark zerocomm.comm "
                     f"(unset ZEROCOMM_BENCH_STANDIN, now {target_name()!r}) or use --backend gloo")

    def body(spec: launch.InitSpec) -> int:
        return run_rank(args, cfg, dist, spec)

    if launched is not None:
        if args.nprocs is not None and args.nprocs != launched.world_size and launched.rank == 0:
            print(f"# --nprocs {args.nprocs} ignored: {launched.launcher} started "
                  f"{launched.world_size} ranks", file=sys.stderr)
        return body(launch.launched_spec(launched, args.backend))
    nprocs = args.nprocs or DEFAULT_NPROCS
    if not 0 <= args.root < nprocs:
        parser.error(f"--root {args.root} is not a rank of {nprocs} ranks")
    if args.backend == "mpi":
        return launch.relaunch_under_mpiexec(nprocs, ["collectives", *argv])
    return launch.run_forked(nprocs, args.backend, body)


def tune_main(argv: Sequence[str]) -> int:
    """The ``tune`` subcommand: measure every algorithm and write ``comm/auto_table.json``."""
    from . import tune
    return tune.main(list(argv))


def compression_main(argv: Sequence[str]) -> int:
    """The ``compression`` subcommand: compressed vs uncompressed all_reduce, bytes and time."""
    from . import compression
    return compression.main(list(argv))


def compare_main(argv: Sequence[str]) -> int:
    """The ``compare`` subcommand: several backends and world sizes side by side, with ratios."""
    from . import compare
    return compare.main(list(argv))


def zero_main(argv: Sequence[str]) -> int:
    """The ``zero`` subcommand: ZeRO stages against torch DDP / ZeroRedundancyOptimizer / FSDP2."""
    from . import zero_bench
    return zero_bench.main(list(argv))


SUBCOMMANDS = {"collectives": collectives_main, "compare": compare_main, "tune": tune_main,
               "compression": compression_main, "zero": zero_main}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``zerocomm-bench``: dispatch to a subcommand (default ``collectives``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: zerocomm-bench [{'|'.join(SUBCOMMANDS)}] [options]  "
              f"(default subcommand: collectives)\n")
    return collectives_main(argv)


if __name__ == "__main__":
    sys.exit(main())
