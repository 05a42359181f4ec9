"""``zerocomm-bench``: one ``argparse`` parser with a subparser per subcommand.

A subcommand is a module of this package with

* ``HELP``: one line for ``zerocomm-bench --help``;
* ``DESCRIPTION``: what ``zerocomm-bench COMMAND --help`` says above the options, written for users
  (the module's docstring is for readers of the code);
* ``add_arguments(parser)``: its options, on the subparser (multi-value flags take comma-separated
  values, see ``options``);
* ``run(args) -> int``: the work, returning the exit status; it raises ``options.UsageError``
  naming the flag or variable for a bad value, before starting any rank.  ``args.argv`` holds the
  subcommand's own command line (for re-running it under ``mpiexec``).

Adding one is a module plus a line in ``COMMANDS``.  A command line that does not start with a subcommand's name
runs ``collectives``, so ``zerocomm-bench -b 8 -e 64M -f 2`` works as in nccl-tests.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType
from typing import Optional, Sequence

from .options import UsageError

#: Subcommand name -> module of this package; the first is the default.
COMMANDS = {
    "collectives": "collectives_cli",
    "compare": "compare_cli",
    "tune": "tune",
    "compression": "compression",
    "zero": "zero_cli",
    "trace": "trace_cli",
    "overhead": "overhead",
    "soak": "soak",
    "kills": "kill_sweep",
    "call-counts": "call_counts",
    "check-cost": "check_cost",
    "shm": "shm_bench",
    "cluster": "cluster",
    "gpu": "gpu",
    "step-calls": "step_calls",
}
DEFAULT_COMMAND = next(iter(COMMANDS))


def command_module(name: str) -> ModuleType:
    return importlib.import_module(f".{COMMANDS[name]}", __package__)


def _version() -> str:
    from .. import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: ``zerocomm-bench [COMMAND] [options]``."""
    parser = argparse.ArgumentParser(
        prog="zerocomm-bench",
        description="Benchmarks of zerocomm.comm with nccl-tests' conventions (S, algbw, busbw; averaged "
                    "back-to-back calls; the maximum over ranks).  'zerocomm-bench --peers' puts zerocomm's default "
                    "algorithm beside torch's gloo and MPICH.",
        epilog=f"Without a COMMAND, '{DEFAULT_COMMAND}' runs: 'zerocomm-bench -b 8 -e 64M -f 2' is "
               f"'zerocomm-bench {DEFAULT_COMMAND} -b 8 -e 64M -f 2'.  'zerocomm-bench COMMAND --help' lists a "
               "command's options; lists of values are comma-separated (--nprocs 2,4).")
    parser.add_argument("--version", action="version", version=f"zerocomm {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in COMMANDS:
        module = command_module(name)
        sub = commands.add_parser(name, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP),
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
    return parser


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``zerocomm-bench``; returns the exit status (2: a bad argument, nothing ran)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv = [DEFAULT_COMMAND, *argv]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv[1:]
    sub = _subparser(parser, args.command)
    try:
        return command_module(args.command).run(args)
    except UsageError as exc:
        sub.error(str(exc))
        raise  # unreachable: error() exits


if __name__ == "__main__":
    sys.exit(main())
