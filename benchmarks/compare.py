"""Side-by-side runs: several backends (and world sizes) in one invocation, with ratios, and plots.

``zerocomm-bench compare --backends gloo,mpi --nprocs 2,4 --algorithms native,ring,tree`` runs the
collectives benchmark once per (backend, world size) — each a world of its own, started as
``zerocomm-bench collectives`` would start it — and prints one long table: every row with its busbw
over the same backend's native busbw (``vs native``) and over the first backend's native
(``vs <backend> native``, e.g. zerocomm's ring on MPI against gloo's own all_reduce).
``zerocomm-bench --compare gloo,mpi ...`` is the same.  ``--plot out.png`` draws busbw against size,
one line per backend/algorithm, one panel per (collective, world size).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

from tabulate import tabulate

from .units import format_size


def run_one(backend: str, nprocs: int, options: Sequence[str]) -> List[dict]:
    """Rows of ``zerocomm-bench collectives --backend backend --nprocs nprocs *options``."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "rows.json")
        command = [sys.executable, "-m", "zerocomm.benchmarks", "collectives", "--backend", backend,
                   "--nprocs", str(nprocs), *options, "--json", path, "--no-progress"]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        with open(path) as handle:
            rows = json.load(handle)["rows"]
    for row in rows:
        row["backend"], row["world_size"] = backend, nprocs
    return rows


def with_ratios(rows: List[dict], baseline_backend: str) -> List[dict]:
    """Add ``vs_native`` (same backend) and ``vs_baseline`` (the baseline backend's native)."""
    native: Dict[tuple, float] = {(r["backend"], r["world_size"], r["collective"], r["size"]): r["time_us"]
                                  for r in rows if r["algorithm"] == "native" and r["time_us"]}
    for row in rows:
        key = (row["world_size"], row["collective"], row["size"])
        own = native.get((row["backend"], *key))
        base = native.get((baseline_backend, *key))
        row["vs_native"] = own / row["time_us"] if own and row["time_us"] else None
        row["vs_baseline"] = base / row["time_us"] if base and row["time_us"] else None
    return rows


def table(rows: List[dict], baseline_backend: str) -> str:
    def ratio(value: Optional[float]) -> str:
        return "-" if value is None else f"{value:.2f}"

    body = [[r["collective"], r["world_size"], format_size(r["size"]), r["backend"], r["algorithm"],
             "unsupported" if r["time_us"] is None else f"{r['time_us']:.1f}",
             "-" if r["busbw"] is None else f"{r['busbw']:.3f}", ratio(r["vs_native"]), ratio(r["vs_baseline"])]
            for r in sorted(rows, key=lambda r: (r["collective"], r["world_size"], r["size"], r["backend"]))]
    return tabulate(body, headers=["collective", "n", "size", "backend", "algorithm", "time (µs)", "busbw (GB/s)",
                                   "vs native", f"vs {baseline_backend} native"], disable_numparse=True)


def plot(rows: List[dict], path: str) -> None:
    """busbw against size (log-log), one panel per (collective, n): colour = algorithm, line style = backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"native": "tab:blue", "ring": "tab:orange", "tree": "tab:green", "recursive_doubling": "tab:red"}
    backends = sorted({r["backend"] for r in rows})
    styles = dict(zip(backends, [("-", "o"), ("--", "s"), (":", "^")]))
    panels = sorted({(r["collective"], r["world_size"]) for r in rows})
    columns = min(3, len(panels))
    lines = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(lines, columns, figsize=(5 * columns, 3.6 * lines), squeeze=False)
    for axis, (collective, n) in zip(axes.flat, panels):
        series = sorted({(r["backend"], r["algorithm"]) for r in rows
                         if r["collective"] == collective and r["world_size"] == n})
        for backend, algorithm in series:
            points = sorted((r["size"], r["busbw"]) for r in rows if r["collective"] == collective
                            and r["world_size"] == n and r["backend"] == backend and r["algorithm"] == algorithm
                            and r["busbw"])
            if points:
                line, marker = styles.get(backend, ("-.", "x"))
                axis.plot(*zip(*points), marker=marker, markersize=3, linestyle=line, label=f"{backend} {algorithm}",
                          color=colors.get(algorithm))
        axis.set(xscale="log", yscale="log", title=f"{collective}, {n} ranks", xlabel="size S (bytes)",
                 ylabel="busbw (GB/s)")
        axis.grid(True, which="major", alpha=0.3)
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(panels):]:
        axis.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="zerocomm-bench compare", description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="gloo,mpi", help="comma-separated; the first is the baseline")
    parser.add_argument("--nprocs", default="2,4", help="comma-separated world sizes")
    parser.add_argument("--plot", metavar="PNG", help="write busbw-vs-size plots")
    parser.add_argument("--json", metavar="PATH", help="write every row (with ratios) as JSON")
    args, options = parser.parse_known_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    rows: List[dict] = []
    for backend in backends:
        for nprocs in (int(n) for n in args.nprocs.split(",")):
            print(f"# running {backend} at {nprocs} ranks", file=sys.stderr, flush=True)
            rows.extend(run_one(backend, nprocs, options))
    with_ratios(rows, backends[0])
    print(table(rows, backends[0]))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    if args.plot:
        plot(rows, args.plot)
        print(f"# plot written to {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
