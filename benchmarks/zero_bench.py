"""ZeRO benchmark: zerocomm stages 0-3 beside torch DDP, ZeroRedundancyOptimizer and FSDP2.

    zerocomm-bench zero --nprocs 2,4 --steps 5

Every variant runs in freshly forked ranks (gloo over a FileStore in a temporary folder); all train
the same seeded TinyLM on the same batches with Adam, fp32.

``step ms``: the median over the measured steps (after warm-up) of the slowest rank's wall time per
step, steps run back to back as in training (forward + backward + step + zero_grad, from one step's
start to the next's; the batches are made beforehand).  zerocomm's post-step all_gather is waited for
where the next forward needs it, so it counts in the step that waits; the last step ends with
``synchronize()``.
``peak MiB``: the rank's peak resident set during model construction, wrapping and training, above
its resident set just before (Linux ``VmHWM`` reset through ``clear_refs``; lazily loaded kernels
are warmed up first; glibc is told to return large freed blocks at once), the largest over ranks.
``model states MiB``: parameters + gradients + optimizer state this rank holds after a step
(zerocomm: ``model_state_bytes()``; torch: local shards of parameters, ``param.grad`` and the
optimizer's state; DDP's own bucket copies of the gradients are not included).
``offload cpu`` / ``offload nvme``: stage 2 with the optimizer state in host memory (for these CPU ranks the
same placement as without offload) or in files, stepped in pieces of ``--offload-buffer-numel`` elements with
``--offload-buffer-count`` pieces in memory (with NVMe, the reduced gradient shard streams to files during backward);
``offload nvme params``: stage 3 with the parameter shards in files too (``offload_param: nvme``); ``last loss``
shows the runs train alike.
``sent/step MiB``: bytes one rank sends in one step — measured message by message for zerocomm's
ring; for native gloo collectives zerocomm reports the optimal schedule's bytes, although gloo's
reduce_scatter really runs a full all_reduce (so native stages 1-3 move more than shown); the
textbook value for the torch variants (DDP 2Φ(N−1)/N, ZeroRedundancyOptimizer and FSDP2 3Φ(N−1)/N);
0 for zerocomm's "shm" rows, whose ranks read each other's buffers in shared memory and send nothing over
the backend (the choice ZeRO makes by itself when every rank is on one host and ``algorithm`` is left open).

``--interleave K`` measures step times only, every variant in the same ranks, K steps each in turn
(zero_interleaved.py): ratios of steps run seconds apart, for machines whose speed drifts, and timed
under glibc's default allocator instead of the pinned mmap threshold the peak column needs here, which
makes every large allocation page-fault (zero_interleaved.py, [Note: the allocator]).  Compare step
times from ``--interleave``.
"""
from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import time
import traceback

import torch

from .models import LMShape, TinyLM, batch_for, loss_fn

