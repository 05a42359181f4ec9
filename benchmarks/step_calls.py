"""Host cost of one training step: Python function calls of a ZeRO step against torch DDP's, in one run.

    zerocomm-bench step-calls                     # stages 1-3, fp32 and bf16, 400 parameters, 2 ranks
    zerocomm-bench step-calls --top 15            # and where each variant's calls go

On a GPU the host runs ahead of the kernels only while each step's Python stays small, so the count
of Python function calls (cProfile, builtins included) of one step is the figure this machine can
give without one.  Two forked gloo ranks build the same model (an MLP of ``--layers`` Linear layers:
two parameters each, 400 by default) and train it with:

* torch's ``DistributedDataParallel`` over torch's gloo with ``torch.optim.AdamW`` (fp32), and the
  same under ``torch.autocast("cpu", torch.bfloat16)`` (the peer of ZeRO's bf16);
* zerocomm ZeRO stages 1, 2 and 3, at fp32 and bf16, with AdamW, on zerocomm's gloo, twice: with the
  default configuration ("default": on one host the step's collectives run zerocomm's "shm" schedule,
  written in Python, on the group's executor thread) and with ``algorithm="native"`` (gloo's own
  collectives; their async calls on the group's executor too while gloo's direct issue is off).

A step is forward, loss, backward, ``optimizer.step()`` and ``zero_grad()``; the count is of one step
after ``--warmup`` steps, on the step's thread, the largest over ranks.  The last column counts the
groups' executor threads alive after the step: calls on them are not on the step's thread and the
count leaves them out.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile

STAGES = (1, 2, 3)
PRECISIONS = ("fp32", "bf16")
TARGET = 1.1
#: ZeroConfig.algorithm -> its name in the report: the default ("shm" for the step's collectives when the ranks
#: share a host, a schedule that runs on the group's executor thread), and gloo's own collectives, issued from
#: the step's thread as NCCL's are on a GPU.
ALGORITHMS = {"native": "native", None: "default"}


def _model(layers: int, width: int):
    import torch
    from .models import MLP
    torch.manual_seed(0)
    return MLP(sizes=(width,) * (layers + 1))


def _executor_threads() -> int:
    import threading
    # Groups' executors only (``zerocomm-<group>``), not the process's watch of peer exits (gloo_exits.py).
    return sum(1 for t in threading.enumerate() if t.name.startswith("zerocomm-") and t.name != "zerocomm-peer-exits")


def _count(step, warmup: int, top: int, callers: str = "") -> tuple:
    for _ in range(warmup):
        step()
    profile = cProfile.Profile()
    profile.enable()
    step()
    profile.disable()
    stats = pstats.Stats(profile)
    lines = []
    if callers:
        import io
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("calls").print_callers(callers)
        lines.append(text.getvalue())
    if top:
        rows = sorted(stats.stats.items(), key=lambda item: -item[1][1])[:top]
        lines = [f"{calls:7d}  {os.path.basename(func[0])}:{func[1]} {func[2]}" for func, (_, calls, *_) in rows]
    return stats.total_calls, _executor_threads(), lines


def _worker(rank: int, world: int, folder: str, args, out) -> None:
    import datetime

    import torch
    import torch.distributed as td
    from torch.nn.parallel import DistributedDataParallel

    import zerocomm.comm as dist
    from zerocomm.zero import ZeroConfig, initialize
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=300)
    td.init_process_group("gloo", init_method=f"file://{folder}/torch", rank=rank, world_size=world, timeout=timeout)
    dist.init_process_group("gloo", init_method=f"file://{folder}/zerocomm", rank=rank, world_size=world,
                            timeout=timeout)
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width, generator=generator)
    y = torch.randn(args.batch, args.width, generator=generator)
    results = {}

    def adamw(params):
        return torch.optim.AdamW(params, lr=1e-3)

    for precision in PRECISIONS:
        model = DistributedDataParallel(_model(args.layers, args.width))
        optimizer = adamw(model.parameters())

        def ddp_step(model=model, optimizer=optimizer, precision=precision):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        td.barrier()
        results[f"DDP {precision}"] = _count(ddp_step, args.warmup, args.top, args.callers)
        del model, optimizer
    for algorithm, label in ALGORITHMS.items():  # "native" first: the executor thread is not started before it
        for stage in STAGES:
            for precision in PRECISIONS:
                config = ZeroConfig(stage=stage, precision=precision, algorithm=algorithm)
                model, optimizer = initialize(_model(args.layers, args.width), adamw, config)

                def zero_step(model=model, optimizer=optimizer):
                    loss = torch.nn.functional.mse_loss(model(x).float(), y)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()

                dist.barrier()
                results[f"ZeRO-{stage} {label} {precision}"] = _count(zero_step, args.warmup, args.top, args.callers)
                optimizer.remove_hooks()
                del model, optimizer
    everyone = [None] * world
    td.all_gather_object(everyone, results)
    dist.destroy_process_group()
    td.destroy_process_group()
    if rank == 0:
        out.write(json.dumps(everyone))


def _run(args) -> list:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "out.json")
        children = []
        for rank in range(args.nprocs):
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    with open(path if rank == 0 else os.devnull, "w") as out:
                        _worker(rank, args.nprocs, folder, args, out)
                except BaseException:  # the parent reports the failed rank
                    import traceback
                    traceback.print_exc()
                    code = 1
                os._exit(code)
            children.append(pid)
        failed = []
        for rank, pid in enumerate(children):
            _, status = os.waitpid(pid, 0)
            if status != 0:
                failed.append(f"rank {rank} (pid {pid}) exited with status {status}")
        if failed:
            raise RuntimeError("step-calls: " + "; ".join(failed))
        with open(path) as handle:
            return json.load(handle)


def table(per_rank: list, top: int = 0) -> str:
    """The report: per variant the most calls over ranks, the ratio to DDP at the same precision, the target."""
    from tabulate import tabulate
    names = list(per_rank[0])
    rows, details = [], []
    for name in names:
        calls = max(rank[name][0] for rank in per_rank)
        threads = max(rank[name][1] for rank in per_rank)
        peer = "DDP " + name.split()[-1]
        ratio = calls / max(rank[peer][0] for rank in per_rank)
        verdict = "" if name.startswith("DDP") else ("yes" if ratio <= TARGET else "no")
        rows.append([name, calls, f"{ratio:.2f}", verdict, threads])
        if per_rank[0][name][2]:
            details.append(f"\n{name}, rank 0:\n" + "\n".join(per_rank[0][name][2]))
    head = tabulate(rows, headers=["variant", "Python calls / step", "× DDP (same precision)", f"≤ {TARGET}×",
                                   "executor threads alive"])
    return head + "".join(details)


HELP = "Python function calls of one ZeRO step (stages 1-3, fp32/bf16) against torch DDP's, 2 gloo ranks"

DESCRIPTION = """\
The host cost of one training step, counted: Python function calls (cProfile, builtins included)
of one step after warm-up, on the step's thread, the most over ranks.  torch DDP (fp32, and under
torch.autocast("cpu", bfloat16) for bf16) beside zerocomm ZeRO stages 1-3 at fp32 and bf16, on an
MLP of --layers Linear layers (two parameters each) at 2 forked gloo ranks, in one run.  The
target is at most 1.1x DDP's count at the same precision.

