"""``zerocomm-bench trace``: merge the per-rank Chrome traces of one run into one file.

    ZEROCOMM_PROFILE=run torchrun --nproc-per-node 4 train.py   # writes run.rank0.trace.json ...
    zerocomm-bench trace run                                      # writes run.trace.json

Every rank's events keep their rank as ``pid`` and already share one clock (wall-clock time, see
``zerocomm.comm.profiler``), so in Perfetto (https://ui.perfetto.dev) or ``chrome://tracing`` the
ranks' bars of one collective line up.
"""
from __future__ import annotations

import argparse
import sys

from .options import UsageError

HELP = "merge the per-rank Chrome traces of ZEROCOMM_PROFILE (or Profiler exports) into one"

DESCRIPTION = """\
Merges the per-rank Chrome traces of one run into one file, where the ranks' bars of a
collective line up (open it in https://ui.perfetto.dev or chrome://tracing).

Example:
  ZEROCOMM_PROFILE=run torchrun --nproc-per-node 4 train.py   # writes run.rank0.trace.json, ...
  zerocomm-bench trace run                                      # writes run.trace.json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sources", nargs="+", metavar="PREFIX_OR_FILE",
                        help="a ZEROCOMM_PROFILE prefix (reads PREFIX.rankN.trace.json) or per-rank trace files")
    parser.add_argument("-o", "--out", default=None, metavar="PATH",
                        help="the merged trace (default: PREFIX.trace.json for a prefix; required for files)")


def run(args: argparse.Namespace) -> int:
    from ..comm import Profiler

    prefix = args.sources[0] if len(args.sources) == 1 else None
    out = args.out or (f"{prefix}.trace.json" if prefix is not None else None)
    if out is None:
        raise UsageError("-o/--out is required when merging several files")
    try:
        merged = Profiler.merge_chrome_traces(prefix if prefix is not None else args.sources, out)
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"cannot merge {' '.join(args.sources)}: {exc}") from None
    ranks = merged["otherData"]["ranks"]
    print(f"wrote {out}: ranks {', '.join(map(str, ranks))}, {len(merged['traceEvents'])} events", file=sys.stderr)
    return 0