VARIANTS = [("torch DDP", None), ("torch ZeroRedundancyOptimizer", None), ("torch FSDP2", None),
            ("zerocomm stage 0", "native"), ("zerocomm stage 1", "native"), ("zerocomm stage 2", "native"),
            ("zerocomm stage 1", "ring"), ("zerocomm stage 2", "ring"), ("zerocomm stage 3", "native"),
            ("zerocomm stage 3", "ring"), ("zerocomm stage 1", "shm"), ("zerocomm stage 2", "shm"),
            ("zerocomm stage 3", "shm"), ("zerocomm stage 2 offload cpu", "native"),
            ("zerocomm stage 2 offload nvme", "native"), ("zerocomm stage 3 offload nvme", "native"),
            ("zerocomm stage 3 offload nvme params", "native")]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> int:
    """Reset this process's peak resident set (Linux: ``clear_refs`` 5) and return the current one."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass  # then the peak also counts what came before
    return _rss_bytes()


def _peak_bytes() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _adam(params):
    return torch.optim.Adam(params, lr=1e-4)


def _local_bytes(tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # FSDP2's DTensors: this rank's shard
    return local.numel() * local.element_size()


def _torch_states(model, optimizer) -> int:
    """Bytes of parameters, their gradients and the optimizer's state tensors on this rank."""
    total = sum(_local_bytes(p) for p in model.parameters())
    total += sum(_local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard's optimizer here
    for state in inner.state.values():
        total += sum(_local_bytes(v) for v in state.values() if isinstance(v, torch.Tensor))
    return total


def _return_freed_memory() -> None:
    """A fixed mmap threshold makes glibc return every large freed block to the system at once, so the
    resident set follows live memory (the dynamic threshold would keep freed buffers resident)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD = 64 KiB
    except (OSError, AttributeError):
        pass


def _warm_up() -> None:
    """Load what every variant loads lazily (optimizer, autograd and attention kernels, torch's
    distributed modules), so the measured peak is the variant's own."""
    import torch.distributed.optim  # noqa: F401
    import zerocomm.zero  # noqa: F401

    model = TinyLM(LMShape())
    optimizer = _adam(model.parameters())
    x, y = batch_for(model, seed=0, rank=0, step=0)
    loss_fn(model, model(x), y).backward()
    optimizer.step()


def _model(args):
    torch.manual_seed(0)
    model = TinyLM(LMShape(**args.shape))
    return model, sum(p.numel() for p in model.parameters())


def _torch_variant(name: str, model, phi: int, world: int):
    """(model to call, model that owns the data recipe, optimizer, textbook bytes sent per step)."""
    one_phi = 4 * phi * (world - 1) // world
    if "FSDP2" in name:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model, model, _adam(model.parameters()), 3 * one_phi  # all_gather twice, reduce_scatter
    from torch.nn.parallel import DistributedDataParallel

    wrapped = DistributedDataParallel(model)
    if "Redundancy" in name:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
        return wrapped, model, optimizer, 3 * one_phi  # all_reduce, then every shard broadcast
    return wrapped, model, _adam(wrapped.parameters()), 2 * one_phi


def _run_variant(rank, world, store_dir, name, algorithm, args, conn):
    try:
        _return_freed_memory()
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        store = torch.distributed.FileStore(os.path.join(store_dir, "store"), world)
        timeout = datetime.timedelta(seconds=300)
        sent = None
        if name.startswith("torch"):
            import torch.distributed as td

            td.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
            td.all_reduce(torch.ones(1))  # the first collective's lazy set-up is not the model's memory
            _warm_up()
            base = _reset_peak()
            model, phi = _model(args)
            model, data_model, optimizer, sent = _torch_variant(name, model, phi, world)
            synchronize, barrier, states = (lambda: None), td.barrier, None
        else:
            import zerocomm.comm as dist

            dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
            for algorithm_name in ("native", "ring", "shm"):  # "shm" maps the group's shared segment
                dist.all_reduce(torch.ones(1), algorithm=algorithm_name)
            _warm_up()
            base = _reset_peak()
            model, phi = _model(args)
            model, optimizer = zero_variant(name, algorithm, model, args, args.nvme_path or store_dir)
            data_model, synchronize, barrier = model, optimizer.synchronize, dist.barrier
        batches = [batch_for(data_model, seed=0, rank=rank, step=step, batch_size=args.batch)
                   for step in range(args.warmup + args.steps)]
        for step in range(args.warmup):  # the last warm-up step also counts zerocomm's bytes
            x, y = batches[step]
            if name.startswith("zerocomm") and step == args.warmup - 1:
                import zerocomm.comm as dist
                with dist.count_bytes() as counter:
                    loss_fn(data_model, model(x), y).backward()
                    optimizer.step()
                    synchronize()
                sent = counter.bytes_sent
            else:
                loss_fn(data_model, model(x), y).backward()
                if name.startswith("torch") and step == args.warmup - 1:
                    states = _torch_states(model, optimizer)
                optimizer.step()
            optimizer.zero_grad()
        synchronize()
        barrier()
        # Steps back to back, as in training: a step is timed from its start to the next one's, so work a
        # step leaves in flight (zerocomm's post-step all_gather) is paid where it is waited for, in the
        # next forward; the last step ends with a synchronize.
        stamps = [time.perf_counter()]
        for step in range(args.warmup, args.warmup + args.steps):
            x, y = batches[step]
            loss = loss_fn(data_model, model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step == args.warmup + args.steps - 1:
                synchronize()
            stamps.append(time.perf_counter())
        times = [b - a for a, b in zip(stamps, stamps[1:])]
        if args.trace and name.startswith("zerocomm"):
            _trace_steps(args, rank, world, name, algorithm, data_model, model, optimizer, batches[:2])
        if name.startswith("zerocomm"):
            states = sum(optimizer.model_state_bytes().values())
        peak = _peak_bytes() - base
        conn.send(("ok", {"times": times, "peak": peak, "states": states, "sent": sent, "phi": phi,
                          "loss": float(loss.detach())}))
    except BaseException:  # reported by the parent
        conn.send(("err", traceback.format_exc()))
    finally:
        conn.close()


def _trace_steps(args, rank, world, name, algorithm, data_model, model, optimizer, batches) -> None:
    """Two more steps under ``zerocomm.comm.profile()`` with forward / backward / step marked; rank 0 writes
    the Chrome trace to ``args.trace/zero_trace_<stage>_<algorithm>_n<world>.json`` (open it in Perfetto)."""
    import zerocomm.comm as dist

    with dist.profile() as prof:
        for x, y in batches:
            with prof.span("forward"):
                loss = loss_fn(data_model, model(x), y)
            with prof.span("backward"):
                loss.backward()
            with prof.span("step"):
                optimizer.step()
                optimizer.zero_grad()
        optimizer.synchronize()
    if rank == 0:
        os.makedirs(args.trace, exist_ok=True)
        stage, offload = _stage_and_offload(name)
        suffix = "" if offload == "none" else f"_offload_{offload}"
        prof.export_chrome_trace(os.path.join(args.trace, f"zero_trace_stage{stage}{suffix}_{algorithm}_n{world}.json"))


def zero_variant(name: str, algorithm, model, args, nvme_dir: str):
    """(model, optimizer) of the zerocomm variant ``name`` ("zerocomm stage 2 offload nvme") around ``model``;
    NVMe offload keeps its files in ``nvme_dir``."""
    from zerocomm.zero import ZeroConfig, initialize

    stage, offload = _stage_and_offload(name)
    fields = {"offload_optimizer": offload}
    if name.endswith(" params"):
        fields["offload_param"] = offload
    if offload == "nvme":
        fields.update(nvme_path=nvme_dir, offload_buffer_numel=args.offload_buffer_numel,
                      offload_buffer_count=args.offload_buffer_count)
    return initialize(model, _adam, ZeroConfig(stage=stage, algorithm=algorithm, reduce_bucket_numel=args.bucket_numel,
                                               allgather_bucket_numel=args.bucket_numel, precision=args.precision,
                                               **fields))


def _stage_and_offload(name: str) -> tuple:
    """("zerocomm stage 2 offload nvme") -> (2, "nvme"); no offload word -> "none"."""
    words = name.split()
    return int(words[2]), (words[4] if len(words) > 4 else "none")


def fork_ranks(world: int, target, extra: tuple, timeout: float, what: str) -> list:
    """Fork ``world`` ranks, each running ``target(rank, world, store_dir, *extra, conn)`` with a fresh temporary
    ``store_dir``, and return what they sent as ``("ok", report)`` (index = rank).  A rank that sends an error, or
    nothing within ``timeout`` seconds, kills them all and raises, naming ``what``."""
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="zero-bench-") as store_dir:
        pipes, procs = [], []
        for rank in range(world):
            parent, child = context.Pipe(duplex=False)
            proc = context.Process(target=target, args=(rank, world, store_dir, *extra, child), daemon=True)
            proc.start()
            child.close()
            pipes.append(parent)
            procs.append(proc)
        reports = []
        for rank, pipe in enumerate(pipes):
            if not pipe.poll(timeout):
                for other in procs:
                    other.kill()
                raise TimeoutError(f"{what} at world size {world}: rank {rank} did not report within {timeout} s")
            status, value = pipe.recv()
            if status != "ok":
                for other in procs:
                    other.kill()
                raise RuntimeError(f"{what} at world size {world}: rank {rank} failed:\n{value}")
            reports.append(value)
        for proc in procs:
            proc.join(10)
    return reports


def run_variant(world: int, name: str, algorithm, args) -> list:
    """Fork ``world`` ranks for one variant and return their reports (index = rank)."""
    return fork_ranks(world, _run_variant, (name, algorithm, args), args.timeout, name)


def summarize(world: int, name: str, algorithm, reports: list) -> list:
    slowest = [max(r["times"][i] for r in reports) for i in range(len(reports[0]["times"]))]
    mib = 1 << 20
    return [world, name, algorithm or "-", f"{statistics.median(slowest) * 1e3:.0f}",
            f"{max(r['peak'] for r in reports) / mib:.1f}", f"{max(r['states'] for r in reports) / mib:.1f}",
            f"{max(r['sent'] for r in reports) / mib:.1f}", f"{reports[0]['loss']:.6f}"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``zerocomm-bench zero`` (lists comma-separated, as everywhere in zerocomm-bench)."""
    from .options import list_of, positive_float, positive_int, split_commas

    parser.add_argument("--nprocs", type=list_of(positive_int, "world size"), default=[2, 4], metavar="N[,N...]",
                        help="world sizes, each run in ranks of its own (default: 2,4)")
    parser.add_argument("--world-sizes", dest="world_sizes_deprecated", type=list_of(positive_int, "world size"),
                        nargs="+", default=None, help=argparse.SUPPRESS)  # the old name of --nprocs
    parser.add_argument("--steps", type=positive_int, default=5, metavar="N", help="measured steps per variant "
                        "(default: 5)")
    parser.add_argument("--warmup", type=positive_int, default=2, metavar="N",
                        help="unmeasured steps first, at least 1 (default: 2)")
    parser.add_argument("--repeat", type=positive_int, default=1, metavar="R",
                        help="rounds over the variants, interleaved; step ms is the median over rounds (default: 1)")
    parser.add_argument("--batch", type=positive_int, default=2, metavar="B",
                        help="sequences per rank per step (default: 2)")
    parser.add_argument("--bucket-numel", type=positive_int, default=1 << 21, metavar="ELEMENTS",
                        help="gradient bucket size of the zerocomm variants (default: 2097152)")
    parser.add_argument("--timeout", type=positive_float, default=600.0, metavar="SECONDS",
                        help="a variant's ranks are stopped after this (default: 600)")
    parser.add_argument("--small", action="store_true", help="a 30 K-parameter model (a quick check)")
    parser.add_argument("--only", type=split_commas, default=None, metavar="WORD[,WORD...]",
                        help="run only the variants whose 'name algorithm' contains one of these words, e.g. "
                             "'torch DDP,stage 2 native'")
    parser.add_argument("--plot", metavar="PNG", help="bar charts of step time and per-rank peak memory "
                        "(needs zerocomm[bench])")
    parser.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="the zerocomm variants' precision: fp32, bf16 or fp16; the torch variants run fp32 "
                             "(default: fp32)")
    parser.add_argument("--nvme-path", default=None, metavar="DIR", help="folder for the NVMe-offload variants' "
                        "state files (default: a temporary folder)")
    parser.add_argument("--offload-buffer-numel", type=positive_int, default=1 << 18, metavar="ELEMENTS",
                        help="NVMe offload: elements stepped at once, the pieces read and written (default: 262144)")
    parser.add_argument("--offload-buffer-count", type=positive_int, default=3, metavar="N",
                        help="NVMe offload: pieces in memory at once (default: 3)")
    parser.add_argument("--interleave", type=int, default=0, metavar="K",
                        help="step times only: every variant in the same ranks, K steps each in turn, --repeat "
                        "rotations; × DDP is the median of the per-rotation ratios")
    parser.add_argument("--pin-mmap-threshold", action="store_true",
                        help="--interleave: time the steps under the default mode's allocator setting (glibc hands "
                        "every freed block over 64 KiB back to the kernel at once, so each new one page-faults), to "
                        "compare with the default mode's step times; without it the ranks keep glibc's defaults, as "
                        "a training process does")
    parser.add_argument("--trace", metavar="DIR", help="after the measured steps, profile two more steps of every "
                        "zerocomm variant and write rank 0's Chrome trace into DIR")


def checked(args: argparse.Namespace) -> LMShape:
    """The options of ``zerocomm-bench zero``, checked (``options.UsageError`` for a bad combination, before any
    rank starts) and completed; the model's shape."""
    from .options import UsageError, require

    if args.world_sizes_deprecated:
        args.nprocs = [n for values in args.world_sizes_deprecated for n in values]
    args.world_sizes = args.nprocs
    if args.plot:  # matplotlib is imported only when it draws, after every variant ran: check it now
        require("matplotlib", "--plot", "bench")
    shape = LMShape() if args.small else TinyLM.benchmark_size()
    args.shape = {field: getattr(shape, field) for field in LMShape.__dataclass_fields__}
    if args.interleave:
        if args.interleave < 1 or args.repeat < 1:
            raise UsageError(f"--interleave and --repeat must be at least 1, got {args.interleave} and {args.repeat}")
        if args.plot or args.trace:
            raise UsageError("--interleave measures step times only: --plot and --trace need the default mode")
    elif args.pin_mmap_threshold:
        raise UsageError("--pin-mmap-threshold is for --interleave: the default mode always pins it (for the peak column)")
    return shape


def run(args: argparse.Namespace, shape: LMShape) -> int:
    """The default mode of ``zerocomm-bench zero`` (``args`` as :func:`checked` left them): every variant in
    freshly started ranks, one table."""
    rows = []
    for world in args.world_sizes:
        chosen = chosen_variants(args)
        # With --repeat R the variants run round after round (interleaved, so that a stretch of load from
        # elsewhere hits every variant alike); a row reports the median over rounds of the step time.
        rounds: dict = {variant: [] for variant in chosen}
        # A first, discarded run: on a shared machine the first variant after a pause was measured up to 2x
        # slower in its first round (torch DDP, first in the list, looked 1215 ms against 610 ms a round later).
        if chosen:
            run_variant(world, *chosen[0], args)
        for round_index in range(args.repeat):
            for name, algorithm in chosen:
                reports = run_variant(world, name, algorithm, args)
                row = summarize(world, name, algorithm, reports)
                rounds[(name, algorithm)].append(row)
                print(f"round {round_index + 1}: " + " | ".join(str(cell) for cell in row), file=sys.stderr, flush=True)
        for variant in chosen:
            row = list(rounds[variant][-1])
            row[3] = f"{statistics.median(float(r[3]) for r in rounds[variant]):.0f}"
            rows.append(row)
    phi = reports[0]["phi"]
    from tabulate import tabulate

    print(f"TinyLM {shape}: Φ = {phi:,} parameters, {args.precision} (zerocomm), Adam, batch {args.batch} x {shape.seq_len} tokens per rank, "
          f"gloo, {os.cpu_count()} cores")
    ddp = {row[0]: float(row[3]) for row in rows if row[1] == "torch DDP"}
    for row in rows:  # step time over torch DDP's at the same world size, when DDP ran
        row.insert(4, f"{float(row[3]) / ddp[row[0]]:.2f}" if row[0] in ddp else "-")
    headers = ["N", "variant", "algorithm", "step ms", "× DDP", "peak MiB", "model states MiB", "sent/step MiB",
               "last loss (rank 0)"]
    print(tabulate(rows, headers=headers, tablefmt="github"))
    if args.json:
        import json
        with open(args.json, "w") as handle:
            json.dump([dict(zip(headers, row)) for row in rows], handle, indent=1)
    if args.plot:
        plot(rows, args.plot)
    return 0


def chosen_variants(args) -> list:
    """``(name, algorithm)`` of every variant ``--only`` keeps."""
    return [(name, algorithm) for name, algorithm in VARIANTS
            if not args.only or any(word in f"{name} {algorithm}" for word in args.only)]


def plot(rows: list, path: str) -> None:
    """Step time and per-rank peak memory per variant, one panel pair per world size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted({row[0] for row in rows})
    figure, axes = plt.subplots(len(worlds), 2, figsize=(12, 3.2 * len(worlds)), squeeze=False)
    for line, world in zip(axes, worlds):
        mine = [row for row in rows if row[0] == world]
        labels = [f"{row[1]}" + (f" ({row[2]})" if row[2] != "-" else "") for row in mine]
        colors = ["tab:gray" if row[1].startswith("torch") else "tab:blue" for row in mine]
        for axis, column, title in ((line[0], 3, "step time (ms)"), (line[1], 5, "per-rank peak memory (MiB)")):
            axis.barh(labels, [float(row[column]) for row in mine], color=colors)
            axis.set_title(f"{title}, {world} ranks")
            axis.invert_yaxis()
            axis.tick_params(axis="y", labelsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
