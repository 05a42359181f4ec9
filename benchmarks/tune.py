"""``zerocomm-bench tune``: measure every algorithm and write the table ``algorithm="auto"`` reads.

For each backend and world size it runs the collectives microbenchmark (this package's
own CLI, in a subprocess, with ``--json``), comparing every algorithm at every size,
and keeps per (collective, world size) the fastest algorithm of each size.  An
algorithm replaces ``native`` only when it is at least ``MARGIN`` faster, and a lone size whose
winner differs from both (agreeing) neighbours takes theirs: on a shared machine smaller
differences are noise, and the backend's own path is the safer default.
Consecutive sizes with the same winner merge into one row.

Output (``auto_table.json`` in the current folder by default, never the installed package: an
install may be read-only or shared, and a rebuild must not silently change what every user of it
gets).  Backends this run does not measure are kept from ``--out`` when it exists, else from the
installed table.  To change what ``algorithm="auto"`` picks, commit the file as
``comm/auto_table.json`` in a checkout (``--out comm/auto_table.json`` there)::

    {"gloo": {"all_reduce": [[max_world_size, max_bytes, "algorithm"], ...], ...}, ...,
     "_measured": {...how and where...}}

``select.py`` takes the first row whose ``max_world_size`` and ``max_bytes`` cover the
call; the largest measured world size is extended to any larger one.

``--add shm`` measures a new algorithm's cells without re-deciding the others: each (collective,
world size, size) keeps the algorithm the existing table picks unless an added algorithm takes at
most ``MARGIN`` of that pick's time, measured side by side in the same run.  The result goes to the
backend's ``"<backend>+one_host"`` section (read only by groups whose ranks share a host, as shm
needs); the plain section, which groups across hosts fall back on, stays as it was.  ``--rows PATH`` keeps
every measured row (for plots: ``zerocomm-bench tune --rows`` then ``benchmarks/busbw_plot.py``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from typing import Dict, List

from .units import COLLECTIVES, SIZELESS

#: An algorithm must take at most this fraction of native's time to be chosen over it.
MARGIN = 0.9
ALGORITHMS = ("native", "ring", "tree", "recursive_doubling", "shm")
UNBOUNDED = 1 << 62
DEFAULT_OUT = "auto_table.json"
#: The table the installed package reads (``select.auto_table``); only ever read here.
PACKAGE_TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "comm", "auto_table.json")


def measure(backend: str, nprocs: int, sizes: str, factor: int, iters: int,
            algorithms=ALGORITHMS) -> List[dict]:
    """Rows of one benchmark run (every collective and barrier, every algorithm)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "rows.json")
        command = [sys.executable, "-m", "zerocomm.benchmarks", "collectives", "--backend", backend,
                   "--nprocs", str(nprocs), "--ops", ",".join(COLLECTIVES + SIZELESS),
                   "--algorithms", ",".join(algorithms), "--sizes", sizes,
                   "--factor", str(factor), "--iters", str(iters), "--json", path, "--no-progress"]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        with open(path) as handle:
            return json.load(handle)["rows"]


def winners(rows: List[dict], incumbent=None, added=()) -> Dict[str, List[tuple]]:
    """``{collective: [(size, algorithm), ...]}``, sizes ascending, by the margin rule.

    ``incumbent(collective, size)``: the algorithm to keep unless one of ``added`` beats it by the margin
    (``--add``); without it the baseline is native and any measured algorithm may beat it.
    """
    by_cell: Dict[tuple, Dict[str, float]] = {}
    for row in rows:
        if row.get("time_us") is None:
            continue  # an unsupported (collective, algorithm) cell
        by_cell.setdefault((row["collective"], row["size"]), {})[row["algorithm"]] = row["time_us"]
    out: Dict[str, List[tuple]] = {}
    for (collective, size), times in sorted(by_cell.items()):
        if incumbent is None:
            best = "native" if "native" in times else min(times, key=times.get)
            contenders = times
        else:
            best = incumbent(collective, size)
            contenders = {a: t for a, t in times.items() if a in added}
            if best not in times:  # the table's pick was not measured (cannot happen with --add's algorithms)
                best = min(times, key=times.get)
        fastest = min(contenders, key=contenders.get, default=best)
        if best != fastest and times[fastest] <= MARGIN * times[best]:
            best = fastest
        out.setdefault(collective, []).append((size, best))
    return {collective: _smooth(sized) for collective, sized in out.items()}


