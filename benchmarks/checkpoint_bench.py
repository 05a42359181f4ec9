"""What checksums cost a checkpoint: save and load of a ~8.4 M-parameter model's shard, with and without CRC-32.

    python -m zerocomm.benchmarks.checkpoint_bench [--repeat 5] [--stage 1]

One process (a gloo world of one) builds ``TinyLM.benchmark_size()`` (about 8.4 M parameters), takes one
Adam step under ZeRO and times, side by side, on the same shard (float32 masters + Adam's two moments,
about 12 bytes per parameter):

* ``torch.save`` + fsync of the shard (what a save cost before checksums) against ``write_shard``, which
  computes the CRC-32 while the bytes stream out;
* ``torch.load`` (memory-mapped, every tensor read once) against ``load_shard``, which first streams the
  file through CRC-32 and checks run id, dtypes and shapes;
* a whole ``optimizer.save`` (manifest, renames, agreements) and ``optimizer.load``.

Medians of ``--repeat`` runs, in seconds.  The files live in a temporary folder (the page cache is warm
after the first run, so these are CPU costs, not disk reads).  Record ``uptime`` beside the numbers.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch


def _median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _touch(shard: dict) -> float:
    """Read every tensor of a loaded shard once (memory-mapped tensors are read lazily)."""
    total = 0.0
    for tensor in shard["masters"]:
        total += float(tensor.sum())
    for state in shard["optimizer"]["state"].values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                total += float(value.sum())
    return total


def measure(repeat: int, stage: int) -> list[tuple[str, float]]:
    import zerocomm.comm as dist
    from zerocomm.benchmarks.models import TinyLM, batch_for, loss_fn
    from zerocomm.zero import ZeroConfig, initialize
    from zerocomm.zero.checkpoint import _shard
    from zerocomm.zero.manifest import MANIFEST, load_shard, read_manifest, write_shard

    folder = Path(tempfile.mkdtemp(prefix="zerocomm-ckpt-bench-"))
    store = torch.distributed.FileStore(str(folder / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=600))
    torch.manual_seed(0)
    model = TinyLM(TinyLM.benchmark_size())
    phi = sum(p.numel() for p in model.parameters())
    model, optimizer = initialize(model, lambda params: torch.optim.Adam(params, lr=1e-4),
                                  ZeroConfig(stage=stage, algorithm="native"))
    x, y = batch_for(model, seed=0, rank=0, step=0, batch_size=2)
    loss_fn(model, model(x[:, :32]), y[:, :32]).backward()
    optimizer.step()
    shard = _shard(optimizer, "0" * 32)
    plain, checked = folder / "plain.pt", folder / "checked.pt"

    def save_plain():
        with open(plain, "wb") as handle:
            torch.save(shard, handle)
            handle.flush()
            os.fsync(handle.fileno())

    rows = [("parameters (M)", phi / 1e6)]
    save_plain()
    write_shard(shard, checked)
    rows.append(("shard MiB", plain.stat().st_size / 2 ** 20))
    rows.append(("torch.save + fsync s", _median(save_plain, repeat)))
    rows.append(("write_shard (CRC-32 inline) s", _median(lambda: write_shard(shard, checked), repeat)))
    root = folder / "ckpt"
    rows.append(("optimizer.save s", _median(lambda: optimizer.save(root), repeat)))
    step = sorted(p for p in root.iterdir() if p.name.startswith("step-"))[-1]
    manifest = read_manifest(step)
    rows.append(("torch.load + read s", _median(lambda: _touch(torch.load(step / "shard-00000.pt", mmap=True,
                                                                          weights_only=True)), repeat)))
    rows.append(("load_shard (CRC-32 + checks) + read s", _median(lambda: _touch(load_shard(step, manifest, 0)),
                                                                repeat)))
    rows.append(("optimizer.load s", _median(lambda: optimizer.load(root), repeat)))
    assert (step / MANIFEST).is_file()
    optimizer.remove_hooks()
    dist.destroy_process_group()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerocomm.benchmarks.checkpoint_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--stage", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = measure(args.repeat, args.stage)
    print(f"| checkpoint of TinyLM.benchmark_size(), stage {args.stage}, world 1, median of {args.repeat} | value |")
    print("|---|---|")
    for name, value in rows:
        print(f"| {name} | {value:.3f} |")
    values = dict(rows)
    save_cost = values["write_shard (CRC-32 inline) s"] - values["torch.save + fsync s"]
    load_cost = values["load_shard (CRC-32 + checks) + read s"] - values["torch.load + read s"]
    print(f"\nCRC-32 on save: {save_cost * 1e3:+.0f} ms ({save_cost / values['torch.save + fsync s']:+.0%}); "
          f"verification on load: {load_cost * 1e3:+.0f} ms ({load_cost / values['torch.load + read s']:+.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
