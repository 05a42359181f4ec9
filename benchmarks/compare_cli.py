"""``zerocomm-bench compare``: several backends and world sizes side by side (``collectives --compare``).

Its options are the collectives benchmark's measurement options with ``--backends`` and ``--nprocs``; it runs
as ``zerocomm-bench collectives --compare`` does (``compare.py`` runs the worlds and merges their rows).
"""
from __future__ import annotations

import argparse

from .collectives_cli import add_measure_arguments
from .collectives_cli import run as run_collectives
from .options import BACKENDS, choice, list_of, positive_int

HELP = "several backends and world sizes side by side, with ratios (= collectives --compare)"

DESCRIPTION = """\
Runs the collective benchmark once per (backend, world size), each world on its own, one after
another, and prints one table of every row with two ratios of busbw (above 1: faster):

  vs native              over the same backend's own collective at the same size
  vs <first> native      over the first backend's own collective (e.g. zerocomm's ring on MPI
                         against gloo's all_reduce)

then nccl-tests' closing lines for each world.  --json and --csv keep every world's rows with
their backend and world size; --plot draws busbw against size, one panel per (collective, n).

Example:
  zerocomm-bench compare --backends gloo,mpi --nprocs 2,4 --ops all_reduce --algorithms native,ring

'zerocomm-bench collectives --compare gloo,mpi' is the same.  To set zerocomm beside torch's own
gloo and MPICH instead, use 'zerocomm-bench --peers'.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", dest="compare", default=["gloo", "mpi"],
                        type=list_of(choice(BACKENDS, "backend"), "backend"), metavar="B[,B...]",
                        help=f"backends ({', '.join(BACKENDS)}); the first is the baseline of the ratios "
                             "(default: gloo,mpi)")
    parser.add_argument("--nprocs", type=list_of(positive_int, "world size"), default=[2, 4], metavar="N[,N...]",
                        help="world sizes (default: 2,4)")
    parser.set_defaults(backend="gloo")
    add_measure_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return run_collectives(args)