Examples:
  zerocomm-bench step-calls
  zerocomm-bench step-calls --top 20 --json step_calls.json
"""


def add_arguments(parser) -> None:
    parser.add_argument("--layers", type=int, default=200, metavar="N",
                        help="Linear layers of the model, two parameters each (default: 200 = 400 parameters)")
    parser.add_argument("--width", type=int, default=16, metavar="W", help="features per layer (default: 16)")
    parser.add_argument("--batch", type=int, default=8, metavar="B", help="rows per batch (default: 8)")
    parser.add_argument("--warmup", type=int, default=3, metavar="N", help="steps before the counted one (default: 3)")
    parser.add_argument("--nprocs", type=int, default=2, metavar="N", help="ranks (default: 2)")
    parser.add_argument("--top", type=int, default=0, metavar="N", help="also list each variant's N most called "
                        "functions (rank 0)")
    parser.add_argument("--callers", default="", metavar="REGEX", help="also list who calls the functions whose "
                        "names match REGEX (rank 0; pstats' print_callers)")
    parser.add_argument("--json", metavar="PATH", help="also write the counts as JSON")


def run(args) -> int:
    from .options import UsageError
    if args.layers < 1 or args.width < 1 or args.batch < 1 or args.warmup < 1 or args.nprocs < 1:
        raise UsageError(f"--layers, --width, --batch, --warmup and --nprocs must be positive, got {args.layers}, "
                         f"{args.width}, {args.batch}, {args.warmup}, {args.nprocs}")
    per_rank = _run(args)
    print(f"one training step, {2 * args.layers} parameters ({args.layers} Linear {args.width}x{args.width}), "
          f"{args.nprocs} gloo ranks, AdamW; Python function calls on the step's thread, most over ranks")
    print(table(per_rank, args.top or bool(args.callers)))
    load = os.getloadavg()
    print(f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"per_rank": per_rank, "loadavg": load}, handle, indent=1)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerocomm.benchmarks.step_calls", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
