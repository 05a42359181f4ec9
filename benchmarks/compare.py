"""Side-by-side runs: several backends (and world sizes) in one invocation, with ratios, and plots.

The ``compare`` subcommand's options are ``compare_cli``'s.

``zerocomm-bench compare --backends gloo,mpi --nprocs 2,4 --algorithms native,ring,tree`` runs the
collectives benchmark once per (backend, world size) — each a world of its own, started as
``zerocomm-bench collectives`` would start it, in a subprocess that writes its rows as JSON — and
prints one long table: every row with its busbw over the same backend's native busbw (``vs
native``) and over the first backend's native (``vs <backend> native``, e.g. zerocomm's ring on MPI
against gloo's own all_reduce), then nccl-tests' closing lines for each world.  ``zerocomm-bench
--compare gloo,mpi ...`` (or ``--compare=gloo,mpi``) is the same.  ``--json``/``--csv`` keep every
world's rows, each with its backend and world size; ``--plot out.png`` draws busbw against size,
one line per backend/algorithm, one panel per (collective, world size).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

from tabulate import tabulate

from . import report
from .collectives import SweepConfig
from .target import STANDIN_ENV
from .units import format_size

#: CSV columns of a side-by-side run: the collectives' columns and the two ratios.
CSV_FIELDS = (*report.CSV_FIELDS, "vs_native", "vs_baseline")


def child_argv(args: argparse.Namespace, cfg: SweepConfig, backend: str, nprocs: int, *,
               outputs: dict[str, Optional[str]], progress: bool) -> list[str]:
    """The ``collectives`` options of one world, from the checked plan (not the raw command line)."""
    argv = ["collectives", "--backend", backend, "--nprocs", str(nprocs), "--ops", ",".join(cfg.collectives),
            "--algorithms", ",".join(cfg.algorithms), "--sizes", ",".join(map(str, cfg.sizes)),
            "--warmup", str(cfg.warmup), "--iters", str(cfg.iters), "--check", str(int(cfg.check)),
            "--dtype", cfg.dtype, "--op", cfg.op, "--root", str(cfg.root), "--device", cfg.device,
            "--threads", str(args.threads), "--timeout", repr(args.timeout)]
    if cfg.in_place:
        argv.append("--in-place")
    for flag, path in outputs.items():
        if path:
            argv += [f"--{flag}", path]
    return argv + ([] if progress else ["--no-progress"])


def run_one(args: argparse.Namespace, checked, backend: str, nprocs: int, *, cfg=None,
            target: str = "zerocomm") -> tuple[int, dict, List[dict]]:
    """(exit status, metadata, rows) of one world, run as ``zerocomm-bench collectives`` in a subprocess;
    ``cfg`` replaces the plan's sweep, ``target`` is the module measured (``target.STANDIN_ENV``)."""
    env = {key: value for key, value in os.environ.items() if key != STANDIN_ENV}
    if target != "zerocomm":
        env[STANDIN_ENV] = target
    with tempfile.TemporaryDirectory(prefix="zerocomm-compare-") as folder:
        path = os.path.join(folder, "rows.json")
        argv = child_argv(args, cfg or checked.cfg, backend, nprocs, outputs={"json": path}, progress=False)
        done = subprocess.run([sys.executable, "-m", "zerocomm.benchmarks", *argv], stdout=subprocess.DEVNULL,
                              env=env)
        if not os.path.exists(path):
            return done.returncode or 1, {}, []
        with open(path) as handle:
            data = json.load(handle)
    return done.returncode, data["meta"], data["rows"]


def run_worlds(args: argparse.Namespace, checked) -> int:
    """Every (backend, world size) of ``checked`` (a ``collectives_cli.Plan``), then one report."""
    rows: List[dict] = []
    metas: List[dict] = []
    status = 0
    for backend in checked.backends:
        for nprocs in checked.world_sizes:
            print(f"# running {backend} at {nprocs} ranks", file=sys.stderr, flush=True)
            code, meta, world_rows = run_one(args, checked, backend, nprocs)
            if code != 0:
                print(f"# {backend} at {nprocs} ranks failed (exit status {code})", file=sys.stderr, flush=True)
                status = max(status, 1)
            if meta:
                metas.append(meta)
                rows.extend(world_rows)
    baseline = checked.backends[0]
    with_ratios(rows, baseline)
    lines = [table(rows, baseline)]
    for meta in metas:
        mine = [r for r in rows if (r["backend"], r["world_size"]) == (meta["backend"], meta["world_size"])]
        lines += report.closing_lines([(r["algorithm"], r["busbw"], r["wrong"]) for r in mine],
                                      check=checked.cfg.check, label=f"{meta['backend']}, {meta['world_size']} ranks")
    print("\n".join(lines), flush=True)
    if args.json:
        report.write_json_records(args.json, {"baseline": baseline, "worlds": metas}, rows)
    if args.csv:
        report.write_csv_records(args.csv, rows, CSV_FIELDS)
    if args.plot:
        plot(rows, args.plot)
        print(f"# plot written to {args.plot}", file=sys.stderr)
    return status


