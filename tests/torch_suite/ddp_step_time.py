"""DDP step time on backend "zerocomm" against DDP on torch's gloo, side by side in one run (opt-in script).

    flock /tmp/zerocomm-heavy.lock python tests/torch_suite/ddp_step_time.py [--steps 30] [--algorithms auto,ring]

Two ranks are forked; each initializes torch's default group with backend "zerocomm" (gloo transport) and a
``new_group(backend="gloo")``; the same ~10M-parameter MLP is wrapped in DDP once per group (and once per zerocomm
algorithm, through a ``new_group(backend="zerocomm", pg_options=Options(algorithm=...))``), and once more on
``zerocomm.comm.group.WORLD`` (zerocomm's own default group, gloo transport, handed to DDP as it is); the steps
alternate between them so that machine load hits them alike.  Prints the median step time of each and the
ratio to gloo.
"""
import argparse
import datetime
import gc
import multiprocessing
import os
import statistics
import tempfile
import time

import torch


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 1024))


def rank_main(rank: int, world: int, store_path: str, steps: int, algorithms: list, queue) -> None:
    import torch.distributed as td
    from torch.nn.parallel import DistributedDataParallel

    import zerocomm.comm as zc
    from zerocomm.comm.c10d import Options

    torch.set_num_threads(1)
    store = td.FileStore(store_path, world)
    td.init_process_group("zerocomm", store=store, rank=rank, world_size=world,
                          timeout=datetime.timedelta(seconds=120))
    groups = {"gloo": td.new_group(backend="gloo")}
    for algorithm in algorithms:
        groups[f"zerocomm/{algorithm}"] = td.new_group(backend="zerocomm", pg_options=Options(algorithm=algorithm))
    zc.init_process_group("gloo", store=td.PrefixStore("zerocomm.comm/", store), rank=rank, world_size=world,
                          timeout=datetime.timedelta(seconds=120))
    groups["zerocomm.comm group.WORLD"] = zc.group.WORLD
    runs = {name: DistributedDataParallel(model(), process_group=group) for name, group in groups.items()}
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in runs.items()}
    x = torch.randn(32, 1024)
    times = {name: [] for name in runs}
    for step in range(steps + 3):
        for name, m in runs.items():
            td.barrier(groups["gloo"])
            start = time.perf_counter()
            optimizers[name].zero_grad()
            m(x).square().mean().backward()
            optimizers[name].step()
            if step >= 3:  # warm-up
                times[name].append(time.perf_counter() - start)
    if rank == 0:
        queue.put({name: statistics.median(t) for name, t in times.items()})
    del runs, optimizers  # before their groups: see the teardown note in tests/support/torch_backend_checks.py
    gc.collect()
    zc.destroy_process_group()
    td.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--algorithms", default="auto,ring")
    args = parser.parse_args()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    store = os.path.join(tempfile.mkdtemp(), "store")
    params = sum(p.numel() for p in model().parameters())
    procs = [context.Process(target=rank_main, args=(r, 2, store, args.steps, args.algorithms.split(","), queue))
             for r in range(2)]
    for p in procs:
        p.start()
    result = queue.get(timeout=600)
    for p in procs:
        p.join()
    print(f"DDP, {params / 1e6:.1f}M parameters fp32, n=2, batch 32, median of {args.steps} steps (load: "
          f"{os.getloadavg()[0]:.2f})")
    print("| process group | step ms | / gloo |\n|---|---|---|")
    for name, seconds in result.items():
        print(f"| {name} | {seconds * 1e3:.1f} | {seconds / result['gloo']:.3f} |")


if __name__ == "__main__":
    main()