def table_pick(table: dict, backend: str, collective: str, world: int, size: int) -> str:
    """The algorithm ``table``'s rows give a call (as ``select.rule`` reads them; "native" past them)."""
    for max_world, max_bytes, algorithm in table.get(backend, {}).get(collective, []):
        if world <= max_world and size <= max_bytes:
            return algorithm
    return "native"


def _smooth(sized: List[tuple]) -> List[tuple]:
    """A lone size whose winner differs from both agreeing neighbours takes theirs: one cell is noise."""
    smoothed = list(sized)
    for index in range(1, len(sized) - 1):
        before, here, after = sized[index - 1][1], sized[index][1], sized[index + 1][1]
        if before == after != here:
            smoothed[index] = (sized[index][0], before)
    return smoothed


def table_rows(per_world: Dict[int, Dict[str, List[tuple]]]) -> Dict[str, List[list]]:
    """Merge sizes with the same winner; the largest world's rows also cover larger worlds."""
    table: Dict[str, List[list]] = {}
    largest = max(per_world)
    for world in sorted(per_world):
        bound = UNBOUNDED if world == largest else world
        for collective, sized in per_world[world].items():
            rows = table.setdefault(collective, [])
            merged: List[list] = []
            for index, (size, algorithm) in enumerate(sized):
                upper = UNBOUNDED if index == len(sized) - 1 else size
                if merged and merged[-1][2] == algorithm:
                    merged[-1][1] = upper
                else:
                    merged.append([bound, upper, algorithm])
            rows.extend(merged)
    return table


def plot_rows(measured: Dict[str, Dict[int, list]], path: str,
              algorithms=("native", "ring", "shm"), collective: str = "all_reduce") -> None:
    """busbw against size of ``collective`` for ``algorithms``, one panel per world size, one line per
    backend and algorithm (``compare.plot``'s figure), from ``{backend: {world: rows}}``."""
    from .compare import plot
    rows = [dict(row, backend=backend, world_size=world) for backend, worlds in measured.items()
            for world, world_rows in worlds.items() for row in world_rows
            if row["collective"] == collective and row["algorithm"] in algorithms]
    plot(rows, path)


HELP = "measure every algorithm and write the table algorithm='auto' reads"