#: What ``--peers`` runs beside zerocomm: (label, stand-in measured, backend).
PEERS = (("torch gloo", "torch", "gloo"), ("MPICH", "mpi4py", "mpi"))


def run_peers(args: argparse.Namespace, checked) -> int:
    """zerocomm (the plan's backend and algorithms) and each of ``PEERS`` (their own collectives), one
    world after another at each world size, then one table of their times side by side."""
    backend = checked.backends[0]
    native = dataclasses.replace(checked.cfg, algorithms=("native",))
    worlds = [(f"zerocomm {backend}", "zerocomm", backend, checked.cfg),
              *((label, target, peer_backend, native) for label, target, peer_backend in PEERS)]
    rows: List[dict] = []
    closing: List[str] = []
    status = 0
    for nprocs in checked.world_sizes:
        for label, target, world_backend, cfg in worlds:
            print(f"# running {label} at {nprocs} ranks", file=sys.stderr, flush=True)
            code, meta, world_rows = run_one(args, checked, world_backend, nprocs, cfg=cfg, target=target)
            if code != 0:
                print(f"# {label} at {nprocs} ranks failed (exit status {code})", file=sys.stderr, flush=True)
                status = max(status, 1)
            for row in world_rows:
                row["target"] = label
            rows.extend(world_rows)
            closing += report.closing_lines([(r["algorithm"], r["busbw"], r["wrong"]) for r in world_rows],
                                            check=cfg.check, label=f"{label}, {nprocs} ranks")
    labels = [label for label, *_ in worlds]
    print("\n".join([f"# zerocomm.comm ({backend}, algorithm {','.join(checked.cfg.algorithms)}) beside "
                     f"torch.distributed's gloo and MPICH (mpi4py); each world ran alone, one after another",
                     peers_table(rows, labels), *closing]), flush=True)
    if args.json:
        report.write_json_records(args.json, {"peers": labels}, rows)
    if args.csv:
        report.write_csv_records(args.csv, rows, (*report.CSV_FIELDS, "target"))
    if args.plot:
        plot([{**r, "backend": r["target"]} for r in rows], args.plot)
        print(f"# plot written to {args.plot}", file=sys.stderr)
    return status


def peers_table(rows: List[dict], labels: List[str]) -> str:
    """One line per (collective, n, size): each target's time, and each peer's time over zerocomm's first
    algorithm's (``x``: above 1, zerocomm is faster)."""
    mine, peers = labels[0], labels[1:]
    columns = [(mine, a) for a in dict.fromkeys(r["algorithm"] for r in rows if r["target"] == mine)]
    columns += [(peer, "native") for peer in peers]
    times: Dict[tuple, Optional[float]] = {(r["collective"], r["world_size"], r["size"], r["target"], r["algorithm"]):
                                           r["time_us"] for r in rows}
    keys = sorted({(r["collective"], r["world_size"], r["size"]) for r in rows})
    body = []
    for key in keys:
        cells = [times.get((*key, *column)) for column in columns]
        own = cells[0]
        speedups = [f"{t / own:.2f}" if t and own else "-" for t in cells[len(columns) - len(peers):]]
        body.append([key[0], key[1], format_size(key[2]), *("-" if t is None else f"{t:.1f}" for t in cells),
                     *speedups])
    headers = ["collective", "n", "size",
               *(f"{label} {algorithm} (µs)" if label == mine else f"{label} (µs)" for label, algorithm in columns),
               *(f"x vs {peer}" for peer in peers)]
    return tabulate(body, headers=headers, disable_numparse=True)


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

    colors = {"native": "tab:blue", "ring": "tab:orange", "tree": "tab:green", "recursive_doubling": "tab:red",
              "shm": "tab:purple", "hierarchical": "tab:brown"}
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
