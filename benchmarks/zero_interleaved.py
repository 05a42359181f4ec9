"""``zerocomm-bench zero --interleave K``: step times of every variant measured in the same ranks, K steps
at a time in turn, so that a ratio compares steps run seconds apart instead of minutes.

On a shared or virtual machine the speed of the cores drifts by tens of percent within minutes (on the
2-core test machine torch DDP's step measured 350 ms and 490 ms in two rounds a minute apart).  The
default mode forks fresh ranks per variant, which is what a peak-memory figure needs, but then two
variants' steps are tens of seconds apart.  Here each rank builds every chosen variant once (torch's
variants on torch.distributed's default gloo group, zerocomm's on its own group; one store, two
prefixes), warms each up, then runs ``--repeat`` rotations; in a rotation each variant runs a *block*
of K steps back to back, as in training (its last step ends with ``synchronize()``, so no work of one
variant runs in another's block).

Per block: the median over its steps of the slowest rank's step time.  A variant's ``step ms`` is the
median over rotations of its blocks; ``× DDP`` is the median over rotations of (block / torch DDP's block
of the same rotation), with the smallest and largest of those ratios beside it.  Memory is not measured
here (every variant lives in the same process): use the default mode for the memory columns.

[Note: the allocator]  The default mode fixes glibc's mmap threshold at 64 KiB so that its peak resident
set follows live memory: every freed block over 64 KiB goes back to the kernel, and the next one costs
page faults and the kernel's zeroing.  That is a cost of measuring memory, not of training, and it is not
small: on the 2-core test machine torch DDP's step took 450 ms with the pinned threshold and 270 ms
without (2026-11-27), and every variant pays it in proportion to what it allocates per step.  This mode
measures time only, so its ranks keep glibc's defaults, as a training process does (the dynamic threshold
keeps a freed buffer for the next one of its size); ``--pin-mmap-threshold`` times them the default
mode's way instead.
"""
from __future__ import annotations

import datetime
import os
import statistics
import time
import traceback

import torch

from .models import batch_for, loss_fn
from .zero_bench import (_model, _return_freed_memory, _torch_variant, _warm_up, chosen_variants, fork_ranks,
                         zero_variant)


def _build(name: str, algorithm, args, world: int, nvme_dir: str):
    """(model to call, model that owns the data recipe, optimizer, synchronize) of one variant (NVMe offload:
    its files in ``nvme_dir``, a folder of its own)."""
    model, phi = _model(args)
    if name.startswith("torch"):
        call, data_model, optimizer, _ = _torch_variant(name, model, phi, world)
        return call, data_model, optimizer, lambda: None
    os.makedirs(nvme_dir, exist_ok=True)
    call, optimizer = zero_variant(name, algorithm, model, args, nvme_dir)
    return call, call, optimizer, optimizer.synchronize


