"""``zerocomm-bench zero``: registers ``zero_bench`` (the ZeRO benchmark, its own module and parser)
as a subcommand, and speaks the command line's comma convention to it.

``zero_bench`` reads several values as separate words (``--world-sizes 2 4``); here
``--world-sizes 2,4`` (or ``--world-sizes=2,4``) is accepted too and split before it parses, so
every subcommand takes lists the same way.  Its options and ``--help`` are its own.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

HELP = "ZeRO stages against torch DDP, ZeroRedundancyOptimizer and FSDP2 (see zero --help)"

#: The command line is handed to zero_bench unparsed (its parser, its --help).
PASSTHROUGH = True

#: zero_bench's options that take several values (nargs="+").
LIST_OPTIONS = ("--world-sizes", "--only")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Nothing: ``zero_bench`` parses its own options (see ``PASSTHROUGH``)."""


def split_lists(argv: Sequence[str]) -> list[str]:
    """``argv`` with the comma-separated values of ``LIST_OPTIONS`` split into separate words."""
    out: list[str] = []
    expecting = False
    for item in argv:
        name, eq, value = item.partition("=")
        if name in LIST_OPTIONS and eq:
            out += [name, *value.split(",")]
            expecting = False
        elif expecting and not item.startswith("-"):
            out += [part for part in item.split(",") if part]
        else:
            out.append(item)
            expecting = item in LIST_OPTIONS
    return out


def main(argv: Sequence[str]) -> int:
    argv = split_lists(argv)
    if any(item == "--plot" or item.startswith("--plot=") for item in argv):
        from .options import UsageError, require

        try:  # zero_bench imports matplotlib only when it draws, after every variant ran
            require("matplotlib", "--plot", "bench")
        except UsageError as exc:
            print(f"zerocomm-bench zero: error: {exc}", file=sys.stderr)
            return 2
    from . import zero_bench

    return zero_bench.main(argv)
