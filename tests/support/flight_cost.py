"""The flight recorder's cost per call, measured side by side: an 8-byte all_reduce at 2 forked ranks (gloo, its
small calls on "shm" by auto), in blocks that alternate the recorder on and off in the same processes, so that a
load change touches both alike.  Per-call times (perf_counter around each call); prints the medians, their
difference and ``/proc/loadavg``.

    python tests/support/flight_cost.py [--blocks 40] [--calls 2000] [--backend gloo] [--callers]

It switches the recorder off the only way there is, for this measurement: ``group.flight = None`` (the
recorder is always on; see ``zerocomm/comm/flight.py``).  ``--callers`` measures instead what
``ZEROCOMM_FLIGHT_CALLERS=1`` adds: "on" notes every call's caller, "off" is the recorder as it always runs.
"""
import argparse
import json
import os
import statistics
import sys
import time


def _body(spec, blocks: int, calls: int, callers: bool = False) -> int:
    import torch

    import zerocomm.comm as dist
    from zerocomm.comm.group import WORLD

    torch.set_num_threads(1)
    dist.init_process_group(**spec.kwargs())
    group = WORLD.default
    ring = group.flight
    if callers:
        from zerocomm.comm import flight
        group.flight_callers = [None] * flight.RING
    if os.environ.get("FLIGHT_COST_NO_PUBLISHER"):
        from zerocomm.comm import flight
        flight.stop()
    t = torch.ones(2)
    for _ in range(2000):
        dist.all_reduce(t)
    times = {"on": [], "off": []}
    means = {"on": [], "off": []}  # each block's mean: its least is the least disturbed by the machine's load
    perf = time.perf_counter
    for block in range(2 * blocks):
        variant = ("on", "off")[block % 2] if block % 4 < 2 else ("off", "on")[block % 2]  # ABBA
        if callers:  # the recorder on in both; "on" also notes each call's caller (Group._run_noting_caller)
            if variant == "on":
                group.run = group._run_noting_caller
            else:
                group.__dict__.pop("run", None)
        else:
            group.flight = ring if variant == "on" else None
        spent = times[variant]
        began = perf()
        for _ in range(calls):
            start = perf()
            dist.all_reduce(t)
            spent.append(perf() - start)
        means[variant].append((perf() - began) / calls)
    group.flight = ring
    group.__dict__.pop("run", None)
    medians = torch.tensor([statistics.median(times["on"]), statistics.median(times["off"]), min(means["on"]),
                            min(means["off"])], dtype=torch.float64)
    everyone = [torch.zeros_like(medians) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, medians)
    if dist.get_rank() == 0:
        rows = [row.tolist() for row in everyone]
        with open("/proc/loadavg") as load:
            loadavg = load.read().strip()
        on = max(row[0] for row in rows)
        off = max(row[1] for row in rows)
        least_on, least_off = max(row[2] for row in rows), max(row[3] for row in rows)
        print(json.dumps({"measured": "callers noted" if callers else "recorder", "backend": spec.backend, "algorithm": dist.which_algorithm("all_reduce", t),
                          "calls_per_variant": blocks * calls, "median_us_on": round(on * 1e6, 3),
                          "median_us_off": round(off * 1e6, 3), "cost_ns": round((on - off) * 1e9, 1),
                          "cost_percent": round((on - off) / off * 100, 2),
                          "least_block_mean_us_on": round(least_on * 1e6, 3),
                          "least_block_mean_us_off": round(least_off * 1e6, 3),
                          "least_block_cost_ns": round((least_on - least_off) * 1e9, 1),
                          "per_rank_us": [[round(v * 1e6, 3) for v in row] for row in rows],
                          "loadavg": loadavg}))
    dist.destroy_process_group()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--nprocs", type=int, default=2, help="ranks (1: the recorder's own CPU cost, no peer)")
    parser.add_argument("--callers", action="store_true", help="the cost of ZEROCOMM_FLIGHT_CALLERS=1 instead")
    args = parser.parse_args()
    from zerocomm.benchmarks.launch import run_forked
    return run_forked(args.nprocs, args.backend, lambda spec: _body(spec, args.blocks, args.calls, args.callers))


if __name__ == "__main__":
    sys.exit(main())