def _rank(rank: int, world: int, store_dir: str, chosen: list, args, conn) -> None:
    try:
        if args.pin_mmap_threshold:
            _return_freed_memory()  # see [Note: the allocator]
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        import torch.distributed as td

        import zerocomm.comm as dist

        store = td.FileStore(os.path.join(store_dir, "store"), world)
        timeout = datetime.timedelta(seconds=args.timeout)
        td.init_process_group("gloo", store=td.PrefixStore("torch", store), rank=rank, world_size=world,
                              timeout=timeout)
        dist.init_process_group("gloo", store=td.PrefixStore("zerocomm", store), rank=rank, world_size=world,
                                timeout=timeout)
        td.all_reduce(torch.ones(1))
        for algorithm_name in ("native", "ring", "shm"):
            dist.all_reduce(torch.ones(1), algorithm=algorithm_name)
        _warm_up()
        folder = args.nvme_path or store_dir
        variants = [_build(name, algorithm, args, world, os.path.join(folder, f"variant-{index}"))
                    for index, (name, algorithm) in enumerate(chosen)]
        steps = args.warmup + args.repeat * args.interleave
        batches = [batch_for(variants[0][1], seed=0, rank=rank, step=step, batch_size=args.batch)
                   for step in range(steps)]
        blocks: list = [[] for _ in chosen]  # per variant: one list of step times per rotation
        losses = [0.0] * len(chosen)

        def run_block(index: int, first_step: int, count: int) -> list:
            call, data_model, optimizer, synchronize = variants[index]
            td.barrier()
            stamps = [time.perf_counter()]
            for step in range(first_step, first_step + count):
                x, y = batches[step]
                loss = loss_fn(data_model, call(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if step == first_step + count - 1:
                    synchronize()
                stamps.append(time.perf_counter())
            losses[index] = float(loss.detach())
            return [b - a for a, b in zip(stamps, stamps[1:])]

        for index in range(len(chosen)):
            run_block(index, 0, args.warmup)
        for rotation in range(args.repeat):
            first = args.warmup + rotation * args.interleave
            for index in range(len(chosen)):
                blocks[index].append(run_block(index, first, args.interleave))
        dist.destroy_process_group()
        td.destroy_process_group()
        conn.send(("ok", {"blocks": blocks, "losses": losses}))
    except BaseException:  # reported by the parent
        conn.send(("err", traceback.format_exc()))
    finally:
        conn.close()


def measure(world: int, chosen: list, args) -> list:
    """Run ``chosen`` ((name, algorithm) pairs; torch DDP among them for the ratios) interleaved in
    ``world`` forked ranks; returns one row per variant: [N, variant, algorithm, step ms, × DDP,
    smallest × DDP, largest × DDP, last loss (rank 0)]."""
    reports = fork_ranks(world, _rank, (chosen, args), args.timeout, "--interleave")
    # block_ms[v][k]: variant v's block in rotation k, the median over its steps of the slowest rank.
    block_ms = [[statistics.median(max(r["blocks"][v][k][i] for r in reports) for i in range(args.interleave)) * 1e3
                 for k in range(args.repeat)] for v in range(len(chosen))]
    names = [name for name, _ in chosen]
    ddp = block_ms[names.index("torch DDP")] if "torch DDP" in names else None
    rows = []
    for v, (name, algorithm) in enumerate(chosen):
        ratios = [mine / base for mine, base in zip(block_ms[v], ddp)] if ddp else None
        rows.append([world, name, algorithm or "-", f"{statistics.median(block_ms[v]):.0f}",
                     f"{statistics.median(ratios):.2f}" if ratios else "-",
                     f"{min(ratios):.2f}" if ratios else "-", f"{max(ratios):.2f}" if ratios else "-",
                     f"{reports[0]['losses'][v]:.6f}"])
    return rows


HEADERS = ["N", "variant", "algorithm", "step ms", "× DDP", "smallest × DDP", "largest × DDP", "last loss (rank 0)"]


def describe(args) -> str:
    return (f"interleaved: every variant in the same ranks, {args.repeat} rotations of {args.interleave} steps each "
            f"(after {args.warmup} warm-up steps per variant); memory not measured in this mode; glibc's "
            + ("mmap threshold pinned at 64 KiB, as in the default mode" if args.pin_mmap_threshold
               else "allocator left at its defaults"))


def main(args, shape) -> int:
    """``zerocomm-bench zero --interleave K`` (``args`` as ``zero_bench.checked`` left them): one table."""
    from tabulate import tabulate

    rows = []
    for world in args.world_sizes:
        rows += measure(world, chosen_variants(args), args)
    print(f"TinyLM {shape}, {args.precision} (zerocomm), Adam, batch {args.batch} x {shape.seq_len} tokens per rank, "
          f"gloo, {os.cpu_count()} cores; {describe(args)}")
    print(tabulate(rows, headers=HEADERS, tablefmt="github"))
    if args.json:
        import json
        with open(args.json, "w") as handle:
            json.dump([dict(zip(HEADERS, row)) for row in rows], handle, indent=1)
    return 0