DESCRIPTION = """\
Measures every collective with every algorithm at every size, for each backend and world size,
and writes the table that algorithm="auto" reads: per (collective, world size, size range), the
algorithm to run.  An algorithm replaces the backend's own (native) only where it takes at most
90% of native's time; a lone size whose winner differs from both neighbours takes theirs.

The table goes to ./auto_table.json by default, never into the installed package.  Backends this
run does not measure are kept from --out when it exists, else from the installed table.  To ship
a table, write it as comm/auto_table.json in a checkout (--out comm/auto_table.json).

Examples:
  zerocomm-bench tune --backends gloo --nprocs 2,4
  zerocomm-bench tune --add shm         # measure shm beside the table's picks, for one-host groups
  zerocomm-bench tune --rows rows.json --plot busbw.png

Takes several minutes per backend and world size on 2 cores.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .options import BACKENDS, choice, list_of, positive_int, step_factor

    parser.add_argument("--backends", type=list_of(choice(BACKENDS, "backend"), "backend"), default=["gloo", "mpi"],
                        metavar="B[,B...]", help=f"backends to measure: {', '.join(BACKENDS)} (default: gloo,mpi)")
    parser.add_argument("--nprocs", dest="world_sizes", type=list_of(positive_int, "world size"), default=[2, 3, 4],
                        metavar="N[,N...]", help="world sizes to measure (default: 2,3,4)")
    parser.add_argument("--world-sizes", dest="world_sizes", type=list_of(positive_int, "world size"),
                        help=argparse.SUPPRESS)  # the old name of --nprocs
    parser.add_argument("--sizes", default="8B:16MiB", metavar="SPEC",
                        help="sizes S, ranges lo:hi and single sizes as collectives' --sizes (default: 8B:16MiB)")
    parser.add_argument("--factor", type=step_factor, default=8, metavar="F",
                        help="step factor of size ranges (default: 8)")
    parser.add_argument("--iters", type=positive_int, default=10, metavar="N",
                        help="timed calls per cell (default: 10)")
    parser.add_argument("--add", type=list_of(str, "algorithm"), default=None, metavar="ALG[,ALG...]",
                        help="measure these algorithms beside the existing table's picks and take them only "
                             "where they win (the other cells keep the table's choice)")
    parser.add_argument("--rows", metavar="PATH", help="also write every measured row as JSON (for plots)")
    parser.add_argument("--plot", metavar="PNG", help="draw the all_reduce busbw of native, ring and shm per backend "
                                                      "and world size from the rows (needs zerocomm[bench]); with "
                                                      "--plot-only, from an earlier run's --rows file")
    parser.add_argument("--plot-only", action="store_true", help="measure nothing: plot --rows into --plot")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="PATH",
                        help=f"where to write the table (default: {DEFAULT_OUT} in the current folder)")


def main(argv=None) -> int:
    """``python -m zerocomm.benchmarks.tune`` (what ``zerocomm-bench tune`` runs)."""
    parser = argparse.ArgumentParser(prog="zerocomm-bench tune", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """The ``tune`` subcommand."""
    from .options import UsageError
    from .units import size_sweep

    try:
        size_sweep(args.sizes, args.factor)
    except ValueError as exc:
        raise UsageError(f"--sizes {args.sizes!r}: {exc}") from None
    if args.plot_only:
        if not (args.rows and args.plot):
            raise UsageError("--plot-only needs --rows (an earlier run's rows) and --plot")
        with open(args.rows) as handle:
            plot_rows({b: {int(w): r for w, r in worlds.items()} for b, worlds in json.load(handle).items()}, args.plot)
        return 0
    table: Dict[str, object] = {}
    seed = args.out if os.path.exists(args.out) else PACKAGE_TABLE
    if os.path.exists(seed):  # keep the backends this run does not measure
        with open(seed) as handle:
            table = {k: v for k, v in json.load(handle).items() if k != "_measured"}
    seeded = dict(table)
    measured: Dict[str, Dict[int, list]] = {}
    for backend in args.backends:
        per_world = {}
        for world in args.world_sizes:
            print(f"# measuring {backend} at {world} ranks", file=sys.stderr, flush=True)
            rows = measure(backend, world, args.sizes, args.factor, args.iters)
            measured.setdefault(backend, {})[world] = rows
            if args.add:
                def keep(collective, size, backend=backend, world=world):
                    return table_pick(seeded, backend, collective, world, size)
                per_world[world] = winners(rows, keep, tuple(args.add))
            else:
                per_world[world] = winners(rows)
        table[f"{backend}+one_host" if args.add else backend] = table_rows(per_world)
    if args.rows:
        with open(args.rows, "w") as handle:
            json.dump(measured, handle, indent=1)
            handle.write("\n")
    if args.plot:
        plot_rows(measured, args.plot)
    table["_measured"] = {"by": "zerocomm-bench tune", "host": platform.node(), "machine": platform.machine(),
                          "cpus": os.cpu_count(), "sizes": args.sizes, "factor": args.factor, "iters": args.iters,
                          "margin": MARGIN, "date": datetime.date.today().isoformat(),
                          "added": args.add or [], "load": os.getloadavg()}
    with open(args.out, "w") as handle:
        json.dump(table, handle, indent=1)
        handle.write("\n")
    print(f"wrote {args.out}; algorithm='auto' reads {PACKAGE_TABLE}: copy it there (in a checkout, "
          f"commit it as comm/auto_table.json) to use it", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
