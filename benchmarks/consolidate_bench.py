"""Consolidation benchmark: time and peak memory of ``zerocomm.zero.consolidate`` on a large checkpoint.

    python -m zerocomm.benchmarks.consolidate_bench --world-size 2 --stage 3

Two forked gloo ranks build a ~109 M-parameter TinyLM, take one Adam step under ZeRO (so the
checkpoint holds optimizer state too) and save a sharded checkpoint.  A fresh forked process then
consolidates it; its peak resident set above its resident set just before (Linux ``VmHWM`` after a
``clear_refs`` reset) is compared with one full float32 copy of the parameters (4Φ bytes), the
bound the streaming consolidation aims at.  Writing the result (.pt) is timed separately.
"""
from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import sys
import tempfile
import time
import traceback

import torch

from .models import LMShape, TinyLM, batch_for, loss_fn
from .zero_bench import _peak_bytes, _reset_peak, _return_freed_memory

BIG = LMShape(vocab=32768, d_model=1024, n_heads=16, n_layers=6, seq_len=128)


def _save_rank(rank: int, world: int, store_dir: str, path: str, stage: int, conn) -> None:
    try:
        import zerocomm.comm as dist
        from zerocomm.zero import ZeroConfig, initialize

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        store = torch.distributed.FileStore(os.path.join(store_dir, "store"), world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=600))
        torch.manual_seed(0)
        model = TinyLM(BIG)
        phi = sum(p.numel() for p in model.parameters())
        model, optimizer = initialize(model, lambda params: torch.optim.Adam(params, lr=1e-4),
                                      ZeroConfig(stage=stage, algorithm="native"))
        x, y = batch_for(model, seed=0, rank=rank, step=0, batch_size=1)
        loss_fn(model, model(x[:, :16]), y[:, :16]).backward()
        optimizer.step()
        start = time.perf_counter()
        optimizer.save(path)
        conn.send(("ok", {"phi": phi, "save_s": time.perf_counter() - start}))
    except BaseException:  # reported by the parent
        conn.send(("err", traceback.format_exc()))


def _consolidate(path: str, out: str, conn) -> None:
    try:
        _return_freed_memory()
        from zerocomm.zero import consolidate

        base = _reset_peak()
        start = time.perf_counter()
        state = consolidate(path)
        seconds = time.perf_counter() - start
        peak = _peak_bytes() - base
        start = time.perf_counter()
        torch.save(state, out)
        conn.send(("ok", {"consolidate_s": seconds, "peak": peak, "write_s": time.perf_counter() - start,
                          "elements": sum(t.numel() for t in {id(t): t for t in state.values()}.values())}))
    except BaseException:
        conn.send(("err", traceback.format_exc()))


def _run(target, args_list, timeout: float) -> list:
    context = multiprocessing.get_context("fork")
    pipes, procs = [], []
    for args in args_list:
        parent, child = context.Pipe(duplex=False)
        proc = context.Process(target=target, args=(*args, child), daemon=True)
        proc.start()
        child.close()
        pipes.append(parent)
        procs.append(proc)
    results = []
    for pipe in pipes:
        if not pipe.poll(timeout):
            for proc in procs:
                proc.kill()
            raise TimeoutError(f"{target.__name__} did not report within {timeout} s")
        status, value = pipe.recv()
        if status != "ok":
            raise RuntimeError(value)
        results.append(value)
    for proc in procs:
        proc.join(30)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--stage", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    from tabulate import tabulate

    with tempfile.TemporaryDirectory(prefix="zero-consolidate-") as tmp:
        path = os.path.join(tmp, "ckpt")
        saved = _run(_save_rank, [(r, args.world_size, tmp, path, args.stage) for r in range(args.world_size)],
                     args.timeout)
        on_disk = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)
        (done,) = _run(_consolidate, [(path, os.path.join(tmp, "model.pt"))], args.timeout)
    phi, mib = saved[0]["phi"], 1 << 20
    print(f"TinyLM {BIG}: Φ = {phi:,} parameters; ZeRO stage {args.stage} at {args.world_size} ranks, gloo, "
          f"one Adam step; {os.cpu_count()} cores")
    print(tabulate([[f"{on_disk / mib:.0f}", f"{max(s['save_s'] for s in saved):.1f}", f"{done['consolidate_s']:.1f}",
                     f"{done['peak'] / mib:.0f}", f"{4 * phi / mib:.0f}", f"{done['write_s']:.1f}"]],
                   headers=["checkpoint MiB", "save s", "consolidate s", "consolidate peak MiB",
                            "one fp32 copy MiB", "torch.save s"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
